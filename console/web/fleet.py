"""The fleet: one row per configured database (`/databases`, `/api/v1/databases`).

Each database is read in its own thread, in its own app context bound to that database's pool
(`console.web.database.use_database`), its queries under the console's statement timeout: a
database that is down waits at most `web.db_wait` for a connection and shows as down, and
the others' rows are computed meanwhile, not after it. The figures come from each database's
own newest samples (the scheduler collects every database into its own samples) and its own
firing alerts.

Reading fifty databases took 1.8 s, so a crowd looking at the fleet during an incident read
every database once per request (issue 31 target 5). The rows are read once per
`web.fleet_seconds` bucket of the process's clock and shown to every request of that bucket
(a `CycleCache` of their own, `fleet_cache`; `reads` counts the reads): when the bucket moves,
the first request reads them again while the requests arriving meanwhile are shown the previous
rows, if that read began less than twice `fleet_seconds` ago; else they wait for the read.
So rows are never older than 2 x `fleet_seconds`, each says when it was read (`read_at`; the
page says "read N s ago", the API `age_s`), and a database that goes down shows as down within
one bucket and its `db_wait`. Every row is kept, a down or slow database's too: it is the
answer, and a crowd must not read the fleet again per request because one database is down.
`fleet_seconds = 0` reads every database on every request.

The read holds nothing of the request that ran it: each database's thread runs in an app
context of its own (no request context, so no session nor sign-in), and the rows are plain
values nobody changes once cached, shown to every viewer (they do not depend on who asks).

Rows read each database's primary; a database with `replica_dsn` also gets its replica's
state and lag (`replica_probe`, asked on the replica).

It does not act on any database (no route here changes anything) and does not scope the other
pages to a database.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psycopg
from flask import Blueprint, Flask, current_app, jsonify, render_template
from psycopg_pool import PoolTimeout

from console.web import cycle
from console.web.api import BOOL, INT, NUM, STR, TIME, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import (
    DatabaseUnreachable,
    release,
    replica_probe,
    run_panel,
    use_database,
)
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
                           "collected_at": None, "read_at": datetime.now(UTC).isoformat()}
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


def clock() -> float:
    """The seconds the buckets and the rows' ages are counted in (tests move it)."""
    return time.monotonic()


_reads_lock = threading.Lock()
reads = 0  # how many times this process read every database (tests and the bench read it)


def read_fleet(app: Flask, names: list[str]) -> dict[str, Any]:
    """Every database's row, in config order, read in parallel: {"rows", "started"} (`clock()`
    when the read began). Needs no request: each database is read in an app context of its own."""
    global reads
    with _reads_lock:
        reads += 1
    started = clock()

    def one(name: str) -> dict[str, Any]:
        # Its own app context, so its own `g` and the connection it borrows (given back when the
        # context ends); never the request's, whose connection (the sign-in check's) is borrowed.
        with app.app_context():
            return database_row(name)

    with ThreadPoolExecutor(max_workers=min(len(names), 16), thread_name_prefix="skiplock-fleet") as pool:
        rows = list(pool.map(one, names))
    return {"rows": rows, "started": started}


def fleet_seconds() -> float:
    return float(_state().config.web.fleet_seconds)


def fleet_cache() -> cycle.CycleCache:
    """This process's fleet read, by bucket: one slot; the previous read is shown while the next
    runs if it began less than 2 x fleet_seconds ago."""
    extra = _state().extra
    found = extra.get("fleet_cache")
    if found is None:
        found = extra.setdefault("fleet_cache", cycle.CycleCache(
            size=1, stale_seconds=2 * fleet_seconds(), clock=lambda: clock(), age_from_start=True))
    return found


def fleet_read() -> tuple[dict[str, Any], cycle.Generation | None]:
    """(the read the request is shown, its bucket's generation; None when not cached)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    names = list(_state().databases.names)
    seconds = fleet_seconds()
    # The request's own connection (its sign-in check's) is not needed while the fleet is read
    # or while it waits for another request's read: given back, a crowd cannot empty the pool.
    release()
    if seconds <= 0:
        return read_fleet(app, names), None
    bucket = cycle.Generation("", False, ("fleet", int(clock() // seconds)))
    return fleet_cache().get(("fleet",), bucket, lambda: read_fleet(app, names))


def fleet_data() -> list[dict[str, Any]]:
    """Every configured database's row, in config order (cached: `fleet_read`)."""
    return fleet_read()[0]["rows"]


def _age(read: dict[str, Any]) -> float:
    return round(max(0.0, clock() - read["started"]), 1)


ROW = obj({"name": STR, "reachable": BOOL, "error": opt(STR),
           "verdict": {"enum": ["healthy", "degraded", "failing", "unknown", "down"]}, "reasons": arr(STR),
           "depth": opt(NUM), "oldest_job_s": opt(NUM), "dead_letters": opt(NUM), "firing_alerts": opt(INT),
           "collected_at": opt(TIME), "read_at": TIME, "ms": NUM,
           "replica": obj({"configured": BOOL, "reachable": opt(BOOL), "lag_seconds": opt(NUM)})})


@bp.get("/databases")
@requires("viewer")
def index():
    read, _ = fleet_read()
    rows = read["rows"]
    down = sum(1 for r in rows if not r["reachable"])
    return render_template("fleet/index.html", rows=rows, age_s=_age(read), fleet_seconds=fleet_seconds(),
                           tab_state=f"{down} down" if down else "")


@bp.get("/api/v1/databases")
@requires("viewer")
@api_doc("Every configured database: reachable, verdict, depth, oldest job, dead letters, firing alerts",
         description="One row per [[databases]] entry (or `default`), in config order, each read in parallel "
                     "under its own time limits. A database that cannot be reached within web.db_wait has "
                     "reachable false and verdict `down`; its figures are null. depth sums the eligible, "
                     "scheduled and running jobs of the newest samples; oldest_job_s is the oldest eligible "
                     "job's age; ms is how long that database's row took. The figures are the primary's; "
                     "replica is the replica_dsn's state (configured false: none; reachable null then), "
                     "its lag_seconds measured on the replica (0 when it has replayed all it received). "
                     "Each web process reads the databases once per web.fleet_seconds and shows that read "
                     "to every request meanwhile: read_at is when a row was read, age_s how many seconds "
                     "ago the read began (never more than max_age_s, twice web.fleet_seconds). A client "
                     "sending the ETag of its last answer gets 304 until the next read.",
         response=obj({"databases": arr(ROW), "age_s": NUM, "max_age_s": NUM}))
def api_index():
    read, shown = fleet_read()

    def render():
        return jsonify({"databases": read["rows"], "age_s": _age(read), "max_age_s": 2 * fleet_seconds()})

    return render() if shown is None else cycle.respond(shown, render)
