"""Periodic (cron) jobs: each schedule in words, its last run and outcome, next run and missed
slots, with pause/resume and "run now" for operators.

GET  /periodic, /periodic/_table (the polled fragment), /api/v1/periodic
POST /periodic/<name>/pause, /resume, /run (operator; CSRF; audited by console.queue.periodic with the
form's `reason`) and the same under /api/v1/periodic/<name>/...

The page reads `skiplock.periodic`, which the scheduler leader keeps: a schedule appears once a
scheduler that declares it has run. It does not parse the config's schedules itself.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console.actions import clean_reason
from console.queue import periodic
from console.web.api import BOOL, INT, NUM, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn, run_panel
from console.web.redact import payload_for

bp = Blueprint("periodic", __name__)

SCHEDULE = obj({
    "name": STR, "kind": STR, "queue": STR, "payload": {},
    "schedule": {**STR, "description": "the schedule in words, or the cron text"},
    "expression": {**STR, "description": "the cron expression, or `every N s`"},
    "cron": opt(STR), "every_seconds": opt(INT), "timezone": STR, "catch_up": BOOL,
    "interval_seconds": {**NUM, "description": "longest gap between two slots"},
    "source": {"enum": ["config", "code"]},
    "paused": BOOL, "paused_at": opt(TIME), "paused_by": opt(STR),
    "last_slot": opt(TIME), "next_slot": opt(TIME),
    "missed": {**INT, "description": "slots skipped while paused or after downtime with catch_up = false"},
    "last_success_at": opt(TIME), "last_success_age_seconds": opt(NUM),
    "last_run_slot": opt(TIME), "last_run_manual": opt(BOOL), "last_run_at": opt(TIME), "last_run_job_id": opt(INT),
    "last_run_status": {"anyOf": [{"enum": ["pending", "running", "completed", "failed", "gone"]}, {"type": "null"}],
                        "description": "the newest run's job state (null before the first run)"},
    "late": {**BOOL, "description": "not paused and no success within twice the interval"},
    "created_at": TIME, "now": TIME,
})
REASON = Param("reason", where="form", description="why (kept in the audit log; first 500 characters)")


def periodic_data() -> dict[str, Any]:
    listed = run_panel(periodic.list_schedules)
    # A schedule's payload is the payload of every job it enqueues: redacted like one.
    rows = [{**r, "payload": payload_for(r.get("payload"), g.user)} for r in listed.data] if listed.ok else []
    late = sum(1 for r in rows if r["late"])
    paused = sum(1 for r in rows if r["paused"])
    bits = ([f"{late} late"] if late else []) + ([f"{paused} paused"] if paused else [])
    return {"schedules": rows, "available": listed.ok, "error": listed.error, "tab_state": " · ".join(bits)}


@bp.get("/periodic")
@requires("viewer")
def index():
    return render_template("periodic/index.html", **periodic_data())


@bp.get("/periodic/_table")
@requires("viewer")
def table():
    return render_template("periodic/_table.html", **periodic_data())


@bp.get("/api/v1/periodic")
@requires("viewer")
@api_doc("Periodic (cron) schedules: schedule in words, last run and its outcome, next run, missed slots, late",
         description="One entry per live schedule, ordered by name. `available` is false (and `error` says why) "
                     "when the query timed out; `schedules` is then empty.",
         response=obj({"schedules": arr(SCHEDULE), "available": BOOL, "error": opt(STR), "tab_state": STR}))
def api_index():
    return jsonify(periodic_data())


def _act(name: str, action: str) -> int | None:
    reason = clean_reason(request.form.get("reason"))  # console.actions' rule (400 when it says nothing)
    conn = get_conn()
    try:
        if action == "run":
            return periodic.run_now(conn, name, actor=g.user.name, reason=reason)
        periodic.set_paused(conn, name, action == "pause", actor=g.user.name, reason=reason)
    except periodic.PeriodicError as exc:
        abort(404, str(exc))
    return None


def _page_answer():
    if request.headers.get("HX-Request"):
        return table()
    return redirect(url_for("periodic.index"))


@bp.post("/periodic/<name>/pause")
@requires("operator")
def pause(name: str):
    _act(name, "pause")
    return _page_answer()


@bp.post("/periodic/<name>/resume")
@requires("operator")
def resume(name: str):
    _act(name, "resume")
    return _page_answer()


@bp.post("/periodic/<name>/run")
@requires("operator")
def run(name: str):
    _act(name, "run")
    return _page_answer()


_ACTION = obj({"ok": BOOL, "name": STR, "paused": BOOL})


@bp.post("/api/v1/periodic/<name>/pause")
@requires("operator")
@api_doc("Pause a periodic schedule: its slots are counted as missed, not enqueued (audited)", params=[REASON],
         responses={"404": "no such periodic schedule"}, response=_ACTION)
def api_pause(name: str):
    _act(name, "pause")
    return jsonify({"ok": True, "name": name, "paused": True})


@bp.post("/api/v1/periodic/<name>/resume")
@requires("operator")
@api_doc("Resume a paused periodic schedule from its next slot (audited)", params=[REASON],
         responses={"404": "no such periodic schedule"}, response=_ACTION)
def api_resume(name: str):
    _act(name, "resume")
    return jsonify({"ok": True, "name": name, "paused": False})


@bp.post("/api/v1/periodic/<name>/run")
@requires("operator")
@api_doc("Run a periodic schedule's job now, outside its slots (audited); answers the new job's id", params=[REASON],
         responses={"404": "no such periodic schedule"}, status=201,
         response=obj({"ok": BOOL, "name": STR, "job_id": INT}))
def api_run(name: str):
    job_id = _act(name, "run")
    return jsonify({"ok": True, "name": name, "job_id": job_id}), 201

