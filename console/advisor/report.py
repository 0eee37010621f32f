"""The advisor's stored run: the last full run of every check, so pages read it instead of
running the checks on every poll.

Running all the checks costs 0.2-0.8 s of database work. The run is stored in
skiplock.advisor_snapshots (name "report": the report, what it cost, who asked) by whoever may
write: the scheduler once per collection cycle (`refresh`, as job `advisor`), an operator's
"Re-run checks" (POST /advisor/run, POST /api/v1/advisor/run). Reading never writes (issue 26:
a GET changes nothing): `stored(conn)` reads the row, and `run_unstored(conn, config)` runs
the checks in a transaction it rolls back, for a console that has never stored a run (the
checks' own memory of counter readings is rolled back with it; their outcomes are not
changed by that).

The run includes the table-as-queue checks of every [[external_queues]] source
(console.advisor.external.run_sources). This module does not decide what a check says.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.advisor.checks import run_checks
from console.advisor.external import run_sources
from console.sqlfiles import query

REPORT_SNAPSHOT = "report"  # skiplock.advisor_snapshots row holding the last full run


def run(conn: psycopg.Connection, config: Any, actor: str | None) -> dict[str, Any]:
    """Every check now, with its cost: {"report", "duration_ms", "checked_by"} (not stored)."""
    started = time.perf_counter()
    report = run_checks(conn, config)
    report.results += run_sources(conn, config)
    duration_ms = (time.perf_counter() - started) * 1000
    return {"report": report.to_dict(), "duration_ms": round(duration_ms, 1), "checked_by": actor}


def run_and_store(conn: psycopg.Connection, config: Any, actor: str | None) -> dict[str, Any]:
    """Run every check, store the run, and return it as stored (age 0). A state change: the
    scheduler's cycle and an operator's POST call it, never a GET."""
    done = run(conn, config, actor)
    conn.execute(query("advisor", "snapshot_put"), {"name": REPORT_SNAPSHOT, "data": Jsonb(done)})
    return {**done, "age_s": 0.0}


def run_unstored(conn: psycopg.Connection, config: Any) -> dict[str, Any]:
    """Run every check in a transaction that is rolled back: nothing is stored, not even the
    checks' memory. For a reader when no run is stored yet (`age_s` is None: not stored)."""
    with conn.transaction(force_rollback=True):
        done = run(conn, config, None)
    return {**done, "age_s": None}


def stored(conn: psycopg.Connection) -> dict[str, Any] | None:
    """The stored run with its age in seconds (`age_s`), or None when none is stored."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("advisor", "snapshot_get"), {"name": REPORT_SNAPSHOT}).fetchone()
    if row is None or "report" not in (row["data"] or {}):
        return None
    return {**row["data"], "age_s": float(row["age_s"]) if row["age_s"] is not None else 0.0}


def refresh(conn: psycopg.Connection, config: Any) -> dict[str, Any]:
    """The scheduler's cycle: run and store (actor "scheduler")."""
    return run_and_store(conn, config, "scheduler")


__all__ = ["REPORT_SNAPSHOT", "refresh", "run", "run_and_store", "run_unstored", "stored"]
