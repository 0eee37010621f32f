"""Queue depth by state, age of the oldest eligible job, stuck leases, dead letters and growth.

Counts walk the partial indexes (pending: jobs_claim_idx, running: jobs_lease_idx, failed:
jobs_failed_idx) and stop at a cap, so a ten-million-row table costs the same as a small one.
Below the cap the numbers are exact. Above it, pending counts are scaled to the planner's
estimate of pending rows (pg_stats on jobs.status x reltuples, as of the last ANALYZE) and
`queue_depth_estimated` is 1. The split by queue and state then comes from the head of the
claim index (the first `depth_exact_limit` entries in claim order), so jobs scheduled for later,
which sort last, are under-represented in it. The per-queue dead-letter split is scaled the
same way to the total, which is exact up to `failed_total_limit` and the planner's estimate
beyond it (`queue_depth_estimated` is 1 then too).
Completed rows are never counted, only estimated from the same statistics.

`dead_letter_growth` is the arrival rate of dead letters over `[scheduler] rate_window`
(default 15 minutes), per hour: the jobs that became failed within the window and are still
failed, counted through jobs_failed_idx. It is never the difference of two samples a collection
interval apart, which read 0 / 360 / 720 per hour for a steady 180 per hour with 10 s
collections, and 360 per hour after one dead letter. A job replayed or purged within the window
no longer counts.

A queue is reported while it is in `skiplock.queues` or holds pending, running or failed jobs,
and for one more cycle after it drains: the cycle reports its zeros, so the newest sample the
pages read (samples_latest) says "empty" instead of keeping the last busy reading for the ten
minutes a sample stays current. The queues that were busy last cycle are remembered for that.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.collectors.base import Context
from console.samples import Sample


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    cap = opts.depth_exact_limit
    snap = ctx.rows("collectors_queue", "queue_snapshot", {
        "cap": cap, "failed_total_cap": opts.failed_total_limit, "failed_queue_cap": opts.failed_queue_limit,
        "window": opts.rate_window,
    })[0]
    pending, running, failed_rows = snap["pending"], snap["running"], snap["failed"]
    failed_total = snap["failed_total"]
    estimates = snap["estimates"]
    known = set(snap["known"])

    arrived = snap["arrived"]
    per_hour = arrival_rates(arrived, opts.rate_window, opts.failed_queue_limit)
    drained = ctx.previous.get("busy", [])
    queues = sorted({*known, *(r["queue"] for r in pending), *(r["queue"] for r in running),
                     *(r["queue"] for r in failed_rows), *per_hour, *drained})

    pending_seen = sum(r["eligible"] + r["scheduled"] for r in pending)
    scale = 1.0
    estimated = False
    if pending_seen >= cap:
        estimate = estimates.get("pending") or 0.0
        if estimate > pending_seen:
            scale = estimate / pending_seen
        estimated = True

    if failed_total >= opts.failed_total_limit:
        failed_total = max(failed_total, round(estimates.get("failed") or 0.0))
        estimated = True
    failed_seen = sum(r["failed"] for r in failed_rows)
    failed_scale = failed_total / failed_seen if failed_seen and failed_total > failed_seen else 1.0

    by_pending = {r["queue"]: r for r in pending}
    by_running = {r["queue"]: r for r in running}
    by_failed = {r["queue"]: r["failed"] for r in failed_rows}

    out: list[Sample] = []
    busy: list[str] = []
    for name in queues:
        p = by_pending.get(name)
        r = by_running.get(name)
        eligible = round((p["eligible"] if p else 0) * scale)
        scheduled = round((p["scheduled"] if p else 0) * scale)
        dead = float(round(by_failed.get(name, 0) * failed_scale))
        q = {"queue": name, "system": "skiplock"}
        out += [
            Sample("queue_depth", {**q, "state": "eligible"}, eligible),
            Sample("queue_depth", {**q, "state": "scheduled"}, scheduled),
            Sample("queue_depth", {**q, "state": "running"}, r["running"] if r else 0),
            Sample("queue_depth", {**q, "state": "failed"}, dead),
            Sample("queue_age_seconds", q, max(p["oldest_eligible_s"], 0.0) if p and p["oldest_eligible_s"] is not None else 0.0),
            Sample("stuck_leases", q, r["stuck"] if r else 0),
            Sample("stuck_lease_age_seconds", q, r["oldest_stuck_s"] if r and r["oldest_stuck_s"] is not None else 0.0),
            Sample("dead_letters", q, dead),
            Sample("dead_letter_growth", q, per_hour.get(name, 0.0)),
        ]
        if name not in known and (p or r or dead or name in per_hour):
            busy.append(name)
    # A known queue is reported every cycle anyway, so only the others need remembering.
    ctx.remember({"busy": busy})

    out.append(Sample("queue_depth_estimated", {"system": "skiplock"}, 1.0 if estimated else 0.0))
    out.append(Sample("completed_rows_estimate", {}, estimates.get("completed", 0.0)))
    return out


def arrival_rates(arrived: dict, window: float, cap: int) -> dict[str, float]:
    """Dead letters per hour by queue from the window's arrivals. When the cap was hit, the
    arrivals seen cover only the newest part of the window: divide by the span they cover."""
    seen = arrived.get("seen") or 0
    span = window
    if seen >= cap and arrived.get("span_s"):
        span = max(min(float(arrived["span_s"]), window), 1.0)
    return {queue: jobs * 3600.0 / span for queue, jobs in (arrived.get("by_queue") or {}).items()}
