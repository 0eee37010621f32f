"""The fleet: one row per configured database (`/databases`, `/api/v1/databases`).

Each database is read in its own thread, in its own app context bound to that database's pool
(`console.web.database.use_database`), its queries under the console's statement timeout: a
database that is down waits at most `web.db_wait` for a connection and shows as down, and
the others' rows are computed meanwhile, not after it. The figures come from each database's
own newest samples (the scheduler collects every database into its own samples) and its own
firing alerts; nothing is cached.

Rows read each database's primary; a database with `replica_dsn` also gets its replica's
state and lag (`replica_probe`, asked on the replica).

It does not act on any database (no route here changes anything) and does not scope the other
pages to a database.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from flask import Blueprint, copy_current_request_context, jsonify, render_template
from psycopg_pool import PoolTimeout

from console.web.api import BOOL, INT, NUM, STR, TIME, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import DatabaseUnreachable, replica_probe, run_panel, use_database
from console.web.errors import failure_reason

log = logging.getLogger(__name__)

bp = Blueprint("fleet", __name__)

DEPTH_STATES = ("eligible", "scheduled", "running")  # queue_depth's states that are live work


def _state():
    from console.web import state

    return state()


def database_row(name: str) -> dict[str, Any]:
    """One database's row, read through its own pool (call inside an app context of its own)."""
    from console.web.overview import _latest, default_judge, firing_alerts, load_judge, verdict

    t0 = time.perf_counter()
    row: dict[str, Any] = {"name": name, "reachable": False, "error": None, "verdict": "unknown", "reasons": [],
                           "depth": None, "oldest_job_s": None, "dead_letters": None, "firing_alerts": None,
                           "collected_at": None}
    use_database(name)
    # Measured on the replica itself, whatever happens to the primary below (bounded: a
    # replica that does not answer within REPLICA_WAIT_S is "unreachable").
    row["replica"] = replica_probe(name)
    try:
        latest = run_panel(_latest)
        row["reachable"] = True
        alerts = run_panel(firing_alerts)
        judged = run_panel(load_judge)
        judge = judged.data if judged.ok else default_judge()
        if alerts.ok and alerts.data is not None:
            row["firing_alerts"] = len(alerts.data)
        if latest.ok:
            data = latest.data
            depths = [data.total("queue_depth", state=s) for s in DEPTH_STATES]
            row["depth"] = sum(d for d in depths if d is not None) if any(d is not None for d in depths) else None
            row["oldest_job_s"] = data.most("queue_age_seconds")
            row["dead_letters"] = data.total("dead_letters")
            newest = data.newest()
            row["collected_at"] = newest.isoformat() if newest else None
            judged_verdict = run_panel(verdict, data, alerts.data if alerts.ok else "load", judge)
            if judged_verdict.ok:
                row["verdict"] = judged_verdict.data["state"]
                row["reasons"] = list(judged_verdict.data["reasons"])
            else:
                row["error"] = f"verdict not available: {judged_verdict.error}"
        else:
            row["error"] = f"samples not available: {latest.error}"
    except (DatabaseUnreachable, PoolTimeout, psycopg.OperationalError) as exc:
        log.warning("database %s unreachable: %s", name, failure_reason(exc))
        row["reachable"] = False
        row["verdict"] = "down"
        row["error"] = "unreachable" if isinstance(exc, DatabaseUnreachable | PoolTimeout) else "connection lost"
    row["ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
    return row


def fleet_data() -> list[dict[str, Any]]:
    """Every configured database's row, in config order, read in parallel."""
    names = _state().databases.names
    # Each call runs in a copy of this request's context with an app context of its own, so its
    # `g` (and the connection it borrows) is its own. Wrapped here, in the request's thread.
    calls = [copy_current_request_context(functools.partial(database_row, name)) for name in names]
    # Always in a thread, even for one database: in this thread the copy would share the
    # request's app context, whose connection (the sign-in check's) is already borrowed.
    with ThreadPoolExecutor(max_workers=min(len(calls), 16), thread_name_prefix="skiplock-fleet") as pool:
        return list(pool.map(lambda call: call(), calls))


ROW = obj({"name": STR, "reachable": BOOL, "error": opt(STR),
           "verdict": {"enum": ["healthy", "degraded", "failing", "unknown", "down"]}, "reasons": arr(STR),
           "depth": opt(NUM), "oldest_job_s": opt(NUM), "dead_letters": opt(NUM), "firing_alerts": opt(INT),
           "collected_at": opt(TIME), "ms": NUM,
           "replica": obj({"configured": BOOL, "reachable": opt(BOOL), "lag_seconds": opt(NUM)})})


@bp.get("/databases")
@requires("viewer")
def index():
    rows = fleet_data()
    down = sum(1 for r in rows if not r["reachable"])
    return render_template("fleet/index.html", rows=rows, tab_state=f"{down} down" if down else "")


@bp.get("/api/v1/databases")
@requires("viewer")
@api_doc("Every configured database: reachable, verdict, depth, oldest job, dead letters, firing alerts",
         description="One row per [[databases]] entry (or `default`), in config order, each read in parallel "
                     "under its own time limits. A database that cannot be reached within web.db_wait has "
                     "reachable false and verdict `down`; its figures are null. depth sums the eligible, "
                     "scheduled and running jobs of the newest samples; oldest_job_s is the oldest eligible "
                     "job's age; ms is how long that database's row took. The figures are the primary's; "
                     "replica is the replica_dsn's state (configured false: none; reachable null then), "
                     "its lag_seconds measured on the replica (0 when it has replayed all it received).",
         response=obj({"databases": arr(ROW)}))
def api_index():
    return jsonify({"databases": fleet_data()})
