"""Maintenance-run rows: one per run of archive, retention or reap.

`start()` inserts the row (outcome 'running', with the backend that runs it), `batch()` counts
a batch in the caller's open transaction (the same one that did the work, so the counts match
what committed even after a kill -9), and `finish()` closes it. A 'running' row whose backend
has disconnected is marked 'abandoned' by the next `start()` of any task.

`try_lock()` / `unlock()` take and release a task's session advisory lock on the connection that
does the work, and `live_run()` finds a run of the task in progress anywhere: the web's "run
now" uses both to refuse a second run while one runs.

It does not decide what a task does; archive.py, retention.py and actions.py do.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.sqlfiles import query

TASKS = ("archive", "retention", "reap")
OUTCOMES = ("running", "ok", "error", "cancelled", "abandoned")
TASK_LOCK_CLASS = 0x5C1B_4A5  # advisory lock namespace of maintenance runs (second key: TASKS index + 1)


def _lock_params(task: str) -> dict[str, int]:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}")
    return {"lock_class": TASK_LOCK_CLASS, "task_key": TASKS.index(task) + 1}


def try_lock(conn: psycopg.Connection, task: str) -> bool:
    """Take the task's session advisory lock on `conn` (autocommit) if free; never waits."""
    return bool(conn.execute(query("maintenance", "task_try_lock"), _lock_params(task)).fetchone()[0])


def unlock(conn: psycopg.Connection, task: str) -> None:
    conn.execute(query("maintenance", "task_unlock"), _lock_params(task))


def live_run(conn: psycopg.Connection, task: str) -> dict[str, Any] | None:
    """The task's run in progress (its backend still connected), or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("maintenance", "run_live"), {"task": task}).fetchone()


def mark_abandoned(conn: psycopg.Connection) -> list[int]:
    """Close 'running' rows whose process went away; returns their ids."""
    with conn.transaction():
        return [r[0] for r in conn.execute(query("maintenance", "runs_mark_abandoned")).fetchall()]


def start(conn: psycopg.Connection, task: str, actor: str, detail: dict[str, Any] | None = None) -> int:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}")
    mark_abandoned(conn)
    with conn.transaction():
        row = conn.execute(
            query("maintenance", "run_start"),
            {"task": task, "actor": actor, "detail": Jsonb(detail or {})},
        ).fetchone()
    return row[0]


def batch(conn: psycopg.Connection, run_id: int, rows: int, batch_ms: float) -> None:
    """Count one batch. Call it inside the batch's own transaction."""
    conn.execute(query("maintenance", "run_batch"), {"id": run_id, "rows": rows, "batch_ms": batch_ms})


def finish(
    conn: psycopg.Connection,
    run_id: int,
    outcome: str,
    *,
    error: str | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if outcome not in OUTCOMES or outcome == "running":
        raise ValueError(f"a run finishes as one of {', '.join(OUTCOMES[1:])}")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            query("maintenance", "run_finish"),
            {"id": run_id, "outcome": outcome, "error": error, "detail": Jsonb(detail or {})},
        ).fetchone()


def recent(conn: psycopg.Connection, *, task: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Newest runs first (all tasks, or one)."""
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be between 1 and 1000")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("maintenance", "runs_recent"), {"task": task, "limit": limit}).fetchall()


def last_by_task(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """{task: its newest run}: what the maintenance page summarises."""
    with conn.cursor(row_factory=dict_row) as cur:
        return {r["task"]: r for r in cur.execute(query("maintenance", "runs_last_by_task"), {"tasks": list(TASKS)}).fetchall()}
