"""The advisor page: the production checklist evaluated live, and the verdict over the stored
history ("fits PostgreSQL" / "watch" / "outgrowing PostgreSQL").

GET /advisor, /advisor/_checks (polled fragment), /api/v1/advisor

Each check runs in its own time-limited transaction (console.advisor), so a slow or refused
check says "not available" and the rest of the page renders. Read-only: the only write is the
advisor's own memory of counter readings (skiplock.advisor_snapshots).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template, request

from console.advisor import checks as advisor_checks
from console.advisor.verdict import evaluate_verdict
from console.web.api import INT, OBJ, STR, Param, api_doc, arr, obj
from console.web.auth import requires
from console.web.database import get_conn

bp = Blueprint("advisor", __name__)

LEVEL_CLASS = {"ok": "good", "fail": "bad", "warn": "warn", "unknown": "na",
               "watch": "warn", "outgrowing": "bad"}


def _only() -> list[str] | None:
    """`?check=a,b` or `?check=a&check=b`; an unknown id is a 400 (UnknownCheck is a ValueError)."""
    wanted = [c.strip() for value in request.args.getlist("check") for c in value.split(",") if c.strip()]
    return wanted or None


def checks_data(only: list[str] | None = None) -> dict[str, Any]:
    from console.web import state

    report = advisor_checks.run_checks(get_conn(), state().config, only=only)
    counts = report.counts
    areas: list[dict[str, Any]] = []
    for result in report.results:
        if not areas or areas[-1]["area"] != result.area:
            areas.append({"area": result.area, "checks": []})
        areas[-1]["checks"].append(result.to_dict())
    tab = []
    if counts["fail"]:
        tab.append(f"{counts['fail']} failing")
    if counts["warn"]:
        tab.append(f"{counts['warn']} warning")
    return {"report": report.to_dict(), "areas": areas, "counts": counts, "worst": report.worst,
            "tab_state": ", ".join(tab)}


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


@bp.get("/api/v1/advisor")
@requires("viewer")
@api_doc(
    "The advisor: every production-checklist check (ok/warn/fail/unknown with evidence, remedy and a docs link) "
    "and the verdict over the stored history",
    params=[Param("check", repeat=True, description="Only these checks (repeat or comma-separate ids)")],
    response=obj({"database": STR, "worst": STR, "counts": obj({"ok": INT, "warn": INT, "fail": INT, "unknown": INT}),
                  "checks": arr(obj({"id": STR, "title": STR, "area": STR,
                                     "status": {"enum": ["ok", "warn", "fail", "unknown"]}, "summary": STR,
                                     "evidence": arr(STR)})),
                  "verdict": obj({"label": STR, "level": STR, "headline": STR, "signals": arr(OBJ)})}),
)
def api_index():
    data = checks_data(_only())
    return jsonify({**data["report"], "verdict": verdict_data()})
