"""Live workers, throughput, retry rate, and claim/pickup latency from the workers' counters.

Each worker process writes its cumulative counters and fixed-bucket histograms to its row in
`skiplock.workers` every flush interval. This collector subtracts the previous cycle's snapshot
(kept in `skiplock.collector_state`) worker by worker: a worker seen for the first time counts
from zero, a worker whose counters went down (restarted under the same id) counts from zero
too, and a worker that disappeared contributes nothing. Rates are per second of the database
clock between the two snapshots; quantiles come from the summed histogram deltas.

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
    claim_hist: list[int] = []
    pickup_hist: list[int] = []
    snapshot: dict[str, dict] = {}
    for r in rows:
        now_counts = {k: float(r[k]) for k in COUNTERS}
        snapshot[r["id"]] = {**now_counts, "claim_histogram": list(r["claim_histogram"]), "pickup_histogram": list(r["pickup_histogram"])}
        before = previous.get(r["id"])
        restarted = before is not None and any(now_counts[k] < before.get(k, 0) for k in COUNTERS)
        base = None if before is None or restarted else before
        for k in COUNTERS:
            totals[k] += now_counts[k] - (base.get(k, 0) if base else 0)
        claim_hist = _sum_hist(claim_hist, delta(r["claim_histogram"], base.get("claim_histogram") if base else None))
        pickup_hist = _sum_hist(pickup_hist, delta(r["pickup_histogram"], base.get("pickup_histogram") if base else None))
    ctx.remember({"workers": snapshot, "history": _history(ctx, rows)})

    if interval is None:
        # First cycle (nothing to subtract): rates need two snapshots.
        for outcome in ("completed", "failed", "retried"):
            out.append(Sample("throughput", {"outcome": outcome}, None))
        out.append(Sample("retry_rate", {}, None))
        for label, _ in QUANTILES:
            out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": label}, None))
            out.append(Sample("pickup_delay_seconds", {"quantile": label}, None))
        return out

    for outcome in ("completed", "failed", "retried"):
        out.append(Sample("throughput", {"outcome": outcome}, totals[outcome] / interval))
    finished = totals["completed"] + totals["failed"] + totals["retried"]
    out.append(Sample("retry_rate", {}, totals["retried"] / finished if finished else 0.0))
    for label, q in QUANTILES:
        out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": label}, quantile(claim_hist, q)))
        out.append(Sample("pickup_delay_seconds", {"quantile": label}, quantile(pickup_hist, q)))
    return out


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
