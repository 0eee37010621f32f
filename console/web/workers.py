"""Workers: live processes, last seen, throughput, claim latency, in-flight jobs; stale ones
(no heartbeat for web.stale_worker_after seconds) are highlighted.

GET /workers, /workers/_table (polled fragment), /api/v1/workers
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template

from console import browse
from console.web.api import INT, NUM, OBJ, STR, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import run_panel

bp = Blueprint("workers", __name__)


def workers_data() -> dict[str, Any]:
    from console.web import state

    stale_after = state().config.web.stale_worker_after
    listing = run_panel(browse.workers, stale_after=stale_after)
    running = run_panel(browse.running_jobs)
    rows = listing.data if listing.ok else []
    live = [w for w in rows if not w["stopped"] and not w["stale"]]
    stale = [w for w in rows if w["stale"]]
    return {
        "workers": rows,
        "workers_error": listing.error,
        "running": running.data if running.ok else [],
        "running_error": running.error,
        "live": len(live),
        "stale": len(stale),
        "in_flight": sum(w["in_flight"] for w in live),
        "stale_after": stale_after,
        "tab_state": f"{len(stale)} stale" if stale else ("no workers" if listing.ok and not live else ""),
    }


@bp.get("/workers")
@requires("viewer")
def index():
    return render_template("workers/index.html", **workers_data())


@bp.get("/workers/_table")
@requires("viewer")
def table():
    return render_template("workers/_table.html", **workers_data())


@bp.get("/api/v1/workers")
@requires("viewer")
@api_doc("Workers (live and stopped within the hour) with counters, throughput, claim latency, stale flag; running jobs",
         response=obj({"workers": arr(OBJ), "workers_error": opt(STR), "running": arr(obj({"id": INT, "queue": STR})),
                       "running_error": opt(STR), "live": INT, "stale": INT, "in_flight": INT, "stale_after": NUM}))
def api_index():
    return jsonify(workers_data())
