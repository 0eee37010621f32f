"""The maintenance page: the last and recent runs of the reaper, archiver and retention, recent
bulk replays/purges, "run now" buttons, the current settings (secrets masked), the scheduler's
health (each job's runs, failures and latest failure, kept after later successes) and the
collectors' errors of the last hour with their messages (console.collectors.errors).

GET  /maintenance                 the page
POST /maintenance/run/<task>      reap | archive now (operator; archive needs a reason, 422 without; audited)
and the same under /api/v1/maintenance.

A "run now" takes a connection from the pool and the task's advisory lock on it (409 when the
lock is taken or a run of the task is in progress anywhere, so two gunicorn workers never run
the same task at once), starts the task in a background thread on that connection and returns at
once; the run appears as a 'running' row and its end is recorded by console.maintenance
(run row + audit row). The archiver's run-now is bounded (`RUN_NOW_MAX_BATCHES`) so a button
press never becomes an hour-long sweep; the scheduler keeps doing the rest.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from flask import Blueprint, abort, jsonify, redirect, render_template, url_for
from psycopg_pool import PoolTimeout

from console import maintenance as m
from console.actions import MAX_REASON
from console.config import SETTINGS
from console.maintenance import runs
from console.timefmt import duration
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt, panel, ref
from console.web.auth import requires
from console.web.database import DatabaseUnreachable, run_panel

log = logging.getLogger(__name__)
bp = Blueprint("maintenance", __name__)

RUN_NOW = ("reap", "archive")
RUN_NOW_MAX_BATCHES = 100
TASK_HELP = {
    "reap": "Rescues jobs whose worker stopped heartbeating (expired lease): back to pending, or failed when out of attempts.",
    "archive": "Moves completed jobs older than maintenance.archive_after out of the hot table, so claims stay fast.",
    "retention": "Drops archived jobs older than maintenance.archive_retention (whole day partitions).",
}
# A task whose newest successful run is older than this is shown amber (the scheduler runs
# them every few minutes; retention hourly).
EXPECTED_EVERY = {"reap": timedelta(minutes=10), "archive": timedelta(minutes=30), "retention": timedelta(hours=3)}


def _state():
    from console.web import state

    return state()


def _display(value: Any) -> str:
    if isinstance(value, timedelta):
        return duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return "(empty)"
    return str(value)


def settings_rows() -> list[dict[str, Any]]:
    current = _state().config.as_dict(redact=True)
    out = []
    for s in SETTINGS:
        value = current[s.section][s.key]
        out.append({"section": s.section, "key": s.key, "value": value, "display": _display(value),
                    "default": "********" if s.secret and s.default else _display(s.default),
                    "changed": (value != s.default) if not s.secret else bool(value), "secret": s.secret,
                    "env": s.env_var, "help": s.help})
    return out


def _task_summary(conn) -> list[dict[str, Any]]:
    last = runs.last_by_task(conn)
    now = datetime.now(UTC)
    out = []
    for task in runs.TASKS:
        row = last.get(task)
        if row is None:
            lv, note = "warn", "never run: is the scheduler (skiplock scheduler) running?"
        elif row["outcome"] in ("error", "abandoned"):
            lv, note = "bad", f"the last run ended {row['outcome']}: {row.get('error') or 'its process went away'}"
        elif row["outcome"] == "running":
            lv, note = "good", "running now"
        elif row["finished_at"] and now - row["finished_at"] > EXPECTED_EVERY[task]:
            lv, note = "warn", "no run for a while: is the scheduler (skiplock scheduler) running?"
        else:
            lv, note = "good", "ran recently"
        out.append({"task": task, "help": TASK_HELP[task], "last": row, "level": lv, "note": note})
    return out


def _scheduler(conn) -> dict[str, Any] | None:
    """`console.scheduler.status()` (leader, nodes, jobs) when the scheduler is installed."""
    try:
        from console import scheduler
    except ImportError:
        return None
    status = getattr(scheduler, "status", None)
    return status(conn) if status else None


def maintenance_data() -> dict[str, Any]:
    from console.collectors.errors import recent_errors
    from console.web.deadletters import op_for

    operations = run_panel(m.recent_operations, limit=20)
    if operations.ok:  # a failed one shows its error: redacted for viewers, as on the dead-letters page
        operations.data = [op_for(op) for op in operations.data]
    return {
        "tasks": run_panel(_task_summary),
        "runs": run_panel(runs.recent, limit=50),
        "operations": operations,
        "scheduler": run_panel(_scheduler),
        "collectors": run_panel(recent_errors),
        "settings": settings_rows(),
    }


@bp.get("/maintenance")
@requires("viewer")
def index():
    return render_template("maintenance/index.html", task_help=TASK_HELP, run_now=RUN_NOW, **maintenance_data())


def _panel(p) -> Any:
    return p.data if p.ok else {"available": False, "error": p.error}


@bp.get("/api/v1/maintenance")
@requires("viewer")
@api_doc("Maintenance: the last run of each task with a level, recent runs, recent bulk operations, settings (secrets masked)",
         response=obj({"tasks": panel(arr(obj({"task": STR, "level": STR}))),
                       "runs": panel(arr(obj({"id": INT, "task": STR, "actor": STR, "started_at": TIME,
                                              "finished_at": opt(TIME), "outcome": opt(STR)}))),
                       "operations": panel(arr(ref("Operation"))), "scheduler": panel(opt(OBJ)),
                       "collectors": panel(arr(obj({"kind": {"enum": ["collector", "external"]}, "name": STR,
                                                    "cycles": INT, "errors": INT, "last_error": opt(STR),
                                                    "last_error_at": opt(TIME), "last_cycle_at": TIME,
                                                    "failing_now": BOOL}))),
                       "settings": arr(obj({"section": STR, "key": STR, "display": STR, "secret": BOOL}))}))
def api_index():
    data = maintenance_data()
    return jsonify({k: (_panel(v) if k != "settings" else v) for k, v in data.items()})


def _give_back(conn, task: str | None) -> None:
    """Release the task's lock and return the connection to the pool; a connection that cannot
    say it unlocked is closed, so no lock ever stays behind in the pool."""
    pool = _state().pool
    if task is not None:
        try:
            runs.unlock(conn, task)
        except Exception:  # noqa: BLE001 - closing the session releases its locks
            conn.close()
    pool.putconn(conn)


def _run_in_background(task: str, conn, actor: str, reason: str | None) -> threading.Thread:
    """Run `task` on `conn` (a pool connection holding the task's lock) in a thread; the thread
    gives both back when the run ends."""
    st = _state()
    settings, pool = m.MaintenanceSettings.from_config(st.config), st.pool

    def target() -> None:
        try:
            if task == "reap":
                m.reap(conn, actor=actor, reason=reason, batch_size=settings.batch_size)
            else:
                m.archive_completed(conn, actor=actor, reason=reason, max_batches=RUN_NOW_MAX_BATCHES,
                                    **settings.archive_kwargs())
        except Exception:
            log.exception("%s now (by %s) failed", task, actor)
        finally:
            try:
                runs.unlock(conn, task)
            except Exception:  # noqa: BLE001 - closing the session releases its locks
                conn.close()
            pool.putconn(conn)

    thread = threading.Thread(target=target, name=f"skiplock-{task}-now", daemon=True)
    thread.start()
    return thread


def run_now(task: str) -> dict[str, Any]:
    """Start `task` on a pool connection that holds the task's advisory lock; 409 when a run of
    it is already going (this console's, another web worker's, the scheduler's or the CLI's)."""
    if task not in RUN_NOW:
        abort(404, f"no task {task!r} to run now; tasks: {', '.join(RUN_NOW)}")
    reason = reason_for(task)  # archive by hand needs one (422); reap may leave it empty
    st = _state()
    try:
        conn = st.pool.getconn(timeout=st.config.web.db_wait)
    except PoolTimeout:
        raise DatabaseUnreachable(f"no database connection within {st.config.web.db_wait:g} s") from None
    try:
        if not runs.try_lock(conn, task):
            _give_back(conn, None)
            abort(409, f"{task} is already running (started from the console); wait for it to finish")
        live = runs.live_run(conn, task)
    except psycopg.Error:
        _give_back(conn, task)
        raise
    if live is not None:
        _give_back(conn, task)
        abort(409, f"{task} is already running (run {live['id']} by {live['actor']}, started "
                   f"{live['started_at']:%H:%M:%S} UTC); wait for it to finish")
    thread = _run_in_background(task, conn, actor(), reason)
    return {"task": task, "started": True, "thread": thread.name}


@bp.post("/maintenance/run/<task>")
@requires("operator")
def run(task: str):
    run_now(task)
    return redirect(url_for("maintenance.index"), 303)


@bp.post("/api/v1/maintenance/run/<task>")
@requires("operator")
@api_doc("Run reap or archive now, in the background (the run shows in the maintenance runs; audited)",
         params=[Param("task", where="path", enum=RUN_NOW),
                 Param("reason", where="form", max_length=MAX_REASON,
                       description="why (kept in the audit log); required for archive, optional for reap")],
         status=202, responses={"202": "started", "404": "no such task", "409": "a run of the task is in progress",
                                "422": "archive without a reason"},
         response=obj({"task": {"enum": list(RUN_NOW)}, "started": BOOL}))
def api_run(task: str):
    out = run_now(task)
    out.pop("thread")
    return jsonify(out), 202
