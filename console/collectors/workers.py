"""Live workers, throughput, retry rate, and claim/pickup latency from the workers' counters.

Each worker process writes its cumulative counters and fixed-bucket histograms to its row in
`skiplock.workers` every flush interval. This collector subtracts the previous cycle's snapshot
(kept in `skiplock.collector_state`) worker by worker: a worker seen for the first time counts
from zero, a worker whose counters went down (restarted under the same id) counts from zero
too, and a worker that disappeared contributes nothing. Rates are per second of the database
clock between the two snapshots; quantiles come from the summed histogram deltas.

Per queue: each worker's `queue_counts` ({queue: [completed, failed, retried]}, workers of
this release) give `queue_throughput{queue, outcome}` the same way, so a queue finishing fast
jobs reads busy even when no sample catches one running ("idle" is defined in
console.signals).

`retry_rate` is taken over `[scheduler] rate_window` (default 15 minutes), not over one
collection interval: the snapshot keeps each cycle's summed deltas (`recent`) for the window,
and the rate is retried / finished over all of them. One interval of 10 s holds a handful of
attempts at most, so its ratio jumped between 0 and 1 and reset the rule's `for` every time.

The snapshot also keeps, per worker, its `completed` and `failed` counters at each of the last
few minutes' cycles (`history`: [[epoch seconds, completed, failed], ...], at most
HISTORY_SECONDS back): the Workers page subtracts the one about a minute old from the live
row to show each worker's recent throughput (console.browse.workers), not a lifetime average.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.collectors.base import Context
from console.histogram import delta, quantile
from console.samples import Sample

COUNTERS = ("claimed", "completed", "failed", "retried", "lost", "claim_calls", "pickup_count")
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("max", 1.0))
HISTORY_SECONDS = 180.0  # per-worker counter marks kept for the Workers page's last-minute throughput
HISTORY_MAX = 60  # and at most this many per worker, whatever the collect interval


def _sum_hist(total: list[int], add: list[int]) -> list[int]:
    if len(add) > len(total):
        total = total + [0] * (len(add) - len(total))
    return [t + (add[i] if i < len(add) else 0) for i, t in enumerate(total)]


def collect(ctx: Context) -> Iterable[Sample]:
    rows = ctx.rows("collectors_workers", "workers", {"live_within": ctx.options.live_worker_within})
    previous = ctx.previous.get("workers", {})
    interval = ctx.interval

    out: list[Sample] = [
        Sample("workers_live", {}, sum(1 for r in rows if r["live"])),
        Sample("workers_in_flight", {}, sum(r["in_flight"] for r in rows if r["live"])),
    ]

    totals = dict.fromkeys(COUNTERS, 0.0)
    by_queue: dict[str, list[float]] = {}
    claim_hist: list[int] = []
    pickup_hist: list[int] = []
    snapshot: dict[str, dict] = {}
    for r in rows:
        now_counts = {k: float(r[k]) for k in COUNTERS}
        queue_counts = r.get("queue_counts") or {}
        snapshot[r["id"]] = {**now_counts, "claim_histogram": list(r["claim_histogram"]),
                             "pickup_histogram": list(r["pickup_histogram"]), "queue_counts": queue_counts}
        before = previous.get(r["id"])
        restarted = before is not None and any(now_counts[k] < before.get(k, 0) for k in COUNTERS)
        base = None if before is None or restarted else before
        for k in COUNTERS:
            totals[k] += now_counts[k] - (base.get(k, 0) if base else 0)
        base_queues = (base or {}).get("queue_counts") or {}
        for queue, counts in queue_counts.items():
            old = base_queues.get(queue) or [0, 0, 0]
            summed = by_queue.setdefault(queue, [0.0, 0.0, 0.0])
            for i in range(3):
                summed[i] += max(float(counts[i]) - float(old[i]), 0.0)
        claim_hist = _sum_hist(claim_hist, delta(r["claim_histogram"], base.get("claim_histogram") if base else None))
        pickup_hist = _sum_hist(pickup_hist, delta(r["pickup_histogram"], base.get("pickup_histogram") if base else None))
    recent = _recent(ctx, interval, totals)
    ctx.remember({"workers": snapshot, "history": _history(ctx, rows), "recent": recent})

    if interval is None:
        # First cycle (nothing to subtract): rates need two snapshots.
        for outcome in ("completed", "failed", "retried"):
            out.append(Sample("throughput", {"outcome": outcome}, None))
        out.append(Sample("retry_rate", {}, None))
        out.append(Sample("failure_ratio", {}, None))
        for label, _ in QUANTILES:
            out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": label}, None))
            out.append(Sample("pickup_delay_seconds", {"quantile": label}, None))
        return out

    for outcome in ("completed", "failed", "retried"):
        out.append(Sample("throughput", {"outcome": outcome}, totals[outcome] / interval))
    for queue, counts in sorted(by_queue.items()):
        for i, outcome in enumerate(("completed", "failed", "retried")):
            out.append(Sample("queue_throughput", {"queue": queue, "outcome": outcome, "system": "skiplock"},
                              counts[i] / interval))
    out.append(Sample("retry_rate", {}, retry_rate(recent)))
    out.append(Sample("failure_ratio", {}, failure_ratio(recent)))
    for label, q in QUANTILES:
        out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": label}, quantile(claim_hist, q)))
        out.append(Sample("pickup_delay_seconds", {"quantile": label}, quantile(pickup_hist, q)))
    return out


def _recent(ctx: Context, interval: float | None, totals: dict[str, float]) -> list[list[float]]:
    """This cycle's summed deltas [end epoch, seconds, completed, failed, retried] appended to
    the previous cycles' that end within the rate window (the first cycle adds nothing)."""
    now = ctx.now.timestamp()
    kept = [m for m in ctx.previous.get("recent", []) if now - m[0] < ctx.options.rate_window]
    if interval is not None:
        kept.append([now, interval, totals["completed"], totals["failed"], totals["retried"]])
    return kept


def retry_rate(recent: list[list[float]]) -> float:
    """Retried attempts over finished attempts (completed, failed for good, retried) in the
    window; 0 when nothing finished in it (nothing is being retried)."""
    completed = sum(m[2] for m in recent)
    failed = sum(m[3] for m in recent)
    retried = sum(m[4] for m in recent)
    finished = completed + failed + retried
    return retried / finished if finished else 0.0


def failure_ratio(recent: list[list[float]]) -> float:
    """Jobs that failed for good over jobs finished (completed or failed for good) in the
    window; 0 when none finished."""
    completed = sum(m[2] for m in recent)
    failed = sum(m[3] for m in recent)
    return failed / (completed + failed) if completed + failed else 0.0


def _history(ctx: Context, rows: list[dict]) -> dict[str, list[list[float]]]:
    """Each listed worker's recent (time, completed, failed) marks, this cycle's appended."""
    now = ctx.now.timestamp()
    before = ctx.previous.get("history", {})
    out: dict[str, list[list[float]]] = {}
    for r in rows:
        marks = [m for m in before.get(r["id"], []) if now - m[0] <= HISTORY_SECONDS]
        marks.append([now, float(r["completed"]), float(r["failed"])])
        out[r["id"]] = marks[-HISTORY_MAX:]
    return out
