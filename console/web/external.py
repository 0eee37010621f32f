"""Queues Skiplock watches but did not create ([[external_queues]]): one page per source, with
its queues' figures, its dead letters, and the actions its library offers when the entry says
`actions = true` (console.external.actions does them, the way the library does).

GET  /external/<name>                           the source: queues, dead letters (?queue=), operations
GET  /external/<name>/_deadletters              its dead-letter list alone (the page's fragment)
POST /external/<name>/preview                   exact count + sample + confirm form (operator)
POST /external/<name>/operations                start the replay or purge bound to it; runs in a thread
GET  /external/operations/<id>                  its page; /_progress is the polled fragment (286 when over)
POST /external/operations/<id>/cancel|resume    (operator; resume needs a reason)
POST /external/<name>/jobs/cancel               cancel waiting jobs by key (operator)
POST /external/<name>/queues/<queue>/pause|resume  where the library has a pause (operator, reason)
and the same under /api/v1/external.

Every POST checks the source first (console.external.actions.require_action): a source whose
entry lacks `actions = true`, or whose library does not offer the action, gets 403 before
anything connects to it. Reasons follow console.actions (a replay of more than one job, a
purge, a pause and a resume need one: 422 without). A purge needs its preview's confirm fields
(expected, digest, previewed_at, selection_hash); a replay may send them; a start whose jobs
are no longer exactly the previewed ones is refused (409). Viewers see error text redacted
(console.web.redact). Reads of the source run READ ONLY under a statement timeout; the queue
figures come from the collectors' newest samples.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console.actions import MAX_REASON, bulk_action
from console.external import actions as xa
from console.maintenance import MaintenanceSettings
from console.maintenance.errors import OperationState, PreviewMismatch
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt, panel
from console.web.auth import requires
from console.web.database import current_database, get_conn, run_panel
from console.web.redact import text_for

bp = Blueprint("external", __name__)

PAGE = 50
SAMPLE = 10
MAX_RATE = 100_000.0

SOURCE_ROW = obj({"name": STR, "system": STR, "table": STR, "schema_version": STR, "actions": arr(STR),
                  "read_only": opt(STR), "offered": OBJ, "withheld": OBJ})
DEAD_ROW = obj({"key": STR, "queue": STR, "failed_at": opt(TIME), "error": opt(STR), "attempts": opt(INT)})
OPERATION = obj({"id": INT, "source": STR, "system": STR, "action": STR, "state": STR, "total": INT, "done": INT,
                 "skipped": INT, "percent": {"type": "number"}, "selection": OBJ, "actor": STR, "reason": opt(STR)},
                optional=("reason",))
SELECTION_PARAMS = [
    Param("action", where="form", enum=xa.BULK_ACTIONS, required=True, description="replay or purge"),
    Param("queue", where="form", max_length=500, description="the source's queue (its library's name for one)"),
    Param("keys", where="form", repeat=True, max_length=1100,
          description="job keys (repeatable): an id, or name:id for pg-boss and queue:id for BullMQ"),
    Param("all", where="form", enum=("1", "true", "on"), description="every dead letter of the source"),
]
PREVIEW_PARAMS = [
    Param("expected", where="form", type="integer", minimum=0, description="the preview's count (`confirm.expected`)"),
    Param("digest", where="form", max_length=100, description="the preview's MD5 of the keys (`confirm.digest`)"),
    Param("previewed_at", where="form", max_length=100, description="the preview's time (`confirm.previewed_at`)"),
    Param("selection_hash", where="form", max_length=100, description="the preview's selection hash"),
]


def _state():
    from console.web import state

    return state()


def _settings() -> MaintenanceSettings:
    return MaintenanceSettings.from_config(_state().config)


def _sources() -> dict[str, Any]:
    return xa.sources_of(_state().config, current_database())


def _adapter(name: str):
    found = _sources().get(name)
    if found is None:
        abort(404, f"there is no external queue {name!r} in this database's [[external_queues]]")
    return found


def _require(adapter, action: str) -> None:
    try:
        xa.require_action(adapter, action)
    except xa.ActionsOff as exc:
        abort(403, str(exc))


def _console_dsn() -> str:
    return _state().databases.get(current_database()).dsn


@contextmanager
def _source_conn(adapter):
    """The connection the source is read and changed on: the request's own when the source
    lives in the console's database, else one opened for this request."""
    if not adapter.entry.dsn:
        yield get_conn()
        return
    conn = xa.open_source(adapter, _console_dsn(), application_name="skiplock-web")
    try:
        yield conn
    finally:
        conn.close()


def source_row(adapter) -> dict[str, Any]:
    return {"name": adapter.name, "system": adapter.system, "table": ".".join(adapter.queue_table),
            "schema_version": adapter.schema_version, "actions": list(adapter.actions),
            "read_only": adapter.read_only_reason, "offered": dict(adapter.offered), "withheld": dict(adapter.withheld)}


def dead_row_for(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "error": text_for(row.get("error"), g.user)}


def op_for(op: dict[str, Any]) -> dict[str, Any]:
    return {**op, "error": text_for(op.get("error"), g.user)}


def _text_arg(name: str) -> str | None:
    value = request.args.get(name, "").strip()
    if len(value) > 500 or "\x00" in value:
        abort(400, f"{name}: longer than 500 characters, or holding a NUL character")
    return value or None


def _before() -> tuple[datetime | None, str] | None:
    raw = request.args.get("before")
    if not raw:
        return None
    stamp, sep, key = raw.partition("~")
    if not sep or not key or len(key) > 1100 or "\x00" in key:
        abort(400, f"before: {raw[:80]!r} is not a cursor from a previous page")
    try:
        at = datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        abort(400, f"before: {raw[:80]!r} is not a cursor from a previous page")
    return at, key


def _list(conn, adapter, queue: str | None) -> list[dict[str, Any]]:
    return xa.list_dead_letters(conn, adapter, xa.Selection(queue=queue) if queue else None, limit=PAGE,
                                before=_before())


def source_data(name: str) -> dict[str, Any]:
    """The page's data: the source, its queues (newest samples), paused queues, dead letters, operations."""
    from console.collectors.external import latest_sources

    adapter = _adapter(name)
    queue = _text_arg("queue")
    figures = run_panel(latest_sources)
    info = next((s for s in (figures.data or []) if s["name"] == name), None) if figures.ok else None
    queues = [r for r in (info or {}).get("queues", []) if queue is None or r["queue"] == queue]
    with _source_conn(adapter) as conn:
        dead = run_panel(lambda _c: _list(conn, adapter, queue))
        paused = run_panel(lambda _c: xa.paused_queues(conn, adapter))
    if dead.ok:
        dead.data = [dead_row_for(r) for r in dead.data]
    ops = run_panel(xa.recent, source=name, limit=10)
    if ops.ok:
        ops.data = [op_for(op) for op in ops.data]
    nxt = None
    if dead.ok and len(dead.data) == PAGE:
        last = dead.data[-1]
        nxt = f"{last['failed_at'].isoformat() if last['failed_at'] else ''}~{last['key']}"
    return {"source": source_row(adapter), "queue": queue, "queues": queues,
            "figures_error": None if figures.ok else figures.error, "source_error": (info or {}).get("error"),
            "collected_at": (info or {}).get("collected_at"), "paused": sorted(paused.data) if paused.ok and paused.data else [],
            "dead_letters": dead, "next": nxt, "operations": ops}


def _panel_json(p) -> Any:
    return p.data if p.ok else {"available": False, "error": p.error}


@bp.get("/external/<name>")
@requires("viewer")
def index(name: str):
    return render_template("external/index.html", **source_data(name))


@bp.get("/external/<name>/_deadletters")
@requires("viewer")
def deadletters_fragment(name: str):
    return render_template("external/_deadletters.html", **source_data(name))


@bp.get("/api/v1/external")
@requires("viewer")
@api_doc("The [[external_queues]] sources of this database: system, table, schema read, the actions the console may "
         "take on each (`actions = true` in its entry) and what its library offers", response=arr(SOURCE_ROW))
def api_sources():
    return jsonify([source_row(a) for a in _sources().values()])


@bp.get("/api/v1/external/<name>")
@requires("viewer")
@api_doc("One external source: its queues (newest samples; ?queue= filters), paused queues, dead letters (newest "
         "failure first, 50 per page) and recent operations",
         params=[Param("queue", max_length=500), Param("before", description="the `next` cursor of the previous page")],
         responses={"404": "no such source in this database"},
         response=obj({"source": SOURCE_ROW, "queue": opt(STR), "queues": arr(OBJ), "figures_error": opt(STR),
                       "source_error": opt(STR), "collected_at": opt(TIME), "paused": arr(STR),
                       "dead_letters": panel(arr(DEAD_ROW)), "next": opt(STR), "operations": panel(arr(OPERATION))}))
def api_source(name: str):
    data = source_data(name)
    return jsonify({**data, "dead_letters": _panel_json(data["dead_letters"]),
                    "operations": _panel_json(data["operations"])})


# --- selections, previews, operations -----------------------------------------------------------

def _action() -> str:
    action = request.form.get("action", "")
    if action not in xa.BULK_ACTIONS:
        abort(400, f"action: {action[:40]!r} is not one of {', '.join(xa.BULK_ACTIONS)}")
    return action


def _selection_from_form() -> xa.Selection:
    form = request.form
    keys = [k.strip() for k in form.getlist("keys") if k.strip()]
    queue = (form.get("queue") or "").strip() or None
    every = (form.get("all") or "").strip().lower() in ("1", "true", "on")
    if not (keys or queue or every):
        raise xa.InvalidSelection("nothing selected: tick some jobs, or choose a queue")
    return xa.Selection(queue=queue, keys=tuple(keys) or None, all=every)


def preview_data(name: str) -> dict[str, Any]:
    adapter = _adapter(name)
    action = _action()
    _require(adapter, action)
    sel = _selection_from_form()
    with _source_conn(adapter) as conn:
        p = xa.preview(conn, adapter, sel, sample=SAMPLE)
    data = p.as_dict()
    data["sample"] = [dead_row_for(r) for r in data["sample"]]
    return {"action": action, "how": adapter.offered[action], **data}


@bp.post("/external/<name>/preview")
@requires("operator")
def preview(name: str):
    data = preview_data(name)
    template = "external/_confirm.html" if request.headers.get("HX-Request") else "external/confirm.html"
    return render_template(template, default_rate=_settings().bulk_rate, **data)


@bp.post("/api/v1/external/<name>/preview")
@requires("operator")
@api_doc("Preview a replay or purge of an external source's dead letters: the exact count, a sample (changes nothing)",
         params=SELECTION_PARAMS,
         description="`confirm` holds the fields to send back to /api/v1/external/<name>/operations: the operation is "
                     "then bound to exactly the previewed jobs. 403 when the source's actions are off.",
         responses={"403": "actions are off for the source, or its library does not offer the action",
                    "404": "no such source"},
         response=obj({"action": STR, "how": STR, "source": STR, "system": STR, "total": INT, "too_many": BOOL,
                       "sample": arr(DEAD_ROW), "selection": OBJ, "description": STR, "previewed_at": TIME,
                       "confirm": opt(obj({"expected": INT, "digest": STR, "previewed_at": STR, "selection_hash": STR}))}))
def api_preview(name: str):
    return jsonify(preview_data(name))


def _rate(default: float | None) -> float | None:
    raw = (request.form.get("rate") or "").strip()
    if not raw:
        return default
    try:
        rate = float(raw)
    except ValueError:
        abort(400, f"rate: {raw[:40]!r} is not a number of jobs per second")
    if not 0 < rate <= MAX_RATE:
        abort(400, f"rate: jobs per second must be greater than 0 and at most {MAX_RATE:,.0f} (got {raw[:40]})")
    return rate


def start_operation(name: str) -> dict[str, Any]:
    adapter = _adapter(name)
    action = _action()
    _require(adapter, action)
    sel = _selection_from_form().checked(adapter)
    kind = bulk_action(action, {"ids": list(sel.keys)} if sel.keys and not sel.queue else sel.to_dict())
    reason = reason_for(kind)
    previewed = xa.Previewed.from_fields(request.form)
    if previewed is None and action == "purge":
        abort(400, "purge needs the preview it confirms: missing expected, digest, previewed_at, selection_hash "
                   f"(POST the selection to /api/v1/external/{name}/preview and send back its `confirm` fields)")
    settings = _settings()
    rate = _rate(settings.bulk_rate)
    console = get_conn()
    with _source_conn(adapter) as src:
        try:
            op_id = xa.start(console, src, adapter, action, sel, actor=actor(), reason=reason, rate=rate,
                             batch_size=settings.batch_size, preview=previewed, database_name=current_database())
        except PreviewMismatch as exc:
            abort(409, str(exc))
    xa.run_in_thread(_console_dsn(), op_id, _sources())
    return op_for(xa.progress(console, op_id))


@bp.post("/external/<name>/operations")
@requires("operator")
def start(name: str):
    op = start_operation(name)
    if request.headers.get("HX-Request"):
        return render_template("external/_progress.html", op=op, poll=True)
    return redirect(url_for("external.operation", op_id=op["id"]), 303)


@bp.post("/api/v1/external/<name>/operations")
@requires("operator")
@api_doc("Start a replay or purge of an external source's dead letters, the library's way; it runs in the background",
         params=[*SELECTION_PARAMS,
                 Param("reason", where="form", max_length=MAX_REASON, description="why (kept in the audit log); "
                       "required for a purge and for a replay of more than one job"),
                 Param("rate", where="form", type="number", minimum=0, maximum=int(MAX_RATE),
                       description="most jobs per second; empty: maintenance.bulk_rate"),
                 *PREVIEW_PARAMS],
         status=201, responses={"400": "bad selection or rate, or a purge without its preview's fields",
                                "403": "actions are off for the source, or its library does not offer the action",
                                "404": "no such source", "409": "other jobs match than previewed: preview again",
                                "422": "no reason", "201": "started"}, response=OPERATION)
def api_start(name: str):
    return jsonify(start_operation(name)), 201


def _op(op_id: int) -> dict[str, Any]:
    if op_id > 2**63 - 1:
        abort(404, f"there is no external-queue operation {op_id}")
    try:
        op = xa.progress(get_conn(), op_id)
    except OperationState as exc:
        abort(404, str(exc))
    if op["source"] not in _sources():
        abort(404, f"external-queue operation {op_id} is not one of this database's sources")
    return op_for(op)


@bp.get("/external/operations/<int:op_id>")
@requires("viewer")
def operation(op_id: int):
    op = _op(op_id)
    return render_template("external/operation.html", op=op, poll=op["active"])


@bp.get("/external/operations/<int:op_id>/_progress")
@requires("viewer")
def progress_fragment(op_id: int):
    op = _op(op_id)
    return render_template("external/_progress.html", op=op, poll=op["active"]), 200 if op["active"] else 286


@bp.get("/api/v1/external/operations/<int:op_id>")
@requires("viewer")
@api_doc("An external-queue operation's progress: state, total, done (changed by the library), skipped (no longer "
         "dead letters when their batch came), percent", responses={"404": "no such operation"}, response=OPERATION)
def api_operation(op_id: int):
    return jsonify(_op(op_id))


def _cancel_op(op_id: int) -> dict[str, Any]:
    _op(op_id)
    try:
        return op_for(xa.cancel(get_conn(), op_id, actor=actor(), reason=reason_for("operation_cancel")))
    except OperationState as exc:
        abort(409, str(exc))


@bp.post("/external/operations/<int:op_id>/cancel")
@requires("operator")
def cancel(op_id: int):
    op = _cancel_op(op_id)
    if request.headers.get("HX-Request"):
        return render_template("external/_progress.html", op=op, poll=op["active"])
    return redirect(url_for("external.operation", op_id=op_id), 303)


@bp.post("/api/v1/external/operations/<int:op_id>/cancel")
@requires("operator")
@api_doc("Cancel an external-queue operation (it stops between two batches)",
         params=[Param("reason", where="form", max_length=MAX_REASON)], response=OPERATION,
         responses={"404": "no such operation", "409": "it has already ended"})
def api_cancel(op_id: int):
    return jsonify(_cancel_op(op_id))


def _resume_op(op_id: int) -> dict[str, Any]:
    op = _op(op_id)
    adapter = _sources()[op["source"]]
    _require(adapter, op["action"])
    reason = reason_for("operation_resume")
    try:
        resumed = xa.resume(get_conn(), op_id, actor=actor(), reason=reason, adapter=adapter)
    except OperationState as exc:
        abort(409, str(exc))
    xa.run_in_thread(_console_dsn(), op_id, _sources())
    return op_for(resumed)


@bp.post("/external/operations/<int:op_id>/resume")
@requires("operator")
def resume(op_id: int):
    op = _resume_op(op_id)
    if request.headers.get("HX-Request"):
        return render_template("external/_progress.html", op=op, poll=True)
    return redirect(url_for("external.operation", op_id=op_id), 303)


@bp.post("/api/v1/external/operations/<int:op_id>/resume")
@requires("operator")
@api_doc("Resume a cancelled or failed external-queue operation from its cursor (its previewed jobs only)",
         params=[Param("reason", where="form", required=True, max_length=MAX_REASON, description="why")],
         response=OPERATION, responses={"403": "the source's actions are off now", "404": "no such operation",
                                        "409": "not cancelled or failed", "422": "no reason"})
def api_resume(op_id: int):
    return jsonify(_resume_op(op_id))


# --- one job, one queue ---------------------------------------------------------------------------

def _cancel_jobs(name: str) -> dict[str, Any]:
    adapter = _adapter(name)
    _require(adapter, "cancel")
    keys = [k.strip() for k in request.form.getlist("keys") if k.strip()]
    if not keys:
        abort(400, "keys: name at least one waiting job to cancel")
    reason = reason_for("cancel_job")
    with _source_conn(adapter) as src:
        return xa.cancel_jobs(get_conn(), src, adapter, keys, actor=actor(), reason=reason).as_dict()


@bp.post("/external/<name>/jobs/cancel")
@requires("operator")
def cancel_jobs(name: str):
    _cancel_jobs(name)
    return redirect(url_for("external.index", name=name), 303)


@bp.post("/api/v1/external/<name>/jobs/cancel")
@requires("operator")
@api_doc("Cancel waiting jobs of an external source by key, the library's way (a job that no longer waits is left alone)",
         params=[Param("keys", where="form", repeat=True, required=True, max_length=1100),
                 Param("reason", where="form", max_length=MAX_REASON)],
         responses={"403": "actions are off for the source, or its library has no cancel", "404": "no such source"},
         response=obj({"action": STR, "changed": INT, "asked": INT}))
def api_cancel_jobs(name: str):
    return jsonify(_cancel_jobs(name))


def _set_paused(name: str, queue: str, paused: bool) -> dict[str, Any]:
    adapter = _adapter(name)
    action = "pause" if paused else "resume"
    _require(adapter, action)
    reason = reason_for(action)
    with _source_conn(adapter) as src:
        return xa.set_paused(get_conn(), src, adapter, queue, paused, actor=actor(), reason=reason).as_dict()


@bp.post("/external/<name>/queues/<queue>/pause")
@requires("operator")
def pause(name: str, queue: str):
    _set_paused(name, queue, True)
    return redirect(url_for("external.index", name=name), 303)


@bp.post("/external/<name>/queues/<queue>/resume")
@requires("operator")
def resume_queue(name: str, queue: str):
    _set_paused(name, queue, False)
    return redirect(url_for("external.index", name=name), 303)


_PAUSE_DOC = dict(params=[Param("reason", where="form", required=True, max_length=MAX_REASON, description="why")],
                  responses={"403": "actions are off for the source, or its library has no pause", "404": "no such source",
                             "422": "no reason"},
                  response=obj({"action": STR, "changed": INT, "asked": INT, "queue": STR}))


@bp.post("/api/v1/external/<name>/queues/<queue>/pause")
@requires("operator")
@api_doc("Pause one queue of an external source through its library (BullMQ's Queue.pause)", **_PAUSE_DOC)
def api_pause(name: str, queue: str):
    return jsonify(_set_paused(name, queue, True))


@bp.post("/api/v1/external/<name>/queues/<queue>/resume")
@requires("operator")
@api_doc("Resume one paused queue of an external source through its library", **_PAUSE_DOC)
def api_resume_queue(name: str, queue: str):
    return jsonify(_set_paused(name, queue, False))


def selection_json(selection: dict[str, Any]) -> str:
    return json.dumps(selection, sort_keys=True)
