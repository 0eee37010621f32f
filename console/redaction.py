"""What a secret looks like hidden: the values of sensitive keys in JSON values and in text.

The rule, whoever applies it (the web's viewers, webhook bodies, error fingerprints): an object
key named in the key set (any depth, case-insensitive) shows `[redacted]` instead of its value,
and in text the value written after such a key (`token=abc`, `"password": "..."`,
`card_number: 4111...`) shows `[redacted]`. Everything derived from a value that may hold a
secret is derived from the redacted form (docs/security.md lists them).

- `redact_value(value, keys, bounds)`: a JSON value with those keys' values hidden, walked
  without recursion and within `bounds` (console.jsonbounds: depth, items, string length).
- `redact_text(text, keys)`: text with the values after those keys hidden. Idempotent: a
  value that is already `[redacted]`, or a fingerprint placeholder such as `<redacted>` or
  `<n>`, is left as it is.
- `DEFAULT_KEYS`: the keys hidden when nothing else is configured (`web.redact_keys`' default;
  the engine's error fingerprints use them, console.fingerprint).

This module knows no users, roles or HTTP: console.web.redact decides who sees what.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from console.jsonbounds import WHOLE, Bounds, bounded

REDACTED = "[redacted]"
DEFAULT_KEYS: frozenset[str] = frozenset(
    ("password", "passwd", "secret", "token", "api_key", "apikey", "authorization", "card_number", "ssn"))


def key_set(keys: Iterable[str] | str) -> frozenset[str]:
    """`"a, B"` or an iterable -> {"a", "b"} (lower-cased, blanks dropped)."""
    items = keys.split(",") if isinstance(keys, str) else keys
    return frozenset(k.strip().lower() for k in items if k and k.strip())


@lru_cache(maxsize=16)
def keyed_value(keys: frozenset[str]) -> re.Pattern[str] | None:
    """A redacted key, optionally quoted, then `=` or `:`, then its value: a quoted string, or
    everything up to a space, comma, semicolon, ampersand or closing bracket. A value that is
    already hidden (`[redacted]`, or a placeholder like `<redacted>` or `<str>`) does not match,
    so redacting twice changes nothing."""
    if not keys:
        return None
    names = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    return re.compile(
        rf"""(?P<key>(?<![\w-])["']?(?:{names})["']?\s*[:=]\s*)"""
        rf"""(?!\[redacted\](?![^\s,;&)}}\]])|<\w+>(?![^\s,;&)}}\]]))"""
        rf"""(?P<value>"[^"]*"|'[^']*'|[^\s,;&)}}\]]+)""",
        re.IGNORECASE,
    )


def redact_text(text: str, keys: frozenset[str], replacement: str = REDACTED) -> str:
    """`card_number=4111 1111` -> `card_number=[redacted] 1111`: the value after a redacted key."""
    pattern = keyed_value(keys)
    if pattern is None or not text:
        return text
    return pattern.sub(lambda m: m.group("key") + replacement, text)


def redact_value(value: Any, keys: frozenset[str], bounds: Bounds = WHOLE) -> Any:
    """`value` with the values of `keys` (any depth) replaced by REDACTED, within `bounds`."""
    return bounded(value, bounds, hide_keys=keys, hidden=REDACTED)


__all__ = ["DEFAULT_KEYS", "REDACTED", "key_set", "keyed_value", "redact_text", "redact_value"]
