"""The verdict: is this workload outgrowing PostgreSQL?

The checks say what is wrong now; the verdict reads the stored history (samples written by the
collectors, default the last 7 days) for the migration signals the PostgreSQL-as-a-queue
literature names: claim latency growing, autovacuum falling behind, lock or SLRU waits, replica
lag, WAL pressure, business queries competing with the workers. Each signal is ok, "watch" or
"outgrowing"; the verdict is the worst of them:

- "fits PostgreSQL": no signal fires;
- "watch": a signal is rising or fires now and then, or it has a known cause;
- "outgrowing PostgreSQL": a signal fires most of the time or has grown several-fold, over at
  least `OUTGROWING_HISTORY` and `OUTGROWING_POINTS` sampling points of its own history, and
  nothing present at the same time explains it;
- "not enough history": less than `MIN_HISTORY` of samples (the collectors have not run long
  enough): "not enough history yet (N of M)".

Evidence before a verdict. A signal with less history than the outgrowing minimum says "not
enough history yet (N of M)" and stays at "watch". A signal explained by a known cause present
at the same time (console.advisor.causes: an xmin horizon holder during most of the instants it
held, a paused or limited queue's backlog at the head of the claim index since before most of
them, an operator's load-changing action in the audit log shortly before it began) names that
cause and its fix instead, at "watch": the remedy is to end the cause, not to move off
PostgreSQL. With less than a day of history the verdict says that trends need a day.

What is read: stored samples (bounded by time through samples_metric_time_idx or the rollups),
the newest collection cycle's details (who holds the horizon), and for a signal that fires, the
present state that may explain it (the queues and limits tables with at most `causes.HEAD`
entries of the claim index, a few audit rows through audit_log_at_idx); each read under a time
limit, a read that times out counts as missing. This module does not collect
(console.collectors does) and renders nothing.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import samples
from console.advisor import causes
from console.advisor.causes import Cause
from console.sqlfiles import query

FITS, WATCH, OUTGROWING, NO_HISTORY = "fits PostgreSQL", "watch", "outgrowing PostgreSQL", "not enough history"
SIGNAL_OK, SIGNAL_WATCH, SIGNAL_OUTGROWING = "ok", "watch", "outgrowing"
_RANK = {SIGNAL_OK: 0, SIGNAL_WATCH: 1, SIGNAL_OUTGROWING: 2}
MIN_HISTORY = timedelta(hours=1)  # any verdict at all
# "Outgrowing" needs this much of the signal's own history, and this many sampling points
# (collection cycles, or hours when a week is read from the hourly rollups): a trend over
# minutes, or over two samples hours apart, is not a reason to plan a migration.
OUTGROWING_HISTORY = timedelta(hours=6)
OUTGROWING_POINTS = 6
TREND_HISTORY = timedelta(days=1)
DEFAULT_WINDOW = timedelta(days=7)
EXPLAINS = 0.5  # a cause explains a signal when present during at least this share of its instants
# Which causes can drive which signal: a horizon holder leaves dead rows that vacuum cannot remove
# and the claim walks past; held-back work is walked past by every claim; an operator's change
# can move any of them.
HOLDER_SIGNALS = ("claim-latency", "autovacuum", "competition", "queue-claim-latency")
HELD_BACK_SIGNALS = ("claim-latency", "competition", "queue-claim-latency")


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
    history_seconds: float = 0.0  # the span of this signal's own samples
    instants: int = 0  # its distinct sampling points
    cause: dict[str, Any] | None = None  # the known cause that explains it (Cause.to_dict)
    held: list[datetime] = field(default_factory=list)  # when it held: matched against causes, not shown


@dataclass
class Verdict:
    label: str
    level: str  # ok / watch / outgrowing / unknown, for colouring
    headline: str
    signals: list[Signal]
    history_seconds: float
    window_seconds: float
    enough_history: bool
    minimums: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["history_text"] = _fmt_span(self.history_seconds)
        for sig in out["signals"]:
            del sig["held"]
            sig["history_text"] = _fmt_span(sig["history_seconds"])
        return out


def minimums() -> dict[str, Any]:
    """The evidence a verdict needs, as the page and the API state it."""
    return {"verdict_s": MIN_HISTORY.total_seconds(), "outgrowing_s": OUTGROWING_HISTORY.total_seconds(),
            "outgrowing_points": OUTGROWING_POINTS, "trend_s": TREND_HISTORY.total_seconds(),
            "explains_share": EXPLAINS, "holder_present_s": causes.HOLDER_PRESENT_S,
            "backlog_min": causes.BACKLOG_MIN, "changes_before_s": causes.CHANGES_BEFORE.total_seconds(),
            "text": minimums_text()}


def minimums_text() -> str:
    return (f"A verdict needs {_fmt_span(MIN_HISTORY.total_seconds())} of samples; \"outgrowing\" needs "
            f"{_fmt_span(OUTGROWING_HISTORY.total_seconds())} and {OUTGROWING_POINTS} sampling points of the "
            "signal's own history, and no known cause present during most of the time it held (an xmin horizon "
            f"holder, a paused or limited queue with {causes.BACKLOG_MIN}+ jobs at the head of the claim index, an "
            f"operator's load-changing action up to {_fmt_span(causes.CHANGES_BEFORE.total_seconds())} before it "
            "began); trends need a day.")


def _fmt_span(value: float) -> str:
    """A span of history: 8 min, 2.5 h, 1.5 days (whole hours without a decimal)."""
    if value < 3600:
        return f"{value / 60:.0f} min"
    if value < 48 * 3600:
        hours = value / 3600
        return f"{hours:.0f} h" if abs(hours - round(hours)) < 0.05 else f"{hours:.1f} h"
    return f"{value / 86400:.1f} days"


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


def read(conn: psycopg.Connection, metric: str, window: timedelta, labels: dict[str, str] | None = None) -> Series:
    groups: dict[tuple[tuple[str, str], ...], list[tuple[datetime, float]]] = {}
    for point in samples.series(conn, metric, since=window, labels=labels):
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


def _history(groups: list[list[tuple[datetime, float]]]) -> tuple[float, int]:
    """The span (seconds) and the distinct sampling points of a signal's own samples."""
    stamps = {at for pts in groups for at, _ in pts}
    if not stamps:
        return 0.0, 0
    return (max(stamps) - min(stamps)).total_seconds(), len(stamps)


def _step(stamps: list[datetime]) -> float:
    """The usual distance between sampling points, in seconds (60 when unknown)."""
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else 60.0


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
    best: tuple[float, float, float, list[tuple[datetime, float]]] | None = None
    for pts in groups:
        first, last = trend(pts)
        if first is None or last is None:
            continue
        ratio = last / max(first, floor)
        if best is None or ratio > best[0]:
            best = (ratio, first, last, pts)
    points = sum(len(p) for p in groups)
    if best is None:
        return Signal(sid, name, "unknown", f"no samples of {what} yet", points)
    ratio, first, last, pts = best
    span, instants = _history([pts])
    # when it held: the points already grown past the watch ratio
    held = [at for at, v in pts if v >= watch_ratio * max(first, floor) and v >= floor]
    data = {"ratio": ratio, "step_s": _step([at for at, _ in pts])}
    text = f"{what} went from {fmt(first)} to {fmt(last)} ({ratio:.1f}x)"
    if ratio >= outgrowing_ratio and last >= outgrowing_floor:
        level = SIGNAL_OUTGROWING
    elif ratio >= watch_ratio and last >= floor:
        level = SIGNAL_WATCH
    else:
        level, text, held = SIGNAL_OK, f"{what} steady: {fmt(first)} then {fmt(last)}", []
    return Signal(sid, name, level, text, points, first, last, data, span, instants, held=held)


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
    stamps = sorted(by_time)
    data = {"share": share, "instants": len(by_time), "step_s": _step(stamps)}
    text = f"{what} {share:.0%} of the time ({len(by_time):,} sampling points)"
    level = SIGNAL_OUTGROWING if share >= outgrowing else SIGNAL_WATCH if share >= watch else SIGNAL_OK
    held = [at for at in stamps if by_time[at] > 0] if level != SIGNAL_OK else []
    return Signal(sid, name, level, text, len(pts), data=data, history_seconds=(stamps[-1] - stamps[0]).total_seconds(),
                  instants=len(stamps), held=held)


def _claim_latency(series: dict[str, Series]) -> Signal:
    groups = series["claim_latency_seconds"].select(lambda lab: lab.get("quantile") in ("p95", "mean", "last") and lab.get("queue", "all") == "all")
    return _claim_latency_of("claim-latency", "Claim latency growing", groups, what="claim latency")


def _claim_latency_of(sid: str, name: str, groups: list[list[tuple[datetime, float]]], *, what: str) -> Signal:
    """The claim-latency thresholds, for all queues (the verdict) and for one (queue_claim_latency)."""
    return _growth_signal(sid, name, groups, floor=0.002, watch_ratio=1.5, outgrowing_ratio=3.0, outgrowing_floor=0.02,
                          fmt=_fmt_s, what=what)


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
        sig.held = sorted(set(sig.held) | set(mx.held))
    elif mx.level != "unknown":
        sig.text = f"{sig.text}; {mx.text}"
    if sig.level == "unknown" and mx.level != "unknown":
        sig.level, sig.text = mx.level, mx.text
    sig.history_seconds, sig.instants = max(sig.history_seconds, mx.history_seconds), max(sig.instants, mx.instants)
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
    span, instants = _history(groups)
    held = sorted({at for at, v in pts if v >= 30} | set(growth.held)) if level != SIGNAL_OK else []
    return Signal("replica-lag", "Replica lag", level, f"p95 replica lag {_fmt_s(worst)} ({who}); {growth.text}", len(pts),
                  growth.first, growth.last, {"p95": worst, "standby": who, "step_s": _step(sorted({at for at, _ in pts}))},
                  span, instants, held=held)


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
    held: set[datetime] = set()
    span, instants = _history([sorted(by_time.items())])
    if limit and by_time:
        peak = p95(sorted(by_time.items())) or 0.0
        share = peak / limit
        parts.append(f"p95 connections {peak:.0f} of {limit:.0f} ({share:.0%})")
        level = SIGNAL_OUTGROWING if share >= 0.95 else SIGNAL_WATCH if share >= 0.8 else SIGNAL_OK
        if level != SIGNAL_OK:
            held |= {at for at, v in by_time.items() if v >= 0.8 * limit}
    throughput = series["throughput"].select(lambda lab: lab.get("outcome") == "completed")
    t_first, t_last = trend(throughput[0]) if throughput else (None, None)
    if latency.level in (SIGNAL_WATCH, SIGNAL_OUTGROWING) and t_first is not None and t_last is not None:
        work_ratio = t_last / max(t_first, 0.01)
        if work_ratio < 1.2:
            parts.append(f"claims slowed down while completed jobs/s went {t_first:.1f} -> {t_last:.1f}: other load competes")
            level = max(level, SIGNAL_WATCH, key=_RANK.__getitem__)
            held |= set(latency.held)
            span, instants = max(span, latency.history_seconds), max(instants, latency.instants)
    if not parts:
        return Signal("competition", "Business queries competing with workers", "unknown", "no connection samples yet")
    stamps = sorted(by_time)
    return Signal("competition", "Business queries competing with workers", level, "; ".join(parts), len(by_time),
                  data={"step_s": _step(stamps) if stamps else latency.data.get("step_s", 60.0)},
                  history_seconds=span, instants=instants, held=sorted(held))


METRICS = ("claim_latency_seconds", "table_autovacuum_behind", "vacuum_removed_nothing", "lock_waits", "lwlock_waits",
           "multixact_consumption_per_second", "replica_lag_seconds", "wal_bytes_per_second", "connections",
           "max_connections", "throughput", "xmin_horizon_age_seconds")


# --- known causes -----------------------------------------------------------------------------


def _limited(conn: psycopg.Connection, timeout_ms: int, read_it: Callable[[psycopg.Cursor], Any]) -> Any:
    """One read in its own transaction under the time limit; None when it times out or waits on
    a lock (a cause not read is a cause not named, never an error)."""
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
            cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
            return read_it(cur)
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable):
        return None


class _Present:
    """What there is now that may explain a signal, each read at most once, on demand."""

    def __init__(self, conn: psycopg.Connection, timeout_ms: int, now: datetime):
        self.conn, self.timeout_ms, self.now = conn, timeout_ms, now
        self._details: Any = ...
        self._held_back: Any = ...

    def holders(self) -> tuple[datetime, list[dict[str, Any]]] | None:
        """The horizon collector's newest details: (when that cycle ran, its holders)."""
        if self._details is ...:
            row = _limited(self.conn, self.timeout_ms,
                           lambda cur: cur.execute(query("collectors_runs", "latest_details"), {}).fetchone())
            details = (row or {}).get("details") or {}
            self._details = (row["started_at"], list(details.get("xmin_holders") or [])) if row else None
        return self._details

    def held_back(self) -> list[dict[str, Any]]:
        if self._held_back is ...:
            self._held_back = _limited(self.conn, self.timeout_ms, causes.held_back_work) or []
        return self._held_back

    def changes(self, since: datetime, until: datetime) -> list[dict[str, Any]]:
        return _limited(self.conn, self.timeout_ms, lambda cur: causes.operator_changes(cur, since, until)) or []


def _at(points: list[tuple[datetime, float]], stamps: list[datetime], at: datetime, tolerance: float) -> float | None:
    """The value of the sample nearest `at`, if one is within `tolerance` seconds."""
    i = bisect.bisect_left(stamps, at)
    near = [j for j in (i - 1, i) if 0 <= j < len(points)]
    if not near:
        return None
    j = min(near, key=lambda k: abs((stamps[k] - at).total_seconds()))
    return points[j][1] if abs((stamps[j] - at).total_seconds()) <= tolerance else None


_HOLDER_WORDS = {"idle_in_transaction": "a session idle in transaction", "transaction": "a long transaction",
                 "replication_slot": "a replication slot", "prepared_transaction": "a prepared transaction",
                 "standby": "a standby's feedback"}


def _holder_explains(sig: Signal, horizon: Series, present: _Present) -> Cause | None:
    """A horizon holder of HOLDER_PRESENT_S or more during at least EXPLAINS of the instants
    the signal held; named from the newest cycle's details when it is still there."""
    groups = {dict(key).get("holder"): pts for key, pts in horizon.groups.items() if pts}
    anyone = groups.get("any")
    if not anyone or not sig.held:
        return None
    stamps = [at for at, _ in anyone]
    tolerance = max(1.5 * _step(stamps), 90.0)
    there = [(at, v) for at in sig.held
             if (v := _at(anyone, stamps, at, tolerance)) is not None and v >= causes.HOLDER_PRESENT_S]
    share = len(there) / len(sig.held)
    if share < EXPLAINS:
        return None
    last = there[-1][0]
    longest = max(v for _, v in there)
    kinds = {k: pts for k, pts in groups.items() if k and k != "any"}
    kind = max(kinds, key=lambda k: _at(kinds[k], [a for a, _ in kinds[k]], last, tolerance) or 0.0) if kinds else None
    found = present.holders()
    if found is not None:
        cycle_at, holders = found
        # the one of that kind that was already holding at the last instant the history shows
        still = [h for h in holders if kind in (None, h.get("kind")) and (
            h.get("age_s") is None or cycle_at - timedelta(seconds=float(h["age_s"])) <= last + timedelta(seconds=tolerance))]
        if still:
            h = max(still, key=lambda x: (x.get("age_s") is not None, x.get("age_s") or 0.0, x.get("xid_age") or 0.0))
            age = None if h.get("age_s") is None else float(h["age_s"]) + max((present.now - cycle_at).total_seconds(), 0.0)
            cause = causes.holder_cause(h, age_s=age)
            cause.data.update(share=share, longest_s=longest)
            return cause
    words = _HOLDER_WORDS.get(kind or "", "something")
    return Cause(causes.HOLDER, kind or "holder",
                 f"{words} held the xmin horizon (up to {_fmt_span(longest) if longest >= 120 else f'{longest:.0f} s'}) "
                 "while this signal held, and the newest collection no longer lists it",
                 "nothing to end now; set idle_in_transaction_session_timeout (or end such holders sooner: "
                 "Database page, holders panel) so it cannot recur",
                 data={"holder_kind": kind, "share": share, "longest_s": longest})


def _held_back_explains(sig: Signal, present: _Present) -> Cause | None:
    """Paused or limited work with a backlog at the head of the claim index, paused or limited
    since before at least EXPLAINS of the instants the signal held."""
    for cause in causes.held_back_causes(present.held_back(), present.now):
        share = 1.0 if cause.since is None else sum(1 for at in sig.held if at >= cause.since) / len(sig.held)
        if share >= EXPLAINS:
            cause.data["share"] = share
            return cause
    return None


def _change_explains(sig: Signal, present: _Present) -> Cause | None:
    """A load-changing operator action up to CHANGES_BEFORE before the signal began to hold
    (or within one sampling step after: the samples see it late)."""
    onset = sig.held[0]
    rows = present.changes(onset - causes.CHANGES_BEFORE, onset + timedelta(seconds=sig.data.get("step_s") or 60.0))
    return causes.change_cause(rows[0], onset) if rows else None


def _explain(sig: Signal, series: dict[str, Series], present: _Present) -> Cause | None:
    if not sig.held:
        return None
    if sig.id in HOLDER_SIGNALS and (cause := _holder_explains(sig, series["xmin_horizon_age_seconds"], present)):
        return cause
    if sig.id in HELD_BACK_SIGNALS and (cause := _held_back_explains(sig, present)):
        return cause
    return _change_explains(sig, present)


_THEN = {"claim-latency": "claims recover once vacuum runs", "competition": "claims recover once vacuum runs",
         "queue-claim-latency": "claims recover once vacuum runs",
         "autovacuum": "vacuum can then remove the dead rows"}


def _judge(sig: Signal, series: dict[str, Series], present: _Present) -> None:
    """A firing signal with a known cause names it (and stays at watch); one without enough
    history of its own cannot say outgrowing yet."""
    if sig.level not in (SIGNAL_WATCH, SIGNAL_OUTGROWING):
        return
    cause = _explain(sig, series, present)
    if cause is not None:
        sig.cause = {**cause.to_dict(), "sentence": cause.sentence(_THEN.get(sig.id, "") if cause.kind == causes.HOLDER else ""),
                     "share": cause.data.get("share")}
        sig.level = SIGNAL_WATCH
        return
    short = sig.history_seconds < OUTGROWING_HISTORY.total_seconds() or sig.instants < OUTGROWING_POINTS
    if sig.level == SIGNAL_OUTGROWING and short:
        sig.level = SIGNAL_WATCH
        sig.data["short_history"] = True
        sig.text += (f"; not enough history yet to call it outgrowing ({_fmt_span(sig.history_seconds)} of "
                     f"{_fmt_span(OUTGROWING_HISTORY.total_seconds())}, {sig.instants} of {OUTGROWING_POINTS} "
                     "sampling points at least)")


def _named(signals: list[Signal]) -> str:
    return "; ".join(f"{s.name.lower()} ({s.text})" for s in signals)


def _known_causes(signals: list[Signal]) -> str:
    """". Known cause: <cause>: <fix>." once per cause, however many signals it explains (the
    first signal's words: claim latency comes first)."""
    seen: dict[tuple[str, str], str] = {}
    for s in signals:
        if s.cause:
            seen.setdefault((s.cause["kind"], s.cause["subject"]), s.cause["sentence"])
    return "".join(f". Known cause: {sentence}" for sentence in seen.values()) + ("." if seen else "")


def evaluate_verdict(conn: psycopg.Connection, *, window: timedelta = DEFAULT_WINDOW, timeout_ms: int = 2000) -> Verdict:
    """Read the stored history and decide. A metric whose read times out counts as missing."""
    series = {metric: _read_limited(conn, metric, window, timeout_ms) for metric in METRICS}
    spans = [s.span for s in series.values() if s.span]
    history = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else timedelta(0)
    latency = _claim_latency(series)
    signals = [latency, _autovacuum(series), _lock_waits(series), _slru_waits(series), _replica_lag(series),
               _wal(series), _competition(series, latency)]
    present = _Present(conn, timeout_ms, datetime.now(UTC))
    for sig in signals:
        _judge(sig, series, present)
    enough = history >= TREND_HISTORY
    hours = history.total_seconds() / 3600
    explained = [s for s in signals if s.cause]
    if history < MIN_HISTORY:
        label, level = NO_HISTORY, "unknown"
        headline = (f"Not enough history yet ({_fmt_span(history.total_seconds())} of {_fmt_span(MIN_HISTORY.total_seconds())} "
                    "of samples)" if spans else
                    "Not enough history yet: no samples stored yet (is the scheduler running?)")
        if explained:
            headline += f"; meanwhile {_named(explained)}{_known_causes(explained)}"
    else:
        worst = max((s.level for s in signals if s.level in _RANK), key=_RANK.__getitem__, default=SIGNAL_OK)
        label = {SIGNAL_OK: FITS, SIGNAL_WATCH: WATCH, SIGNAL_OUTGROWING: OUTGROWING}[worst]
        level = worst
        driving = [s for s in signals if s.level == worst and worst != SIGNAL_OK]
        span_text = f"{hours / 24:.1f} days" if hours >= 48 else f"{hours:.0f} h"
        if driving:
            headline = f"{label[0].upper()}{label[1:]}: {_named(driving)}"
            if not enough:
                headline += f" (only {span_text} of history; trends need at least a day)"
            headline += _known_causes(driving)
        elif enough:
            headline = f"Fits PostgreSQL: no migration signal over {span_text} of history"
        else:
            headline = f"Fits PostgreSQL so far: no migration signal in {span_text} of history; trends need at least a day"
    return Verdict(label, level, headline, signals, history.total_seconds(), window.total_seconds(), enough, minimums())


def _read_limited(conn: psycopg.Connection, metric: str, window: timedelta, timeout_ms: int,
                  labels: dict[str, str] | None = None) -> Series:
    """One metric's history under the time limit; a read that times out is an empty series."""
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
            return read(conn, metric, window, labels)
    except psycopg.errors.QueryCanceled:
        return Series({})


def queue_claim_latency(conn: psycopg.Connection, queue: str, *, window: timedelta = DEFAULT_WINDOW,
                        timeout_ms: int = 2000) -> Signal:
    """One queue's own claim latency: the collectors' rolled-back probe of that queue alone
    (`claim_latency_seconds{queue=Q, source="probe"}`, taken each cycle for the `[scheduler]
    probe_queues` queues with eligible jobs at the head of the claim index), judged exactly as
    the verdict's claim-latency signal (thresholds, evidence, known causes). Not part of the
    verdict, which reads all queues together; `skiplock exit-plan` shows it beside the verdict."""
    series = {"claim_latency_seconds": _read_limited(conn, "claim_latency_seconds", window, timeout_ms, {"queue": queue}),
              "xmin_horizon_age_seconds": _read_limited(conn, "xmin_horizon_age_seconds", window, timeout_ms)}
    groups = series["claim_latency_seconds"].select(lambda lab: lab.get("quantile") in ("p95", "mean", "last"))
    sig = _claim_latency_of("queue-claim-latency", f"Claim latency of queue {queue}", groups,
                            what=f"claim latency of queue {queue}")
    if sig.level == "unknown":
        sig.text = (f"no probe samples of queue {queue} yet (the collectors probe the [scheduler] probe_queues "
                    "queues with eligible jobs at the head of the claim index)")
    _judge(sig, series, _Present(conn, timeout_ms, datetime.now(UTC)))
    return sig


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
