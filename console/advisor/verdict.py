"""The verdict: is this workload outgrowing PostgreSQL?

The checks say what is wrong now; the verdict reads the stored history (samples written by the
collectors, default the last 7 days) for the migration signals the PostgreSQL-as-a-queue
literature names: claim latency growing, autovacuum falling behind, lock or SLRU waits, replica
lag, WAL pressure, business queries competing with the workers. Each signal is ok, "watch" or
"outgrowing"; the verdict is the worst of them:

- "fits PostgreSQL": no signal fires;
- "watch": a signal is rising or fires now and then;
- "outgrowing PostgreSQL": a signal fires most of the time or has grown several-fold;
- "not enough history": less than an hour of samples (the collectors have not run long enough).

With less than a day of history the verdict is given but says that trends need a day.

Only stored samples are read (bounded by time through samples_metric_time_idx or the rollups),
each read under a time limit; nothing here touches the jobs table. This module does not collect
(console.collectors does) and renders nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from console import samples

FITS, WATCH, OUTGROWING, NO_HISTORY = "fits PostgreSQL", "watch", "outgrowing PostgreSQL", "not enough history"
SIGNAL_OK, SIGNAL_WATCH, SIGNAL_OUTGROWING = "ok", "watch", "outgrowing"
_RANK = {SIGNAL_OK: 0, SIGNAL_WATCH: 1, SIGNAL_OUTGROWING: 2}
MIN_HISTORY = timedelta(hours=1)
TREND_HISTORY = timedelta(days=1)
DEFAULT_WINDOW = timedelta(days=7)


@dataclass
class Signal:
    id: str
    name: str
    level: str  # ok / watch / outgrowing / unknown (no data)
    text: str
    points: int = 0
    first: float | None = None  # median of the first third of the window
    last: float | None = None  # median of the last third
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verdict:
    label: str
    level: str  # ok / watch / outgrowing / unknown, for colouring
    headline: str
    signals: list[Signal]
    history_seconds: float
    window_seconds: float
    enough_history: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- reading the history --------------------------------------------------------------------


@dataclass
class Series:
    """Points of one metric, grouped by label set: {labels-key: [(at, value), ...]}."""

    groups: dict[tuple[tuple[str, str], ...], list[tuple[datetime, float]]]

    def select(self, keep: Callable[[dict[str, str]], bool]) -> list[list[tuple[datetime, float]]]:
        return [pts for key, pts in self.groups.items() if keep(dict(key)) and pts]

    @property
    def span(self) -> tuple[datetime, datetime] | None:
        stamps = [at for pts in self.groups.values() for at, _ in pts]
        return (min(stamps), max(stamps)) if stamps else None


def read(conn: psycopg.Connection, metric: str, window: timedelta) -> Series:
    groups: dict[tuple[tuple[str, str], ...], list[tuple[datetime, float]]] = {}
    for point in samples.series(conn, metric, since=window):
        if point["value"] is None or "external" in (point["labels"] or {}):
            continue  # [[external_queues]] series (their claim latency, throughput) are not Skiplock's workload
        key = tuple(sorted((point["labels"] or {}).items()))
        groups.setdefault(key, []).append((point["at"], float(point["value"])))
    for pts in groups.values():
        pts.sort()
    return Series(groups)


def trend(points: list[tuple[datetime, float]]) -> tuple[float | None, float | None]:
    """Median of the first and of the last third of the points' time span."""
    if len(points) < 3:
        return None, None
    start, end = points[0][0], points[-1][0]
    third = (end - start) / 3
    first = [v for at, v in points if at <= start + third]
    last = [v for at, v in points if at >= end - third]
    if not first or not last:
        return None, None
    return statistics.median(first), statistics.median(last)


def share_nonzero(points: list[tuple[datetime, float]]) -> float:
    return sum(1 for _, v in points if v > 0) / len(points) if points else 0.0


def p95(points: list[tuple[datetime, float]]) -> float | None:
    values = sorted(v for _, v in points)
    if not values:
        return None
    return values[min(len(values) - 1, int(0.95 * len(values)))]


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.1f} s"


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "unknown"
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


# --- the signals ----------------------------------------------------------------------------


def _growth_signal(sid: str, name: str, groups: list[list[tuple[datetime, float]]], *, floor: float,
                   watch_ratio: float, outgrowing_ratio: float, outgrowing_floor: float,
                   fmt: Callable[[float | None], str], what: str) -> Signal:
    """The worst-growing series of a metric: median of the last third against the first."""
    best: tuple[float, float, float, int] | None = None
    for pts in groups:
        first, last = trend(pts)
        if first is None or last is None:
            continue
        ratio = last / max(first, floor)
        if best is None or ratio > best[0]:
            best = (ratio, first, last, len(pts))
    points = sum(len(p) for p in groups)
    if best is None:
        return Signal(sid, name, "unknown", f"no samples of {what} yet", points)
    ratio, first, last, _ = best
    data = {"ratio": ratio}
    text = f"{what} went from {fmt(first)} to {fmt(last)} ({ratio:.1f}x)"
    if ratio >= outgrowing_ratio and last >= outgrowing_floor:
        return Signal(sid, name, SIGNAL_OUTGROWING, text, points, first, last, data)
    if ratio >= watch_ratio and last >= floor:
        return Signal(sid, name, SIGNAL_WATCH, text, points, first, last, data)
    return Signal(sid, name, SIGNAL_OK, f"{what} steady: {fmt(first)} then {fmt(last)}", points, first, last, data)


def _share_signal(sid: str, name: str, groups: list[list[tuple[datetime, float]]], *, watch: float,
                  outgrowing: float, what: str) -> Signal:
    pts = [p for g in groups for p in g]
    if not pts:
        return Signal(sid, name, "unknown", f"no samples of {what} yet")
    # the share of time the condition held, over all series together: each instant counts
    # min(value, 1), so a raw 0/1 (or a count) sample is "held or not", and an hourly rollup's
    # average of a 0/1 metric is the share of that hour it held
    by_time: dict[datetime, float] = {}
    for at, v in pts:
        by_time[at] = max(by_time.get(at, 0.0), min(max(v, 0.0), 1.0))
    share = sum(by_time.values()) / len(by_time)
    data = {"share": share, "instants": len(by_time)}
    text = f"{what} {share:.0%} of the time ({len(by_time):,} sampling points)"
    level = SIGNAL_OUTGROWING if share >= outgrowing else SIGNAL_WATCH if share >= watch else SIGNAL_OK
    return Signal(sid, name, level, text, len(pts), data=data)


def _claim_latency(series: dict[str, Series]) -> Signal:
    groups = series["claim_latency_seconds"].select(lambda lab: lab.get("quantile") in ("p95", "mean", "last") and lab.get("queue", "all") == "all")
    return _growth_signal("claim-latency", "Claim latency growing", groups, floor=0.002, watch_ratio=1.5,
                          outgrowing_ratio=3.0, outgrowing_floor=0.02, fmt=_fmt_s, what="claim latency")


def _autovacuum(series: dict[str, Series]) -> Signal:
    behind = series["table_autovacuum_behind"].select(lambda lab: lab.get("table") == "jobs")
    blocked = series["vacuum_removed_nothing"].select(lambda lab: lab.get("table") == "jobs")
    sig = _share_signal("autovacuum", "Autovacuum falling behind", behind + blocked, watch=0.05, outgrowing=0.3,
                        what="autovacuum behind (or removing nothing) on skiplock.jobs")
    return sig


def _lock_waits(series: dict[str, Series]) -> Signal:
    groups = series["lock_waits"].select(lambda lab: lab.get("relation") in ("jobs", "jobs_archive"))
    return _share_signal("lock-waits", "Lock waits on the jobs tables", groups, watch=0.02, outgrowing=0.2,
                         what="sessions waiting on jobs-table locks")


def _slru_waits(series: dict[str, Series]) -> Signal:
    groups = series["lwlock_waits"].select(lambda lab: lab.get("event") in ("multixact", "slru"))
    sig = _share_signal("slru-waits", "MultiXact / SLRU waits", groups, watch=0.02, outgrowing=0.15,
                        what="sessions waiting on MultiXact or SLRU locks")
    mx = _growth_signal("multixact", "", series["multixact_consumption_per_second"].select(lambda lab: True),
                        floor=1.0, watch_ratio=3.0, outgrowing_ratio=10.0, outgrowing_floor=100.0,
                        fmt=lambda v: "unknown" if v is None else f"{v:.1f}/s", what="MultiXact consumption")
    if mx.level in (SIGNAL_WATCH, SIGNAL_OUTGROWING) and _RANK[mx.level] > _RANK.get(sig.level, 0):
        sig.level, sig.text = mx.level, f"{sig.text}; {mx.text}"
    elif mx.level != "unknown":
        sig.text = f"{sig.text}; {mx.text}"
    return sig


def _replica_lag(series: dict[str, Series]) -> Signal:
    groups = series["replica_lag_seconds"].select(lambda lab: True)
    pts = [p for g in groups for p in g]
    if not pts:
        return Signal("replica-lag", "Replica lag", SIGNAL_OK, "no standby reported (nothing replays this database's WAL)")
    worst = max((p95(g) or 0.0) for g in groups)
    # name the standby with the worst p95 (labels: standby, client), so the text says which one
    named = [(p95(pts) or 0.0, dict(key).get("standby", "?")) for key, pts in series["replica_lag_seconds"].groups.items() if pts]
    who = max(named)[1] if named else "?"
    growth = _growth_signal("replica-lag", "Replica lag", groups, floor=1.0, watch_ratio=3.0, outgrowing_ratio=10.0,
                            outgrowing_floor=60.0, fmt=_fmt_s, what="replica lag")
    level = SIGNAL_OUTGROWING if worst >= 300 else SIGNAL_WATCH if worst >= 30 else SIGNAL_OK
    level = max(level, growth.level if growth.level in _RANK else SIGNAL_OK, key=_RANK.__getitem__)
    return Signal("replica-lag", "Replica lag", level, f"p95 replica lag {_fmt_s(worst)} ({who}); {growth.text}", len(pts),
                  growth.first, growth.last, {"p95": worst, "standby": who})


def _wal(series: dict[str, Series]) -> Signal:
    return _growth_signal("wal", "WAL pressure", series["wal_bytes_per_second"].select(lambda lab: True),
                          floor=64 * 1024, watch_ratio=2.0, outgrowing_ratio=4.0, outgrowing_floor=1024 * 1024,
                          fmt=lambda v: f"{_fmt_bytes(v)}/s", what="WAL rate")


def _competition(series: dict[str, Series], latency: Signal) -> Signal:
    """Business queries competing with workers: connections near the limit, or claims slowing
    down while the queue's own work does not grow."""
    conns = series["connections"]
    limit_pts = [p for g in series["max_connections"].select(lambda lab: True) for p in g]
    limit = max((v for _, v in limit_pts), default=None)
    by_time: dict[datetime, float] = {}
    for pts in conns.select(lambda lab: True):
        for at, v in pts:
            by_time[at] = by_time.get(at, 0.0) + v
    parts = []
    level = SIGNAL_OK
    if limit and by_time:
        peak = p95(sorted(by_time.items())) or 0.0
        share = peak / limit
        parts.append(f"p95 connections {peak:.0f} of {limit:.0f} ({share:.0%})")
        level = SIGNAL_OUTGROWING if share >= 0.95 else SIGNAL_WATCH if share >= 0.8 else SIGNAL_OK
    throughput = series["throughput"].select(lambda lab: lab.get("outcome") == "completed")
    t_first, t_last = trend(throughput[0]) if throughput else (None, None)
    if latency.level in (SIGNAL_WATCH, SIGNAL_OUTGROWING) and t_first is not None and t_last is not None:
        work_ratio = t_last / max(t_first, 0.01)
        if work_ratio < 1.2:
            parts.append(f"claims slowed down while completed jobs/s went {t_first:.1f} -> {t_last:.1f}: other load competes")
            level = max(level, SIGNAL_WATCH, key=_RANK.__getitem__)
    if not parts:
        return Signal("competition", "Business queries competing with workers", "unknown", "no connection samples yet")
    return Signal("competition", "Business queries competing with workers", level, "; ".join(parts), len(by_time))


METRICS = ("claim_latency_seconds", "table_autovacuum_behind", "vacuum_removed_nothing", "lock_waits", "lwlock_waits",
           "multixact_consumption_per_second", "replica_lag_seconds", "wal_bytes_per_second", "connections",
           "max_connections", "throughput")


def evaluate_verdict(conn: psycopg.Connection, *, window: timedelta = DEFAULT_WINDOW, timeout_ms: int = 2000) -> Verdict:
    """Read the stored history and decide. A metric whose read times out counts as missing."""
    series: dict[str, Series] = {}
    for metric in METRICS:
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
                series[metric] = read(conn, metric, window)
        except psycopg.errors.QueryCanceled:
            series[metric] = Series({})
    spans = [s.span for s in series.values() if s.span]
    history = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else timedelta(0)
    latency = _claim_latency(series)
    signals = [latency, _autovacuum(series), _lock_waits(series), _slru_waits(series), _replica_lag(series),
               _wal(series), _competition(series, latency)]
    enough = history >= TREND_HISTORY
    hours = history.total_seconds() / 3600
    if history < MIN_HISTORY:
        label, level = NO_HISTORY, "unknown"
        headline = (f"Not enough history to judge: {hours * 60:.0f} min of samples"
                    if spans else "Not enough history to judge: no samples stored yet (is the scheduler running?)")
    else:
        worst = max((s.level for s in signals if s.level in _RANK), key=_RANK.__getitem__, default=SIGNAL_OK)
        label = {SIGNAL_OK: FITS, SIGNAL_WATCH: WATCH, SIGNAL_OUTGROWING: OUTGROWING}[worst]
        level = worst
        driving = [s for s in signals if s.level == worst and worst != SIGNAL_OK]
        span_text = f"{hours / 24:.1f} days" if hours >= 48 else f"{hours:.0f} h"
        if driving:
            headline = f"{label[0].upper()}{label[1:]}: " + "; ".join(f"{s.name.lower()} ({s.text})" for s in driving)
            if not enough:
                headline += f" (only {span_text} of history; trends need at least a day)"
        elif enough:
            headline = f"Fits PostgreSQL: no migration signal over {span_text} of history"
        else:
            headline = f"Fits PostgreSQL so far: no migration signal in {span_text} of history; trends need at least a day"
    return Verdict(label, level, headline, signals, history.total_seconds(), window.total_seconds(), enough)


# How the verdict reads on the overview's healthy / degraded / failing scale: outgrowing is a
# reason to plan, not an outage, so it degrades the line; "watch" leaves it healthy (the
# advisor page shows it) and no history says nothing.
OVERVIEW_STATE = {FITS: "healthy", WATCH: "healthy", OUTGROWING: "degraded", NO_HISTORY: "unknown"}


# The last line per database and window, with the newest sample it was read at. The verdict
# reads a week of 11 stored series (40 ms of the overview's 100 at 10 M rows, bench/pages.py)
# and can change only when a collection cycle stores new samples, so a caller that knows the
# newest sample's time gets the stored line while that is unchanged. A handful of keys (the
# configured databases), so nothing evicts.
_LINES: dict[tuple[Any, ...], tuple[datetime, dict[str, Any]]] = {}


def verdict_line(conn: psycopg.Connection, *, window: timedelta = DEFAULT_WINDOW, timeout_ms: int = 2000,
                 newest: datetime | None = None) -> dict[str, Any]:
    """The one line the overview page shows. Reads stored samples only; never raises for a
    database error (the line then says so). `newest`: the time of the newest stored sample; a
    line already read at that time is returned without reading again.

    Keys: label (fits PostgreSQL / watch / outgrowing PostgreSQL / not enough history), level
    (ok / watch / outgrowing / unknown), text (the headline), signals (names driving it),
    enough_history, link ("/advisor"); and for the overview's scale: state (healthy / degraded /
    unknown) and reasons (empty unless outgrowing).
    """
    key = (conn.info.host, conn.info.port, conn.info.dbname, window)
    if newest is not None and (stored := _LINES.get(key)) is not None and stored[0] == newest:
        return _own_copy(stored[1])
    try:
        verdict = evaluate_verdict(conn, window=window, timeout_ms=timeout_ms)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        return {"label": NO_HISTORY, "level": "unknown", "text": f"advisor verdict not available: {first}",
                "signals": [], "enough_history": False, "link": "/advisor", "state": "unknown", "reasons": []}
    driving = [s.name for s in verdict.signals if s.level == verdict.level and s.level in (SIGNAL_WATCH, SIGNAL_OUTGROWING)]
    state = OVERVIEW_STATE[verdict.label]
    line = {"label": verdict.label, "level": verdict.level, "text": verdict.headline, "signals": driving,
            "enough_history": verdict.enough_history, "link": "/advisor",
            "state": state, "reasons": [verdict.headline] if state == "degraded" else []}
    if newest is not None:
        _LINES[key] = (newest, line)
    return _own_copy(line)


def _own_copy(line: dict[str, Any]) -> dict[str, Any]:
    """A kept line's copy for one caller: its lists too, so no page can change the kept one."""
    return {**line, "signals": list(line["signals"]), "reasons": list(line["reasons"])}
