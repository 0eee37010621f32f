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

Viewers see error text and payloads redacted (console.web.redact), like PostgreSQL's dead
letters. A broker that does not answer is a 503 with the reason; a queue that is not a broker
queue and has no dead-letter stream is a 404. No PostgreSQL transaction is open while NATS is
called. Not here (yet): an /api/v1 mirror.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, abort, g, render_template, request

from console import jsonbounds
from console import maintenance as m
from console.actions import bulk_action
from console.maintenance import brokerdlq
from console.queue import broker
from console.web.actor import actor, reason_for
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


@bp.get("/deadletters/broker/<name>")
@requires("viewer")
def index(name: str):
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
    return render_template("deadletters/broker.html", queue=queue, backend=backend,
                           stream=broker.dead_stream(queue), rows=[_row_for(r) for r in page["rows"]],
                           stream_total=page["stream_total"], next=page["next"], after=int(raw_after))


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


@bp.post("/deadletters/broker/<name>/preview")
@requires("operator")
def preview(name: str):
    queue = _queue(name)
    action = _action()
    sel = _selection(queue)
    nats_url, timeout = _broker()
    try:
        p = brokerdlq.preview(nats_url, sel, sample=SAMPLE, scan=SCAN, timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        _unavailable(exc, queue)
    data = p.as_dict()
    data["sample"] = [_row_for(r) for r in data["sample"]]
    return _page("broker_confirm", action=action, scan=SCAN, selection_json=json.dumps(p.selection, sort_keys=True),
                 **data)


@bp.post("/deadletters/broker/<name>/operations")
@requires("operator")
def start(name: str):
    queue = _queue(name)
    action = _action()
    sel = _selection(queue)
    reason = reason_for(bulk_action(action, sel.to_dict()))
    previewed = brokerdlq.BrokerPreviewed.from_fields(request.form)
    if previewed is None and action == "purge":
        abort(400, "purge needs the preview it confirms: missing expected, max_seq, selection_hash (preview first)")
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
    return _page("broker_done", queue=queue, result=result.as_dict(), description=brokerdlq.describe(sel))
