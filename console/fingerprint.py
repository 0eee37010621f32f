"""Error fingerprints: one failure "kind", whatever ids, numbers or quoted values it carried.

`fingerprint("KeyError", "user 4411 not found at 0x7f3a")` and the same error for user 17 give
the same string, so dead letters can be grouped, counted and replayed as one group.
"""

from __future__ import annotations

import re

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


def normalise(message: str) -> str:
    text = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text)[:MAX_LENGTH]


def fingerprint(error_class: str, message: str) -> str:
    return f"{error_class}: {normalise(message)}"
