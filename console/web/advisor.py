"""The advisor page: the production checklist evaluated live, and the verdict over the stored
history ("fits PostgreSQL" / "watch" / "outgrowing PostgreSQL").

GET /advisor, /advisor/_checks (polled fragment), /api/v1/advisor; POST /advisor/run and
/api/v1/advisor/run (operator: run the checks now and store the run)

Running all the checks costs 0.2-0.8 s of database work, too much for every 5 s poll of every
open tab. So the last full run is kept in skiplock.advisor_snapshots (console.advisor.report)
and the page and its poll show that one, with "checked N s ago; the checks cost X ms". The
scheduler stores a new run every collection cycle; an operator's "Re-run checks" stores one at
once. A GET never writes (issue 26): it reads the stored run, and only when none was ever
stored runs the checks in a transaction it rolls back. `?check=` picks checks out of the run;
`?fresh=1` on the API, which used to run and store them from a GET, is refused with a 400 that
names the POST.

Each check runs in its own time-limited transaction (console.advisor), so a slow or refused
check says "not available" and the rest of the page renders.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console.advisor import checks as advisor_checks
from console.advisor import report as stored_run
from console.advisor.external import CHECKS as EXTERNAL_CHECKS
from console.advisor.verdict import evaluate_verdict
from console.web.api import BOOL, INT, NUM, OBJ, STR, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn

bp = Blueprint("advisor", __name__)

LEVEL_CLASS = {"ok": "good", "fail": "bad", "warn": "warn", "unknown": "na",
               "watch": "warn", "outgrowing": "bad"}


def _only() -> list[str] | None:
    """`?check=a,b` or `?check=a&check=b`; an unknown id is a 400 (UnknownCheck is a ValueError)."""
    wanted = [c.strip() for value in request.args.getlist("check") for c in value.split(",") if c.strip()]
    return wanted or None


def checks_data(only: list[str] | None = None, *, fresh: bool = False) -> dict[str, Any]:
    from console.web import state

    if only:
        known = advisor_checks.check_ids() + [cid for cid, _, _ in EXTERNAL_CHECKS]
        unknown = [name for name in only if name not in known]
        if unknown:
            raise advisor_checks.UnknownCheck(f"unknown check {', '.join(unknown)}; known checks: {', '.join(known)}")
    conn, config = get_conn(), state().config
    if fresh:  # a POST's: an operator's re-run, stored
        stored = stored_run.run_and_store(conn, config, g.user.name)
    else:  # a GET's: the stored run, or for a console that never stored one, a run it does not store
        stored = stored_run.stored(conn) or stored_run.run_unstored(conn, config)
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
    age = stored["age_s"]
    checked = {"age_s": None if age is None else round(age, 1), "duration_ms": stored["duration_ms"],
               "checked_by": stored.get("checked_by"), "stored": age is not None,
               "stale": age is not None and age > 2 * config.scheduler.collect_interval}
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
    """Re-run every check now and store the run (an operator's button); the page then shows it."""
    data = checks_data(fresh=True)
    if request.headers.get("HX-Request"):
        return render_template("advisor/_checks.html", level_class=LEVEL_CLASS, **data)
    return redirect(url_for("advisor.index"), 303)


API_RESPONSE = obj({
    "database": STR, "worst": STR, "counts": obj({"ok": INT, "warn": INT, "fail": INT, "unknown": INT}),
    "checks": arr(obj({"id": STR, "title": STR, "area": STR, "status": {"enum": ["ok", "warn", "fail", "unknown"]},
                       "summary": STR, "evidence": arr(STR)})),
    "verdict": obj({"label": STR, "level": STR, "headline": STR, "signals": arr(OBJ)}),
    "checked": obj({"age_s": opt(NUM), "duration_ms": NUM, "checked_by": opt(STR), "stored": BOOL, "stale": BOOL}),
})


def _api_answer(data: dict[str, Any]) -> dict[str, Any]:
    return {**data["report"], "checked": data["checked"], "verdict": verdict_data()}


@bp.post("/api/v1/advisor/run")
@requires("operator")
@api_doc("Run every check now and store the run (what the page's Re-run button does); answers as GET /api/v1/advisor",
         params=[Param("check", repeat=True, description="Only these checks in the answer (all are run and stored)")],
         response=API_RESPONSE)
def api_rerun():
    return jsonify(_api_answer(checks_data(_only(), fresh=True)))


@bp.get("/api/v1/advisor")
@requires("viewer")
@api_doc(
    "The advisor: every production-checklist check (ok/warn/fail/unknown with evidence, remedy and a docs link) "
    "and the verdict over the stored history",
    params=[Param("check", repeat=True, description="Only these checks (repeat or comma-separate ids)")],
    description="The stored run (the scheduler refreshes it every collection cycle; POST /api/v1/advisor/run runs "
                "and stores it now). A GET never runs or stores the checks: `fresh=1` is refused (400).",
    response=API_RESPONSE,
)
def api_index():
    if "fresh" in request.args:
        # It used to run and store the checks: a GET that wrote, even with a read-only token.
        abort(400, "fresh: a GET never runs the checks; POST /api/v1/advisor/run (operator) runs and stores them now")
    return jsonify(_api_answer(checks_data(_only())))
