"""Queues: per-queue figures (depth by state, age of the oldest eligible job, stuck leases,
dead letters), a backlog drain estimate from the collectors' samples, pause/resume, and the
queue's concurrency and rate limits with their usage (console.limits).

GET  /queues, /queues/_table (the polled fragment), /queues/<name>
POST /queues/<name>/pause, /queues/<name>/resume (operator; CSRF; audited by console.maintenance)
POST /queues/<name>/limits (operator; CSRF; audited by console.limits)
and the same under /api/v1/queues (limits: PUT /api/v1/queues/<name>/limits).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console import browse, limits, samples
from console.maintenance import pause_queue, resume_queue
from console.web.api import BOOL, INT, NUM, STR, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn, run_panel

bp = Blueprint("queues", __name__)

LIMITS = obj({"concurrency": opt(INT), "rate": opt(STR), "burst": opt(NUM)})
USAGE = obj({"concurrency": opt(INT), "rate": opt(STR), "burst": opt(NUM), "running": INT, "tokens": opt(NUM)},
            optional=("running", "tokens"))
QUEUE_ROW = obj({"queue": STR, "eligible": opt(NUM), "running": opt(NUM), "failed": opt(NUM), "paused": opt(BOOL),
                 "limits": opt(USAGE),
                 "drain": obj({"state": STR, "text": STR, "seconds": opt(NUM), "net_per_second": opt(NUM)})},
                optional=("eligible", "running", "failed", "paused", "limits"))


def _from_samples(conn) -> list[dict[str, Any]]:
    """Figures from the latest samples, for when the live query is too slow."""
    by_queue: dict[str, dict[str, Any]] = {}
    for s in samples.latest(conn, "queue_depth"):
        row = by_queue.setdefault(s.labels.get("queue", "?"), {"queue": s.labels.get("queue", "?"), "sampled_at": s.at})
        row[s.labels.get("state", "?")] = s.value
    for s in samples.latest(conn, "queue_age_seconds"):
        by_queue.setdefault(s.labels.get("queue", "?"), {"queue": s.labels.get("queue", "?")})["age_seconds"] = s.value
    return sorted(by_queue.values(), key=lambda r: r["queue"])


def queues_data() -> dict[str, Any]:
    live = run_panel(browse.queue_figures)
    rows, source, error = (live.data, "live", None) if live.ok else ([], "samples", live.error)
    if not live.ok:
        fallback = run_panel(_from_samples)
        rows = fallback.data if fallback.ok else []
    points = run_panel(browse.backlog_points)
    for row in rows:
        if points.ok:
            estimate = browse.drain_estimate(points.data.get(row["queue"], []))
        else:
            estimate = browse.Drain("unknown", "samples not available")
        if estimate.state == "unknown" and row.get("eligible") == 0:
            estimate = browse.Drain("empty", "nothing waiting", 0.0)
        row["drain"] = {"state": estimate.state, "text": estimate.text, "seconds": estimate.seconds,
                        "net_per_second": estimate.net_per_second}
    limited = run_panel(limits.queue_limits)
    by_queue = {r["queue"]: r for r in limited.data} if limited.ok else {}
    for row in rows:
        lim = by_queue.get(row["queue"])
        row["limits"] = None if lim is None else {k: lim[k] for k in ("concurrency", "rate", "burst", "running", "tokens")}
    stuck = sum(r.get("stuck") or 0 for r in rows)
    paused = sum(1 for r in rows if r.get("paused"))
    state_bits = ([f"{stuck} stuck"] if stuck else []) + ([f"{paused} paused"] if paused else [])
    return {"queues": rows, "source": source, "error": error, "tab_state": " · ".join(state_bits)}


@bp.get("/queues")
@requires("viewer")
def index():
    return render_template("queues/index.html", **queues_data())


@bp.get("/queues/_table")
@requires("viewer")
def table():
    return render_template("queues/_table.html", **queues_data())


@bp.get("/api/v1/queues")
@requires("viewer")
@api_doc("Per-queue figures: eligible, scheduled, running, stuck, failed, oldest eligible age, paused, drain estimate",
         description="`source` is `live`, or `samples` when the live query timed out (then `error` says why).",
         response=obj({"queues": arr(QUEUE_ROW), "source": {"enum": ["live", "samples"]}, "error": opt(STR),
                       "tab_state": STR}))
def api_index():
    return jsonify(queues_data())


def queue_data(name: str) -> dict[str, Any]:
    data = queues_data()
    row = next((r for r in data["queues"] if r["queue"] == name), None)
    if row is None:
        abort(404, f"there is no queue {name!r} (no jobs and never paused)")
    return {"queue": row, "source": data["source"], "error": data["error"],
            "tab_state": "paused" if row.get("paused") else ""}


@bp.get("/queues/<name>")
@requires("viewer")
def detail(name: str):
    return render_template("queues/detail.html", **queue_data(name))


@bp.get("/api/v1/queues/<name>")
@requires("viewer")
@api_doc("One queue's figures and drain estimate", responses={"404": "no such queue (no jobs and never paused)"},
         response=obj({"queue": QUEUE_ROW, "source": {"enum": ["live", "samples"]}, "error": opt(STR),
                       "tab_state": STR}))
def api_detail(name: str):
    return jsonify(queue_data(name))


def _set(name: str, action: str) -> None:
    reason = (request.form.get("reason") or "").strip()[:500] or None
    (pause_queue if action == "pause" else resume_queue)(get_conn(), name, actor=g.user.name, reason=reason)


def _back(name: str):
    target = request.form.get("back")
    if target == "index":
        return redirect(url_for("queues.index"))
    return redirect(url_for("queues.detail", name=name))


@bp.post("/queues/<name>/pause")
@requires("operator")
def pause(name: str):
    _set(name, "pause")
    if request.headers.get("HX-Request"):
        return table()
    return _back(name)


@bp.post("/queues/<name>/resume")
@requires("operator")
def resume(name: str):
    _set(name, "resume")
    if request.headers.get("HX-Request"):
        return table()
    return _back(name)


@bp.post("/api/v1/queues/<name>/pause")
@requires("operator")
@api_doc("Pause a queue: workers stop claiming from it; in-flight jobs finish (audited)",
         params=[Param("reason", where="form", description="why (kept in the audit log; first 500 characters)")],
         response=obj({"ok": BOOL, "queue": STR, "paused": BOOL}))
def api_pause(name: str):
    _set(name, "pause")
    return jsonify({"ok": True, "queue": name, "paused": True})


@bp.post("/api/v1/queues/<name>/resume")
@requires("operator")
@api_doc("Resume a paused queue (audited)", params=[Param("reason", where="form", description="why")],
         response=obj({"ok": BOOL, "queue": STR, "paused": BOOL}))
def api_resume(name: str):
    _set(name, "resume")
    return jsonify({"ok": True, "queue": name, "paused": False})


# --- limits -------------------------------------------------------------------------------

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("", "0", "false", "off", "no")


def _limits_input() -> dict[str, Any]:
    """The request's {concurrency, rate, clear, reason}, from a JSON body or a form."""
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object: {concurrency, rate, clear, reason}")
    else:
        body = {k: v for k, v in request.form.items() if k not in ("csrf_token", "back")}
    clear = body.get("clear", False)
    if isinstance(clear, str) and clear.strip().lower() in _TRUE + _FALSE:
        clear = clear.strip().lower() in _TRUE
    if clear is None:
        clear = False
    if not isinstance(clear, bool):
        raise ValueError("clear: must be true or false")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError("reason: must be a string")
    rate = body.get("rate")
    if rate is not None and not isinstance(rate, str):
        raise ValueError("rate: must be a string like 10/s or 30/m")
    return {"concurrency": body.get("concurrency"), "rate": rate, "clear": clear,
            "reason": (reason or "").strip()[:500] or None}


def _set_limits(name: str) -> dict[str, Any]:
    data = _limits_input()
    return limits.set_limits(get_conn(), name, concurrency=data["concurrency"], rate=data["rate"],
                             clear=data["clear"], actor=g.user.name, reason=data["reason"])


@bp.post("/queues/<name>/limits")
@requires("operator")
def set_limits(name: str):
    _set_limits(name)
    return redirect(url_for("queues.detail", name=name))


@bp.put("/api/v1/queues/<name>/limits")
@requires("operator")
@api_doc("Set, change or clear a queue's concurrency and rate limits (audited)",
         description="A limit not given keeps its value; `clear` removes both first, then sets the ones given. "
                     "`concurrency`: at most that many of the queue's jobs run at once across all workers. "
                     "`rate`: `N/s` or `N/m`, claims per second or minute, with a burst of a second's worth "
                     "(at least 1). Workers apply it within a poll interval.",
         params=[Param("concurrency", where="form", type="integer", minimum=1, maximum=limits.MAX_CONCURRENCY,
                       description="most jobs of this queue running at once, fleet-wide"),
                 Param("rate", where="form", pattern=r"^\s*\d+\s*/\s*(s|sec|second|m|min|minute)\s*$",
                       description="most claims per second (N/s) or minute (N/m)"),
                 Param("clear", where="form", type="boolean", description="remove both limits first"),
                 Param("reason", where="form", description="why (kept in the audit log; first 500 characters)")],
         body=obj({"concurrency": opt({**INT, "minimum": 1, "maximum": limits.MAX_CONCURRENCY}),
                   "rate": opt({**STR, "pattern": r"^\s*\d+\s*/\s*(s|sec|second|m|min|minute)\s*$"}),
                   "clear": BOOL, "reason": STR},
                  optional=("concurrency", "rate", "clear", "reason")),
         response=obj({"ok": BOOL, "queue": STR, "before": LIMITS, "after": LIMITS}))
def api_set_limits(name: str):
    result = _set_limits(name)
    return jsonify({"ok": True, **result})
