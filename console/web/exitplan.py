"""The exit plan of one queue and its move, in the console and the API (issue 32; docs/exit-plan.md).

GET  /queues/<name>/exit-plan            the plan (console.exitplan.plan, the model `skiplock exit-plan`
                                         prints): the verdict and its signals, the queue's own claim
                                         latency, the backend, the dual run (bounded counts, "+" a lower
                                         bound) and the numbered steps with their commands and marks; for
                                         operators, the "Move to NATS" / "Move back to PostgreSQL" form.
POST /queues/<name>/move                 that form (operator; CSRF; `to`, `reason` required, 422 without;
                                         audited as 'move queue' by console.exitplan.move, the function
                                         `skiplock queues move` calls): a redirect to the plan with a
                                         message; a move to the backend the queue has changes nothing.
GET  /api/v1/queues/<name>/exit-plan     the plan as JSON, the shape of `skiplock exit-plan --json`.
POST /api/v1/queues/<name>/move          the move (operator; `to`, `reason`; form or JSON body): the
                                         shape of `skiplock queues move --json`.

A name no queue has is a 404 naming the nearest ones (the CLI's exit code 2); a queue is not
created from here (`skiplock queues move --create` does that). What it will not do: read the
broker. Like the command line, the plan sees PostgreSQL only; the steps that depend on the
broker say "check".
"""

from __future__ import annotations

from typing import Any, NoReturn

from flask import (
    Blueprint,
    abort,
    flash,
    get_flashed_messages,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)

from console import exitplan
from console.actions import MAX_REASON, ReasonRequired
from console.maintenance import UnknownQueue
from console.queue import broker
from console.web import state
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, NUM, STR, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import primary_conn, run_limited, run_panel

bp = Blueprint("exitplan", __name__)

LEVEL_CLASS = {"ok": "good", "watch": "warn", "outgrowing": "bad", "unknown": "na"}
STATE_CLASS = {exitplan.DONE: "good", exitplan.TODO: "warn", exitplan.CHECK: "na", exitplan.IF_NEEDED: "muted"}
BACKEND = {"enum": list(broker.BACKENDS)}
COUNTS = obj({"pending": INT, "scheduled": INT, "running": INT, "stuck": INT, "failed": INT, "capped": BOOL,
              "failed_capped": BOOL})
DUAL_RUN = obj({"queue": STR, "backend": BACKEND, "jobs": COUNTS,
                "outbox": obj({"unsent": INT, "waiting": INT, "capped": BOOL, "oldest": opt(STR)}),
                "old_side": BACKEND, "left": INT, "drained": opt(BOOL), "text": STR})
SIGNAL = obj({"id": STR, "name": STR, "level": {"enum": ["ok", "watch", "outgrowing", "unknown"]}, "text": STR,
              "scope": {"enum": ["database", "queue"]}, "history_seconds": NUM, "instants": INT, "cause": opt(STR)})
STEP = obj({"number": INT, "title": STR, "commands": arr(STR),
            "state": {"enum": [exitplan.DONE, exitplan.TODO, exitplan.CHECK, exitplan.IF_NEEDED]}, "note": STR})
PLAN = obj({"queue": STR, "backend": BACKEND,
            "verdict": obj({"label": STR, "level": STR, "headline": STR, "history_seconds": opt(NUM),
                            "enough_history": BOOL}),
            "signals": arr(SIGNAL), "dual_run": DUAL_RUN, "steps": arr(STEP), "advice": STR})
MOVED = obj({"queue": STR, "before": BACKEND, "after": BACKEND, "changed": BOOL, "dual_run": DUAL_RUN})


def _plan(conn, name: str) -> dict[str, Any]:
    config = state().config
    return exitplan.plan(conn, name, nats_url=config.broker.nats_url,
                         timeout_ms=config.database.statement_timeout_ms).to_dict()


def _unknown(exc: UnknownQueue) -> NoReturn:
    abort(404, str(exc).replace("(skiplock queues list)", "(the Queues page)"))


def _page(name: str, *, move_error: str | None = None, move_form: dict[str, Any] | None = None) -> str:
    """The plan page; `move_error` and `move_form` bring the move form back as it was typed."""
    try:
        panel = run_panel(_plan, name)
    except UnknownQueue as exc:
        _unknown(exc)
    plan = panel.data if panel.ok else None
    signals = (plan or {}).get("signals", [])
    return render_template("exitplan/page.html", name=name, plan=plan, error=panel.error,
                           database_signals=[s for s in signals if s["scope"] == "database"],
                           own=next((s for s in signals if s["scope"] == "queue"), None),
                           level_class=LEVEL_CLASS, state_class=STATE_CLASS, move_error=move_error,
                           move_form=move_form or {}, messages=get_flashed_messages(with_categories=True))


@bp.get("/queues/<name>/exit-plan")
@requires("viewer")
def page(name: str):
    return _page(name)


def _move_input() -> dict[str, Any]:
    """{to, reason} from a JSON body or a form; ValueError (400) for a malformed one."""
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object: {to, reason}")
    else:
        body = {k: v for k, v in request.form.items() if k in ("to", "reason")}
    to = body.get("to")
    if to is None or to == "":
        raise ValueError(f"to: required, one of {', '.join(broker.BACKENDS)}")
    if not isinstance(to, str) or to not in broker.BACKENDS:
        raise ValueError(f"to: must be one of {', '.join(broker.BACKENDS)} (got {to!r})")
    return {"to": to, "reason": body.get("reason")}


def _move(name: str) -> dict[str, Any]:
    """The move, checked in the order nothing changes before: the backend and the name (400),
    the reason (422), the queue (404); then console.exitplan.move, audited with the actor."""
    data = _move_input()
    broker.check_backend(name, data["to"])
    reason = reason_for("queue_move", data)
    try:
        return exitplan.move(primary_conn(), name, data["to"], actor=actor(), reason=reason or "")
    except UnknownQueue as exc:
        _unknown(exc)


@bp.post("/queues/<name>/move")
@requires("operator")
def move(name: str):
    try:
        result = _move(name)
    except ValueError as exc:  # ReasonRequired (422), a bad `to` or name (400): the page again, as typed
        typed = {k: v for k, v in request.form.items() if k in ("to", "reason")}
        status = 422 if isinstance(exc, ReasonRequired) else 400
        return _page(name, move_error=str(exc), move_form=typed), status
    if result["changed"]:
        where = "the outbox, published by `skiplock relay`" if result["after"] == "nats" else "skiplock.jobs"
        flash(f"Queue {name!r} moved to {result['after']} (was: {result['before']}); new jobs go to {where}. "
              f"{result['dual_run']['text']}", "good")
    else:
        flash(f"Queue {name!r} is already served by {result['after']}: nothing changed (no audit row).", "muted")
    return redirect(url_for("exitplan.page", name=name), 303)


@bp.get("/api/v1/queues/<name>/exit-plan")
@requires("viewer")
@api_doc("The exit plan of one queue: the advisor's verdict and signals, the backend, the dual run and the steps",
         description="The model `skiplock exit-plan QUEUE --json` prints (docs/exit-plan.md): `signals` are the "
                     "verdict's (scope `database`) and the queue's own claim latency (scope `queue`); `dual_run` "
                     "counts the queue's jobs in skiplock.jobs and its unsent outbox rows (bounded: `capped` means "
                     "a lower bound); `steps` are numbered, each `done`, `to do`, `check` (look yourself) or "
                     "`if needed`. It reads and changes nothing.",
         responses={"400": "a blank queue name",
                    "404": "no queue has that name (no jobs, samples or limits, never paused); the message names "
                           "the nearest"},
         response=PLAN)
def api_plan(name: str):
    try:
        return jsonify(run_limited(_plan, name))
    except UnknownQueue as exc:
        _unknown(exc)


@bp.post("/api/v1/queues/<name>/move")
@requires("operator")
@api_doc("Move a queue's new jobs to NATS JetStream or back to PostgreSQL, with a dual-run window (audited)",
         description="What `skiplock queues move QUEUE --to nats|postgres` does: new jobs go to the new backend at "
                     "once, the old side's workers finish what it holds (`dual_run`). Audited as `move queue` with "
                     "the reason and what the old side still held. A move to the backend the queue already has "
                     "changes nothing and writes no audit row (`changed: false`). A queue moved to nats needs a "
                     "name of letters, digits, `_` or `-`.",
         params=[Param("to", where="form", required=True, enum=tuple(broker.BACKENDS),
                       description="the backend that serves the queue's new jobs from now on"),
                 Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         body=obj({"to": BACKEND, "reason": STR}),
         responses={"404": "no queue has that name (no jobs, samples or limits, never paused); the message names "
                           "the nearest", "422": "no reason"},
         response=MOVED)
def api_move(name: str):
    return jsonify(_move(name))
