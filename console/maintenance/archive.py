"""Archival: completed jobs older than an age leave the hot table in bounded batches.

Each batch is one short transaction: it picks at most `batch_size` completed jobs finished
before the cutoff (oldest first, through the partial index `jobs_completed_idx`, FOR UPDATE
SKIP LOCKED), deletes them from `skiplock.jobs` and inserts them into the archive (or only
deletes them in "delete" mode), and counts the batch in the run's maintenance-run row. Then the
archiver pauses (`pause_ms`, and as long as `rate` rows/s requires) so vacuum and workers keep
up. A kill -9 at any moment loses nothing: a batch is in the hot table or in the archive.

The archive is partitioned by finish day (UTC); `ensure_partitions()` creates day partitions
ahead of time, and rows with no partition land in the default partition (retention empties it).

It does not delete archived rows (retention.py does) nor touch pending, running or failed jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from console import audit
from console.db import time_limited
from console.maintenance import runs
from console.maintenance._throttle import Throttle, elapsed_ms
from console.maintenance.errors import InvalidSettings
from console.sqlfiles import query

log = logging.getLogger("skiplock.maintenance.archive")

MODES = ("archive", "delete")
MAX_BATCH_SIZE = 100_000
PARTITION_PREFIX = "jobs_archive_p"
OLDEST_PARTITION_DAYS = 62  # never create partitions further back than this (older rows use the default)


@dataclass
class RunResult:
    """What one maintenance run did. `batch_ms` lists every batch's transaction time."""

    run_id: int
    task: str
    outcome: str  # ok, error, cancelled
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0
    error: str | None = None
    batch_ms: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def slowest_batch_ms(self) -> float | None:
        return max(self.batch_ms) if self.batch_ms else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "task": self.task, "outcome": self.outcome, "batches": self.batches,
            "rows": self.rows, "seconds": round(self.seconds, 3), "slowest_batch_ms": self.slowest_batch_ms,
            "error": self.error, "detail": self.detail,
        }


def check_batching(batch_size: int, rate: float | None, pause_ms: float = 0.0) -> None:
    """Refuse a batch size or rate that would be unbounded or meaningless."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidSettings(f"batch size must be a whole number from 1 to {MAX_BATCH_SIZE:,} (got {batch_size!r})")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0):
        raise InvalidSettings(f"rate must be a number of rows per second greater than 0 (got {rate!r})")
    if not isinstance(pause_ms, int | float) or pause_ms < 0:
        raise InvalidSettings(f"pause must be 0 ms or more (got {pause_ms!r})")


def check_age(name: str, age: timedelta) -> None:
    if not isinstance(age, timedelta) or age < timedelta(0):
        raise InvalidSettings(f"{name} must be a duration of 0 or more (got {age!r})")


# --- partitions ----------------------------------------------------------------------------


def partition_name(day: date) -> str:
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def partitions(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The archive's day partitions, oldest first: {name, day, estimated_rows}."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("maintenance", "archive_partitions")).fetchall()


def _day_bounds(day: date) -> tuple[datetime, datetime]:
    lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return lo, lo + timedelta(days=1)


def ensure_partitions(
    conn: psycopg.Connection,
    first_day: date,
    last_day: date,
    *,
    lock_timeout_ms: int = 2000,
) -> list[str]:
    """Create the missing day partitions from first_day to last_day (UTC); returns those created.

    A day whose rows already sit in the default partition is skipped (creating it would fail);
    those rows stay where they are until retention removes them. Each partition is created in
    its own transaction under a lock timeout, so a busy archive delays this, never the workers.
    """
    if last_day < first_day:
        return []
    if (last_day - first_day).days > 400:
        raise InvalidSettings("at most 400 archive partitions are created at once")
    existing = {p["name"] for p in partitions(conn)}
    created: list[str] = []
    day = first_day
    while day <= last_day:
        name = partition_name(day)
        if name not in existing:
            lo, hi = _day_bounds(day)
            try:
                with time_limited(conn, 10_000, lock_timeout_ms=lock_timeout_ms) as cur:
                    busy = cur.execute(query("maintenance", "default_partition_has_rows"), {"lo": lo, "hi": hi}).fetchone()
                    if busy["has_rows"]:
                        log.info("archive partition %s skipped: the default partition holds rows of that day", name)
                    else:
                        cur.execute(sql.SQL(query("maintenance", "create_partition")).format(
                            partition=sql.Identifier("skiplock", name), lo=sql.Literal(lo), hi=sql.Literal(hi)))
                        created.append(name)
            except psycopg.errors.LockNotAvailable:
                log.warning("archive partition %s not created this time: the archive is busy", name)
            except psycopg.errors.DuplicateTable:
                pass  # another process created it a moment ago
        day += timedelta(days=1)
    return created


def _utc_today(conn: psycopg.Connection) -> date:
    return conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]


def prepare_partitions(conn: psycopg.Connection, *, days_ahead: int = 7, keep: timedelta | None = None) -> list[str]:
    """Partitions from the oldest completed job's day (at most `keep`, else 62 days back) to
    `days_ahead` days from today: what the archiver calls before it moves rows."""
    today = _utc_today(conn)
    oldest = conn.execute(query("maintenance", "oldest_completed")).fetchone()
    back = min(keep.days if keep is not None else OLDEST_PARTITION_DAYS, OLDEST_PARTITION_DAYS)
    first = today - timedelta(days=back)
    if oldest is not None and oldest[0] is not None:
        first = max(first, oldest[0].astimezone(UTC).date())
    else:
        first = today
    return ensure_partitions(conn, min(first, today), today + timedelta(days=days_ahead))


# --- archival ------------------------------------------------------------------------------


def archive_completed(
    conn: psycopg.Connection,
    *,
    older_than: timedelta,
    mode: str = "archive",
    batch_size: int = 1000,
    rate: float | None = None,
    pause_ms: float = 10.0,
    max_batches: int | None = None,
    actor: str = "scheduler",
    reason: str | None = None,
    days_ahead: int = 7,
    keep: timedelta | None = None,
    statement_timeout_ms: int = 10_000,
    stop: threading.Event | None = None,
) -> RunResult:
    """Archive (or delete) completed jobs finished more than `older_than` ago, in batches.

    `conn` must be an autocommit connection (each batch is its own transaction). `rate` caps
    rows per second (None: no cap), `pause_ms` is the least pause between two batches,
    `max_batches` bounds the run (None: until nothing is left), `stop` ends it between batches
    (outcome 'cancelled'). A run by anyone other than "scheduler" is an operator's "archive now"
    and is written to the audit log. Returns the run's figures; a failure is recorded in the
    run row (outcome 'error') and raised.
    """
    check_age("older_than", older_than)
    check_batching(batch_size, rate, pause_ms)
    if mode not in MODES:
        raise InvalidSettings(f"archive mode must be one of {', '.join(MODES)} (got {mode!r})")
    if max_batches is not None and max_batches < 1:
        raise InvalidSettings("max_batches must be at least 1")

    settings = {"older_than_s": older_than.total_seconds(), "mode": mode, "batch_size": batch_size, "rate": rate}
    run_id = runs.start(conn, "archive", actor, settings)
    result = RunResult(run_id=run_id, task="archive", outcome="ok")
    throttle = Throttle(rate, min_pause=pause_ms / 1000.0, stop=stop)
    started = time.perf_counter()
    try:
        if mode == "archive":
            result.detail["partitions_created"] = prepare_partitions(conn, days_ahead=days_ahead, keep=keep)
        cutoff = conn.execute("SELECT now() - %s::interval", (older_than,)).fetchone()[0]
        result.detail["cutoff"] = cutoff.isoformat()
        after = {"after_finished_at": "-infinity", "after_id": 0}
        batch_query = query("maintenance", "archive_batch" if mode == "archive" else "delete_batch")
        while max_batches is None or result.batches < max_batches:
            if throttle.stop.is_set():
                result.outcome = "cancelled"
                break
            t0 = time.perf_counter()
            with time_limited(conn, statement_timeout_ms) as cur:
                row = cur.execute(batch_query, {"cutoff": cutoff, "batch_size": batch_size, **after}).fetchone()
                if row["rows"]:
                    runs.batch(conn, run_id, row["rows"], elapsed_ms(t0))
            ms = elapsed_ms(t0)
            if not row["rows"]:
                break
            result.batches += 1
            result.rows += row["rows"]
            result.batch_ms.append(ms)
            after = {"after_finished_at": row["last_finished_at"], "after_id": row["last_id"]}
            if row["rows"] < batch_size:
                break  # the rest is newer than the cutoff (or held by another archiver)
            if not throttle.wait(row["rows"], ms / 1000.0):
                result.outcome = "cancelled"
                break
    except Exception as exc:
        result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}".strip()
        raise
    finally:
        result.seconds = time.perf_counter() - started
        _close(conn, result, actor, reason, settings)
    return result


def _close(conn: psycopg.Connection, result: RunResult, actor: str, reason: str | None, selection: dict[str, Any]) -> None:
    """Finish the run row and, for an operator's run, write the audit row. Never masks the
    original error: a failure here is logged."""
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        runs.finish(conn, result.run_id, result.outcome, error=result.error, detail=result.detail)
        if actor != "scheduler":
            audit.record(
                conn, actor=actor, action=result.task,
                target=f"run:{result.run_id}", selection=selection, reason=reason, rows=result.rows,
                outcome="ok" if result.outcome == "ok" else ("cancelled" if result.outcome == "cancelled" else "error"),
                detail={"batches": result.batches, "seconds": round(result.seconds, 3), "error": result.error},
            )
    except Exception:  # pragma: no cover - the database went away; the run row shows 'running'
        log.exception("could not record the end of maintenance run %s", result.run_id)


def archived_job(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    """One archived job by id (None when it is not in the archive)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("maintenance", "archive_lookup"), {"id": job_id}).fetchone()


def archive_size(conn: psycopg.Connection) -> dict[str, int]:
    """{partitions, total_bytes, estimated_rows}: pg_total_relation_size() of a partitioned
    table is 0, so collectors and pages should read the archive's size here."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("maintenance", "archive_size")).fetchone()
