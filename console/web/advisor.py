"""The advisor page: the production checklist evaluated live, and the verdict over the stored
history ("fits PostgreSQL" / "watch" / "outgrowing PostgreSQL").

GET /advisor, /advisor/_checks (polled fragment), /api/v1/advisor; POST /advisor/run

Running all the checks costs 0.2-0.8 s of database work, too much for every 5 s poll of every
open tab. So the last full run is kept in skiplock.advisor_snapshots (name "report": the
report, when it ran, what it cost, who asked) and the page and its poll show that one, with
"checked N s ago; the checks cost X ms". The run includes the table-as-queue checks of every
[[external_queues]] source (console.advisor.external.run_sources), each source its own area
with its system. It is re-run when it is older than one collection
cycle (scheduler.collect_interval), or at once when an operator presses "Re-run checks" (POST
/advisor/run). `?check=` picks checks out of the stored report; the API with `?fresh=1` runs
them now.

Each check runs in its own time-limited transaction (console.advisor), so a slow or refused
check says "not available" and the rest of the page renders. The only writes are the
advisor's own memory in skiplock.advisor_snapshots (counter readings and the last report).
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.advisor import checks as advisor_checks
from console.advisor.external import CHECKS as EXTERNAL_CHECKS
from console.advisor.external import run_sources
from console.advisor.verdict import evaluate_verdict
from console.sqlfiles import query
from console.web.api import INT, NUM, OBJ, STR, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn

bp = Blueprint("advisor", __name__)

LEVEL_CLASS = {"ok": "good", "fail": "bad", "warn": "warn", "unknown": "na",
               "watch": "warn", "outgrowing": "bad"}


def _only() -> list[str] | None:
    """`?check=a,b` or `?check=a&check=b`; an unknown id is a 400 (UnknownCheck is a ValueError)."""
    wanted = [c.strip() for value in request.args.getlist("check") for c in value.split(",") if c.strip()]
    return wanted or None


REPORT_SNAPSHOT = "report"  # skiplock.advisor_snapshots row holding the last full run


def run_and_store(actor: str | None) -> dict[str, Any]:
    """Run every check now, store the report with its cost, and return the stored form."""
    from console.web import state

    conn = get_conn()
    started = time.perf_counter()
    report = advisor_checks.run_checks(conn, state().config)
    # The table-as-queue checks of each [[external_queues]] source, in the same stored run.
    report.results += run_sources(conn, state().config)
    duration_ms = (time.perf_counter() - started) * 1000
    stored = {"report": report.to_dict(), "duration_ms": round(duration_ms, 1), "checked_by": actor}
    conn.execute(query("advisor", "snapshot_put"), {"name": REPORT_SNAPSHOT, "data": Jsonb(stored)})
    return {**stored, "age_s": 0.0}


def last_report(max_age_s: float) -> dict[str, Any]:
    """The stored report when it is younger than `max_age_s`, else a fresh run (stored)."""
    with get_conn().cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("advisor", "snapshot_get"), {"name": REPORT_SNAPSHOT}).fetchone()
    if row is not None and row["age_s"] is not None and float(row["age_s"]) < max_age_s and "report" in row["data"]:
        return {**row["data"], "age_s": float(row["age_s"])}
    return run_and_store(None)


def checks_data(only: list[str] | None = None, *, fresh: bool = False) -> dict[str, Any]:
    from console.web import state

    if only:
        known = advisor_checks.check_ids() + [cid for cid, _, _ in EXTERNAL_CHECKS]
        unknown = [name for name in only if name not in known]
        if unknown:
            raise advisor_checks.UnknownCheck(f"unknown check {', '.join(unknown)}; known checks: {', '.join(known)}")
    stored = run_and_store(g.user.name) if fresh else last_report(state().config.scheduler.collect_interval)
    checks = [c for c in stored["report"]["checks"] if not only or c["id"] in only]
    counts = {status: 0 for status in ("ok", "warn", "fail", "unknown")}
    for check in checks:
        counts[check["status"]] = counts.get(check["status"], 0) + 1
    areas: list[dict[str, Any]] = []
    for check in checks:
        if not areas or areas[-1]["area"] != check["area"]:
            areas.append({"area": check["area"], "system": check.get("system", "skiplock"),
                          "external": check.get("external"), "checks": []})
        areas[-1]["checks"].append(check)
    worst = next((s for s in ("fail", "warn", "unknown") if counts[s]), "ok")
    tab = []
    if counts["fail"]:
        tab.append(f"{counts['fail']} failing")
    if counts["warn"]:
        tab.append(f"{counts['warn']} warning")
    report = {**stored["report"], "checks": checks, "counts": counts, "worst": worst}
    checked = {"age_s": round(stored["age_s"], 1), "duration_ms": stored["duration_ms"],
               "checked_by": stored.get("checked_by")}
    # `linked`: the page was asked for these checks (an alert's look-here link): their evidence is open.
    return {"report": report, "areas": areas, "counts": counts, "worst": worst,
            "tab_state": ", ".join(tab), "checked": checked, "linked": bool(only)}


def verdict_data() -> dict[str, Any]:
    from console.web import state

    return evaluate_verdict(get_conn(), timeout_ms=state().config.database.statement_timeout_ms).to_dict()


@bp.get("/advisor")
@requires("viewer")
def index():
    data = checks_data(_only())
    return render_template("advisor/index.html", verdict=verdict_data(), level_class=LEVEL_CLASS, **data)


@bp.get("/advisor/_checks")
@requires("viewer")
def checks_fragment():
    return render_template("advisor/_checks.html", level_class=LEVEL_CLASS, **checks_data(_only()))


@bp.post("/advisor/run")
@requires("operator")
def rerun():
    """Re-run every check now (an operator's button); the page then shows the fresh result."""
    data = checks_data(fresh=True)
    if request.headers.get("HX-Request"):
        return render_template("advisor/_checks.html", level_class=LEVEL_CLASS, **data)
    return redirect(url_for("advisor.index"), 303)


@bp.get("/api/v1/advisor")
@requires("viewer")
@api_doc(
    "The advisor: every production-checklist check (ok/warn/fail/unknown with evidence, remedy and a docs link) "
    "and the verdict over the stored history",
    params=[Param("check", repeat=True, description="Only these checks (repeat or comma-separate ids)"),
            Param("fresh", description="1: run the checks now (operator) instead of the last stored run")],
    response=obj({"database": STR, "worst": STR, "counts": obj({"ok": INT, "warn": INT, "fail": INT, "unknown": INT}),
                  "checks": arr(obj({"id": STR, "title": STR, "area": STR,
                                     "status": {"enum": ["ok", "warn", "fail", "unknown"]}, "summary": STR,
                                     "evidence": arr(STR)})),
                  "verdict": obj({"label": STR, "level": STR, "headline": STR, "signals": arr(OBJ)}),
                  "checked": obj({"age_s": NUM, "duration_ms": NUM, "checked_by": opt(STR)})}),
)
def api_index():
    fresh = request.args.get("fresh", "") in {"1", "true", "yes"}
    if fresh and not g.user.can("operator"):
        abort(403, "running the checks now (fresh=1) needs the operator role")
    data = checks_data(_only(), fresh=fresh)
    return jsonify({**data["report"], "checked": data["checked"], "verdict": verdict_data()})
