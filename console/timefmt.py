"""Short human durations, shared by the web pages and the domain's messages, and the one parser
of the time filters that people type (`since=7d`, `until=2026-11-30T03:00`).

`parse_instant` never lets an absurd value through to arithmetic or to PostgreSQL: a span past
`MAX_SPAN_DAYS`, a date before `EARLIEST` or after `LATEST`, an offset that pushes a date out of
range, a negative or non-numeric span all raise `ValueError` (or the caller's subclass) with a
message that starts with the parameter's name, so the web answers 400 and says which one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

MAX_SPAN_DAYS = 36500  # a hundred years back is the longest span a filter may name
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, tzinfo=UTC)
SPAN_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
_SPAN = re.compile(r"([0-9]{1,12})([mhdw])", re.ASCII)
_MAX_TEXT = 64


def parse_instant(text: str, field: str, *, now: datetime | None = None, relative: bool = True,
                  error: type[ValueError] = ValueError) -> datetime:
    """An aware UTC datetime from ISO 8601 (a date, or date and time; UTC when no offset is
    given) or, when `relative`, a span back from now ('15m', '6h', '7d', '2w').

    Raises `error` (a ValueError) naming `field` for anything else, including spans longer than
    MAX_SPAN_DAYS and times outside EARLIEST..LATEST."""
    text = str(text).strip()
    hint = "use 2026-11-30T03:00, 2026-11-30" + (", or 15m/6h/7d" if relative else "")
    what = "a time" if relative else "a date-time"
    shown = text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "…"
    if len(text) > _MAX_TEXT:
        raise error(f"{field}: {shown!r} is not {what} ({hint})")
    span = _SPAN.fullmatch(text) if relative else None
    if span:
        seconds = int(span.group(1)) * SPAN_UNITS[span.group(2)]
        if seconds > MAX_SPAN_DAYS * 86400:
            raise error(f"{field}: {text!r} is too far back (at most {MAX_SPAN_DAYS} days)")
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise error(f"{field}: {shown!r} is not {what} ({hint})") from None
    return bounded(value, field, error=error, shown=shown)


def bounded(value: datetime, field: str, *, error: type[ValueError] = ValueError, shown: str | None = None) -> datetime:
    """`value` in UTC (a naive one is read as UTC), or `error` when it lies outside EARLIEST..LATEST."""
    try:
        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+14:00 has no UTC equivalent
        value = None
    if value is None or not EARLIEST <= value <= LATEST:
        raise error(f"{field}: {shown or str(value)!r} is out of range "
                    f"(between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d})")
    return value


def duration(seconds: float | timedelta | None) -> str:
    """A short human duration: '850 ms', '42 s', '3 min 5 s', '2 h 10 min', '3 d 4 h'."""
    if seconds is None:
        return "—"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    s = abs(float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 3600:
        m, sec = divmod(int(s), 60)
        return f"{m} min {sec} s" if sec and m < 10 else f"{m} min"
    if s < 86400:
        h, rem = divmod(int(s), 3600)
        return f"{h} h {rem // 60} min" if rem >= 60 else f"{h} h"
    d, rem = divmod(int(s), 86400)
    return f"{d} d {rem // 3600} h" if rem >= 3600 else f"{d} d"
