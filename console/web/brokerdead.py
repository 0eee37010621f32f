"""Dead letters of a broker queue: the messages of its JetStream stream `skiplock_dead_<queue>`,
listed (bounded), previewed, and replayed or purged with a reason (issue 32; docs/exit-plan.md,
"Dead letters of a broker queue").

GET  /deadletters/broker/<name>               the stream's dead letters, oldest first, 50 a page (viewer)
POST /deadletters/broker/<name>/preview      exact count + sample + reason form (operator)
POST /deadletters/broker/<name>/operations   replay or purge what was previewed, now (operator, reason)

The work is console.maintenance.brokerdlq's (the CLI's `skiplock replay/purge --queue` for a
nats queue calls the same functions): a preview reads at most SCAN messages of the stream, a
start is bound to the preview (409 when the selection no longer matches exactly its count
within its sequence bound), replay publishes each job again to the queue's job stream and
deletes the dead letter only after JetStream stored the job, and both write audit rows.
Reasons follow console.actions (a purge, and a replay of more than one job, need one: 422).
The run is synchronous in the request (bounded by SCAN); there is no background operation,
progress bar or cancel as for PostgreSQL's dead letters.

The same three under /api/v1/deadletters/broker/<name> (JSON; a token acts without CSRF, a
session with it, as every /api/v1 route): the list (`rows`, `next`: the `after` cursor), the
preview (with `confirm`: the fields a start sends back) and the start, which answers 200 with
what was done (the run is over when it answers, so there is no operation to poll).

Viewers see error text and payloads redacted (console.web.redact), like PostgreSQL's dead
letters. A broker that does not answer is a 503 with the reason; a queue that is not a broker
queue and has no dead-letter stream is a 404. No PostgreSQL transaction is open while NATS is
called.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, abort, g, jsonify, render_template, request

from console import jsonbounds
from console import maintenance as m
from console.actions import MAX_REASON, bulk_action
from console.maintenance import brokerdlq
from console.queue import broker
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, NUM, OBJ, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import primary_conn, run_limited
from console.web.deadletters import form_ids
from console.web.redact import payload_for, text_for

bp = Blueprint("brokerdead", __name__)

PAGE = 50
SAMPLE = 10
SCAN = 1_000  # messages one preview (and so one start) reads at most from the web


def _state():
    from console.web import state

    return state()


def _broker() -> tuple[str, float]:
    cfg = _state().config.broker
    return cfg.nats_url, float(cfg.publish_timeout)


def _queue(queue: str) -> str:
    try:
        return broker.check_queue(queue)
    except broker.InvalidBrokerQueue as exc:
        abort(404, str(exc))


def _row_for(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "last_error": text_for(row.get("last_error"), g.user), "payload": payload_for(row.get("payload"), g.user)}


def _unavailable(exc: brokerdlq.BrokerUnavailable, queue: str):
    """503 when the broker did not answer about a queue it serves; 404 for any other queue (most
    likely a PostgreSQL queue on a machine without a broker): nothing of it is there to act on."""
    if run_limited(broker.backend_of, queue) != "nats":
        abort(404, f"queue {queue!r} is not served by NATS (and the broker could not be asked whether it "
                   f"keeps dead letters of it from an earlier move: {exc})")
    abort(503, f"the broker did not answer: {exc}")


def listing(name: str) -> dict[str, Any]:
    """One page of the queue's dead letters (after the `after` cursor), redacted for the reader."""
    queue = _queue(name)
    backend = run_limited(broker.backend_of, queue)
    raw_after = request.args.get("after", "0")
    if not raw_after.isdigit() or len(raw_after) > 19:
        abort(400, f"after: {raw_after[:40]!r} is not a sequence number from a previous page")
    nats_url, timeout = _broker()
    try:
        page = brokerdlq.list_dead_letters(nats_url, queue, limit=PAGE, after=int(raw_after), timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        _unavailable(exc, queue)
    if not page["exists"] and backend != "nats":
        abort(404, f"queue {queue!r} is not served by NATS and has no dead-letter stream")
    return {"queue": queue, "backend": backend, "stream": broker.dead_stream(queue),
            "rows": [_row_for(r) for r in page["rows"]], "stream_total": page["stream_total"],
            "next": page["next"], "after": int(raw_after)}


def _acting_on(queue: str) -> None:
    """404 unless `queue` (checked by _queue) is a broker queue, or one moved back to PostgreSQL
    whose dead-letter stream is still there: nothing of any other is in the broker. Asked after
    the request's input is read, so bad input is a 400 whatever the queue."""
    if run_limited(broker.backend_of, queue) == "nats":
        return queue
    nats_url, timeout = _broker()
    try:
        found = brokerdlq.list_dead_letters(nats_url, queue, limit=1, timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        _unavailable(exc, queue)
    if not found["exists"]:
        abort(404, f"queue {queue!r} is not served by NATS and has no dead-letter stream")


@bp.get("/deadletters/broker/<name>")
@requires("viewer")
def index(name: str):
    return render_template("deadletters/broker.html", **listing(name))


def _selection(queue: str) -> m.Selection:
    form = request.form
    raw = form.get("selection")
    if raw:
        try:
            data = jsonbounds.loads(raw, "selection", jsonbounds.MAX_BODY_DEPTH)
        except (jsonbounds.TooDeep, json.JSONDecodeError) as exc:
            raise m.InvalidSelection(f"selection is not valid JSON: {exc}") from None
        sel = brokerdlq.broker_selection(data)
        if sel.queue != queue:
            abort(400, f"selection: its queue ({sel.queue!r}) is not this page's ({queue!r})")
        return sel
    values: dict[str, Any] = {"queue": queue}
    ids = form_ids(form)
    if ids:
        values["ids"] = ids
    if form.get("kind", "").strip():
        values["kind"] = form["kind"].strip()
    return brokerdlq.broker_selection(values)


def _action() -> str:
    action = request.form.get("action", "")
    if action not in brokerdlq.ACTIONS:
        abort(400, f"action: {action!r} is not one of {', '.join(brokerdlq.ACTIONS)}")
    return action


def _page(template: str, **data: Any):
    name = f"deadletters/_{template}.html" if request.headers.get("HX-Request") else f"deadletters/{template}.html"
    return render_template(name, **data)


def preview_data(name: str) -> dict[str, Any]:
    queue = _queue(name)
    action = _action()
    sel = _selection(queue)
    _acting_on(queue)
    nats_url, timeout = _broker()
    try:
        p = brokerdlq.preview(nats_url, sel, sample=SAMPLE, scan=SCAN, timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        _unavailable(exc, queue)
    data = p.as_dict()
    data["sample"] = [_row_for(r) for r in data["sample"]]
    return {"action": action, "scan": SCAN, **data}


@bp.post("/deadletters/broker/<name>/preview")
@requires("operator")
def preview(name: str):
    data = preview_data(name)
    return _page("broker_confirm", selection_json=json.dumps(data["selection"], sort_keys=True), **data)


def start_data(name: str) -> dict[str, Any]:
    """Replay or purge what the form selects, bound to its preview (required for a purge)."""
    queue = _queue(name)
    action = _action()
    sel = _selection(queue)
    reason = reason_for(bulk_action(action, sel.to_dict()))
    previewed = brokerdlq.BrokerPreviewed.from_fields(request.form)
    if previewed is None and action == "purge":
        abort(400, "purge needs the preview it confirms: missing expected, max_seq, selection_hash (preview first)")
    _acting_on(queue)
    settings = m.MaintenanceSettings.from_config(_state().config)
    nats_url, timeout = _broker()
    try:
        result = brokerdlq.run(primary_conn(), nats_url, action, sel, actor=actor(), reason=reason, preview=previewed,
                               batch_size=min(settings.batch_size, 1000), rate=settings.bulk_rate, scan=SCAN,
                               timeout=timeout)
    except m.PreviewMismatch as exc:
        abort(409, str(exc))
    except brokerdlq.BrokerUnavailable as exc:
        _unavailable(exc, queue)
    return {"queue": queue, "result": result.as_dict(), "description": brokerdlq.describe(sel)}


@bp.post("/deadletters/broker/<name>/operations")
@requires("operator")
def start(name: str):
    return _page("broker_done", **start_data(name))


# --- /api/v1 ----------------------------------------------------------------------------------

NAME = Param("name", where="path", description="the broker queue (letters, digits, '_' or '-')")
DEAD_LETTER = obj({
    "seq": INT, "id": opt(INT), "queue": opt(STR), "kind": opt(STR), "attempts": opt(INT),
    "max_attempts": opt(INT), "last_error": opt(STR), "error_class": opt(STR), "failed_at": opt(TIME),
    "payload": {"description": "the job's payload (redacted for viewers)"},
    "readable": {**BOOL, "description": "false: the message is not a job (shown, never replayed as one)"},
}, optional=("payload",))
SELECTION = [
    Param("action", where="form", enum=brokerdlq.ACTIONS, required=True, description="replay or purge"),
    Param("selection", where="form", json="text",
          description='JSON object: {"queue": <name>, "ids": [1, 2], "kind": ..., "failed_since": ..., '
                      '"failed_before": ...} (its queue must be the path\'s)'),
    Param("ids", where="form", type="integer", repeat=True, minimum=1, maximum=2**63 - 1,
          description="job ids (repeatable; instead of `selection`)"),
    Param("kind", where="form", max_length=500, description="job kind (instead of `selection`)"),
]
CONFIRM = [
    Param("expected", where="form", type="integer", minimum=0,
          description="the preview's count (`confirm.expected`); required for purge"),
    Param("max_seq", where="form", type="integer", minimum=0,
          description="the preview's highest sequence read (`confirm.max_seq`); required for purge"),
    Param("selection_hash", where="form", max_length=100,
          description="the preview's selection hash (`confirm.selection_hash`); required for purge"),
]
BROKER_ERRORS: dict[str, str | tuple[str, dict]] = {"404": "not a broker queue's name, or a queue not served by NATS with no dead-letter stream",
                 "503": "the broker (or the database) did not answer: the message says which and why"}


@bp.get("/api/v1/deadletters/broker/<name>")
@requires("viewer")
@api_doc("A broker queue's dead letters (its JetStream stream skiplock_dead_<name>), oldest first, 50 a page",
         params=[NAME, Param("after", pattern="^[0-9]{1,19}$", max_length=19,
                             description="the `next` cursor of the previous page (a sequence number)")],
         description="Error text and payloads are redacted for viewers.", responses=BROKER_ERRORS,
         response=obj({"queue": STR, "backend": STR, "stream": STR, "rows": arr(DEAD_LETTER), "stream_total": INT,
                       "next": opt(INT), "after": INT}))
def api_index(name: str):
    return jsonify(listing(name))


@bp.post("/api/v1/deadletters/broker/<name>/preview")
@requires("operator")
@api_doc("Preview a replay or purge of a broker queue's dead letters: the exact count, a sample (changes nothing)",
         params=[NAME, *SELECTION],
         description=f"Reads at most {SCAN} messages of the stream, oldest first (`more`: there are more; "
                     "run again for the rest). `confirm` holds the fields to send back to "
                     "/api/v1/deadletters/broker/{name}/operations.",
         responses={**BROKER_ERRORS, "400": "bad selection, or one that names another queue"},
         response=obj({"action": STR, "backend": STR, "queue": STR, "stream": STR, "total": INT,
                       "sample": arr(DEAD_LETTER), "description": STR, "selection": OBJ, "max_seq": INT,
                       "more": BOOL, "stream_total": INT, "selection_hash": STR, "scan": INT,
                       "confirm": obj({"expected": INT, "max_seq": INT, "selection_hash": STR})}))
def api_preview(name: str):
    return jsonify(preview_data(name))


@bp.post("/api/v1/deadletters/broker/<name>/operations")
@requires("operator")
@api_doc("Replay or purge a broker queue's selected dead letters now (audited); answers when it is done",
         params=[NAME, *SELECTION,
                 Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log); a replay of one job may leave it empty"),
                 *CONFIRM],
         description="Replay publishes each job again to the queue's stream and deletes the dead letter once "
                     "JetStream stored it; purge deletes them. Bound to the preview when its `confirm` fields "
                     "are sent (required for a purge): 409 when the selection no longer matches exactly.",
         responses={**BROKER_ERRORS,
                    "400": "bad selection, a purge without its preview's fields, or nothing matches",
                    "409": "the selection no longer matches exactly the previewed dead letters: preview again",
                    "422": "no reason (every purge, and a replay of more than one job, needs one)"},
         response=obj({"queue": STR, "description": STR, "result": obj({
             "backend": STR, "action": STR, "queue": STR, "total": INT, "done": INT, "gone": INT, "batches": INT,
             "seconds": NUM, "more": BOOL, "audit_ids": arr(INT)})}))
def api_start(name: str):
    return jsonify(start_data(name))
