"""The maintenance page: the last and recent runs of the reaper, archiver and retention, recent
bulk replays/purges, "run now" buttons, the current settings (secrets masked) and, when the
scheduler records itself, its health.

GET  /maintenance                 the page
POST /maintenance/run/<task>      reap | archive now (operator; audited by console.maintenance)
and the same under /api/v1/maintenance.

A "run now" starts the task in a background thread on its own connection and returns at
once; the run appears as a 'running' row and its end is recorded by console.maintenance
(run row + audit row). The archiver's run-now is bounded (`RUN_NOW_MAX_BATCHES`) so a button
press never becomes an hour-long sweep; the scheduler keeps doing the rest.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console import maintenance as m
from console.config import SETTINGS
from console.db import connect
from console.maintenance import runs
from console.timefmt import duration
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt, panel, ref
from console.web.auth import requires
from console.web.database import run_panel

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
    return {
        "tasks": run_panel(_task_summary),
        "runs": run_panel(runs.recent, limit=50),
        "operations": run_panel(m.recent_operations, limit=20),
        "scheduler": run_panel(_scheduler),
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
                       "settings": arr(obj({"section": STR, "key": STR, "display": STR, "secret": BOOL}))}))
def api_index():
    data = maintenance_data()
    return jsonify({k: (_panel(v) if k != "settings" else v) for k, v in data.items()})


def _run_in_background(task: str, actor: str, reason: str | None) -> threading.Thread:
    st = _state()
    dsn, settings = st.dsn, m.MaintenanceSettings.from_config(st.config)

    def target() -> None:
        try:
            with connect(dsn, application_name=f"skiplock-web-{task}") as conn:
                if task == "reap":
                    m.reap(conn, actor=actor, reason=reason, batch_size=settings.batch_size)
                else:
                    m.archive_completed(conn, actor=actor, reason=reason, max_batches=RUN_NOW_MAX_BATCHES,
                                        **settings.archive_kwargs())
        except Exception:
            log.exception("%s now (by %s) failed", task, actor)

    thread = threading.Thread(target=target, name=f"skiplock-{task}-now", daemon=True)
    thread.start()
    return thread


def run_now(task: str) -> dict[str, Any]:
    if task not in RUN_NOW:
        abort(404, f"no task {task!r} to run now; tasks: {', '.join(RUN_NOW)}")
    reason = (request.form.get("reason") or "").strip()
    if len(reason) > 500:
        abort(400, "reason: at most 500 characters")
    thread = _run_in_background(task, g.user.name, reason or None)
    return {"task": task, "started": True, "thread": thread.name}


@bp.post("/maintenance/run/<task>")
@requires("operator")
def run(task: str):
    run_now(task)
    return redirect(url_for("maintenance.index"), 303)


@bp.post("/api/v1/maintenance/run/<task>")
@requires("operator")
@api_doc("Run reap or archive now, in the background (the run shows in the maintenance runs; audited)",
         params=[Param("task", where="path", enum=RUN_NOW), Param("reason", where="form", max_length=500)],
         status=202, responses={"202": "started", "404": "no such task"},
         response=obj({"task": {"enum": list(RUN_NOW)}, "started": BOOL}))
def api_run(task: str):
    out = run_now(task)
    out.pop("thread")
    return jsonify(out), 202
