"""Short human durations, shared by the web pages and the domain's messages."""

from __future__ import annotations

from datetime import timedelta


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
