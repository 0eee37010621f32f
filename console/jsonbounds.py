"""JSON with bounds: how deep a value may nest, and how much of a stored value a page shows.

Python's json module (the C scanner and encoder, and the pure-Python encoder behind `indent=`)
recurses once per nested array or object, and raises RecursionError, which is not a ValueError,
somewhere under `sys.getrecursionlimit()` (1000) minus the frames already on the stack. So a
3 KB payload nested 500 levels deep, harmless to PostgreSQL, used to turn every page that
showed it into a 500. The rule here: nothing nested is ever walked by recursion.

Input (a job's payload, a request body, a payload filter, a selection, a page cursor, a
config file): at most `MAX_DEPTH` nested arrays/objects (`{}` is one level, `[[1]]` two).
`check_text(text, what)` measures JSON text with a loop over its brackets (strings skipped)
and raises `TooDeep`, a ValueError naming `what`; `loads(text, what)` is json.loads after that
check. A request body may carry one level of envelope around such a value (`MAX_BODY_DEPTH`).

Reading (a stored value: any client may have written any depth PostgreSQL accepts):
`read_json` is the loader of the console's pooled connections (console.db.make_pool). A value
nested deeper than `READ_DEPTH` arrives as the string `TOO_DEEP_TO_READ` instead of raising in
the middle of a page.

Showing: `bounded(value, ...)` walks a value with an explicit stack and returns a copy whose
depth, items per array/object and string lengths are capped (each cut says what it left out),
hiding the values of `hide_keys` on the way (console.redaction uses it): one pass, no recursion.

This module does not know about users, HTTP or the database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 100          # nested arrays/objects accepted in any JSON input (payloads, filters, config)
MAX_BODY_DEPTH = MAX_DEPTH + 1  # a request body: one level of envelope around a value of MAX_DEPTH
READ_DEPTH = 200         # a stored value nested deeper than this is not turned into Python objects
TOO_DEEP_TO_READ = f"[not shown: JSON nested deeper than {READ_DEPTH} levels]"

# A JSON string (its escapes included) or one bracket: strings are skipped whole, so a bracket
# inside a string does not count.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class TooDeep(ValueError):
    """A JSON input nests deeper than its limit; the message names the input and the limit."""


def depth_of_text(text: str | bytes) -> int:
    """How deeply the JSON `text` nests (0 for a scalar), counted without recursion."""
    return _scan(_as_text(text), None)


def too_deep(text: str | bytes, limit: int) -> bool:
    """Whether the JSON `text` nests deeper than `limit`. Fewer opening brackets than the limit
    (counting those inside strings too) answers at once; otherwise the scan stops as soon as the
    depth passes the limit, so a hostile input is not read to its end."""
    if text.count(b"[" if isinstance(text, bytes | bytearray) else "[") + \
            text.count(b"{" if isinstance(text, bytes | bytearray) else "{") <= limit:
        return False
    return _scan(_as_text(text), limit) > limit


def _as_text(text: str | bytes) -> str:
    return bytes(text).decode("utf-8", "replace") if isinstance(text, bytes | bytearray) else text


def _scan(text: str, stop_after: int | None) -> int:
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_after is not None and deepest > stop_after:
                    return deepest
        elif token in "]}":
            depth -= 1
    return deepest


def check_text(text: str | bytes, what: str, limit: int = MAX_DEPTH) -> None:
    """TooDeep ("<what>: JSON nested deeper than N levels") when `text` nests past `limit`."""
    if too_deep(text, limit):
        raise TooDeep(f"{what}: JSON nested deeper than {limit} levels (arrays and objects count one level each)")


def loads(text: str | bytes, what: str, limit: int = MAX_DEPTH) -> Any:
    """json.loads of `text` after check_text: TooDeep past `limit`, JSONDecodeError when invalid."""
    check_text(text, what, limit)
    return json.loads(text)


def depth_of(value: Any, *, stop_after: int | None = None) -> int:
    """How deeply a Python value (dicts, lists, tuples) nests, walked with an explicit stack."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_after is not None and deepest > stop_after:
                    return deepest
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(data: bytes | bytearray | memoryview | str) -> Any:
    """The loader for json/jsonb values read from PostgreSQL: json.loads, except that a value
    nested deeper than READ_DEPTH becomes TOO_DEEP_TO_READ (a page shows that, not a 500)."""
    if isinstance(data, memoryview):
        data = bytes(data)
    if too_deep(data, READ_DEPTH):
        return TOO_DEEP_TO_READ
    return json.loads(data)


# --- showing a value ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """How much of a value is shown: nesting levels, items of one array or object, characters
    of one string (key names included)."""

    depth: int = MAX_DEPTH
    items: int | None = None
    chars: int | None = None


WHOLE = Bounds()                                  # the API and exports: any width, depth capped
PAGE = Bounds(depth=MAX_DEPTH, items=1000, chars=10_000)  # an HTML page

MORE_KEY = "…"  # the key under which an object says how many keys were left out


def _cut_text(text: str, chars: int | None) -> str:
    if chars is None or len(text) <= chars:
        return text
    return f"{text[:chars]}… [{len(text) - chars:,} more characters not shown]"


def bounded(value: Any, bounds: Bounds = WHOLE, *, hide_keys: frozenset[str] = frozenset(),
            hidden: Any = None, text: Callable[[str], str] | None = None) -> Any:
    """A copy of `value` within `bounds`, built without recursion.

    - deeper than `bounds.depth`: the array or object is replaced by a string saying so;
    - more than `bounds.items` items: the first ones, then a note (an array's last item, an
      object's key MORE_KEY) with the number left out;
    - a string (or key) longer than `bounds.chars`: cut, with the number of characters left out;
    - an object key whose lower-cased name is in `hide_keys`: its value is replaced by
      `hidden`, whatever it held, at any depth;
    - `text(s)`, when given, is applied to every string value (not to keys) before it is cut.
    Scalars other than strings pass unchanged; tuples become lists (as JSON would).
    """
    def leaf(item: Any) -> Any:
        if not isinstance(item, str):
            return item
        return _cut_text(text(item) if text is not None else item, bounds.chars)

    if not isinstance(value, dict | list | tuple):
        return leaf(value)
    root: list[Any] = [None]
    # (source container, its depth, the slot to fill: (parent container, key or index))
    stack: list[tuple[Any, int, Any, Any]] = [(value, 1, root, 0)]
    while stack:
        source, depth, parent, slot = stack.pop()
        if depth > bounds.depth:
            kind = "object" if isinstance(source, dict) else "array"
            parent[slot] = f"[{kind} nested deeper than {bounds.depth} levels: not shown]"
            continue
        if isinstance(source, dict):
            out: dict[str, Any] = {}
            parent[slot] = out
            for n, (key, child) in enumerate(source.items()):
                if bounds.items is not None and n >= bounds.items:
                    out[MORE_KEY] = f"{len(source) - n:,} more keys not shown"
                    break
                name = _cut_text(str(key), bounds.chars)
                if hide_keys and str(key).lower() in hide_keys:
                    out[name] = hidden
                elif isinstance(child, dict | list | tuple):
                    out[name] = None
                    stack.append((child, depth + 1, out, name))
                else:
                    out[name] = leaf(child)
        else:
            items = list(source) if bounds.items is None else list(source[: bounds.items])
            parent[slot] = items
            for i, child in enumerate(items):
                if isinstance(child, dict | list | tuple):
                    stack.append((child, depth + 1, items, i))
                else:
                    items[i] = leaf(child)
            if bounds.items is not None and len(source) > bounds.items:
                items.append(f"… {len(source) - bounds.items:,} more items not shown")
    return root[0]


def keys_in(value: Any) -> Iterable[str]:
    """Every object key in `value`, lower-cased, at any depth (an explicit stack, no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                yield str(key).lower()
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)


__all__ = ["MAX_BODY_DEPTH", "MAX_DEPTH", "MORE_KEY", "PAGE", "READ_DEPTH", "TOO_DEEP_TO_READ", "WHOLE",
           "Bounds", "TooDeep", "bounded", "check_text", "depth_of", "depth_of_text", "keys_in", "loads",
           "read_json", "too_deep"]
