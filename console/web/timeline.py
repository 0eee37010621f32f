"""The incident timeline page, its Markdown postmortem draft, and its JSON twin.

GET /timeline?from=&to=            what happened in one database in a window (default: the last hour)
GET /timeline?alert=<id>           around an alert: 30 min before it fired to its resolution (or now)
GET /timeline.md?...               the same as a Markdown postmortem draft (a download)
GET /api/v1/timeline?...           the same as JSON

`from` and `to` take what the jobs and audit filters take: an ISO 8601 time (UTC unless it
says otherwise) or a span back from now (`90m`, `6h`). With `alert`, `from` and `to` still
override either end. A bad value is a 400 naming it; an unknown alert a 404.

Everyone signed in may read it, viewers redacted as everywhere else (console/web/redact.py): an
audit row's selection and target like the audit page shows them, error fingerprints (an error
group's, an alert's `fingerprint` label) like error text. The page, the draft and the API
redact the same events the same way: `timeline_for()` shapes them once.

Reads the primary (console/web/database.py PRIMARY_READS): whether a worker or a scheduler is
lost turns on its last heartbeat as it is now.
"""

from __future__ import annotations

from flask import Blueprint, Response, abort, g, jsonify, render_template, request

from console import signals, timeline
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.browse import parse_time
from console.web.api import INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auditlog import target_path
from console.web.auth import requires
from console.web.database import current_database, get_conn, timeout_ms
from console.web.redact import audit_row_for, fingerprint_for, fingerprint_hidden, text_for

bp = Blueprint("timeline", __name__)

MAX_ALERT_ID = 2**62

PARAMS = [
    Param("alert", type="integer", minimum=1, maximum=MAX_ALERT_ID,
          description="the window around this alert: 30 min before it fired to its resolution (or now)"),
    Param("from", description="ISO 8601 time or span back from now (90m, 6h); default an hour before `to`"),
    Param("to", description="ISO 8601 time or span back from now; default now (or the alert's resolution)"),
]


def _arg(name: str) -> str | None:
    value = (request.args.get(name) or "").strip()
    return value or None


def _replica_lag_threshold(conn) -> float:
    """The lag whose crossing is an event: the lowest threshold of the `>` rules on
    replica_lag_seconds in force (60 s, the default rule's, when none is)."""
    from console.web import state

    ruleset = r.load(conn, state().config)
    found = [rule.threshold for rule in ruleset.rules.values()
             if rule.metric == "replica_lag_seconds" and rule.op.startswith(">")]
    return min(found, default=60.0)


def _shape(event: timeline.Event) -> timeline.Event:
    """An event as g.user may see it (viewers redacted like the pages that show its source)."""
    user, d = g.user, event.data
    if event.kind == "action":
        row = audit_row_for(d, user)
        shown = text_for(row.get("target"), user)
        row = {**row, "target": shown}
        return timeline.Event(event.at, event.kind, row, event.path)
    if event.kind == "alert" and (d.get("labels") or {}).get("fingerprint"):
        labels = {**d["labels"], "fingerprint": fingerprint_for(d["labels"]["fingerprint"], user)}
        return timeline.Event(event.at, event.kind, {**d, "labels": labels}, event.path)
    if event.kind == "error_group":
        hidden = fingerprint_hidden(d["fingerprint"], user)
        path = "/deadletters#groups" if hidden else event.path
        return timeline.Event(event.at, event.kind, {**d, "fingerprint": fingerprint_for(d["fingerprint"], user)}, path)
    return event


def timeline_for() -> timeline.Timeline:
    """The request's window read and shaped for g.user (400 for a bad parameter, 404 for an
    unknown alert)."""
    from console.web import state

    conn = get_conn()
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]  # one row, always
    raw_alert, raw_from, raw_to = _arg("alert"), _arg("from"), _arg("to")
    alert = None
    since = until = None
    if raw_alert is not None:
        if not raw_alert.isdigit() or not 1 <= int(raw_alert) <= MAX_ALERT_ID:
            abort(400, f"alert: {raw_alert[:40]!r} is not an alert id (a whole number from 1)")
        alert = ev.get_alert(conn, int(raw_alert))
        if alert is None:
            abort(404, f"alert {raw_alert} does not exist")
        since, until = timeline.alert_window(alert, now)
    if raw_from:
        since = parse_time(raw_from, "from", now=now)
    if raw_to:
        until = parse_time(raw_to, "to", now=now)
    try:
        since, until = timeline.window(since, until, now)
    except timeline.WindowError as exc:
        abort(400, str(exc))
    if alert is not None:
        labels = alert.get("labels") or {}
        if labels.get("fingerprint"):
            labels = {**labels, "fingerprint": fingerprint_for(labels["fingerprint"], g.user)}
        alert = {k: alert.get(k) for k in ("id", "rule", "state", "fired_at", "resolved_at", "state_since", "value")}
        alert["labels"] = labels
    tl = timeline.build(conn, since, until, timeout_ms=timeout_ms(), database=current_database(), alert=alert,
                        live_within=signals.live_worker_within(state().config),
                        replica_lag_threshold=_replica_lag_threshold(conn))
    tl.events = [_shape(e) for e in tl.events]
    return tl


def _args_of(tl: timeline.Timeline) -> dict[str, str]:
    """The query string that reads this window again (the draft's link, the page's form)."""
    out = {"from": tl.since.isoformat(), "to": tl.until.isoformat()}
    if tl.alert:
        out = {"alert": str(tl.alert["id"]), **{k: request.args[k] for k in ("from", "to") if _arg(k)}}
    return out


@bp.get("/timeline")
@requires("viewer")
def index():
    tl = timeline_for()
    return render_template("timeline/index.html", tl=tl, kinds=timeline.KINDS, labels=timeline.LABELS,
                           spans=timeline.alert_spans(tl), counts=tl.counts(), args=_args_of(tl), cap=timeline.CAP,
                           target_path=target_path)


@bp.get("/timeline.md")
@requires("viewer")
def postmortem():
    tl = timeline_for()
    text = timeline.markdown(tl, base_url=request.url_root.rstrip("/"))
    stamp = tl.since.strftime("%Y%m%d-%H%M")
    name = f"postmortem-alert-{tl.alert['id']}.md" if tl.alert else f"postmortem-{tl.database}-{stamp}.md"
    return Response(text, mimetype="text/markdown", headers={"Content-Disposition": f'attachment; filename="{name}"'})


EVENT = obj({"at": TIME, "kind": {"enum": list(timeline.KINDS)}, "summary": STR, "path": opt(STR),
             "data": {**OBJ, "description": "the event's facts (names differ by kind), redacted for viewers"}})


@bp.get("/api/v1/timeline")
@requires("viewer")
@api_doc("The incident timeline of this database: alerts, operator actions, scheduler and worker starts and "
         "exits, deploys (a worker running another version or release than the one before it), "
         "autovacuum runs, new xmin holders, lock waits, replica lag and new error groups, oldest first",
         params=PARAMS, responses={"400": "a bad alert, from or to, or a window longer than two days",
                                   "404": "no such alert"},
         description="At most 200 events per kind; `more` says how many of a kind the window holds beyond them. "
                     "A kind whose query timed out is in `unavailable` with the reason. Viewers see audit "
                     "selections and error fingerprints redacted. `markdown` is the postmortem draft "
                     "(also at /timeline.md).",
         response=obj({"database": STR, "since": TIME, "until": TIME, "alert": opt(OBJ), "events": arr(EVENT),
                       "more": {**OBJ, "additionalProperties": INT}, "unavailable": OBJ, "counts": OBJ,
                       "markdown": STR}))
def api_index():
    tl = timeline_for()
    return jsonify({**tl.as_dict(), "markdown": timeline.markdown(tl, base_url=request.url_root.rstrip("/"))})


__all__ = ["bp", "timeline_for"]
