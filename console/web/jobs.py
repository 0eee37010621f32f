"""The jobs browser, exports, one job's page, and single-job actions.

GET  /jobs                     filters in the query string (bookmarkable), keyset pages
GET  /jobs/export.csv|.json    the filtered set, streamed, at most web.export_limit rows
GET  /jobs/<id>                payload and error text (redacted for viewers), timeline, errors, each
                               attempt's log records (redacted), actions
POST /jobs/<id>/<action>       replay | run_now | cancel | request_cancel | purge (operator; CSRF; audited)
and the same under /api/v1/jobs, plus
POST /api/v1/jobs              enqueue one job (operator; JSON body; audited with its reason). The
                               queue page's form posts to /queues/<name>/enqueue (console.web.queues).
"""

from __future__ import annotations

import csv
import io
import json
from contextlib import contextmanager
from typing import Any

from flask import (
    Blueprint,
    Response,
    abort,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)

from console import browse
from console import queue as q
from console.actions import MAX_REASON
from console.db import time_limited
from console.web.actor import actor, reason_for
from console.web.api import ANY, BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt, ref
from console.web.auth import may_act, requires
from console.web.database import get_conn, read_pool, run_limited, run_panel, timeout_ms
from console.web.redact import (
    PAGE,
    WHOLE,
    attempt_logs_for,
    error_entry_for,
    fingerprint_for,
    fingerprint_hidden,
    may_filter_on,
    may_filter_on_fingerprint,
    payload_for,
    text_for,
)

bp = Blueprint("jobs", __name__)

FILTER_PARAMS = [
    Param("state", enum=browse.STATES, description="pending, running, completed or failed; empty = any"),
    Param("queue", max_length=200, description="exact queue name"),
    Param("kind", max_length=200, description="exact job kind"),
    Param("fingerprint", max_length=200, description="error group (the dead letters' fingerprint)"),
    Param("id", type="integer", minimum=0, maximum=2**63 - 1, description="one job id"),
    Param("payload", max_length=2000, json="text", description='JSON object the payload must contain (`@>`), e.g. {"customer": 42}'),
    Param("since", description="ISO 8601 time or a span back from now (15m, 6h, 7d); failed: failure time, else enqueue time"),
    Param("until", description="ISO 8601 time or a span back from now"),
    Param("eligible", enum=("1", "0"), description="1: pending jobs due now (what workers claim next), in claim order; implies state=pending"),
    Param("retrying", enum=("1", "0"), description="1: pending jobs that failed an attempt and wait for the next one (a retry storm's jobs); implies state=pending"),
    Param("lease", enum=("expired",), description="expired: running jobs past their lease (stuck); implies state=running"),
    Param("archived", enum=("1", "0"), description="1: the archive (skiplock.jobs_archive: finished jobs the archiver "
                                                    "moved, and purged dead letters), newest finished first"),
]


def _state():
    from console.web import state

    return state()


def _filter() -> browse.JobFilter:
    f = browse.JobFilter.parse(request.args)
    complaint = may_filter_on(f.payload, g.user) or may_filter_on_fingerprint(f.fingerprint, g.user)
    if complaint:
        abort(403, complaint)
    return f


def _limit() -> int:
    raw = request.args.get("limit")
    if not raw:
        return _state().config.web.page_size
    if not raw.isdigit() or not 1 <= int(raw) <= browse.MAX_PAGE:
        raise browse.InvalidFilter(f"limit: must be a whole number between 1 and {browse.MAX_PAGE}")
    return int(raw)


def _row_out(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "payload" in out:
        out["payload"] = payload_for(out["payload"], g.user) if out["payload"] is not None else None
    if "last_error" in out:
        out["last_error"] = text_for(out["last_error"], g.user)
    if "error_fingerprint" in out:
        out["fingerprint_hidden"] = fingerprint_hidden(out["error_fingerprint"], g.user)
        out["error_fingerprint"] = fingerprint_for(out["error_fingerprint"], g.user)
    return out


def count_data(f: browse.JobFilter) -> dict[str, Any]:
    web = _state().config.web
    count = run_panel(browse.count_jobs, f, cap=web.count_cap, window=web.scan_window)
    if not count.ok:
        return {"count": None, "count_error": count.error}
    c = count.data
    return {"count": {"n": c.n, "capped": c.capped, "window": c.window, "label": c.label()}, "count_error": None}


def browse_data(*, with_count: bool = True) -> dict[str, Any]:
    f = _filter()
    limit = _limit()
    after = request.args.get("after") or None
    page = run_limited(browse.list_jobs, f, after=after, limit=limit, window=_state().config.web.scan_window)
    data = {
        "filter": f.describe(),
        "args": f.as_args(),
        "jobs": [_row_out(r) for r in page.rows],
        "next": page.next_cursor,
        "searched": page.searched,
        "limit": limit,
        "first_page": after is None,
    }
    if with_count:
        data.update(count_data(f))
    return data


@bp.get("/jobs")
@requires("viewer")
def index():
    # The count arrives as its own fragment (/jobs/_count): the first page never waits for it.
    data = browse_data(with_count=False)
    return render_template("jobs/index.html", states=browse.STATES, count_pending=True, **data)


@bp.get("/jobs/_count")
@requires("viewer")
def count_fragment():
    f = _filter()
    return render_template("jobs/_count.html", args=f.as_args(), count_pending=False, **count_data(f))


@bp.get("/api/v1/jobs")
@requires("viewer")
@api_doc("List jobs matching a filter (keyset pages)", params=[
    *FILTER_PARAMS,
    Param("after", json="base64url", description="the `next` cursor of the previous page (a JSON array, base64url)"),
    Param("limit", type="integer", minimum=1, maximum=browse.MAX_PAGE,
          description=f"rows per page, 1-{browse.MAX_PAGE} (default web.page_size)"),
    Param("count", type="boolean", description="false: skip the count"),
], response=obj({
    "filter": OBJ, "args": OBJ, "jobs": arr(ref("Job")), "next": opt(STR), "searched": opt(INT), "limit": INT,
    "first_page": BOOL, "count": opt(obj({"n": INT, "capped": BOOL, "label": STR})), "count_error": opt(STR),
}, optional=("count", "count_error")), description="`count` stops at web.count_cap (`capped: true` means more); with a filter that has no index "
               "(queue, kind, payload, error group) each page looks at web.scan_window jobs: `searched` says a short page "
               "looked at that many and `next` continues after them. Payloads are redacted for viewers.")
def api_index():
    return jsonify(browse_data(with_count=request.args.get("count", "true").lower() not in ("0", "false", "no")))


# --- export ---------------------------------------------------------------------------------

EXPORT_COLUMNS = ("id", "queue", "kind", "status", "priority", "run_at", "attempts", "max_attempts",
                  "last_error", "error_fingerprint", "created_at", "finished_at", "payload")


def _export(fmt: str):
    if fmt not in ("csv", "json"):
        abort(400, f"format: {fmt!r} is not csv or json")
    f = _filter()
    st = _state()
    limit = st.config.web.export_limit
    raw = request.args.get("limit")
    if raw:
        if not raw.isdigit() or not 1 <= int(raw) <= limit:
            raise browse.InvalidFilter(f"limit: must be a whole number between 1 and {limit} (web.export_limit)")
        limit = int(raw)
    user = g.user
    # The database of the page (/db/<name>/), on its replica when the page reads it.
    pool = read_pool()
    wait = st.config.web.db_wait
    ms = timeout_ms()

    @contextmanager
    def limited_conn():
        with pool.connection(timeout=wait) as conn, time_limited(conn, ms):
            yield conn

    # A stream holds one of the process's threads for as long as the client reads: a user has
    # at most caps.exports_per_user of them at once (console/web/inflight.py), given back when
    # the stream ends (read to the end, failed, or closed when the client went away).
    slot = st.in_flight.take("export", user.name, st.config.caps.exports_per_user, "caps.exports_per_user")
    try:
        # The first batch runs before the response starts, so a bad filter or a timeout is an
        # error status, not a truncated file.
        rows = browse.export_jobs(limited_conn, f, limit=limit, window=st.config.web.scan_window)
        first = []
        try:
            first = [next(rows)]
        except StopIteration:
            pass
    except BaseException:
        slot.release()
        raise

    def all_rows():
        yield from first
        yield from rows

    def cleaned():
        for row in all_rows():
            row = {k: row.get(k) for k in EXPORT_COLUMNS}
            row["payload"] = payload_for(row["payload"], user)
            row["last_error"] = text_for(row["last_error"], user)
            row["error_fingerprint"] = fingerprint_for(row["error_fingerprint"], user)
            yield row

    stamp = "skiplock-jobs"
    if fmt == "json":
        def generate_json():
            yield "["
            for i, row in enumerate(cleaned()):
                yield ("," if i else "") + "\n" + json.dumps(row, default=_json_default, ensure_ascii=False)
            yield "\n]\n"

        response = Response(stream_with_context(_releasing(generate_json(), slot)), mimetype="application/json",
                            headers={"Content-Disposition": f'attachment; filename="{stamp}.json"'})
        response.call_on_close(slot.release)
        return response

    def generate_csv():
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(EXPORT_COLUMNS)
        for row in cleaned():
            writer.writerow([_csv_cell(row[c]) for c in EXPORT_COLUMNS])
            if buf.tell() > 64 * 1024:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        yield buf.getvalue()

    response = Response(stream_with_context(_releasing(generate_csv(), slot)), mimetype="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="{stamp}.csv"'})
    response.call_on_close(slot.release)
    return response


def _releasing(chunks, slot):
    """The stream, giving its in-flight slot back when it ends: read to the end, or closed by the
    server when the client goes away (the response's call_on_close covers one never read)."""
    try:
        yield from chunks
    finally:
        slot.release()


def _json_default(o):
    if hasattr(o, "isoformat"):
        return o.isoformat()
    return str(o)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, str):
        return neutralise_formula(value)
    return str(value)  # numbers stay numbers: -5 is a priority, not a formula


# A cell starting with one of these is a formula (or starts one) to spreadsheet programs:
# "=HYPERLINK(...)" in a job's last_error must arrive as text. OWASP "CSV Injection".
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_formula(text: str) -> str:
    """Prefix a text cell that a spreadsheet would read as a formula with a single quote."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


@bp.get("/jobs/export.<fmt>")
@requires("viewer")
def export(fmt: str):
    return _export(fmt)


@bp.get("/api/v1/jobs/export.<fmt>")
@requires("viewer")
@api_doc("Export the filtered jobs as CSV or JSON (streamed, at most web.export_limit rows)",
         params=[Param("fmt", where="path", enum=("csv", "json")), *FILTER_PARAMS,
                 Param("limit", type="integer", minimum=1, description="at most this many rows (1 to web.export_limit)")],
         media=("application/json", "text/csv"),
         responses={"429": "caps.exports_per_user exports of yours are streaming already"}, response=arr(ref("Job")),
         description="fmt is `csv` (a header row, then one row per job) or `json` (an array of jobs).")
def api_export(fmt: str):
    return _export(fmt)


# --- one job --------------------------------------------------------------------------------

def job_data(job_id: int, bounds=WHOLE) -> dict[str, Any]:
    """One job as g.user may see it; `bounds`: how much of the payload (PAGE for the HTML page)."""
    job = run_limited(browse.get_job, job_id)
    if job is None:
        abort(404, f"there is no job {job_id} (not in the jobs table nor the archive)")
    actions = run_panel(browse.job_actions_audit, job_id)
    job = dict(job)
    job["payload"] = payload_for(job.get("payload"), g.user, bounds)
    job["last_error"] = text_for(job.get("last_error"), g.user)
    job["fingerprint_hidden"] = fingerprint_hidden(job.get("error_fingerprint"), g.user)
    job["error_fingerprint"] = fingerprint_for(job.get("error_fingerprint"), g.user)
    # Redacted before the timeline is built from them: its details quote the messages.
    job["errors"] = [{**error_entry_for(e, g.user), "at_time": browse.parse_entry_time(e.get("at"))}
                     for e in job.get("errors") or [] if isinstance(e, dict)]
    # The log records of each attempt that logged (console.queue.joblogs), redacted like error text.
    job["attempt_logs"] = attempt_logs_for(job.get("attempt_logs"), g.user, bounds)
    window = run_panel(q.unique_window, job)
    return {
        "job": job,
        "cancel_requested": browse.cancel_requested(job),
        "unique_window": window.data if window.ok else None,
        "timeline": browse.timeline(job, actions.data if actions.ok else []),
        "actions_note": None if actions.ok else f"operator actions not available: {actions.error}",
        "allowed": browse.allowed_actions(job) if may_act("operator") else [],
        "redacted": not g.user.can("operator"),
    }


@bp.get("/jobs/<int:job_id>")
@requires("viewer")
def detail(job_id: int):
    from console.web.why import job_answer, why_panel

    data = job_data(job_id, PAGE)
    return render_template("jobs/detail.html", descriptions={k: v[1] for k, v in browse.ACTIONS.items()},
                           **why_panel(job_answer(job_id), url_for("why.job_fragment", job_id=job_id)), **data)


@bp.get("/api/v1/jobs/<int:job_id>")
@requires("viewer")
@api_doc("One job: fields, payload and error text (redacted for viewers), error history, timeline, allowed actions",
         response=obj({"job": {**ref("Job"), "description": "also errors (the history), attempt_logs (each attempt's "
                                                  "log records, redacted; see AttemptLog), archived, locked_by"},
                       "timeline": arr(obj({"at": opt(TIME), "event": STR})), "actions_note": opt(STR),
                       "allowed": arr(STR), "redacted": BOOL, "cancel_requested": BOOL,
                       "unique_window": opt(obj({"kind": STR, "idempotency_key": STR, "created_at": TIME,
                                                 "expires_at": TIME, "active": BOOL}))}),
         responses={"404": "no such job"})
def api_detail(job_id: int):
    return jsonify(job_data(job_id))


def _act(job_id: int, action: str) -> dict[str, Any]:
    if action not in browse.ACTIONS:
        abort(404, f"no action {action!r}; actions: {', '.join(browse.ACTIONS)}")
    try:
        # The table's name for it: every purge needs a reason; one job's replay, run_now, cancel may not.
        reason = reason_for({"purge": "purge", "replay": "replay_one", "cancel": "cancel_job"}.get(action, action))
        return browse.act_on_job(get_conn(), job_id, action, actor=actor(), reason=reason, dsn=_state().dsn)
    except browse.JobNotFound as exc:
        abort(404, str(exc))
    except browse.JobStateConflict as exc:
        abort(409, str(exc))


@bp.post("/jobs/<int:job_id>/<action>")
@requires("operator")
def act(job_id: int, action: str):
    _act(job_id, action)
    if action == "purge":
        return redirect(url_for("jobs.index", state="failed"))
    return redirect(url_for("jobs.detail", job_id=job_id))


@bp.post("/api/v1/jobs/<int:job_id>/<action>")
@requires("operator")
@api_doc("Act on one job: replay (failed), run_now (pending, due later), cancel (pending), "
         "request_cancel (running), purge (failed)",
         params=[Param("action", where="path", enum=tuple(browse.ACTIONS)),
                 Param("reason", where="form", max_length=MAX_REASON,
                       description="why (kept in the audit log); required for purge, optional for the others")],
         response=obj({"ok": BOOL, "action": STR}),
         responses={"404": "no such job or action", "409": "the job's state does not allow the action",
                    "422": "a purge without a reason"})
def api_act(job_id: int, action: str):
    result = _act(job_id, action)
    return jsonify({"ok": True, "action": action, **result})


# --- enqueue ----------------------------------------------------------------------------------

ENQUEUE_BODY = obj({
    "kind": {**STR, "minLength": 1, "maxLength": browse.MAX_NAME, "description": "the handler's name"},
    "queue": {**opt({**STR, "maxLength": browse.MAX_NAME}), "description": "default: `default`"},
    "payload": {**ANY, "description": "any JSON value (default {}); at most 256 KiB"},
    "priority": opt({**INT, "minimum": -32768, "maximum": 32767}),
    "run_at": {**opt(TIME), "description": "ISO 8601; UTC when no offset; default now"},
    "idempotency_key": opt({**STR, "maxLength": browse.MAX_KEY}),
    "max_attempts": {**opt({**INT, "minimum": 1, "maximum": browse.MAX_ATTEMPTS_LIMIT}),
                     "description": "default: queue.max_attempts"},
    "unique_for": {**opt({**INT, "minimum": 1, "maximum": 366 * 86400}),
                   "description": "seconds of uniqueness window for (kind, idempotency_key); needs the key"},
    "reason": {**STR, "minLength": 1, "maxLength": 500, "description": "why (kept in the audit log)"},
}, optional=("queue", "payload", "priority", "run_at", "idempotency_key", "max_attempts", "unique_for"))
ENQUEUE_BODY["additionalProperties"] = False


def enqueue_from(fields: Any, *, payload_is_text: bool) -> dict[str, Any]:
    """Both faces' enqueue: the fields checked, the job enqueued and audited as g.user."""
    config = _state().config
    return browse.enqueue_job(get_conn(), fields, actor=g.user.name, payload_is_text=payload_is_text,
                              default_max_attempts=config.queue.max_attempts,
                              per_minute=config.caps.enqueue_per_minute)


@bp.post("/api/v1/jobs")
@requires("operator")
@api_doc("Enqueue one job (audited with the reason)", body=ENQUEUE_BODY, status=201,
         responses={"201": "enqueued, or an existing job's id (created: false)",
                    "429": "caps.enqueue_per_minute jobs enqueued by you within the last minute"},
         response=obj({"id": INT, "created": BOOL, "queue": STR, "kind": STR}),
         description="A JSON object. An idempotency key a job in the hot table has, or a uniqueness window still "
                     "held, answers with that job's id and `created: false` (nothing is inserted). A bad field is "
                     "a 400 whose message starts with the field's name.")
def api_enqueue():
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict):
        abort(400, "body: send a JSON object (Content-Type: application/json)")
    return jsonify(enqueue_from(body, payload_is_text=False)), 201
