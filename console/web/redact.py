"""What a payload looks like to the person reading it.

Viewers see payloads with the keys named in `web.redact_keys` (any depth, case-insensitive)
replaced by "[redacted]"; operators and admins see them whole. Then, for everyone, the
deployer's hook (`web.redact_hook = "module:function"`, called as `hook(payload, user)`) may
change or mask anything else. Exports and the JSON API go through the same function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.users import User

REDACTED = "[redacted]"


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


def payload_for(payload: Any, user: User | None) -> Any:
    from console.web import state

    st = state()
    if user is None or not user.can("operator"):
        payload = redact_keys(payload, st.redact_keys)
    if st.redact_hook is not None:
        payload = st.redact_hook(payload, user)
    return payload


def may_filter_on(payload_filter: dict[str, Any] | None, user: User | None) -> str | None:
    """A viewer may not probe redacted values with a containment filter: the complaint, or None."""
    from console.web import state

    if payload_filter is None or (user is not None and user.can("operator")):
        return None
    hidden = sorted(set(keys_in(payload_filter)) & state().redact_keys)
    if hidden:
        return f"payload filter: viewers cannot filter on redacted keys ({', '.join(hidden)})"
    return None
