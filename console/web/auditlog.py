"""The audit log page: who did what, to which selection, why, with how many rows.

GET /audit?actor=&action=&since=&until=&before= (keyset on id, newest first), /api/v1/audit

A row's `selection` can hold a payload filter and its `detail` an operation's error: viewers see
them through console.web.redact, like payloads and error text everywhere else. The page shows the
selection in words (`selection_text`: "fingerprint KeyError: <str>", not the JSON with its
escapes) and each target as a link to the thing it names (`target_path`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from flask import Blueprint, g, jsonify, render_template, request, url_for

from console import audit
from console.audit import selection_text
from console.browse import InvalidFilter, parse_time
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import current_database, run_limited
from console.web.redact import audit_row_for

bp = Blueprint("auditlog", __name__)


# target prefix -> the page that shows the thing (the part after the colon goes in the path).
_TARGETS = {
    "job": lambda v: url_for("jobs.detail", job_id=int(v)) if v.isdigit() else None,
    "queue": lambda v: url_for("queues.detail", name=v),
    "operation": lambda v: url_for("deadletters.operation", op_id=int(v)) if v.isdigit() else None,
    "alert": lambda v: url_for("alerts.alert_page", alert_id=int(v)) if v.isdigit() else None,
    "periodic": lambda v: url_for("periodic.index") + "#entry-" + quote(v, safe=""),
    "rule": lambda v: url_for("alerts.rules_page"),
    "silence": lambda v: url_for("alerts.index") + "#silences",
    "webhook": lambda v: url_for("alerts.destinations_page"),
    "run": lambda v: url_for("maintenance.index") + "#runs",
    "user": lambda v: url_for("admin.users"),
    "token": lambda v: url_for("admin.users"),
}


def target_path(target: str | None) -> str | None:
    """The console page of an audit row's target ("job:42" -> /jobs/42), or None."""
    kind, sep, value = (target or "").partition(":")
    make = _TARGETS.get(kind) if sep else None
    return make(value) if make and value else None


def audit_data() -> dict[str, Any]:
    from console.web import state

    args = request.args
    actor = (args.get("actor") or "").strip() or None
    action = (args.get("action") or "").strip() or None
    since = parse_time(args["since"], "since") if (args.get("since") or "").strip() else None
    until = parse_time(args["until"], "until") if (args.get("until") or "").strip() else None
    before = (args.get("before") or "").strip() or None
    if before is not None:
        if not before.isdigit() or int(before) > 2**63 - 1:
            raise InvalidFilter(f"before: {before!r} is not an audit row id")
        before = int(before)
    limit = state().config.web.page_size
    rows = run_limited(audit.search, actor=actor, action=action, since=since, until=until, before_id=before, limit=limit + 1)
    more = len(rows) > limit
    # Every row lives in the database its action touched (an action under /db/<name>/ and a CLI
    # `--database NAME` action are written there), so the database is the one this page reads.
    here = current_database()
    rows = [{**audit_row_for(r, g.user), "database": here} for r in rows[:limit]]
    for row in rows:
        row["target_path"] = target_path(row.get("target"))
        row["selection_text"] = selection_text(row.get("selection"))
    keep = {k: v for k, v in (("actor", actor), ("action", action), ("since", args.get("since")), ("until", args.get("until"))) if v}
    return {"entries": rows, "next": rows[-1]["id"] if more and rows else None, "args": keep, "first_page": before is None}


@bp.get("/audit")
@requires("viewer")
def index():
    return render_template("auditlog/index.html", **audit_data())


@bp.get("/api/v1/audit")
@requires("viewer")
@api_doc("The audit log, newest first (keyset pages)", params=[
    Param("actor", description="exact actor (user name, scheduler, cli:...)"),
    Param("action", description="exact action (replay, purge, pause, login, ...)"),
    Param("since", description="ISO 8601 time or span back from now (15m, 6h, 7d)"),
    Param("until", description="ISO 8601 time or span back from now"),
    Param("before", type="integer", minimum=0, maximum=2**63 - 1, description="the `next` value of the previous page"),
], response=obj({"entries": arr(obj({"id": INT, "at": TIME, "actor": STR, "action": STR, "target": opt(STR),
                                     "reason": opt(STR), "rows": opt(INT), "outcome": opt(STR),
                                     "database": STR})),
                 "next": opt(INT), "args": OBJ, "first_page": BOOL}))
def api_index():
    return jsonify(audit_data())
