"""Archive retention: archived rows older than the retention age are removed, never by an
unbounded statement.

Whole day partitions that end before the cutoff are dropped (one short transaction each,
under a lock timeout: dropping a partition briefly locks the archive). What is left before the
cutoff, in the partition that straddles it and in the default partition, is deleted in batches
of at most `batch_size` rows. Partitions for the coming days are created here too, so the
archiver always finds one.

Maintenance-run rows older than the cutoff are pruned too (one bounded batch per run), and
expired uniqueness windows (`skiplock.unique_keys`, whatever their age against the cutoff) in
at most UNIQUE_KEY_BATCHES batches of `batch_size`.

It does not touch the hot table.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import psycopg
from psycopg import sql

from console import queue as q
from console.db import time_limited
from console.maintenance import runs
from console.maintenance._throttle import Throttle, elapsed_ms
from console.maintenance.archive import (
    RunResult,
    _close,
    _day_bounds,
    _utc_today,
    check_age,
    check_batching,
    ensure_partitions,
    partitions,
)
from console.sqlfiles import query

log = logging.getLogger("skiplock.maintenance.retention")

UNIQUE_KEY_BATCHES = 100  # per run: a backlog beyond batch_size x this waits for the next run


def apply_retention(
    conn: psycopg.Connection,
    *,
    retention: timedelta,
    batch_size: int = 1000,
    rate: float | None = None,
    pause_ms: float = 10.0,
    max_batches: int | None = None,
    days_ahead: int = 7,
    actor: str = "scheduler",
    reason: str | None = None,
    lock_timeout_ms: int = 2000,
    statement_timeout_ms: int = 10_000,
    stop: threading.Event | None = None,
) -> RunResult:
    """Remove archived jobs finished more than `retention` ago; create partitions ahead.

    A partition that cannot be dropped because the archive is busy (lock timeout) is left for
    the next run and named in the run's detail (outcome stays 'ok'). Returns the run's figures;
    `rows` counts batch-deleted rows, `detail["estimated_rows_dropped"]` the dropped partitions'.
    """
    check_age("retention", retention)
    check_batching(batch_size, rate, pause_ms)
    settings = {"retention_s": retention.total_seconds(), "batch_size": batch_size}
    run_id = runs.start(conn, "retention", actor, settings)
    result = RunResult(run_id=run_id, task="retention", outcome="ok")
    result.detail.update(partitions_dropped=[], partitions_busy=[], estimated_rows_dropped=0)
    throttle = Throttle(rate, min_pause=pause_ms / 1000.0, stop=stop)
    started = time.perf_counter()
    try:
        today = _utc_today(conn)
        result.detail["partitions_created"] = ensure_partitions(conn, today, today + timedelta(days=days_ahead),
                                                                lock_timeout_ms=lock_timeout_ms)
        cutoff = conn.execute("SELECT now() - %s::interval", (retention,)).fetchone()[0]
        result.detail["cutoff"] = cutoff.isoformat()
        for part in partitions(conn):
            _, upper = _day_bounds(part["day"])
            if upper > cutoff:
                break  # oldest first: every later partition is newer
            try:
                with time_limited(conn, statement_timeout_ms, lock_timeout_ms=lock_timeout_ms) as cur:
                    cur.execute(sql.SQL(query("maintenance", "drop_partition")).format(
                        partition=sql.Identifier("skiplock", part["name"])))
                result.detail["partitions_dropped"].append(part["name"])
                result.detail["estimated_rows_dropped"] += max(part["estimated_rows"], 0)
            except psycopg.errors.LockNotAvailable:
                log.warning("archive partition %s not dropped this time: the archive is busy", part["name"])
                result.detail["partitions_busy"].append(part["name"])
        while max_batches is None or result.batches < max_batches:
            if throttle.stop.is_set():
                result.outcome = "cancelled"
                break
            t0 = time.perf_counter()
            with time_limited(conn, statement_timeout_ms, lock_timeout_ms=lock_timeout_ms) as cur:
                deleted = cur.execute(query("maintenance", "retention_batch"),
                                      {"cutoff": cutoff, "batch_size": batch_size}).rowcount
                if deleted:
                    runs.batch(conn, run_id, deleted, elapsed_ms(t0))
            ms = elapsed_ms(t0)
            if not deleted:
                break
            result.batches += 1
            result.rows += deleted
            result.batch_ms.append(ms)
            if deleted < batch_size:
                break
            if not throttle.wait(deleted, ms / 1000.0):
                result.outcome = "cancelled"
                break
        with time_limited(conn, statement_timeout_ms, lock_timeout_ms=lock_timeout_ms) as cur:
            result.detail["runs_pruned"] = cur.execute(query("maintenance", "prune_runs"),
                                                       {"cutoff": cutoff, "batch_size": batch_size}).rowcount
        result.detail["unique_keys_pruned"] = 0
        for _ in range(UNIQUE_KEY_BATCHES):
            with time_limited(conn, statement_timeout_ms, lock_timeout_ms=lock_timeout_ms) as cur:
                pruned = q.prune_unique_keys(cur.connection, batch_size=batch_size)
            result.detail["unique_keys_pruned"] += pruned
            if pruned < batch_size:
                break
    except Exception as exc:
        result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}".strip()
        raise
    finally:
        result.seconds = time.perf_counter() - started
        _close(conn, result, actor, reason, settings)
    return result
