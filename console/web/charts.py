"""Server-side SVG charts: a line (or area) over time with axes, UTC time labels, the value's
unit, min/max, an optional threshold line, and a plain "No data yet" state. No JavaScript.

    chart = line_chart([Line("eligible", points)], unit="jobs", start=t0, end=t1,
                       threshold=1000, title="Queue depth")
    {{ chart }}   # Markup: an inline <svg> styled by static/oncall.css (light and dark)

A page that draws a chart loads static/oncall.css (`{% block head %}`). The frame and the lines
also say `fill="none"` themselves (a presentation attribute, which the CSP allows and any CSS
rule overrides), so a page that forgets the stylesheet shows a bare chart, not a black box.

`points` are (datetime, value) pairs; a None value is a gap (the collector could not measure),
not a zero. `points_from_rows(rows, ...)` turns `console.samples.series()` rows into lines,
summing over labels or splitting by one label.

This module draws; it does not query (pages pass it the series) and does not decide what is
bad (the threshold comes from the caller).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from markupsafe import Markup, escape

from console.timefmt import duration

# Plot area inside the SVG's viewBox (left margin for y labels, bottom for time labels).
LEFT, RIGHT, TOP, BOTTOM = 62, 8, 10, 20
MAX_LINES = 6
COLOURS = 10  # .chart .s0 ... .s9 in static/oncall.css
DASHES = 3  # .chart .d0 (solid), .d1, .d2: two lines that share a colour still differ


def series_class(label: str, *, alone: bool = False) -> str:
    """The CSS classes of one line: its colour and dash, a function of its label alone (a
    queue's name), so a queue keeps its colour on every chart and when another queue appears.
    A chart's only, unsplit line ("all") keeps the accent colour."""
    if alone and label == "all":
        return "s0 d0"
    h = zlib.crc32(label.encode("utf-8"))
    return f"s{h % COLOURS} d{(h // COLOURS) % DASHES}"


@dataclass
class Line:
    label: str
    points: list[tuple[datetime, float | None]]


# --- values and units -----------------------------------------------------------------------

def format_value(value: float | None, unit: str) -> str:
    """A value with its unit, short: '1,234 jobs', '3 min', '12 MiB', '4.2 %', '3.1/s'."""
    if value is None:
        return "—"
    if unit == "seconds":
        return "0 s" if value == 0 else duration(value)
    if unit in ("bytes", "bytes/s"):
        size = float(value)
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(size) < 1024 or suffix == "TiB":
                text = f"{size:,.0f} {suffix}" if suffix == "B" or abs(size) >= 100 else f"{size:,.1f} {suffix}"
                return text + ("/s" if unit == "bytes/s" else "")
            size /= 1024
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit == "bool":
        return "yes" if value else "no"
    number = _number(value)
    if "/" in unit:
        return f"{number} {unit}"
    return f"{number} {unit}" if unit else number


def axis_value(value: float, unit: str) -> str:
    """A y-axis label: like format_value, but thousands as 'k' so it fits the margin."""
    if unit not in ("seconds", "bytes", "bytes/s", "ratio", "bool") and abs(value) >= 1000:
        v = value / 1_000_000 if abs(value) >= 1_000_000 else value / 1000
        suffix = "M" if abs(value) >= 1_000_000 else "k"
        text = f"{v:.0f}" if float(v).is_integer() or abs(v) >= 10 else f"{v:.1f}"
        return f"{text} {suffix} {unit}".replace("/s", "/s")
    return format_value(value, unit)


def _number(value: float) -> str:
    v = float(value)
    if abs(v) >= 1_000_000:
        return f"{v / 1_000_000:,.1f} M"
    if abs(v) >= 10_000:
        return f"{v / 1000:,.0f} k"
    if v.is_integer():
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.1f}"
    return f"{v:.2g}"


def nice_ceiling(value: float) -> float:
    """The next 'round' number at or above value (1, 2, 2.5, 5 x 10^n), for the y axis top."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    base = 10 ** exp
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base * (1 + 1e-9):
            return step * base
    return 10 * base


_SECONDS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
            7200, 14400, 21600, 43200, 86400, 172800, 604800]


def nice_top(value: float, unit: str) -> float:
    """The y axis top: a round duration for seconds (so halves read '2 min 30 s', not '2 min 5 s'),
    a round number otherwise."""
    if unit == "seconds" and value > 0:
        return next((s for s in _SECONDS if value <= s * (1 + 1e-9)), nice_ceiling(value))
    return nice_ceiling(value)


# --- time ticks -----------------------------------------------------------------------------

_STEPS = [timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30)] + \
         [timedelta(hours=h) for h in (1, 2, 3, 4, 6, 12)] + [timedelta(days=d) for d in (1, 2, 7)]


def time_ticks(start: datetime, end: datetime, most: int = 6) -> list[datetime]:
    """Round UTC times between start and end, at most `most` of them."""
    span = end - start
    step = next((s for s in _STEPS if span / s <= most), _STEPS[-1])
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first = epoch + step * math.ceil((start - epoch) / step)
    ticks = []
    t = first
    while t <= end:
        ticks.append(t)
        t += step
    return ticks


def time_label(t: datetime, span: timedelta) -> str:
    t = t.astimezone(UTC)
    if span > timedelta(days=2):
        return t.strftime("%b %d") if (t.hour, t.minute) == (0, 0) else t.strftime("%d %H:%M")
    return t.strftime("%H:%M")


# --- series rows -> lines -------------------------------------------------------------------

def points_from_rows(rows: Iterable[dict[str, Any]], *, split_by: str | None = None,
                     where: dict[str, str] | None = None, agg: str = "sum") -> list[Line]:
    """`samples.series()` rows -> lines. Rows are filtered by `where` (label values), then
    grouped by the `split_by` label (or all in one line), summing (or taking the max of) the
    values that share a timestamp. A timestamp whose values are all None stays a gap."""
    groups: dict[str, dict[datetime, list[float | None]]] = {}
    for row in rows:
        labels = row.get("labels") or {}
        if where and any(labels.get(k) != v for k, v in where.items()):
            continue
        key = labels.get(split_by, "") if split_by else ""
        groups.setdefault(key, {}).setdefault(row["at"], []).append(row["value"])
    lines = []
    for key in sorted(groups):
        pts = []
        for at in sorted(groups[key]):
            values = [v for v in groups[key][at] if v is not None]
            if not values:
                pts.append((at, None))
            else:
                pts.append((at, float(max(values) if agg == "max" else sum(values))))
        lines.append(Line(key or "all", pts))
    return lines


def last_value(lines: Sequence[Line]) -> float | None:
    """The newest non-None value summed across lines at their latest timestamps."""
    total, seen = 0.0, False
    for line in lines:
        for _, value in reversed(line.points):
            if value is not None:
                total += value
                seen = True
                break
    return total if seen else None


# --- drawing --------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def line_chart(
    lines: Sequence[Line],
    *,
    unit: str,
    start: datetime,
    end: datetime,
    title: str = "",
    threshold: float | None = None,
    threshold_label: str = "threshold",
    width: int = 400,
    height: int = 150,
    area: bool = True,
) -> Markup:
    """An inline SVG line chart (area under a single line). Empty -> 'No data yet'."""
    lines = [ln for ln in lines if ln.points][:MAX_LINES]
    values = [v for ln in lines for _, v in ln.points if v is not None]
    span = end - start if end > start else timedelta(seconds=1)
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
    label = escape(title or "chart")
    parts: list[str] = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMidYMid meet" '
        f'role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg"><title>{label}</title>'
    ]
    if not values:
        parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none"/>')
        parts.append(f'<text class="empty" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2 + 4:.0f}" '
                     f'text-anchor="middle">No data yet</text></svg>')
        return Markup("".join(parts))

    lo = min(0.0, min(values))
    top_value = max(values + ([threshold] if threshold is not None else []))
    hi = nice_top(top_value, unit) if top_value > 0 else 1.0
    if unit in ("ratio", "bool") and hi < 1 and top_value > 0.5:
        hi = 1.0

    def x_of(t: datetime) -> float:
        return LEFT + plot_w * max(0.0, min(1.0, (t - start) / span))

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - (v - lo) / (hi - lo))

    # grid and y labels: bottom, middle, top
    for frac in (0.0, 0.5, 1.0):
        v = lo + (hi - lo) * frac
        y = y_of(v)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{_fmt(y)}" y2="{_fmt(y)}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{_fmt(y + 4)}" text-anchor="end">'
                     f'{escape(axis_value(v, unit))}</text>')
    # time labels
    for t in time_ticks(start, end):
        x = x_of(t)
        parts.append(f'<line class="tick" x1="{_fmt(x)}" x2="{_fmt(x)}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 3}"/>')
        # A label at the right edge would be cut by the viewBox: it ends at its tick instead.
        anchor = "end" if x > LEFT + plot_w - 16 else "middle"
        parts.append(f'<text class="axis" x="{_fmt(x)}" y="{height - 6}" text-anchor="{anchor}">'
                     f'{escape(time_label(t, span))}</text>')
    # the lines; None breaks a line into segments
    for ln in lines:
        cls = series_class(ln.label, alone=len(lines) == 1)
        segments: list[list[tuple[float, float]]] = [[]]
        for at, v in ln.points:
            if v is None:
                if segments[-1]:
                    segments.append([])
                continue
            segments[-1].append((x_of(at), y_of(v)))
        for seg in segments:
            if not seg:
                continue
            if len(seg) == 1:
                x, y = seg[0]
                parts.append(f'<circle class="{cls}" cx="{_fmt(x)}" cy="{_fmt(y)}" r="2"/>')
                continue
            path = " ".join(f"{_fmt(x)},{_fmt(y)}" for x, y in seg)
            if area and len(lines) == 1:
                base = _fmt(y_of(max(lo, 0.0)))
                parts.append(f'<polygon class="area {cls}" points="{_fmt(seg[0][0])},{base} {path} '
                             f'{_fmt(seg[-1][0])},{base}"/>')
            parts.append(f'<polyline class="line {cls}" points="{path}" fill="none"><title>{escape(ln.label)}</title></polyline>')
    if threshold is not None:
        y = _fmt(y_of(threshold))
        parts.append(f'<line class="threshold" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="threshold-label" x="{LEFT + plot_w - 2}" y="{_fmt(y_of(threshold) - 3)}" '
                     f'text-anchor="end">{escape(threshold_label)} {escape(format_value(threshold, unit))}</text>')
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def legend(lines: Sequence[Line]) -> Markup:
    """Colour keys for a chart with several lines (one line needs none)."""
    lines = [ln for ln in lines if ln.points][:MAX_LINES]
    if len(lines) < 2:
        return Markup("")
    items = "".join(f'<span><i class="key {series_class(ln.label)}"></i>{escape(ln.label)}</span>' for ln in lines)
    return Markup(f'<div class="legend">{items}</div>')


def summary(lines: Sequence[Line], unit: str) -> dict[str, str] | None:
    """min / max / last of all plotted values, formatted with the unit (None when empty)."""
    values = [v for ln in lines for _, v in ln.points if v is not None]
    if not values:
        return None
    return {"min": format_value(min(values), unit), "max": format_value(max(values), unit),
            "last": format_value(last_value(lines), unit)}
