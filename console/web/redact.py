"""What a payload, an error text or a selection looks like to the person reading it.

Viewers see payloads with the keys named in `web.redact_keys` (any depth, case-insensitive)
replaced by "[redacted]"; operators and admins see them whole. Then, for everyone, the
deployer's hook (`web.redact_hook = "module:function"`, called as `hook(payload, user)`) may
change or mask anything else.

Error text (a job's `last_error`, its error history's messages and tracebacks, the timeline
built from them, error groups' examples, a bulk operation's error) is as sensitive as the
payload that caused it: `text_for(text, user)` masks, for viewers, the value written after a
redacted key (`card_number=4111...`, `"password": "..."`, `token: abc`), then, for everyone,
the text hook (`web.redact_text_hook = "module:function"`, called as `hook(text, user)`,
returning the text to show) masks whatever else the deployment knows to be secret (card
numbers without a key, e-mail addresses...). It is a second setting, not a new argument of
`redact_hook`, so existing payload hooks keep working unchanged.

Selections (the audit log's `selection`, a bulk operation's) may carry a payload filter:
`selection_for()` shows its `payload` as a payload. Viewers may not filter on a redacted key
at all (`may_filter_on`): a containment filter would tell them the value by its answer.

Pages, exports and the JSON API all go through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from console.users import User

REDACTED = "[redacted]"


def _sees_all(user: User | None) -> bool:
    return user is not None and user.can("operator")


def redact_keys(value: Any, keys: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if str(k).lower() in keys else redact_keys(v, keys)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_keys(v, keys) for v in value]
    return value


def keys_in(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k).lower()
            yield from keys_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from keys_in(v)


@lru_cache(maxsize=8)
def _keyed_value(keys: frozenset[str]) -> re.Pattern[str] | None:
    """A redacted key, optionally quoted, then `=` or `:`, then its value: a quoted string, or
    everything up to a space, comma, semicolon, ampersand or closing bracket."""
    if not keys:
        return None
    names = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    return re.compile(
        rf"""(?P<key>(?<![\w-])["']?(?:{names})["']?\s*[:=]\s*)(?P<value>"[^"]*"|'[^']*'|[^\s,;&)}}\]]+)""",
        re.IGNORECASE,
    )


def redact_text_keys(text: str, keys: frozenset[str]) -> str:
    """`card_number=4111 1111` -> `card_number=[redacted] 1111`: the value after a redacted key."""
    pattern = _keyed_value(keys)
    return text if pattern is None else pattern.sub(lambda m: m.group("key") + REDACTED, text)


def payload_for(payload: Any, user: User | None) -> Any:
    from console.web import state

    st = state()
    if not _sees_all(user):
        payload = redact_keys(payload, st.redact_keys)
    if st.redact_hook is not None:
        payload = st.redact_hook(payload, user)
    return payload


def text_for(text: Any, user: User | None) -> Any:
    """Error text as `user` may see it (None and non-strings pass through)."""
    if not isinstance(text, str) or not text:
        return text
    from console.web import state

    st = state()
    if not _sees_all(user):
        text = redact_text_keys(text, st.redact_keys)
    if st.redact_text_hook is not None:
        text = st.redact_text_hook(text, user)
    return text


def selection_for(selection: Any, user: User | None) -> Any:
    """A stored selection (audit log, bulk operation) with its payload filter shown as a payload."""
    if isinstance(selection, dict) and isinstance(selection.get("payload"), dict | list):
        return {**selection, "payload": payload_for(selection["payload"], user)}
    return selection


def error_entry_for(entry: dict[str, Any], user: User | None) -> dict[str, Any]:
    """One entry of a job's error history, its message and traceback redacted."""
    return {**entry, **{k: text_for(entry.get(k), user) for k in ("message", "traceback", "reason") if k in entry}}


def may_filter_on(payload_filter: dict[str, Any] | None, user: User | None) -> str | None:
    """A viewer may not probe redacted values with a containment filter: the complaint, or None."""
    from console.web import state

    if payload_filter is None or _sees_all(user):
        return None
    hidden = sorted(set(keys_in(payload_filter)) & state().redact_keys)
    if hidden:
        return f"payload filter: viewers cannot filter on redacted keys ({', '.join(hidden)})"
    return None
