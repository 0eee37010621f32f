"""Alerts pages and their JSON twins.

GET  /alerts                          firing and pending alerts, silences, recent transitions
GET  /alerts/<id>                     one alert: its history, notifications and deliveries
POST /alerts/<id>/ack                 acknowledge (operator; audited)
POST /alerts/silences                 silence a rule + labels for a duration (operator; audited)
POST /alerts/silences/<id>/expire     end a silence early (operator; audited)
GET  /alerts/rules                    rules in force and where each comes from
POST /alerts/rules                    save a UI rule (admin; audited; 400 with the reason when invalid)
                                      (every change here needs a `reason` for the audit log: 422 without)
POST /alerts/rules/<name>/delete      (admin)
GET  /alerts/destinations             webhooks (secrets never shown), "send test"
POST /alerts/destinations             save a UI destination (admin)
POST /alerts/destinations/<name>/delete
POST /alerts/destinations/<name>/test send a test notification now, show the real answer (operator)
GET  /alerts/deliveries               the delivery log
and the same under /api/v1/alerts.

Every change goes through the domain (`console.alerts`), which writes the audit row in the
same transaction. This module sends nothing itself except the explicit "send test".

Why one module of about 600 lines: every route above belongs to one blueprint (`alerts.*`
endpoints, one template folder), and each is a thin view over `console.alerts`; the JSON twins
share their data functions with the pages. The seams, should it grow: alerts and silences;
rules; destinations and deliveries.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console.actions import MAX_REASON, ReasonRequired
from console.alerts import context, outbox
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.alerts.defaults import DEFAULT_NAMES
from console.alerts.links import as_dicts, why_queue
from console.catalog import METRICS
from console.web import listing, state
from console.web.actor import actor, reason_for
from console.web.api import (
    BOOL,
    INT,
    NUM,
    OBJ,
    STR,
    TIME,
    Param,
    api_doc,
    arr,
    obj,
    opt,
    panel,
    ref,
)
from console.web.auth import requires
from console.web.database import current_database, get_conn, run_panel, timeout_ms
from console.web.listing import LIST_FIELDS, LIST_PARAMS
from console.web.redact import audit_row_for, notification_keys, text_for

log = logging.getLogger(__name__)
bp = Blueprint("alerts", __name__)

# Rule and destination changes and silences need a reason (console.actions.ACTIONS): 422 without.
REASON = {**STR, "maxLength": MAX_REASON, "description": "why (kept in the audit log)"}
REASON_PARAM = Param("reason", where="form", required=True, max_length=MAX_REASON, description="why (kept in the audit log)")


def _config():
    from console.web import state

    return state().config


@bp.record_once
def _check_config_at_startup(setup_state) -> None:
    # A typo in [[alerts.rules]] or [[webhooks]] stops create_app() with the rule's name.
    r.check_config(setup_state.app.extensions["skiplock"].config)


def _ruleset(conn) -> r.RuleSet:
    return r.load(conn, _config())


def _htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def _wants_json() -> bool:
    return request.path.startswith("/api/")


# --- the alerts page -----------------------------------------------------------------------------


def _labelled(labels: dict[str, str]) -> dict[str, str]:
    """An alert's labels as shown: with the database it is about (as in its webhook payloads)."""
    return {**labels, "database": current_database()}


def _alert_name(a: dict[str, Any]) -> str:
    """What `q` searches in an alert: its rule and its labels (`queue_age queue=billing`)."""
    return " ".join([a["rule"], *(f"{k}={v}" for k, v in (a.get("labels") or {}).items())])


def _active(conn) -> dict[str, Any]:
    """One page of the active alerts (firing, most severe first; `q` searches the rule and
    labels), with the counts over all of them: one alert per queue is 5,000 alerts on a fleet of
    5,000 queues (console/web/listing.py). The database sorts and pages them, and only the
    shown alerts are made into rows (summary, silence, links): a search reads every alert's
    rule and labels, then the page of its matches."""
    ruleset = _ruleset(conn)
    q, page, limit = listing.args(_config().web.list_limit)
    counts = ev.alert_counts(conn)
    offset = (page - 1) * limit
    if q:
        needle = q.lower()
        matching = [a["id"] for a in ev.alert_names(conn, ruleset) if needle in _alert_name(a).lower()]
        rows = ev.alerts_by_id(conn, ruleset, matching[offset:offset + limit], secret_keys=notification_keys())
        total = len(matching)
    else:
        rows = ev.alerts_page(conn, ruleset, offset=offset, limit=limit, secret_keys=notification_keys())
        total = counts.active
    shown = listing.Page(rows=rows, total=total, page=page, limit=limit, query=q, overall=counts.active)
    active = [{**a, "labels": _labelled(a["labels"])} for a in shown.rows]
    return {"alerts": active, "listing": shown, "firing": counts.firing, "pending": counts.pending,
            "rules": sorted(ruleset.rules), "destinations": len(ruleset.destinations)}


def _events(conn, **where) -> list[dict[str, Any]]:
    """Alert transitions, their labels with the database (as the alerts' own)."""
    return [{**e, "labels": _labelled(e["labels"])} for e in ev.recent_events(conn, **where)]


def _public_alert(a: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "rule", "labels", "state", "state_since", "value", "evaluated_at", "fired_at", "severity",
            "summary", "runbook", "condition", "look_here", "acknowledged_by", "acknowledged_at", "ack_note",
            "last_over_value")
    out = {k: a.get(k) for k in keys}
    silence = a.get("silence")
    out["silenced_until"] = silence["ends_at"] if silence else None
    out["silence_id"] = silence["id"] if silence else None
    return out


def _tab_state(active) -> str | None:
    if not active.ok:
        return None
    if active.data["firing"]:
        return f"{active.data['firing']} firing"
    return None


@bp.get("/alerts")
@requires("viewer")
def index():
    active = run_panel(_active)
    events = run_panel(_events, limit=30)
    silences = run_panel(ev.recent_silences, limit=30)
    return render_template("alerts/index.html", active=active, events=events, silences=silences,
                           tab_state=_tab_state(active))


@bp.get("/alerts/active")
@requires("viewer")
def active_fragment():
    active = run_panel(_active)
    return render_template("alerts/_active.html", active=active, tab_state=_tab_state(active))


@bp.get("/api/v1/alerts")
@requires("viewer")
@api_doc("Firing and pending alerts, firing first, most severe first", params=LIST_PARAMS,
         description="Each alert has its rule's severity, summary and runbook, who acknowledged it, and the "
                     "silence that holds its notifications (if any). One page of `limit` alerts (default "
                     "web.list_limit); `q` keeps those whose rule or labels contain it; `firing` and `pending` "
                     "count them all, `total` those matching, `more` those not in this page.",
         response=obj({"firing": INT, "pending": INT, "alerts": arr({"allOf": [ref("Alert"), obj({
             "silenced_until": opt(STR), "silence_id": opt(INT)})]}), **LIST_FIELDS}))
def api_index():
    conn = get_conn()
    data = _active(conn)
    return jsonify({"firing": data["firing"], "pending": data["pending"],
                    "alerts": [_public_alert(a) for a in data["alerts"]], **data["listing"].as_dict()})


@bp.get("/api/v1/alerts/events")
@requires("viewer")
@api_doc("Alert transitions (firing, repeat, resolved, acknowledged), newest first", params=[
    Param("before_id", type="integer", minimum=1, maximum=2**62, description="keyset cursor: events older than this id"),
    Param("alert_id", type="integer", minimum=1, maximum=2**62, description="only this alert"),
    Param("limit", type="integer", minimum=1, maximum=500, description="1-500 (default 50)"),
], response=obj({"events": arr(ref("AlertEvent"))}))
def api_events():
    return jsonify({"events": _events(get_conn(), limit=_int_arg("limit", 50, 1, 500),
                                      before_id=_int_arg("before_id"), alert_id=_int_arg("alert_id"))})


def _int_arg(name: str, default: int | None = None, low: int = 1, high: int = 2**62) -> int | None:
    raw = request.args.get(name)
    if raw in (None, ""):
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValueError(f"{name}: must be a whole number between {low} and {high}")
    return int(raw)


# --- one alert ----------------------------------------------------------------------------------


def _alert_data(conn, alert_id: int) -> dict[str, Any]:
    """One alert, where to look first, its chart's series with the threshold, what changed in
    the half hour before it fired, and its history. The series and the changes are panels: a
    slow one says "not available" and the rest of the page renders; a slow new-group lookup
    leaves that link out (`context.look_here`)."""
    alert = ev.get_alert(conn, alert_id)
    if alert is None:
        abort(404, f"alert {alert_id} does not exist")
    ruleset = _ruleset(conn)
    rule = ruleset.rules.get(alert["rule"])
    labels = alert["labels"]
    now = conn.execute("SELECT now()").fetchone()[0]
    win = context.window(alert, now)
    # The same list as the alert's webhook payloads (a new error group first, when there is one).
    links = as_dicts(context.look_here(conn, rule.metric, labels, win.fired, timeout_ms=timeout_ms(),
                                       secret_keys=notification_keys())) if rule else []
    # A new_error_group alert's group: first and last seen, kinds, queues, an example (its
    # secrets hidden as in the webhook, then redacted for viewers like every error text).
    group = context.error_group(conn, rule.metric, labels, timeout_ms=timeout_ms(),
                                secret_keys=notification_keys()) if rule else None
    if group is not None:
        group = {**group, "example": text_for(group["example"], g.user)}
    series = run_panel(context.series, rule.metric, labels, win, op=rule.op) if rule and rule.metric in METRICS else None
    changes = run_panel(context.changes, win.fired)
    unit = METRICS[rule.metric].unit if rule and rule.metric in METRICS else ""
    return {
        "alert": {**alert, "labels": _labelled(labels), "severity": rule.severity if rule else None,
                  "summary": rule.summary_for(labels, alert["state"], alert["value"], alert["last_over_value"])
                  if rule else alert["rule"],
                  "runbook": rule.runbook if rule else None, "condition": rule.describe() if rule else None,
                  "look_here": links,
                  # The queue whose "why isn't it moving?" answer the page loads (console/web/why.py).
                  "why_queue": why_queue(rule.metric, labels) if rule else None},
        "window": win.as_dict(),
        "error_group": group,
        "series": None if series is None else _panel_out(series, lambda pts: {
            "unit": unit, "threshold": rule.threshold, "points": [{"at": at.isoformat(), "value": v} for at, v in pts]}),
        "changes": _panel_out(changes, lambda rows: [audit_row_for(r, g.user) for r in rows]),
        "events": ev.recent_events(conn, alert_id=alert_id, limit=100),
        "notifications": outbox.recent(conn, alert_id=alert_id, limit=100),
        "deliveries": outbox.delivery_log(conn, alert_id=alert_id, limit=100),
    }


def _panel_out(p, shape) -> Any:
    return shape(p.data) if p.ok else {"available": False, "error": p.error}


def _alert_chart(data: dict[str, Any]):
    from datetime import datetime

    from console.web import charts

    series = data["series"]
    if series is None or "points" not in series:
        return None
    points = [(datetime.fromisoformat(p["at"]), p["value"]) for p in series["points"]]
    win = data["window"]
    return charts.line_chart([charts.Line(data["alert"]["rule"], points)], unit=series["unit"],
                             start=datetime.fromisoformat(win["since"]), end=datetime.fromisoformat(win["until"]),
                             threshold=series["threshold"], title=f"{data['alert']['rule']} over the alert's lifetime",
                             width=720, height=200)  # across the page (the overview's cards draw 400 x 150)


@bp.get("/alerts/<int:alert_id>")
@requires("viewer")
def alert_page(alert_id: int):
    from datetime import datetime

    data = _alert_data(get_conn(), alert_id)
    times = {k: datetime.fromisoformat(v) for k, v in data["window"].items()}
    if data["error_group"]:
        data["error_group"] = {**data["error_group"], **{
            k: datetime.fromisoformat(v) for k, v in data["error_group"].items()
            if k in ("first_seen", "last_seen", "change_at", "previous_seen") and v}}
    return render_template("alerts/alert.html", chart=_alert_chart(data), **{**data, "window": times})


@bp.get("/api/v1/alerts/<int:alert_id>")
@requires("viewer")
@api_doc("One alert with its transitions, notifications and delivery attempts",
         params=[Param("alert_id", where="path", type="integer")], responses={"404": "no such alert"},
         description="`alert.look_here` lists where to look first (the offending jobs, the holder, the check); "
                     "`series` is the rule's metric over [fired - 30 min, resolved or now] with the threshold; "
                     "`changes` the audit rows of the 30 minutes before it fired.",
         response=obj({"alert": ref("Alert"), "window": obj({"since": TIME, "fired": TIME, "until": TIME}),
                       "error_group": {**opt(OBJ), "description": "a new_error_group alert's error group: "
                                       "first_seen, last_seen, change_at, previous_seen, kinds, queues, example"},
                       "series": opt(panel(obj({"unit": STR, "threshold": NUM, "points": arr(obj({
                           "at": TIME, "value": opt(NUM)}))}))),
                       "changes": panel(arr(OBJ)),
                       "events": arr(ref("AlertEvent")), "notifications": arr(OBJ),
                       "deliveries": arr(ref("Delivery"))}))
def api_alert(alert_id: int):
    return jsonify(_alert_data(get_conn(), alert_id))


# --- acknowledge and silence ----------------------------------------------------------------------


def _after_action(message: str):
    """After a POST from the page: the refreshed fragment for htmx, else back to /alerts.
    (`message` is what happened, kept for the log line.)"""
    log.info("%s", message)
    if _wants_json():
        return None
    if _htmx():
        active = run_panel(_active)
        return render_template("alerts/_active.html", active=active, tab_state=_tab_state(active))
    return redirect(url_for("alerts.index"))


def _ack(alert_id: int):
    body = request.get_json(silent=True) if request.is_json else None
    note = request.form.get("note") or (body.get("note") if isinstance(body, dict) else None) or ""
    if not isinstance(note, str):
        raise ValueError("note: must be a string")
    note = note.strip()
    try:
        row = ev.acknowledge(get_conn(), alert_id, actor=actor(), note=note or None)
    except ev.AlertNotFound as exc:
        abort(404, str(exc))
    except ev.AlertNotFiring as exc:
        abort(409, str(exc))
    return row


@bp.post("/alerts/<int:alert_id>/ack")
@requires("operator")
def ack(alert_id: int):
    _ack(alert_id)
    return _after_action(f"Alert {alert_id} acknowledged by {g.user.name}")


@bp.post("/api/v1/alerts/<int:alert_id>/ack")
@requires("operator")
@api_doc("Acknowledge a firing alert (stops repeat notifications until it resolves)", params=[
    Param("alert_id", where="path", type="integer"), Param("note", where="form", description="what you are doing")],
    responses={"404": "no such alert", "409": "the alert is not firing"},
    body=obj({"note": STR}, optional=("note",)), response=obj({"acknowledged": INT, "by": STR}))
def api_ack(alert_id: int):
    row = _ack(alert_id)
    return jsonify({"acknowledged": row["id"], "by": actor()})


def _form() -> dict[str, Any]:
    data = request.get_json(silent=True) if request.is_json else None
    return dict(data) if isinstance(data, dict) else {k: v for k, v in request.form.items() if k != "csrf_token"}


def _silence():
    form = _form()
    for name in ("rule", "reason"):
        if not isinstance(form.get(name) or "", str):
            raise ValueError(f"{name}: must be a string")
    rule = (form.get("rule") or "").strip() or None
    labels = form.get("labels") or {}
    if isinstance(labels, str):
        labels = r.parse_selector(labels)
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError("labels: give key=value[,key=value] or an object of strings")
    try:
        seconds = r.parse_duration(form.get("duration") or "")
    except ValueError as exc:
        raise ValueError(f"duration: {exc}") from None
    reason = reason_for("alert_silence", form)
    conn = get_conn()
    return ev.silence(conn, rule=rule, labels=labels, duration=timedelta(seconds=seconds),
                      reason=reason, actor=actor(), ruleset=_ruleset(conn), cap=_config().caps.silences)


@bp.post("/alerts/silences")
@requires("operator")
def silence():
    row = _silence()
    return _after_action(f"Silenced until {row['ends_at']:%H:%M UTC}")


@bp.post("/api/v1/alerts/silences")
@requires("operator")
@api_doc("Silence the notifications of a rule's alerts (and/or a label subset) for a duration", params=[
    Param("rule", where="form", description="rule name; empty = every rule (then labels are required)"),
    Param("labels", where="form", description="key=value[,key=value] the alert's labels must include"),
    Param("duration", where="form", required=True, description="e.g. 30m, 2h (at most 30 days)"),
    Param("reason", where="form", required=True, max_length=MAX_REASON, description="why; kept in the audit log"),
], body=obj({"rule": opt(STR), "labels": {"anyOf": [STR, {"type": "object", "additionalProperties": STR}]},
             "duration": {"type": ["string", "number"]}, "reason": REASON}, optional=("rule", "labels")),
   status=201, responses={"201": "silenced", "422": "no reason", "429": "caps.silences silences are in force already"},
   response=obj({"silence": ref("Silence")}))
def api_silence():
    return jsonify({"silence": _silence()}), 201


@bp.get("/api/v1/alerts/silences")
@requires("viewer")
@api_doc("Active silences and those that ended within a day", response=obj({"silences": arr(ref("Silence"))}))
def api_silences():
    return jsonify({"silences": ev.recent_silences(get_conn(), limit=200)})


def _expire(silence_id: int):
    try:
        return ev.expire_silence(get_conn(), silence_id, actor=actor())
    except ev.AlertNotFound as exc:
        abort(404, str(exc))


@bp.post("/alerts/silences/<int:silence_id>/expire")
@requires("operator")
def expire_silence(silence_id: int):
    _expire(silence_id)
    return _after_action(f"Silence {silence_id} ended")


@bp.post("/api/v1/alerts/silences/<int:silence_id>/expire")
@requires("operator")
@api_doc("End a silence now", params=[Param("silence_id", where="path", type="integer")],
         responses={"404": "no such active silence"}, response=obj({"expired": INT}))
def api_expire_silence(silence_id: int):
    return jsonify({"expired": _expire(silence_id)["id"]})


# --- rules ---------------------------------------------------------------------------------------


def _rules_data(conn) -> dict[str, Any]:
    ruleset = _ruleset(conn)
    ui_rows = _ui_rule_meta(conn)
    out = []
    for rule in sorted(ruleset.rules.values(), key=lambda x: x.name):
        record = rule.as_record()
        record["condition"] = rule.describe()
        record["editable"] = rule.source != "file"
        record["note"] = ("defined in config file" if rule.source == "file" else
                          "built-in default" if rule.source == "default" else
                          f"saved in the UI by {ui_rows[rule.name]['updated_by']}" if rule.name in ui_rows else "saved in the UI")
        if rule.name in ruleset.shadowed_rules:
            record["note"] += "; the UI's version is ignored (the config file wins)"
        record["overrides_default"] = rule.source != "default" and rule.name in DEFAULT_NAMES
        out.append(record)
    return {"rules": out, "destinations": sorted(ruleset.destinations),
            "shadowed": sorted(ruleset.shadowed_rules)}


def _ui_rule_meta(conn) -> dict[str, dict[str, Any]]:
    from psycopg.rows import dict_row

    from console.sqlfiles import query

    with conn.cursor(row_factory=dict_row) as cur:
        return {row["name"]: row for row in cur.execute(query("alerts", "ui_rules")).fetchall()}


def _metrics() -> list[str]:
    return sorted([*METRICS, *r.DERIVED_METRICS])


@bp.get("/alerts/rules")
@requires("viewer")
def rules_page():
    data = run_panel(_rules_data)
    edit = request.args.get("edit")
    form = None
    if edit and data.ok:
        form = next((x for x in data.data["rules"] if x["name"] == edit), None)
    return render_template("alerts/rules.html", data=data, form=form, metrics=_metrics(), ops=r.OPS,
                           severities=r.SEVERITIES, error=None)


@bp.get("/api/v1/alerts/rules")
@requires("viewer")
@api_doc("Every rule in force with its source (default, ui, file)", response=obj({
    "rules": arr(obj({"name": STR, "metric": STR, "op": {"enum": list(r.OPS)}, "threshold": NUM,
                      "severity": {"enum": list(r.SEVERITIES)}, "source": {"enum": list(r.SOURCES)},
                      "editable": BOOL, "enabled": BOOL, "condition": STR})),
    "destinations": arr(STR), "shadowed": arr(STR)}))
def api_rules():
    return jsonify(_rules_data(get_conn()))


RULE_FIELDS = obj({
    "name": {**STR, "pattern": "^[a-z][a-z0-9_.-]{0,62}$"}, "metric": STR,
    "labels": {"anyOf": [STR, {"type": "object", "additionalProperties": STR}]}, "op": {"enum": list(r.OPS)},
    "threshold": {"type": ["number", "string"]}, "clear": {"type": ["number", "string"]},
    "for": {"type": ["string", "number"]}, "severity": {"enum": list(r.SEVERITIES)}, "summary": STR, "runbook": STR,
    "webhooks": {"anyOf": [STR, arr(STR)]}, "enabled": {"type": ["boolean", "string"]}, "when": OBJ,
    "reason": REASON,
}, optional=("labels", "clear", "for", "severity", "summary", "runbook", "webhooks", "enabled", "when"))


def _rule_record(form: dict[str, Any]) -> dict[str, Any]:
    """A form (or JSON body) as the config file spells a rule; empty optional fields dropped."""
    record = {k: form.get(k) for k in ("name", "metric", "labels", "op", "threshold", "clear", "for", "severity",
                                       "summary", "runbook", "webhooks") if form.get(k) not in (None, "")}
    if isinstance(form.get("enabled"), bool):
        record["enabled"] = form["enabled"]
    elif "enabled_present" in form or "enabled" in form:
        record["enabled"] = form.get("enabled") in ("on", "true", "1", True)
    when = form.get("when")
    if isinstance(when, dict):
        record["when"] = when
    elif any(form.get(k) not in (None, "") for k in ("when_metric", "when_labels", "when_threshold")):
        # The form's guard ("only while ..."): parsed by parse_rule like [[alerts.rules]] `when`, so a
        # half-filled guard is refused with a message naming the missing part, never dropped.
        record["when"] = {"metric": form.get("when_metric") or None, "labels": form.get("when_labels") or {},
                          "op": form.get("when_op"), "threshold": form.get("when_threshold")}
    return record


@bp.post("/alerts/rules")
@requires("admin")
def save_rule():
    form = _form()
    try:
        reason = reason_for("alert_rule_save", form)
        r.save_rule(get_conn(), _rule_record(form), actor=actor(), config=_config(), reason=reason)
    except (r.RuleError, ReasonRequired) as exc:
        data = run_panel(_rules_data)
        return render_template("alerts/rules.html", data=data, form=form, metrics=_metrics(), ops=r.OPS,
                               severities=r.SEVERITIES, error=str(exc)), 422 if isinstance(exc, ReasonRequired) else 400
    return redirect(url_for("alerts.rules_page"))


@bp.post("/api/v1/alerts/rules")
@requires("admin")
@api_doc("Create or replace a UI rule (same fields as [[alerts.rules]]); 400 names the problem",
         description="A rule the config file defines cannot be saved here (the file wins). Send JSON, or the "
                     "same fields form-encoded.",
         body=RULE_FIELDS, params=[*(Param(k, where="form", required=k in ("name", "metric", "op", "threshold"))
                                     for k in ("name", "metric", "labels", "op", "threshold", "clear", "for",
                                               "severity", "summary", "runbook", "webhooks", "enabled")),
                                   Param("when_metric", where="form", description="guard (form-encoded `when`): the metric that must also hold"),
                                   Param("when_labels", where="form", description="guard: label selector, e.g. queue=mail"),
                                   Param("when_op", where="form", enum=r.OPS, description="guard: comparison"),
                                   Param("when_threshold", where="form", description="guard: threshold (a number)"),
                                   REASON_PARAM],
         status=201, responses={"201": "saved", "422": "no reason", "429": "a new rule past caps.alert_rules"},
         response=obj({"rule": obj({"name": STR, "metric": STR})}))
def api_save_rule():
    form = _form()
    reason = reason_for("alert_rule_save", form)
    rule = r.save_rule(get_conn(), _rule_record(form), actor=actor(), config=_config(), reason=reason)
    return jsonify({"rule": rule.as_record()}), 201


@bp.post("/alerts/rules/<name>/delete")
@requires("admin")
def delete_rule(name: str):
    reason = reason_for("alert_rule_delete")
    if not r.delete_rule(get_conn(), name, actor=actor(), reason=reason):
        abort(404, f"no rule named {name!r} was saved in the UI")
    return redirect(url_for("alerts.rules_page"))


@bp.delete("/api/v1/alerts/rules/<name>")
@requires("admin")
@api_doc("Delete a UI rule (a default it overrode comes back)",
         params=[Param("name", where="path"),
                 Param("reason", where="query", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         responses={"404": "no such UI rule", "422": "no reason"}, response=obj({"deleted": STR}))
def api_delete_rule(name: str):
    reason = reason_for("alert_rule_delete")
    if not r.delete_rule(get_conn(), name, actor=actor(), reason=reason):
        abort(404, f"no rule named {name!r} was saved in the UI")
    return jsonify({"deleted": name})


# --- destinations ----------------------------------------------------------------------------------


def _destinations_data(conn) -> dict[str, Any]:
    ruleset = _ruleset(conn)
    out = []
    for dest in sorted(ruleset.destinations.values(), key=lambda d: d.name):
        item = dest.public()
        item["note"] = "defined in config file" if dest.source == "file" else "saved in the UI"
        if dest.name in ruleset.shadowed_destinations:
            item["note"] += "; the UI's version is ignored (the config file wins)"
        out.append(item)
    return {"destinations": out, "pending": outbox.pending_summary(conn)}


@bp.get("/alerts/destinations")
@requires("viewer")
def destinations_page():
    data = run_panel(_destinations_data)
    edit = request.args.get("edit")
    form = next((d for d in data.data["destinations"] if d["name"] == edit), None) if edit and data.ok else None
    return render_template("alerts/destinations.html", data=data, form=form, kinds=r.KINDS, error=None)


@bp.get("/api/v1/alerts/destinations")
@requires("viewer")
@api_doc("Webhook destinations (URLs shortened, secrets never returned) and what waits in the outbox",
         response=obj({"destinations": arr(obj({"name": STR, "kind": {"enum": list(r.KINDS)}, "url": STR,
                                                 "has_secret": BOOL, "source": STR, "note": STR})),
                       "pending": arr(OBJ)}))
def api_destinations():
    return jsonify(_destinations_data(get_conn()))


def _destination_record(form: dict[str, Any]) -> dict[str, Any]:
    record = {k: form.get(k) for k in ("name", "kind", "url", "secret") if form.get(k) not in (None, "")}
    headers = form.get("headers")
    if isinstance(headers, str):
        parsed: dict[str, str] = {}
        for line in headers.splitlines():
            if not line.strip():
                continue
            key, sep, value = line.partition(":")
            if not sep:
                raise r.RuleError(f"webhook {form.get('name')!r}: header line {line.strip()!r} is not Name: value")
            parsed[key.strip()] = value.strip()
        headers = parsed
    if headers:
        record["headers"] = headers
    return record


@bp.post("/alerts/destinations")
@requires("admin")
def save_destination():
    form = _form()
    try:
        reason = reason_for("alert_destination_save", form)
        r.save_destination(get_conn(), _destination_record(form), actor=actor(), config=_config(), reason=reason)
    except (r.RuleError, ReasonRequired) as exc:
        form.pop("secret", None)  # never echo a secret back into the page
        data = run_panel(_destinations_data)
        return (render_template("alerts/destinations.html", data=data, form=form, kinds=r.KINDS, error=str(exc)),
                422 if isinstance(exc, ReasonRequired) else 400)
    return redirect(url_for("alerts.destinations_page"))


@bp.post("/api/v1/alerts/destinations")
@requires("admin")
@api_doc("Create or replace a UI destination; an empty secret keeps the saved one",
         description="Send JSON, or the same fields form-encoded (`headers` then one `Name: value` a line).",
         body=obj({"name": {**STR, "pattern": "^[a-z][a-z0-9_.-]{0,62}$"}, "kind": {"enum": list(r.KINDS)},
                   "url": {**STR, "format": "uri"}, "secret": STR,
                   "headers": {"anyOf": [STR, {"type": "object", "additionalProperties": STR}]},
                   "reason": REASON},
                  optional=("kind", "secret", "headers")),
         params=[Param("name", where="form", required=True), Param("kind", where="form", enum=r.KINDS),
                 Param("url", where="form", required=True, format="uri"), Param("secret", where="form"),
                 Param("headers", where="form", description="one `Name: value` a line"), REASON_PARAM],
         status=201, responses={"201": "saved", "422": "no reason", "429": "a new destination past caps.destinations"},
         response=obj({"destination": obj({"name": STR, "url": STR})}))
def api_save_destination():
    form = _form()
    reason = reason_for("alert_destination_save", form)
    dest = r.save_destination(get_conn(), _destination_record(form), actor=actor(), config=_config(), reason=reason)
    return jsonify({"destination": dest.public()}), 201


@bp.post("/alerts/destinations/<name>/delete")
@requires("admin")
def delete_destination(name: str):
    reason = reason_for("alert_destination_delete")
    if not r.delete_destination(get_conn(), name, actor=actor(), reason=reason):
        abort(404, f"no destination named {name!r} was saved in the UI")
    return redirect(url_for("alerts.destinations_page"))


def _send_test(name: str) -> outbox.TestResult:
    conn = get_conn()
    dest = _ruleset(conn).destinations.get(name)
    if dest is None:
        abort(404, f"no destination named {name!r}")
    settings = ev.AlertSettings.from_config(_config())
    # A test waits for the receiver (up to delivery_timeout) on one of the process's threads.
    with state().in_flight.take("test", g.user.name, _config().caps.tests_per_user, "caps.tests_per_user"):
        return outbox.send_test(conn, dest, timeout=settings.delivery_timeout,
                                allow_private=settings.allow_private_destinations)


@bp.post("/alerts/destinations/<name>/test")
@requires("operator")
def test_destination(name: str):
    result = _send_test(name)
    if _htmx():
        return render_template("alerts/_test_result.html", name=name, result=result)
    # Without htmx: the whole page, the result beside its destination (the row includes the
    # same fragment, which reads `result`).
    data = run_panel(_destinations_data)
    return render_template("alerts/destinations.html", data=data, form=None, kinds=r.KINDS, error=None,
                           test_name=name, result=result)


@bp.post("/api/v1/alerts/destinations/<name>/test")
@requires("operator")
@api_doc("Send a test notification now and return the receiver's real answer",
         params=[Param("name", where="path")],
         responses={"404": "no such destination", "429": "caps.tests_per_user tests of yours are waiting already"},
         response=obj({"ok": BOOL, "status": opt(INT), "message": opt(STR), "duration_ms": opt(NUM)}))
def api_test_destination(name: str):
    result = _send_test(name)
    return jsonify({"ok": result.ok, "status": result.status, "message": result.message,
                    "duration_ms": result.duration_ms})


# --- delivery log ------------------------------------------------------------------------------------


def _deliveries_data(conn) -> dict[str, Any]:
    limit = _int_arg("limit", 50, 1, 500)
    rows = outbox.delivery_log(conn, limit=limit, before_id=_int_arg("before_id"),
                               destination=request.args.get("destination") or None,
                               alert_id=_int_arg("alert_id"))
    return {"deliveries": rows, "next": rows[-1]["id"] if len(rows) == limit else None,
            "destination": request.args.get("destination") or ""}


@bp.get("/alerts/deliveries")
@requires("viewer")
def deliveries_page():
    return render_template("alerts/deliveries.html", data=run_panel(_deliveries_data))


@bp.get("/api/v1/alerts/deliveries")
@requires("viewer")
@api_doc("The delivery log, newest first", params=[
    Param("destination", description="only this destination"),
    Param("alert_id", type="integer", minimum=1, maximum=2**62, description="only this alert's notifications"),
    Param("before_id", type="integer", minimum=1, maximum=2**62, description="keyset cursor (the `next` of the previous page)"),
    Param("limit", type="integer", minimum=1, maximum=500, description="1-500 (default 50)"),
], response=obj({"deliveries": arr(ref("Delivery")), "next": opt(INT), "destination": STR}))
def api_deliveries():
    return jsonify(_deliveries_data(get_conn()))
