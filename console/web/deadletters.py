"""Dead letters: error groups, the jobs in a group or filter, and replay / purge of one job, a
selection, or a whole group or filter, previewed, with a reason, run in the background with a
progress bar that can be cancelled.

GET  /deadletters                            error groups (filter: queue, kind)
GET  /deadletters/jobs                       dead letters matching fingerprint/queue/kind (checkboxes)
POST /deadletters/preview                    exact count + sample + reason form (operator)
POST /deadletters/operations                 start the bulk operation, run it in a thread (operator)
GET  /deadletters/operations/<id>            its page; /_progress is the polled fragment (HTTP 286 when over)
POST /deadletters/operations/<id>/cancel     stop it between two batches (operator)
POST /deadletters/operations/<id>/resume     reopen a cancelled/failed one, run it on from its cursor (operator, reason)
POST /deadletters/jobs/<id>/<replay|purge>   one job, one click (operator)
POST /deadletters/groups/<ignore|unignore>   an error group never alerts / alerts again (operator, reason)
and the same under /api/v1/deadletters.

Each error group carries what the console remembers of it (console/errorgroups.py): `state`
new, regressed (what the new_error_group alert is about), ignored, or none; the jobs of one
group show that memory above them (first seen, kinds, queues, an example, who ignores it and
why) with the ignore button.

Reasons follow console.actions.ACTIONS: a purge (of any number of jobs) and a replay of more
than one job need one (422 without), a one-job replay and a cancel may leave it empty.

The work is `console.maintenance`'s: groups/preview read `jobs_failed_idx`, start() fixes the
exact count at a snapshot and writes the 'started' audit row, run() works in batches and
writes the final audit row. This module only translates requests, so the CLI and the API
behave the same.

A bulk start confirms a preview: the confirm form (and an API client) sends back the
preview's `expected` count, `max_id`, `previewed_at` and `selection_hash`. They are required
for a purge and optional for a replay (all four or none). The start is refused (409) when the
selection no longer matches exactly the previewed jobs, and the operation never touches a
job above `max_id`.

Viewers see error text, error groups' examples and operations' selections and errors through
console.web.redact, and may not filter the dead letters on a redacted payload key (403).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console import browse, errorgroups, jsonbounds
from console import maintenance as m
from console.actions import MAX_REASON, bulk_action
from console.caps import Caps
from console.collectors.broker import broker_figures
from console.maintenance import bulk
from console.maintenance.deadletters import GROUP_NAMES
from console.maintenance.deadletters import count as count_matching
from console.queue import broker
from console.timefmt import bounded
from console.web import listing
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt, panel, ref
from console.web.auth import requires
from console.web.database import get_conn, run_limited, run_panel
from console.web.listing import LIST_FIELDS, LIST_PARAMS
from console.web.redact import (
    attempt_logs_for,
    fingerprint_for,
    group_for,
    may_filter_on,
    may_filter_on_fingerprint,
    payload_for,
    selection_for,
    text_for,
)

bp = Blueprint("deadletters", __name__)

PAGE = 100
SAMPLE = 10
MAX_RATE = 100_000.0  # rows/s an operator may ask for on the confirm form; more is no throttle at all
SELECTION_FIELDS = ("fingerprint", "queue", "kind", "failed_since", "failed_before", "payload")

SELECTION_PARAMS = [
    Param("action", where="form", enum=bulk.ACTIONS, required=True, description="replay or purge"),
    Param("selection", where="form", json="text", description='JSON object: {"fingerprint": ...}, {"ids": [1, 2]}, {"queue": ..., "kind": ...} or {"all": true}'),
    Param("ids", where="form", type="integer", repeat=True, minimum=1, maximum=2**63 - 1,
          description="job ids (repeatable; instead of `selection`)"),
    Param("fingerprint", where="form", description="error group (instead of `selection`)"),
    Param("queue", where="form", description="queue (instead of `selection`)"),
    Param("kind", where="form", description="job kind (instead of `selection`)"),
]

START_PARAMS = [
    Param("rate", where="form", type="number", minimum=0, maximum=int(MAX_RATE),
          description="most rows per second (greater than 0, at most 100000); empty: maintenance.bulk_rate"),
    Param("to_archive", where="form", enum=("0", "1", "true", "false", "on", "off"),
          description="purge only: move the jobs to the archive marked purged instead of deleting them"),
]

PREVIEW_PARAMS = [
    Param("expected", where="form", type="integer", minimum=0, description="the preview's count (`confirm.expected`); required for purge"),
    Param("max_id", where="form", type="integer", minimum=0, description="the preview's highest matching job id (`confirm.max_id`); required for purge"),
    Param("previewed_at", where="form", max_length=100, description="the preview's time (`confirm.previewed_at`); required for purge"),
    Param("selection_hash", where="form", max_length=100, description="the preview's selection hash (`confirm.selection_hash`); required for purge"),
]


def _state():
    from console.web import state

    return state()


def _settings() -> m.MaintenanceSettings:
    return m.MaintenanceSettings.from_config(_state().config)


def _text_arg(name: str) -> str | None:
    value = request.args.get(name, "").strip()
    if len(value) > 500:
        abort(400, f"{name}: longer than 500 characters")
    return value or None


# --- reading --------------------------------------------------------------------------------

def op_for(op: dict[str, Any]) -> dict[str, Any]:
    """A bulk operation as the user may see it: selection and error redacted for viewers, with
    the selection in words (`selection_text`), what it does (`what`: "replay", "purge to the
    archive", "purge (delete)") and, once it is done, where the jobs went (`outcome`)."""
    selection = selection_for(op.get("selection"), g.user)
    try:
        words = m.Selection.from_dict(selection).describe() if isinstance(selection, dict) else str(selection or "")
    except ValueError:  # a redacted payload filter is no longer a valid selection: show its keys
        words = ", ".join(f"{k} {v}" for k, v in (selection or {}).items())
    to_archive = op.get("action") == "purge" and op.get("purge_mode") == "archive"
    what = "replay" if op.get("action") == "replay" else "purge to the archive" if to_archive else "purge (delete)"
    done = op.get("done") or 0
    jobs = f"{done:,} job{'s' if done != 1 else ''}"
    outcome = (f"{jobs} replayed: they are pending again" if op.get("action") == "replay" else
               f"{jobs} purged to the archive (marked purged; the jobs filter's archive finds them)" if to_archive else
               f"{jobs} purged: deleted for good")
    return {**op, "selection": selection, "error": text_for(op.get("error"), g.user), "selection_text": words,
            "what": what, "outcome": outcome}


def _new_for() -> timedelta:
    return _state().config.scheduler.error_group_new_for


def memory_for(group: dict[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    """What the console remembers of an error group (console.errorgroups), as the user may see
    it: the fingerprint and example redacted like error text; the ignore's reason as written."""
    if group is None:
        return None
    return {
        "fingerprint": fingerprint_for(group["fingerprint"], g.user),
        "state": errorgroups.state_of(group, now, _new_for()),
        "first_seen": group["first_seen"], "last_seen": group["last_seen"],
        "kinds": group["kinds"], "queues": group["queues"], "example": text_for(group.get("example"), g.user),
        "example_job": group.get("example_job"), "change": group.get("change"), "change_at": group.get("change_at"),
        "previous_seen": group.get("previous_seen"), "ignored_at": group.get("ignored_at"),
        "ignored_by": group.get("ignored_by"), "ignore_reason": group.get("ignore_reason"),
    }


def _with_memory(conn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups (as stored) with `state`, `ignored_by`, `ignore_reason` from the memory."""
    now = conn.execute("SELECT now()").fetchone()[0]
    found = errorgroups.remembered(conn, [r["fingerprint"] for r in rows])
    out = []
    for row in rows:
        memory = found.get(row["fingerprint"])
        out.append({**row, "state": errorgroups.state_of(memory, now, _new_for()),
                    "ignored_by": memory["ignored_by"] if memory else None,
                    "ignore_reason": memory["ignore_reason"] if memory else None})
    return out


def _groups(conn, **kwargs) -> list[dict[str, Any]]:
    return _with_memory(conn, m.groups(conn, **kwargs))


def groups_data() -> dict[str, Any]:
    """One page of the error groups, largest first (`page`, `limit`; default web.list_limit),
    with the count of all of them: a producer can write a thousand different messages."""
    queue, kind = _text_arg("queue"), _text_arg("kind")
    _query, page, limit = listing.args(_state().config.web.list_limit)
    groups = run_panel(_groups, queue=queue, kind=kind, limit=limit, offset=(page - 1) * limit)
    shown = listing.Page(rows=[], total=0, page=page, limit=limit)
    if groups.ok:
        groups.data = [group_for(grp, g.user) for grp in groups.data]
        total = groups.data[0]["total_groups"] if groups.data else 0
        shown = listing.Page(rows=groups.data, total=total, page=page, limit=limit, overall=total)
    ops = run_panel(m.recent_operations, limit=10)
    if ops.ok:
        ops.data = [op_for(op) for op in ops.data]
    return {"queue": queue, "kind": kind, "groups": groups, "listing": shown, "operations": ops,
            "broker_queues": run_panel(_broker_queues)}


def _broker_queues(conn) -> list[dict[str, Any]]:
    """The broker queues (and those moved back whose streams the collector still watches), with
    their dead letters as last collected: their dead letters live in JetStream, on their own page."""
    figures = broker_figures(conn)
    names = sorted(set(broker.broker_queues(conn)) | set(figures))
    return [{"queue": q, "dead": figures.get(q, {}).get("failed"), "at": figures.get(q, {}).get("at")} for q in names]


def dead_row_for(row: dict[str, Any]) -> dict[str, Any]:
    out = {**row, "last_error": text_for(row.get("last_error"), g.user)}
    if "error_fingerprint" in out:
        out["error_fingerprint"] = fingerprint_for(out["error_fingerprint"], g.user)
    if "payload" in out:
        out["payload"] = payload_for(out["payload"], g.user)
    return out


def _selection_from_args() -> m.Selection:
    values: dict[str, Any] = {k: _text_arg(k) for k in SELECTION_FIELDS if _text_arg(k)}
    if not values:
        return m.Selection(all=True)
    return m.Selection.from_dict(values)


def _before() -> tuple[datetime, int] | None:
    raw = request.args.get("before")
    if not raw:
        return None
    stamp, _, job_id = raw.rpartition("~")
    try:
        return bounded(datetime.fromisoformat(stamp), "before"), int(job_id)
    except ValueError:
        abort(400, f"before: {raw[:80]!r} is not a cursor from a previous page")


def jobs_data() -> dict[str, Any]:
    sel = _selection_from_args()
    # the rules /jobs applies
    complaint = may_filter_on(sel.payload, g.user) or may_filter_on_fingerprint(sel.fingerprint, g.user)
    if complaint:
        abort(403, complaint)
    rows = [dead_row_for(r) for r in run_limited(m.list_dead_letters, sel, limit=PAGE, before=_before())]
    total = run_panel(count_matching, sel)
    group = run_panel(_memory, sel.fingerprint) if sel.fingerprint else None
    sample = _sample(rows[0]["id"]) if rows and _before() is None else None
    nxt = None
    if len(rows) == PAGE:
        last = rows[-1]
        nxt = f"{last['finished_at'].isoformat()}~{last['id']}"
    return {"selection": sel.to_dict(), "description": sel.describe(), "jobs": rows, "next": nxt,
            "total": total.data if total.ok else None, "total_error": total.error,
            "group": group.data if group is not None and group.ok else None,
            "group_fingerprint": sel.fingerprint, "sample": sample,
            "args": {k: v for k, v in sel.to_dict().items() if k != "all"}}


def _sample(job_id: int) -> dict[str, Any]:
    """Why the newest of these dead letters failed, in its handler's words: the log records of
    its last attempt that logged (redacted for the reader), or `logs` None."""
    found = run_panel(m.last_attempt_logs, job_id)
    if not found.ok:
        return {"job": job_id, "logs": None, "error": found.error}
    shown = attempt_logs_for([found.data], g.user) if found.data else []
    return {"job": job_id, "logs": shown[0] if shown else None, "error": None}


def _memory(conn, fingerprint: str) -> dict[str, Any] | None:
    now = conn.execute("SELECT now()").fetchone()[0]
    return memory_for(errorgroups.get(conn, fingerprint), now)


@bp.get("/deadletters")
@requires("viewer")
def index():
    return render_template("deadletters/index.html", **groups_data())


@bp.get("/api/v1/deadletters")
@requires("viewer")
@api_doc("Dead letters grouped by error fingerprint (count, first/last seen, queues, kinds, example), and recent bulk operations",
         params=[Param("queue", max_length=500), Param("kind", max_length=500), *LIST_PARAMS[1:]],
         description="One page of `limit` groups, largest first (default web.list_limit); `total` counts them all "
                     "and `next_page` is the page after this one. Each group names its first "
                     f"{GROUP_NAMES} queues and kinds; `queue_count` and `kind_count` count them all.",
         response=obj({"queue": opt(STR), "kind": opt(STR),
                       "groups": panel(arr(obj({"fingerprint": STR, "count": INT, "first_seen": TIME,
                                                "last_seen": TIME, "queues": arr(STR), "kinds": arr(STR),
                                                "queue_count": INT, "kind_count": INT, "example": opt(STR),
                                                "state": opt({**STR, "enum": ["new", "regressed", "ignored"]}),
                                                "ignored_by": opt(STR), "ignore_reason": opt(STR)}))),
                       "operations": opt(arr(ref("Operation"))), **LIST_FIELDS}))
def api_index():
    data = groups_data()
    groups = [{k: v for k, v in grp.items() if k != "total_groups"} for grp in data["groups"].data] \
        if data["groups"].ok else {"available": False, "error": data["groups"].error}
    return jsonify({"queue": data["queue"], "kind": data["kind"], "groups": groups,
                    "operations": data["operations"].data if data["operations"].ok else None,
                    **data["listing"].as_dict()})


@bp.get("/deadletters/jobs")
@requires("viewer")
def jobs():
    return render_template("deadletters/jobs.html", **jobs_data())


@bp.get("/api/v1/deadletters/jobs")
@requires("viewer")
@api_doc("Dead letters matching a filter, newest failure first (100 per page); with a fingerprint, what the console remembers of that error group", params=[
    Param("fingerprint", max_length=500), Param("queue", max_length=500), Param("kind", max_length=500),
    Param("failed_since", max_length=500, description="ISO 8601"),
    Param("failed_before", max_length=500, description="ISO 8601"),
    Param("payload", max_length=500, json="text", description="JSON object the payload contains (viewers: not on a redacted key, 403)"),
    Param("before", description="the `next` cursor of the previous page"),
], description="Payloads are not included; open a job for it (redacted for viewers). Error text is redacted for viewers.",
   response=obj({"selection": OBJ, "description": STR, "jobs": arr(ref("Job")), "next": opt(STR),
                 "total": opt(INT), "total_error": opt(STR), "group": opt(ref("ErrorGroup")),
                 "group_fingerprint": opt(STR), "args": OBJ,
                 "sample": {**opt(obj({"job": INT, "logs": opt(ref("AttemptLog")), "error": opt(STR)})),
                            "description": "the first page only: the newest dead letter's last attempt "
                                           "that logged, its records redacted (null: nothing matches)"}},
                optional=("sample",)))
def api_jobs():
    data = jobs_data()
    data["jobs"] = [{k: v for k, v in row.items() if k != "payload"} for row in data["jobs"]]
    return jsonify(data)


# --- selections from forms ------------------------------------------------------------------

def form_ids(form) -> list[int]:
    """The ticked jobs' ids of a form (`ids`, repeated; blanks ignored); InvalidSelection names
    the first values that are not ids. Also the broker dead letters' forms (brokerdead.py)."""
    ids = [v for v in form.getlist("ids") if v.strip()]
    try:
        return [int(v) for v in ids]
    except ValueError:
        raise m.InvalidSelection(f"ids: {', '.join(ids[:5])} are not job ids") from None


def _selection_from_form() -> m.Selection:
    form = request.form
    raw = form.get("selection")
    if raw:
        try:
            # the selection object around a payload filter of at most MAX_DEPTH levels
            data = jsonbounds.loads(raw, "selection", jsonbounds.MAX_BODY_DEPTH)
        except jsonbounds.TooDeep as exc:
            raise m.InvalidSelection(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise m.InvalidSelection(f"selection is not valid JSON: {exc}") from None
        return m.Selection.from_dict(data)
    values: dict[str, Any] = {}
    ids = form_ids(form)
    if ids:
        values["ids"] = ids
    for name in SELECTION_FIELDS:
        if form.get(name, "").strip():
            values[name] = form[name].strip() if name != "fingerprint" else form[name]
    if form.get("all") in ("1", "true", "on"):
        values["all"] = True
    if not values:
        raise m.InvalidSelection("nothing selected: tick some jobs, or choose a group")
    return m.Selection.from_dict(values)


def _action() -> str:
    action = request.form.get("action", "")
    if action not in bulk.ACTIONS:
        abort(400, f"action: {action!r} is not one of {', '.join(bulk.ACTIONS)}")
    return action


def preview_data() -> dict[str, Any]:
    action = _action()
    sel = _selection_from_form()
    p = run_limited(m.preview, sel, sample=SAMPLE)
    data = p.as_dict()
    data["sample"] = [dead_row_for(r) for r in data["sample"]]
    return {"action": action, **data, "selection_json": json.dumps(p.selection, sort_keys=True)}


@bp.post("/deadletters/preview")
@requires("operator")
def preview():
    data = preview_data()
    template = "deadletters/_confirm.html" if request.headers.get("HX-Request") else "deadletters/confirm.html"
    return render_template(template, default_rate=_settings().bulk_rate, **data)


@bp.post("/api/v1/deadletters/preview")
@requires("operator")
@api_doc("Preview a replay or purge: the exact count, a sample, the selection as understood (changes nothing)",
         params=SELECTION_PARAMS,
         description="`confirm` holds the fields to send back to /api/v1/deadletters/operations (expected, max_id, "
                     "previewed_at, selection_hash): the operation is then bound to exactly the previewed jobs.",
         response=obj({"action": STR, "total": INT, "sample": arr(ref("Job")), "selection": OBJ, "description": STR,
                       "max_id": opt(INT), "previewed_at": opt(STR), "selection_hash": opt(STR),
                       "confirm": opt(obj({"expected": INT, "max_id": opt(INT), "previewed_at": STR, "selection_hash": STR}))}))
def api_preview():
    data = preview_data()
    data.pop("selection_json")
    data["sample"] = [{k: v for k, v in row.items() if k != "payload"} for row in data["sample"]]
    return jsonify(data)


# --- bulk operations ------------------------------------------------------------------------

def _previewed(action: str) -> m.Previewed | None:
    """The preview this start confirms (form fields); a purge cannot start without one."""
    previewed = m.Previewed.from_fields(request.form)
    if previewed is None and action == "purge":
        abort(400, "purge needs the preview it confirms: missing expected, max_id, previewed_at, selection_hash "
                   "(POST the selection to /api/v1/deadletters/preview and send back its `confirm` fields)")
    return previewed


def _rate(default: float | None) -> float | None:
    """The operator's rows/s from the form: empty means the configured default."""
    raw = (request.form.get("rate") or "").strip()
    if not raw:
        return default
    try:
        rate = float(raw)
    except ValueError:
        abort(400, f"rate: {raw[:40]!r} is not a number of rows per second")
    if not 0 < rate <= MAX_RATE:  # also refuses nan and inf
        abort(400, f"rate: rows per second must be greater than 0 and at most {MAX_RATE:,.0f} (got {raw[:40]})")
    return rate


def _purge_mode(action: str) -> str:
    raw = (request.form.get("to_archive") or "").strip().lower()
    if raw not in ("", "0", "1", "true", "false", "on", "off"):
        abort(400, f"to_archive: {raw[:40]!r} is not true or false")
    to_archive = raw in ("1", "true", "on")
    if to_archive and action != "purge":
        abort(400, "to_archive: only a purge can go to the archive")
    return "archive" if to_archive else "delete"


def start_operation() -> dict[str, Any]:
    action = _action()
    sel = _selection_from_form()
    reason = reason_for(bulk_action(action, sel.to_dict()))
    previewed = _previewed(action)
    settings = _settings()
    rate = _rate(settings.bulk_rate)
    purge_mode = _purge_mode(action)
    conn = get_conn()
    try:
        # The check against the preview and the operation's insert are one transaction.
        op_id = m.start(conn, action, sel, actor=actor(), reason=reason, rate=rate,
                        batch_size=settings.batch_size, purge_mode=purge_mode, preview=previewed,
                        caps=Caps.from_config(_state().config))
    except m.PreviewMismatch as exc:
        abort(409, str(exc))
    bulk.run_in_thread(_state().dsn, op_id, history=settings.error_history)
    return m.progress(conn, op_id)


@bp.post("/deadletters/operations")
@requires("operator")
def start():
    op = op_for(start_operation())
    if request.headers.get("HX-Request"):
        return render_template("deadletters/_progress.html", op=op, poll=True)
    return redirect(url_for("deadletters.operation", op_id=op["id"]), 303)


@bp.post("/api/v1/deadletters/operations")
@requires("operator")
@api_doc("Start a replay or purge of the selection; it runs in the background (poll its progress)", params=[
    *SELECTION_PARAMS,
    Param("reason", where="form", required=True, max_length=MAX_REASON, description="why (kept in the audit log)"),
    *START_PARAMS,
    *PREVIEW_PARAMS,
], status=201, responses={"400": "bad selection, a reason too long, a bad rate or to_archive, or a purge without its preview's fields",
                          "409": "the selection no longer matches exactly the previewed jobs: preview again",
                          "429": "caps.bulk_running operations in this database, or caps.bulk_per_actor of yours, are "
                                 "queued or running already",
                          "422": "no reason (every purge, and a replay of more than one job, needs one)",
                          "201": "started"}, response=ref("Operation"))
def api_start():
    return jsonify(op_for(start_operation())), 201


def _op(op_id: int) -> dict[str, Any]:
    try:
        return op_for(run_limited(m.progress, op_id))
    except m.OperationState as exc:
        abort(404, str(exc))


@bp.get("/deadletters/operations/<int:op_id>")
@requires("viewer")
def operation(op_id: int):
    op = _op(op_id)
    return render_template("deadletters/operation.html", op=op, poll=op["active"])


@bp.get("/deadletters/operations/<int:op_id>/_progress")
@requires("viewer")
def progress_fragment(op_id: int):
    op = _op(op_id)
    body = render_template("deadletters/_progress.html", op=op, poll=op["active"])
    # 286 tells htmx to stop polling: the operation is over.
    return body, 200 if op["active"] else 286


@bp.get("/api/v1/deadletters/operations/<int:op_id>")
@requires("viewer")
@api_doc("A bulk operation's progress: state (queued, running, done, cancelled, failed), total, done, percent, rows/s, ETA",
         responses={"404": "no such operation"}, response=ref("Operation"))
def api_operation(op_id: int):
    return jsonify(_op(op_id))


OPERATIONS_SHOWN = 100


@bp.get("/deadletters/operations")
@requires("viewer")
def operations():
    """Every recent bulk replay and purge: its selection in words, progress, who, why, outcome."""
    ops = [op_for(op) for op in run_limited(m.recent_operations, limit=OPERATIONS_SHOWN)]
    running = sum(1 for op in ops if op["active"])
    return render_template("deadletters/operations.html", ops=ops, shown=OPERATIONS_SHOWN,
                           tab_state=f"{running} running" if running else "")


@bp.get("/api/v1/deadletters/operations")
@requires("viewer")
@api_doc("Recent bulk operations, newest first", response=arr(ref("Operation")),
         description="Each with `selection_text` (the selection in words), `what` (replay, purge to the archive, "
                     "purge (delete)) and `outcome` (where the jobs went).")
def api_operations():
    return jsonify([op_for(op) for op in run_limited(m.recent_operations, limit=50)])


def _cancel(op_id: int) -> dict[str, Any]:
    try:
        return m.cancel(get_conn(), op_id, actor=actor(), reason=reason_for("operation_cancel"))
    except m.OperationState as exc:
        status = 404 if "there is no" in str(exc) else 409
        abort(status, str(exc))


@bp.post("/deadletters/operations/<int:op_id>/cancel")
@requires("operator")
def cancel(op_id: int):
    op = _cancel(op_id)
    if request.headers.get("HX-Request"):
        return render_template("deadletters/_progress.html", op=op, poll=op["active"])
    return redirect(url_for("deadletters.operation", op_id=op_id), 303)


@bp.post("/api/v1/deadletters/operations/<int:op_id>/cancel")
@requires("operator")
@api_doc("Cancel a bulk operation (it stops between two batches; rows already done stay done)",
         params=[Param("reason", where="form", max_length=MAX_REASON)], response=ref("Operation"),
         responses={"404": "no such operation", "409": "it has already ended"})
def api_cancel(op_id: int):
    return jsonify(_cancel(op_id))


def _resume(op_id: int) -> dict[str, Any]:
    """Reopen a cancelled or failed operation and run it again from its cursor, in the
    background. The runner keeps the operation's snapshot and preview bound (max_id), so a
    resume never touches a job the operator did not preview."""
    reason = reason_for("operation_resume")
    conn = get_conn()
    try:
        op = m.resume(conn, op_id, actor=actor(), reason=reason, caps=Caps.from_config(_state().config))
    except m.OperationState as exc:
        abort(404 if "there is no" in str(exc) else 409, str(exc))
    bulk.run_in_thread(_state().dsn, op_id, history=_settings().error_history)
    return op_for(op)


@bp.post("/deadletters/operations/<int:op_id>/resume")
@requires("operator")
def resume(op_id: int):
    op = _resume(op_id)
    if request.headers.get("HX-Request"):
        return render_template("deadletters/_progress.html", op=op, poll=True)
    return redirect(url_for("deadletters.operation", op_id=op_id), 303)


@bp.post("/api/v1/deadletters/operations/<int:op_id>/resume")
@requires("operator")
@api_doc("Resume a cancelled or failed bulk operation from where it stopped (audited; same snapshot and preview bound)",
         params=[Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         description="Rows already done are not touched again, and no job above the operation's `max_id` "
                     "(the confirmed preview's bound) is ever touched.",
         response=ref("Operation"),
         responses={"422": "no reason", "404": "no such operation", "429": "past caps.bulk_running or caps.bulk_per_actor",
                    "409": "it is not cancelled or failed (still running, or done)"})
def api_resume(op_id: int):
    return jsonify(_resume(op_id))


# --- one job --------------------------------------------------------------------------------

def _one(job_id: int, action: str) -> dict[str, Any]:
    if action not in bulk.ACTIONS:
        abort(404, f"no action {action!r}; actions: {', '.join(bulk.ACTIONS)}")
    try:
        reason = reason_for("purge" if action == "purge" else "replay_one")
        return browse.act_on_job(get_conn(), job_id, action, actor=actor(), reason=reason, dsn=_state().dsn)
    except browse.JobNotFound as exc:
        abort(404, str(exc))
    except browse.JobStateConflict as exc:
        abort(409, str(exc))


@bp.post("/deadletters/jobs/<int:job_id>/<action>")
@requires("operator")
def one(job_id: int, action: str):
    _one(job_id, action)
    back = request.form.get("next") or ""
    if not back.startswith("/deadletters") or back.startswith("//"):
        back = url_for("deadletters.index")
    return redirect(back, 303)


@bp.post("/api/v1/deadletters/jobs/<int:job_id>/<action>")
@requires("operator")
@api_doc("Replay or purge one dead letter now (audited)",
         params=[Param("action", where="path", enum=bulk.ACTIONS),
                 Param("reason", where="form", max_length=MAX_REASON,
                       description="why (kept in the audit log); required for a purge, optional for a replay")],
         response=obj({"ok": BOOL, "action": STR}),
         responses={"404": "no such job or action", "409": "the job is not a dead letter (any more)",
                    "422": "a purge without a reason"})
def api_one(job_id: int, action: str):
    return jsonify({"ok": True, "action": action, **_one(job_id, action)})


# --- ignoring an error group -----------------------------------------------------------------

def _group_action(action: str) -> dict[str, Any]:
    """Ignore or unignore the form's (or JSON body's) `fingerprint`, with its reason."""
    if action not in ("ignore", "unignore"):
        abort(404, f"no action {action!r} on an error group; actions: ignore, unignore")
    body = request.get_json(silent=True) if request.is_json else None
    data = body if isinstance(body, dict) else request.form
    fingerprint = data.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint.strip():
        abort(400, "fingerprint: required (the error group, as the dead-letters page lists it)")
    reason = reason_for(f"error_group_{action}", data if isinstance(body, dict) else None)
    conn = get_conn()
    try:
        change = errorgroups.ignore if action == "ignore" else errorgroups.unignore
        row = change(conn, fingerprint, actor=actor(), reason=reason)
    except errorgroups.GroupNotFound as exc:
        abort(404, str(exc))
    except errorgroups.GroupState as exc:
        abort(409, str(exc))
    return memory_for(row, conn.execute("SELECT now()").fetchone()[0]) or {}


@bp.post("/deadletters/groups/<action>")
@requires("operator")
def group_action(action: str):
    _group_action(action)
    back = request.form.get("next") or ""
    if not back.startswith(("/deadletters", "/alerts/")) or back.startswith("//"):
        back = url_for("deadletters.index") + "#groups"
    return redirect(back, 303)


@bp.post("/api/v1/deadletters/groups/<action>")
@requires("operator")
@api_doc("Ignore an error group (it never alerts: the new_error_group alert skips it) or stop ignoring it (audited)",
         params=[Param("action", where="path", enum=("ignore", "unignore")),
                 Param("fingerprint", where="form", required=True, max_length=errorgroups.MAX_FINGERPRINT,
                       description="the error group (`fingerprint` of /api/v1/deadletters)"),
                 Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         description="The fingerprint and reason may also come as a JSON body.",
         response=ref("ErrorGroup"),
         responses={"400": "no fingerprint, or a reason too long", "404": "no dead letter or remembered group has it",
                    "409": "already ignored (ignore), or not ignored (unignore)", "422": "no reason"})
def api_group_action(action: str):
    return jsonify(_group_action(action))
