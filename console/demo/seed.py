"""`skiplock demo --seed-history`: a few hours of plausible samples, so charts are not empty.

The history imitates what the collectors would have stored while the demo's traffic ran (the
same metric names from `console.catalog`, the same labels as `console.collectors`): a rate that
swells and ebbs, a burst on the search queue every four minutes, a killed worker's stuck leases
every three, dead tuples kept low by the workers' vacuums except after each archiver run, and
every twenty minutes an idle session holding the xmin horizon for six while dead tuples climb. The
figures (latencies, buffers, sizes) are those measured on the demo itself. Dead letters ramp up to the count the
database holds now, so the live samples continue the seeded line instead of jumping.

Only for the demo's own database: seeded samples are indistinguishable from measured ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg

from console import samples
from console.catalog import METRICS
from console.samples import Sample

QUEUES = {  # queue: (share of the jobs, mean seconds per job, handler threads serving it)
    "billing": (0.175, 0.25, 8),
    "mail": (0.175, 0.15, 8),
    "webhooks": (0.35, 0.3, 8),
    "default": (0.235, 0.4, 8),
    "reports": (0.045, 5.0, 2),
    "search": (0.0, 0.28, 2),
}
QUANTILES = ("p50", "p95", "max")
HOLDER_KINDS = ("transaction", "idle_in_transaction", "replication_slot", "prepared_transaction", "standby")
TABLES = ("jobs", "jobs_archive")


def _current_dead_letters(conn: psycopg.Connection) -> dict[str, float]:
    rows = conn.execute(
        "SELECT queue, count(*) FROM skiplock.jobs WHERE status = 'failed' GROUP BY queue"  # jobs_failed_idx
    ).fetchall()
    return {queue: float(n) for queue, n in rows}


def history(
    *,
    hours: float = 3.0,
    step: float = 15.0,
    rate: float = 5.0,
    end: datetime | None = None,
    dead_letters_now: dict[str, float] | None = None,
    seed: int = 42,
) -> Iterator[tuple[datetime, list[Sample]]]:
    """Yield (time, samples) every `step` seconds over the `hours` before `end`."""
    rng = random.Random(seed)
    end = end or datetime.now(UTC)
    count = int(hours * 3600 / step)
    start = end - timedelta(seconds=count * step)
    dead_now = {q: (dead_letters_now or {}).get(q, 0.0) for q in QUEUES}
    dead_tuples = 0.0
    archive_rows = rate * 3600 * 2.0  # the archive already held two hours of jobs

    def noisy(value: float, spread: float = 0.15) -> float:
        return max(value * (1 + rng.uniform(-spread, spread)), 0.0)

    for i in range(count):
        at = start + timedelta(seconds=i * step)
        t = i * step
        now_rate = rate * (1.0 + math.sin(2 * math.pi * t / 600.0) / 3.0)
        progress = (i + 1) / count
        out: list[Sample] = []

        burst_age = t % 240.0  # a burst of 300 reindex jobs every 4 minutes, drained in ~45 s
        search_backlog = max(300.0 * (1 - burst_age / 45.0), 0.0)
        kill_phase = t % 180.0  # a worker killed every 3 minutes: leases expire 15 s later
        stuck = 1.0 + (rng.random() < 0.5) if 15.0 <= kill_phase < 30.0 else 0.0
        idle_phase = t % 1200.0  # a session idle in transaction for 6 minutes every 20 minutes
        idle = 90.0 <= idle_phase < 450.0
        idle_age = idle_phase - 90.0 if idle else 0.0

        draining = search_backlog > 0
        completed = noisy(now_rate * 0.93 + (300.0 / 45.0 if draining else 0.0))
        retried = noisy(now_rate * 0.07)
        failed = noisy(now_rate * 0.012, 0.6)
        in_flight = 0.0
        for queue, (share, seconds, threads) in QUEUES.items():
            arrivals = now_rate * share
            busy = min(arrivals * seconds, threads)
            in_flight += busy
            eligible = float(rng.randint(0, 2)) if arrivals * seconds < threads * 0.5 else float(rng.randint(1, 6))
            age = rng.uniform(0.0, 0.4) if eligible else 0.0
            if queue == "search":
                eligible = round(search_backlog)
                age = min(burst_age, 45.0) if draining else 0.0
                busy = 2.0 if draining else 0.0
            scheduled = float(rng.randint(0, 3)) if queue in ("mail", "webhooks", "reports") else 0.0
            dead = round(dead_now[queue] * progress)
            q_stuck = stuck if queue == "reports" else 0.0
            out += [
                Sample("queue_depth", {"queue": queue, "system": "skiplock", "state": "eligible"}, eligible),
                Sample("queue_depth", {"queue": queue, "system": "skiplock", "state": "scheduled"}, scheduled),
                Sample("queue_depth", {"queue": queue, "system": "skiplock", "state": "running"}, round(busy)),
                Sample("queue_depth", {"queue": queue, "system": "skiplock", "state": "failed"}, dead),
                Sample("queue_age_seconds", {"queue": queue, "system": "skiplock"}, age),
                Sample("stuck_leases", {"queue": queue, "system": "skiplock"}, q_stuck),
                Sample("stuck_lease_age_seconds", {"queue": queue, "system": "skiplock"}, (kill_phase - 15.0) if q_stuck else 0.0),
                Sample("dead_letters", {"queue": queue, "system": "skiplock"}, dead),
                Sample("dead_letter_growth", {"queue": queue, "system": "skiplock"}, dead_now[queue] / hours),
            ]
        if draining:
            in_flight += 2.0

        out += [Sample("throughput", {"outcome": "completed"}, completed),
                Sample("throughput", {"outcome": "retried"}, retried),
                Sample("throughput", {"outcome": "failed"}, failed),
                Sample("retry_rate", {}, retried / (completed + retried + failed)),
                Sample("workers_live", {}, 2.0 if 0.0 <= kill_phase < 5.0 else 3.0),
                Sample("workers_in_flight", {}, round(in_flight))]
        # Figures measured on the demo (2 shared cores): claims of a few ms, pickup in ms except
        # while a burst drains, ~25 shared buffers per claim call.
        for label, value in zip(QUANTILES, (0.0035, 0.014, 0.04), strict=True):
            out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": label}, noisy(value, 0.4)))
        pickup = (min(burst_age, 45.0) * 0.5, min(burst_age, 45.0) * 0.9, min(burst_age, 45.0)) if draining else (0.005, 0.05, 0.4)
        for label, value in zip(QUANTILES, pickup, strict=True):
            out.append(Sample("pickup_delay_seconds", {"quantile": label}, noisy(value, 0.3)))
        out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "pg_stat_statements", "quantile": "mean"}, noisy(0.00012, 0.3)))
        out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "probe", "quantile": "last"}, noisy(0.004, 0.6)))
        buffers = 20.0 + (dead_tuples / 20.0 if idle else 0.0)
        for statement, factor in (("all", 1.0), ("claim", 0.6), ("complete_and_claim", 1.0)):
            out.append(Sample("claim_buffers_per_call", {"statement": statement}, noisy(buffers * factor, 0.25)))

        # The hot table: workers vacuum it every 10 s, so dead rows stay low except after each
        # archiver run (a minute's completed jobs deleted at once) and while the idle session
        # holds the horizon (they climb for its whole minute, then vanish).
        archived_now = t % 60.0 < step
        if idle:
            dead_tuples = now_rate * 4.5 * idle_age + rng.uniform(0, 50)
        elif archived_now:
            dead_tuples = now_rate * 60.0 * rng.uniform(0.8, 1.4)
        else:
            dead_tuples = rng.uniform(0, 20)
        live = now_rate * (100.0 + 3.0 * (t % 60.0)) + rng.uniform(20, 60)  # completed jobs wait 2 min
        archive_rows += now_rate * step
        for table, live_rows, dead_rows in (("jobs", live, dead_tuples), ("jobs_archive", archive_rows, 0.0)):
            labels = {"table": table}
            out += [
                Sample("table_live_tuples", labels, round(live_rows)),
                Sample("table_dead_tuples", labels, round(dead_rows)),
                Sample("table_dead_ratio", labels, dead_rows / (live_rows + dead_rows) if live_rows + dead_rows else 0.0),
                Sample("table_autovacuum_threshold", labels, 5000.0 if table == "jobs" else 50.0 + 0.2 * live_rows),
                Sample("table_autovacuum_behind", labels, 0.0),
                Sample("table_size_bytes", {**labels, "part": "heap"}, 8192 * math.ceil(live_rows * 300 / 8192 + 40)),
                Sample("table_size_bytes", {**labels, "part": "indexes"}, 8192 * math.ceil(live_rows * 90 / 8192 + 20)),
                Sample("table_size_bytes", {**labels, "part": "toast"}, 8192.0),
            ]
        for kind in (*HOLDER_KINDS, "any"):
            held = idle_age if kind in ("idle_in_transaction", "transaction", "any") else 0.0
            out.append(Sample("xmin_horizon_age_seconds", {"holder": kind}, held))
            out.append(Sample("xmin_horizon_age_xids", {"holder": kind}, held * now_rate * 1.3))
        out += [
            Sample("idle_in_transaction_sessions", {}, 1.0 if idle else 0.0),
            Sample("connections", {"state": "idle"}, float(rng.randint(8, 11))),
            Sample("connections", {"state": "all"}, float(rng.randint(9, 12)) + (1.0 if idle else 0.0)),
            Sample("max_connections", {}, 200.0),
            Sample("wal_bytes_per_second", {}, noisy(now_rate * 8000.0, 0.4)),
            Sample("collection_duration_seconds", {}, noisy(0.12, 0.5)),
        ]
        yield at, out


def seed_history(conn: psycopg.Connection, *, hours: float = 3.0, step: float = 15.0, rate: float = 5.0) -> int:
    """Store the history in the demo database (batched by time); return the number of samples."""
    if hours <= 0 or step <= 0:
        raise ValueError("hours and step must be greater than 0")
    dead_now = _current_dead_letters(conn)
    stored = 0
    batch: list[Sample] = []
    for at, group in history(hours=hours, step=step, rate=rate, dead_letters_now=dead_now):
        # A metric this installation's catalogue does not know yet is left out, not invented.
        batch += [Sample(s.metric, s.labels, s.value, at) for s in group if s.metric in METRICS]
        if len(batch) >= 5000:
            with conn.transaction():
                stored += samples.store(conn, batch)
            batch = []
    if batch:
        with conn.transaction():
            stored += samples.store(conn, batch)
    return stored
