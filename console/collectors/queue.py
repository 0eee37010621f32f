"""Queue depth by state, age of the oldest eligible job, stuck leases, dead letters and growth.

Counts walk the partial indexes (pending: jobs_claim_idx, running: jobs_lease_idx, failed:
jobs_failed_idx) and stop at a cap, so a ten-million-row table costs the same as a small one.
Below the cap the numbers are exact. Above it, pending counts are scaled to the planner's
estimate of pending rows (pg_stats on jobs.status x reltuples) and `queue_depth_estimated` is 1;
the per-queue dead-letter split is scaled the same way to the exact-up-to-the-cap total.
Completed rows are never counted, only estimated from the same statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.collectors.base import Context
from console.samples import Sample


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    cap = opts.depth_exact_limit
    pending = ctx.rows("collectors_queue", "pending_by_queue", {"cap": cap})
    running = ctx.rows("collectors_queue", "running_by_queue", {"cap": cap})
    failed_total = ctx.rows("collectors_queue", "failed_total", {"cap": cap})[0]["failed"]
    failed_rows = ctx.rows("collectors_queue", "failed_by_queue", {"cap": opts.failed_queue_limit})
    estimates = {r["status"]: r["estimate"] for r in ctx.rows("collectors_queue", "status_estimates")}
    known = [r["name"] for r in ctx.rows("collectors_queue", "known_queues")]

    queues = sorted({*known, *(r["queue"] for r in pending), *(r["queue"] for r in running), *(r["queue"] for r in failed_rows)})

    pending_seen = sum(r["eligible"] + r["scheduled"] for r in pending)
    scale = 1.0
    estimated = False
    if pending_seen >= cap:
        estimate = estimates.get("pending") or 0.0
        if estimate > pending_seen:
            scale = estimate / pending_seen
        estimated = True

    failed_seen = sum(r["failed"] for r in failed_rows)
    failed_scale = failed_total / failed_seen if failed_seen and failed_total > failed_seen else 1.0

    by_pending = {r["queue"]: r for r in pending}
    by_running = {r["queue"]: r for r in running}
    by_failed = {r["queue"]: r["failed"] for r in failed_rows}

    previous_dead = ctx.previous.get("dead_letters", {})
    interval = ctx.interval
    dead_now: dict[str, float] = {}
    out: list[Sample] = []
    for name in queues:
        p = by_pending.get(name)
        r = by_running.get(name)
        eligible = round((p["eligible"] if p else 0) * scale)
        scheduled = round((p["scheduled"] if p else 0) * scale)
        dead = float(round(by_failed.get(name, 0) * failed_scale))
        dead_now[name] = dead
        out += [
            Sample("queue_depth", {"queue": name, "state": "eligible"}, eligible),
            Sample("queue_depth", {"queue": name, "state": "scheduled"}, scheduled),
            Sample("queue_depth", {"queue": name, "state": "running"}, r["running"] if r else 0),
            Sample("queue_depth", {"queue": name, "state": "failed"}, dead),
            Sample("queue_age_seconds", {"queue": name}, max(p["oldest_eligible_s"], 0.0) if p and p["oldest_eligible_s"] is not None else 0.0),
            Sample("stuck_leases", {"queue": name}, r["stuck"] if r else 0),
            Sample("stuck_lease_age_seconds", {"queue": name}, r["oldest_stuck_s"] if r and r["oldest_stuck_s"] is not None else 0.0),
            Sample("dead_letters", {"queue": name}, dead),
        ]
        growth = (dead - previous_dead.get(name, 0.0)) * 3600.0 / interval if interval else None
        out.append(Sample("dead_letter_growth", {"queue": name}, growth))

    out.append(Sample("queue_depth_estimated", {}, 1.0 if estimated else 0.0))
    out.append(Sample("completed_rows_estimate", {}, estimates.get("completed", 0.0)))
    ctx.remember({"dead_letters": dead_now})
    return out
