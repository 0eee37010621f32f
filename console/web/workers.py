"""Workers: live processes, what each runs (Skiplock's version, the application's release: null
from a worker of an earlier release or when `[worker] release` is unset), last seen,
throughput, claim latency, in-flight jobs; stale ones
(no heartbeat within console.signals.live_worker_within: web.stale_worker_after, at least three
flush intervals, as the workers_live metric counts them) are highlighted.

GET /workers, /workers/_table (polled fragment), /api/v1/workers
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template

from console import browse, signals
from console.web.api import INT, NUM, OBJ, STR, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import run_panel

bp = Blueprint("workers", __name__)


def workers_data() -> dict[str, Any]:
    from console.web import state

    stale_after = signals.live_worker_within(state().config)
    listing = run_panel(browse.workers, stale_after=stale_after)
    running = run_panel(browse.running_jobs)
    rows = listing.data if listing.ok else []
    live = [w for w in rows if not w["stopped"] and not w["stale"]]
    stale = [w for w in rows if w["stale"]]
    # What a worker that is gone still holds: its running jobs, until the reaper rescues them.
    held: dict[str, int] = {}
    for job in running.data if running.ok else []:
        held[job["locked_by"]] = held.get(job["locked_by"], 0) + 1
    # The running jobs come from the jobs table, the registry's in_flight from a row each worker
    # writes once per flush: a worker that just claimed showed 0 in flight beside the jobs it
    # held. When the list is whole, a live worker's in flight is what it holds in the table (a
    # broker worker's jobs are in its stream, not the table: its own count stands).
    whole = running.ok and len(running.data) < browse.RUNNING_SHOWN
    for w in rows:
        w["held"] = held.get(w["id"], 0)
        if whole and not w["stale"] and not w["stopped"] and w["backend"] == "postgres":
            w["in_flight"] = w["held"]
    return {
        "workers": rows,
        "workers_error": listing.error,
        "running": running.data if running.ok else [],
        "running_error": running.error,
        "live": len(live),
        "stale": len(stale),
        "in_flight": sum(w["in_flight"] for w in live),
        # said beside in_flight: the running jobs below list them too until the reaper runs
        "held_by_gone": sum(w["held"] for w in rows if w["stale"] or w["stopped"]),
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
@api_doc("Workers (live and stopped within the hour) with counters, throughput, claim latency, stale flag, the "
         "Skiplock `version` and application `release` each runs (null when not reported); running jobs; `in_flight` "
         "counts the live workers' jobs, `held_by_gone` the running jobs stale or stopped workers still hold",
         response=obj({"workers": arr(OBJ), "workers_error": opt(STR), "running": arr(obj({"id": INT, "queue": STR})),
                       "running_error": opt(STR), "live": INT, "stale": INT, "in_flight": INT, "held_by_gone": INT,
                       "stale_after": NUM}))
def api_index():
    return jsonify(workers_data())
