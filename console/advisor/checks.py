"""The production checklist, evaluated live against the database.

Each check is a small function that reads what it needs through `Probe` (named queries from
`sql/advisor.sql`, all bounded: catalogs, statistics views, or a slice of the jobs table through
one of its partial indexes) and returns an `Outcome`: ok / warn / fail, one sentence saying
what it found, the evidence (who, what, how much), and what to do. `run_checks` runs every check
in its own short transaction under a statement timeout; a check whose queries time out or are
refused reports "unknown" (not available) and the others still run.

Checks read the server; they do not change it. The one write is the advisor's own memory
(`skiplock.advisor_snapshots`): readings of cumulative counters kept so the next run can turn
them into rates. docs/advisor.md explains every check (anchors are the check ids).

The checks live in one module per family (the areas the advisor page shows, in this order):
`claim_path`, `locks`, `leases`, `retries`, `hygiene`, `multixact`, `server`; what they share
(results, `Probe`, formatting) is in `console.advisor.base`. This module lists the families,
runs the checks and re-exports the names callers use.

This module does not render anything (the CLI and the web page do) and does not decide the
long-term verdict (`console.advisor.verdict` does, from stored samples).
"""


from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import psycopg

from console.advisor import claim_path, hygiene, leases, locks, multixact, retries, server
from console.advisor.base import (
    FAIL,
    OK,
    STATUSES,
    UNKNOWN,
    WARN,
    Check,
    CheckResult,
    Family,
    Outcome,
    Probe,
    Report,
    UnknownCheck,
)
from console.advisor.locks import waits_for_rows
from console.config import Config, load_config
from console.db import require_schema, time_limited

log = logging.getLogger(__name__)

FAMILIES: tuple[Family, ...] = (claim_path.FAMILY, locks.FAMILY, leases.FAMILY, retries.FAMILY, hygiene.FAMILY,
                                multixact.FAMILY, server.FAMILY)
CHECKS: list[Check] = [chk for family in FAMILIES for chk in family.checks]
AREAS = tuple(family.area for family in FAMILIES)

__all__ = ["AREAS", "CHECKS", "FAIL", "FAMILIES", "OK", "STATUSES", "UNKNOWN", "WARN", "Check", "CheckResult",
           "Outcome", "Probe", "Report", "UnknownCheck", "check_ids", "run_checks", "run_one", "waits_for_rows"]


def check_ids() -> list[str]:
    return [c.id for c in CHECKS]


def run_checks(
    conn: psycopg.Connection,
    config: Config | None = None,
    *,
    only: Iterable[str] | None = None,
    timeout_ms: int | None = None,
) -> Report:
    """Run the checks (all, or those named in `only`) and return the report.

    `conn` should be autocommit: each check is its own short transaction, so statistics are
    fresh for each and nothing stays open between them.
    """
    config = config or load_config()
    wanted = list(only) if only else None
    if wanted:
        unknown = [name for name in wanted if name not in check_ids()]
        if unknown:
            raise UnknownCheck(f"unknown check {', '.join(unknown)}; known checks: {', '.join(check_ids())}")
    require_schema(conn)
    timeout_ms = timeout_ms or config.database.statement_timeout_ms
    results = []
    for chk in CHECKS:
        if wanted and chk.id not in wanted:
            continue
        results.append(run_one(conn, chk, config, timeout_ms))
    return Report(results, database=conn.info.dbname, server_version=conn.info.server_version)


def run_one(conn: psycopg.Connection, chk: Check, config: Config, timeout_ms: int) -> CheckResult:
    started = time.perf_counter()
    try:
        with time_limited(conn, timeout_ms) as cur:
            outcome = chk.func(Probe(cur, config))
    except psycopg.errors.QueryCanceled:
        outcome = Outcome(UNKNOWN, f"not available: the check's queries took longer than {timeout_ms} ms",
                          remedy="Run the check again when the database is less busy, or raise database.statement_timeout_ms.")
    except psycopg.errors.LockNotAvailable:
        outcome = Outcome(UNKNOWN, "not available: the check waited on a lock (a DDL statement holds the jobs table?)")
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        outcome = Outcome(UNKNOWN, f"not available: {first}")
    except Exception as exc:  # a bug in one check must not take the report down
        log.exception("advisor check %s failed", chk.id)
        outcome = Outcome(UNKNOWN, f"not available: the check itself failed ({exc.__class__.__name__}: {exc})")
    elapsed = (time.perf_counter() - started) * 1000.0
    return CheckResult(chk.id, chk.title, chk.area, outcome.status, outcome.summary, outcome.evidence,
                       outcome.remedy, chk.docs, _jsonable(outcome.data), round(elapsed, 1), chk.system, chk.external)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
