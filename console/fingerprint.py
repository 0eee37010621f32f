"""Error fingerprints: one failure "kind", whatever ids, numbers, quoted values or secrets it carried.

`fingerprint("KeyError", "user 4411 not found at 0x7f3a")` and the same error for user 17 give
the same string, so dead letters can be grouped, counted and replayed as one group.

A fingerprint is shown to everyone who may see the dead letters (viewers, webhook receivers,
links), so it is derived from the message with its secrets already hidden: the value after a
sensitive key (`token=...`, `"password": "..."`, console.redaction) becomes `<redacted>` before
anything else is normalised. `secret_keys` defaults to console.redaction.DEFAULT_KEYS (the
default of `web.redact_keys`); the `skiplock worker` command passes the configured keys too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from console.redaction import DEFAULT_KEYS, key_set, redact_text

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`"), "<str>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\bhttps?://\S+"), "<url>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<addr>"),
    (re.compile(r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b"), "<ip>"),
    (re.compile(r"\b[0-9a-f]{16,}\b", re.I), "<hex>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
)

MAX_LENGTH = 300
SECRET = "<redacted>"


def normalise(message: str, secret_keys: Iterable[str] = DEFAULT_KEYS) -> str:
    text = message.strip().splitlines()[0] if message.strip() else ""
    # Secrets first: `token="abc 12"` must not survive as `token=<str>`'s neighbour or a number.
    text = redact_text(text, key_set(secret_keys) if not isinstance(secret_keys, frozenset) else secret_keys, SECRET)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text)[:MAX_LENGTH]


def fingerprint(error_class: str, message: str, secret_keys: Iterable[str] = DEFAULT_KEYS) -> str:
    return f"{error_class}: {normalise(message, secret_keys)}"
