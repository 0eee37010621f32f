"""Writes docs/api.md, the reference of the public API, from the code's signatures and docstrings.

    .venv/bin/python scripts/api_reference.py          # rewrite docs/api.md
    .venv/bin/python scripts/api_reference.py --check  # exit 1 if docs/api.md is stale

tests/test_api_reference.py runs the check, so the page cannot drift from the docstrings: change
a docstring or a signature, then run this script and commit both.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import skiplock  # noqa: E402

PAGE = ROOT / "docs" / "api.md"
HEADER = """# API reference

The public API of Skiplock, imported as `skiplock` (README, "Installing and importing"). Every
name below is typed (the package ships `py.typed`; `mypy --strict` checks this surface in
tests/test_typing.py). Anything not listed here, including the `console.*` modules, is the
implementation and may change.

This page is generated from the docstrings by `scripts/api_reference.py`; edit those, not this
file (tests/test_api_reference.py fails when it is stale). How to use the API in context:
[queue.md](queue.md) ("Enqueueing", "From any stack").

Handles: `SyncHandle` is a psycopg `Connection`, a SQLAlchemy `Session`, `scoped_session` or
`Connection`, or Django's `connection`; `AsyncHandle` is a psycopg `AsyncConnection`, an asyncpg
connection, or a SQLAlchemy `AsyncSession`, `async_scoped_session` or `AsyncConnection`
(console/queue/handles.py). `F` in the decorators is the decorated function's own type: they
return it unchanged.
"""


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _signature(name: str, obj: Any) -> str:
    signature = inspect.signature(obj)
    parts = []
    star_done = False
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if param.kind is param.VAR_POSITIONAL:
            star_done = True
        prefix = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "")
        text = f"{prefix}{param.name}"
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        parts.append(text)
    returns = _annotation(signature.return_annotation)
    prefix = "async def" if inspect.iscoroutinefunction(obj) else "def"
    one_line = f"{prefix} {name}({', '.join(parts)})" + (f" -> {returns}" if returns else "")
    if len(one_line) <= 100:
        return one_line
    body = "".join(f"    {part},\n" for part in parts)
    return f"{prefix} {name}(\n{body})" + (f" -> {returns}" if returns else "")


def _doc(obj: Any) -> str:
    return inspect.getdoc(obj) or "(no docstring)"


def _fence(code: str) -> str:
    return f"```python\n{code}\n```\n"


def _function(name: str, obj: Any) -> str:
    return f"## `{name}`\n\n{_fence(_signature(name, obj))}\n{_doc(obj)}\n"


def _class(name: str, cls: type) -> str:
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    out = [f"## `{name}`\n", _fence(f"class {name}({bases})" if bases else f"class {name}"), _doc(cls), ""]
    if dataclasses.is_dataclass(cls):
        hints = {f.name: f for f in dataclasses.fields(cls)}
        rows = []
        for field_name, field in hints.items():
            default = "" if field.default is dataclasses.MISSING else f" = {field.default!r}"
            if field.default_factory is not dataclasses.MISSING:
                default = f" = {field.default_factory.__name__}()"
            rows.append(f"    {field_name}: {_annotation(field.type)}{default}")
        out += ["Fields:\n", _fence("\n".join(rows))]
    members = [(member, value) for member, value in vars(cls).items()
               if not member.startswith("_") and (callable(value) or isinstance(value, property))
               and not isinstance(value, classmethod)]
    for member, value in members:
        if isinstance(value, property):
            returns = _annotation(inspect.signature(value.fget).return_annotation) if value.fget else ""
            out.append(f"### `{name}.{member}` (property{': ' + returns if returns else ''})\n\n{_doc(value)}\n")
        else:
            out.append(f"### `{name}.{member}`\n\n{_fence(_signature(member, value))}\n{_doc(value)}\n")
    return "\n".join(out)


def render() -> str:
    sections = [HEADER]
    for name in skiplock.__all__:
        obj = getattr(skiplock, name)
        sections.append(_class(name, obj) if isinstance(obj, type) else _function(name, obj))
    return "\n".join(sections).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print("docs/api.md is stale: run .venv/bin/python scripts/api_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
