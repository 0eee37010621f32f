"""Bounded growth of the samples: per-minute and per-hour rollups, then deletion of what is
older than the retention windows, each statement bounded.

Rollups advance a watermark kept in `skiplock.collector_state` (name "retention"): raw samples
of complete minutes are folded into per-minute rows a window of at most `window_minutes` at a
time, per-minute rows of complete hours into per-hour rows likewise. Re-folding a window
replaces its rows (upsert), so a crash between a fold and the watermark update counts nothing
twice. A minute is folded only once it is more than one minute old, so a cycle that is still
being stored is not cut in half. Deletions remove at most `batch_size` rows per statement and
stop after `max_batches` per run; the next run continues. Worker registry rows (skiplock.workers)
whose last heartbeat or stop is older than `worker_grace` ([worker] registry_grace) go the same
way: a killed worker never marks itself stopped, so its row would otherwise stay for ever. A
worker that comes back after that long registers again when it restarts; a hung one that
resumes without restarting keeps working but is not listed until then. Error groups
(skiplock.error_groups) not seen for the hourly rollups' retention go too, unless ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.sqlfiles import query

STATE_NAME = "retention"


@dataclass(frozen=True)
class RetentionSettings:
    raw: timedelta = timedelta(hours=48)
    minute: timedelta = timedelta(days=14)
    hour: timedelta = timedelta(days=400)
    batch_size: int = 5000
    max_batches: int = 20
    window_minutes: int = 60
    max_windows: int = 48
    worker_grace: timedelta = timedelta(hours=1)  # [worker] registry_grace

    @classmethod
    def from_config(cls, config: Any) -> RetentionSettings:
        s = config.scheduler
        return cls(raw=timedelta(hours=s.retention_raw_hours), minute=timedelta(days=s.retention_minute_days),
                   hour=timedelta(days=s.retention_hour_days), batch_size=s.retention_batch_size,
                   worker_grace=config.worker.registry_grace)


@dataclass
class RetentionResult:
    minute_windows: int = 0
    hour_windows: int = 0
    deleted: dict[str, int] = field(default_factory=lambda: {"raw": 0, "minute": 0, "hour": 0, "totals": 0, "runs": 0, "workers": 0,
                                                                           "scheduler_nodes": 0, "error_groups": 0})


def _floor(ts: datetime, unit: str) -> datetime:
    ts = ts.replace(second=0, microsecond=0)
    return ts.replace(minute=0) if unit == "hour" else ts


def _fold(conn: psycopg.Connection, name: str, start: datetime | None, end: datetime, step: timedelta, limit: int) -> tuple[datetime | None, int]:
    """Fold windows of `step` from `start` up to `end` (exclusive); returns (new watermark, windows)."""
    windows = 0
    while start is not None and start < end and windows < limit:
        stop = min(start + step, end)
        with conn.transaction():
            conn.execute(query("collectors_retention", name), {"from": start, "to": stop})
        start = stop
        windows += 1
    return start, windows


def _delete(conn: psycopg.Connection, name: str, params: dict[str, Any], settings: RetentionSettings) -> int:
    total = 0
    for _ in range(settings.max_batches):
        with conn.transaction():
            deleted = conn.execute(query("collectors_retention", name), {**params, "batch": settings.batch_size}).rowcount
        total += deleted
        if deleted < settings.batch_size:
            break
    return total


def run(conn: psycopg.Connection, settings: RetentionSettings | None = None) -> RetentionResult:
    """Roll up, then delete beyond the retention windows. `conn` must be autocommit."""
    settings = settings or RetentionSettings()
    result = RetentionResult()
    with conn.cursor(row_factory=dict_row) as cur:
        now = cur.execute(query("collectors_runs", "db_now"), {}).fetchone()["now"]
        row = cur.execute(query("collectors_runs", "state_of"), {"name": STATE_NAME}).fetchone()
        state = row["state"] if row else {}
        oldest_raw = cur.execute(query("collectors_retention", "oldest_raw"), {}).fetchone()["oldest"]

    minute_mark = datetime.fromisoformat(state["minute"]) if state.get("minute") else (_floor(oldest_raw, "minute") if oldest_raw else None)
    if minute_mark is not None and oldest_raw is not None and minute_mark < _floor(oldest_raw, "minute"):
        minute_mark = _floor(oldest_raw, "minute")  # nothing raw is left before this
    minute_end = _floor(now - timedelta(minutes=1), "minute")
    minute_mark, result.minute_windows = _fold(conn, "rollup_minutes", minute_mark, minute_end,
                                               timedelta(minutes=settings.window_minutes), settings.max_windows)

    hour_mark = datetime.fromisoformat(state["hour"]) if state.get("hour") else None
    if hour_mark is None:
        with conn.cursor(row_factory=dict_row) as cur:
            oldest_minute = cur.execute(query("collectors_retention", "oldest_minute"), {}).fetchone()["oldest"]
        hour_mark = _floor(oldest_minute, "hour") if oldest_minute else None
    hour_end = _floor(minute_mark, "hour") if minute_mark else None  # only hours whose minutes are all folded
    if hour_end is not None:
        hour_mark, result.hour_windows = _fold(conn, "rollup_hours", hour_mark, hour_end, timedelta(hours=6), settings.max_windows)

    with conn.transaction():
        conn.execute(query("collectors_runs", "save_state"), {
            "name": STATE_NAME, "taken_at": now,
            "state": Jsonb({"minute": minute_mark.isoformat() if minute_mark else None,
                            "hour": hour_mark.isoformat() if hour_mark else None}),
        })

    # Raw samples go only once their minutes are folded.
    raw_cutoff = now - settings.raw
    if minute_mark is not None:
        raw_cutoff = min(raw_cutoff, minute_mark)
    result.deleted["raw"] = _delete(conn, "delete_raw_batch", {"cutoff": raw_cutoff}, settings)
    # The per-cycle totals across queues (migration 032) go with the raw samples they summed.
    result.deleted["totals"] = _delete(conn, "delete_totals_batch", {"cutoff": raw_cutoff}, settings)
    result.deleted["minute"] = _delete(conn, "delete_rollup_batch", {"resolution": "minute", "cutoff": now - settings.minute}, settings)
    result.deleted["hour"] = _delete(conn, "delete_rollup_batch", {"resolution": "hour", "cutoff": now - settings.hour}, settings)
    result.deleted["runs"] = _delete(conn, "delete_runs_batch", {"cutoff": now - settings.raw}, settings)
    # Registry rows of workers that stopped, or were killed and never said so, longer ago than
    # the grace: the Workers page and the collectors stop carrying them.
    result.deleted["workers"] = _delete(conn, "delete_workers_batch", {"cutoff": now - settings.worker_grace}, settings)
    # Rows of scheduler processes gone for as long as raw samples are kept (one row a start).
    result.deleted["scheduler_nodes"] = _delete(conn, "delete_scheduler_nodes_batch", {"cutoff": now - settings.raw}, settings)
    # Error groups not seen for as long as the hourly rollups are kept (an ignored one stays).
    result.deleted["error_groups"] = _delete(conn, "delete_error_groups_batch", {"cutoff": now - settings.hour}, settings)
    return result
