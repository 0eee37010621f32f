"""Queues: per-queue figures (depth by state, age of the oldest eligible job, stuck leases,
dead letters; a queue NATS JetStream serves is marked `nats`, with the broker's figures from the
collectors' samples added to PostgreSQL's; an idle queue stays listed for 24 h after its last sample, with "idle since"), a
backlog drain estimate from the collectors' samples, pause/resume, and the queue's concurrency and
rate limits with their usage (console.queue.limits).

GET  /queues, /queues/_table and /queues/_external (the polled fragments), /queues/<name>
POST /queues/<name>/pause, /queues/<name>/resume (operator; CSRF; a reason required, 422 without;
audited by console.maintenance) and the same under /api/v1/queues.
POST /queues/<name>/limits (operator; CSRF; a reason required; audited by console.queue.limits), and
PUT /api/v1/queues/<name>/limits.
POST /queues/<name>/enqueue   the queue page's "Enqueue a job" form (operator; CSRF; audited with
                              its reason); the API twin is POST /api/v1/jobs (console.web.jobs).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, abort, jsonify, redirect, render_template, request, url_for

from console import browse, samples, signals
from console.actions import MAX_REASON, ReasonRequired
from console.collectors.broker import broker_figures
from console.maintenance import UnknownQueue, pause_queue, resume_queue
from console.queue import limits
from console.web import cycle, listing, state
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, NUM, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn, run_panel
from console.web.external_panel import external_panel
from console.web.listing import LIST_FIELDS, LIST_PARAMS

bp = Blueprint("queues", __name__)

LIMITS = obj({"concurrency": opt(INT), "rate": opt(STR), "burst": opt(NUM), "group_concurrency": opt(INT)},
             optional=("group_concurrency",))
USAGE = obj({"concurrency": opt(INT), "rate": opt(STR), "burst": opt(NUM), "group_concurrency": opt(INT),
             "running": INT, "tokens": opt(NUM)},
            optional=("running", "tokens", "group_concurrency"))
GROUP_ROW = obj({"group": opt(STR), "eligible": INT, "capped": BOOL, "age_seconds": opt(NUM), "running": INT,
                 "failed": INT, "starving": BOOL, "weight": {**INT, "minimum": 1, "maximum": limits.MAX_WEIGHT}})
WEIGHTS = {"type": "object", "additionalProperties": INT}
GROUPS = obj({"groups": arr(GROUP_ROW), "groups_seen": INT, "groups_truncated": BOOL, "median_age_seconds": opt(NUM),
              "window_seconds": NUM, "starving": arr(GROUP_ROW), "error": opt(STR)},
             optional=("groups", "groups_seen", "groups_truncated", "median_age_seconds", "window_seconds", "starving",
                       "error"))
BROKER = obj({"eligible": opt(NUM), "running": opt(NUM), "failed": opt(NUM), "age_seconds": opt(NUM),
              "redeliveries": opt(NUM), "at": opt(TIME)})
QUEUE_ROW = obj({"queue": STR, "eligible": opt(NUM), "running": opt(NUM), "failed": opt(NUM), "paused": opt(BOOL),
                 "idle": BOOL, "idle_since": opt(TIME), "limits": opt(USAGE), "backend": {"enum": ["postgres", "nats"]},
                 "broker": BROKER,
                 "drain": obj({"state": STR, "text": STR, "seconds": opt(NUM), "net_per_second": opt(NUM)})},
                optional=("eligible", "running", "failed", "paused", "limits", "backend", "broker"))


def _from_samples(conn) -> list[dict[str, Any]]:
    """Figures from the latest samples, for when the live query is too slow."""
    by_queue: dict[str, dict[str, Any]] = {}
    for s in samples.latest(conn, "queue_depth"):
        if "external" in s.labels or "backend" in s.labels:  # a broker's: added by with_broker
            continue
        row = by_queue.setdefault(s.labels.get("queue", "?"), {"queue": s.labels.get("queue", "?"), "sampled_at": s.at})
        row[s.labels.get("state", "?")] = s.value
    for s in samples.latest(conn, "queue_age_seconds"):
        if "external" in s.labels or "backend" in s.labels:
            continue
        by_queue.setdefault(s.labels.get("queue", "?"), {"queue": s.labels.get("queue", "?")})["age_seconds"] = s.value
    return sorted(by_queue.values(), key=lambda r: r["queue"])


IDLE_ROW = {"eligible": 0, "scheduled": 0, "running": 0, "stuck": 0, "failed": 0, "age_seconds": 0.0,
            "oldest_eligible": None, "paused": False, "paused_at": None, "paused_by": None}


def with_idle_queues(rows: list[dict[str, Any]], activity: dict[str, dict[str, Any]], *,
                     window: timedelta = signals.DEFAULT_RATE_WINDOW) -> list[dict[str, Any]]:
    """The rows plus every queue the samples of the last 24 h know (so an emptied queue does not
    vanish), each with `idle` and `idle_since` as console.signals.queue_idle defines them
    (nothing waiting or running, and nothing finished within the rate window), and
    `last_busy` (the newest sample with work or finished jobs)."""
    by_name = {r["queue"]: r for r in rows}
    for name in activity:
        by_name.setdefault(name, {"queue": name, **IDLE_ROW})
    out = sorted(by_name.values(), key=lambda r: r["queue"])
    now = datetime.now(UTC)
    for row in out:
        last_busy = (activity.get(row["queue"]) or {}).get("last_busy")
        row["idle"], row["idle_since"] = signals.queue_idle(row, last_busy, now=now, window=window)
        row["last_busy"] = last_busy
    return out


def with_broker(rows: list[dict[str, Any]], figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with each broker queue's newest figures (console.collectors.broker.broker_figures)
    added: `broker` holds the broker's own (eligible: not delivered yet, running: delivered and
    not acknowledged, failed: the dead-letter stream, age_seconds, redeliveries, at), and the
    row's eligible, running and failed become the sum of both backends (during a move jobs are
    on both sides), its age the older head. A queue the rows do not know yet is added."""
    by_name = {r["queue"]: r for r in rows}
    now = datetime.now(UTC)
    for name, f in figures.items():
        row = by_name.get(name)
        if row is None:
            row = by_name[name] = {"queue": name, **IDLE_ROW, "backend": "nats"}
            rows.append(row)
        row.setdefault("backend", "nats")
        row["broker"] = {"eligible": f.get("eligible"), "running": f.get("running"), "failed": f.get("failed"),
                         "age_seconds": f.get("age_seconds"), "redeliveries": f.get("redeliveries"), "at": f.get("at")}
        for key in ("eligible", "running", "failed"):
            if f.get(key) is not None:
                row[key] = (row.get(key) or 0) + round(f[key])
        age = f.get("age_seconds")
        if f.get("eligible") and age is not None and age > (row.get("age_seconds") or 0.0):
            row["age_seconds"] = age
            row["oldest_eligible"] = now - timedelta(seconds=age)
    return rows


def worst_first(row: dict[str, Any]) -> tuple:
    """The order of the queues list: stuck leases, then the oldest waiting job, then dead
    letters, then backlog; an idle queue (all zero) last; the name breaks ties."""
    return (-(row.get("stuck") or 0), -(row.get("age_seconds") or 0) if row.get("eligible") else 0,
            -(row.get("failed") or 0), -(row.get("eligible") or 0), row["queue"])


def queue_rows() -> tuple[list[dict[str, Any]], str, str | None]:
    """Every queue (live figures, or the latest samples when the live query is too slow, plus
    the idle ones the samples know), worst first, before drain estimates and limits."""
    live = run_panel(browse.queue_figures)
    rows, source, error = (live.data, "live", None) if live.ok else ([], "samples", live.error)
    if not live.ok:
        fallback = run_panel(_from_samples)
        rows = fallback.data if fallback.ok else []
    # The broker's figures and the queues the samples know change only with a collection
    # cycle: read once per generation of the cycle's model (console/web/cycle.py), not per
    # request (the activity is every queue's series, 25,000 rows at 5,000 queues). A failed
    # read is not kept.
    broker, _ = cycle.cached("queues.broker", lambda: run_panel(broker_figures), keep=lambda p: p.ok)
    if broker.ok:
        rows = with_broker(rows, broker.data)
    activity, _ = cycle.cached("queues.activity", lambda: run_panel(samples.queue_activity), keep=lambda p: p.ok)
    rows = with_idle_queues(rows, activity.data if activity.ok else {}, window=signals.rate_window(state().config))
    rows.sort(key=worst_first)
    return rows, source, error


def with_details(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Drain estimates, limits and the rules' colours for the rows that are shown (not for every
    queue there is)."""
    points = run_panel(browse.backlog_points, queues=[r["queue"] for r in rows])
    now = datetime.now(UTC)
    for row in rows:
        # The trend ends at the figure the row shows (live, or the newest sample): "nothing
        # waiting" beside "2 eligible" was the samples' last point against the live count.
        trend = points.data.get(row["queue"], []) if points.ok else []
        if row.get("eligible") is not None and source == "live":
            trend = [*trend, (now, float(row["eligible"]))]
        if points.ok or row.get("eligible") is not None:
            estimate = browse.drain_estimate(trend)
        else:
            estimate = browse.Drain("unknown", "samples not available")
        row["drain"] = {"state": estimate.state, "text": estimate.text, "seconds": estimate.seconds,
                        "net_per_second": estimate.net_per_second}
    limited = run_panel(limits.queue_limits)
    by_queue = {r["queue"]: r for r in limited.data} if limited.ok else {}
    for row in rows:
        lim = by_queue.get(row["queue"])
        row["limits"] = None if lim is None else {k: lim[k] for k in ("concurrency", "rate", "burst", "running", "tokens")}
        if lim is not None and lim.get("group_concurrency") is not None:
            row["limits"]["group_concurrency"] = lim["group_concurrency"]
    _judge_rows(rows)
    return rows


def queues_data() -> dict[str, Any]:
    """One page of the queues, worst first (`q` searches the names; `page`, `limit`), with the
    count of those not shown; the tab title counts stuck and paused queues over all of them."""
    rows, source, error = queue_rows()
    shown = listing.page_of(rows, name=lambda r: r["queue"], default_limit=state().config.web.list_limit)
    with_details(shown.rows, source)
    stuck = sum(r.get("stuck") or 0 for r in rows)
    paused = sum(1 for r in rows if r.get("paused"))
    state_bits = ([f"{stuck} stuck"] if stuck else []) + ([f"{paused} paused"] if paused else [])
    return {"queues": shown.rows, "listing": shown, "source": source, "error": error,
            "tab_state": " · ".join(state_bits)}


def _judge_rows(rows: list[dict[str, Any]]) -> None:
    """Each row's figures coloured by the alert rules in force, as the overview colours its
    queues and as the alerts fire: the head's age (queue_age), stuck leases (stuck_leases) and
    dead letters per hour over the rate window (dead_letter_growth, from the newest samples).
    `level` is the worst of them; `levels` has each figure's."""
    from console.web.overview import default_judge, load_judge, worst

    judged = run_panel(load_judge)
    judge = judged.data if judged.ok else default_judge()
    # The shown rows' series only (not every queue's: 5,000 at width).
    latest = run_panel(samples.latest_of_queues, "dead_letter_growth", [r["queue"] for r in rows])
    growth: dict[str | None, float | None] = {}
    for name, value in (latest.data if latest.ok else []):
        before = growth.get(name)  # a queue on both backends: the two arrival rates added
        growth[name] = value if before is None else before + (value or 0.0)
    for row in rows:
        name = row["queue"]
        age = row.get("age_seconds") if row.get("eligible") else 0.0
        levels = {
            "age": judge.level("queue_age_seconds", age, {"queue": name, "system": "skiplock"}),
            "stuck": judge.level("stuck_leases", row.get("stuck"), {"queue": name, "system": "skiplock"}),
            "dead_letters": judge.level("dead_letter_growth", growth.get(name), {"queue": name, "system": "skiplock"}),
        }
        row["levels"] = levels
        row["dead_letter_growth"] = growth.get(name)
        row["level"] = worst(lv if lv in ("good", "warn", "bad") else "good" for lv in levels.values())


@bp.get("/queues")
@requires("viewer")
def index():
    return render_template("queues/index.html", external=external_panel(), **queues_data())


@bp.get("/queues/_external")
@requires("viewer")
def external_fragment():
    """The [[external_queues]] panel alone (the Queues page and the overview poll it)."""
    return render_template("queues/_external.html", external=external_panel())


@bp.get("/queues/_table")
@requires("viewer")
def table():
    return render_template("queues/_table.html", **queues_data())


@bp.get("/api/v1/queues")
@requires("viewer")
@api_doc("Per-queue figures: eligible, scheduled, running, stuck, failed, oldest eligible age, paused, drain estimate",
         params=LIST_PARAMS,
         description="Worst first (stuck leases, the longest wait, dead letters, backlog), one page of `limit` "
                     "queues (default web.list_limit); `q` keeps the queues whose name contains it, `total` counts "
                     "them, `more` says how many are not in this page and `next_page` is the page after it. "
                     "`source` is `live`, or `samples` when the live query timed out (then `error` says why).",
         response=obj({"queues": arr(QUEUE_ROW), "source": {"enum": ["live", "samples"]}, "error": opt(STR),
                       "tab_state": STR, **LIST_FIELDS}))
def api_index():
    data = queues_data()
    return jsonify({**{k: v for k, v in data.items() if k != "listing"}, **data["listing"].as_dict()})


def queue_data(name: str) -> dict[str, Any]:
    rows, source, error = queue_rows()
    row = next((r for r in rows if r["queue"] == name), None)
    if row is None:
        abort(404, f"there is no queue {name!r} (no jobs and never paused)")
    with_details([row], source)
    data = {"queue": row, "source": source, "error": error, "tab_state": "paused" if row.get("paused") else ""}
    if (row.get("limits") or {}).get("group_concurrency"):
        # A fair queue: its top groups by backlog, their age, running jobs and dead letters,
        # starvation flagged (bounded, under the page's statement timeout: "not available" when
        # it runs out). The dead letters over the collectors' window and cap, so the panel and
        # the group_* samples (console/collectors/groups.py) count the same ones.
        scheduler = state().config.scheduler
        groups = run_panel(limits.fair_groups, name, window=signals.rate_window(state().config).total_seconds(),
                           failed_cap=scheduler.failed_queue_limit)
        data["groups"] = groups.data if groups.ok else {"error": groups.error}
    return data


@bp.get("/queues/<name>")
@requires("viewer")
def detail(name: str):
    return _page(name)


def _page(name: str, **forms: Any) -> str:
    """The queue page: its figures, its "why isn't it moving?" panel (console/web/why.py), and
    its forms, as typed when one comes back with an error (`form`/`form_error` for the enqueue
    form, `limits_form`/`limits_error` for the limits form)."""
    from console.web.why import queue_answer, why_panel

    data = queue_data(name)
    # The enqueue form's example time is an hour from now, never a fixed date that went by.
    example = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    context = {"form": {}, "form_error": None, "limits_form": {}, "limits_error": None, "run_at_example": example,
               **forms}
    return render_template("queues/detail.html", **why_panel(queue_answer(name), url_for("why.queue_fragment", name=name)),
                           **context, **data)


@bp.post("/queues/<name>/enqueue")
@requires("operator")
def enqueue(name: str):
    from console.web.jobs import enqueue_from

    fields = {k: v for k, v in request.form.items() if k in browse.ENQUEUE_FIELDS and k != "queue"}
    try:
        result = enqueue_from({**fields, "queue": name}, payload_is_text=True)
    except browse.InvalidFilter as exc:
        # The form again, with what was typed and what is wrong.
        return _page(name, form=fields, form_error=str(exc)), 400
    return redirect(url_for("jobs.detail", job_id=result["id"]), 303)


@bp.get("/api/v1/queues/<name>")
@requires("viewer")
@api_doc("One queue's figures and drain estimate", responses={"404": "no such queue (no jobs and never paused)"},
         description="A fair queue (group_concurrency set) also has `groups`: its top 10 groups by backlog "
                     "(eligible jobs counted up to 10,000 each), each one's oldest eligible age, running jobs "
                     "and dead letters that arrived within `window_seconds` ([scheduler] rate_window; a group "
                     "with running jobs or such dead letters is listed even with no backlog), the median group's age, and the groups flagged as starving (waiting over 5 times the "
                     "median and at least 60 s, with nothing running). The NULL group is `group: null`.",
         response=obj({"queue": QUEUE_ROW, "source": {"enum": ["live", "samples"]}, "error": opt(STR),
                       "tab_state": STR, "groups": GROUPS}, optional=("groups",)))
def api_detail(name: str):
    return jsonify(queue_data(name))


def _set(name: str, action: str) -> None:
    """Pause or resume, audited. A name no queue has is a 404 (a typo must not create a queue)
    unless the request says `create=true` (pause a queue before its first job)."""
    reason = reason_for(action)
    create = action == "pause" and (request.form.get("create") or "").strip().lower() in _TRUE
    try:
        if action == "pause":
            pause_queue(get_conn(), name, actor=actor(), reason=reason, create=create,
                        cap=state().config.caps.paused_queues)
        else:
            resume_queue(get_conn(), name, actor=actor(), reason=reason, create=create)
    except UnknownQueue as exc:
        abort(404, str(exc).replace("pass --create", "send create=true"))


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
         params=[Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)"),
                 Param("create", where="form", type="boolean",
                       description="true: pause a queue no job, sample or limit names yet (else 404, a typo)")],
         responses={"404": "no queue has that name (no jobs, samples or limits, never paused); the message names "
                           "the nearest", "422": "no reason",
                    "429": "caps.paused_queues queues are paused already"},
         response=obj({"ok": BOOL, "queue": STR, "paused": BOOL}))
def api_pause(name: str):
    _set(name, "pause")
    return jsonify({"ok": True, "queue": name, "paused": True})


@bp.post("/api/v1/queues/<name>/resume")
@requires("operator")
@api_doc("Resume a paused queue (audited)",
         params=[Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         responses={"404": "no queue has that name", "422": "no reason"},
         response=obj({"ok": BOOL, "queue": STR, "paused": BOOL}))
def api_resume(name: str):
    _set(name, "resume")
    return jsonify({"ok": True, "queue": name, "paused": False})


# --- limits -------------------------------------------------------------------------------

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("", "0", "false", "off", "no")


def _limits_input() -> dict[str, Any]:
    """The request's {concurrency, rate, group_concurrency, group_weights, clear, reason}, from a JSON body or a form."""
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object: {concurrency, rate, group_concurrency, group_weights, clear, reason}")
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
    weights = body.get("group_weights")
    if isinstance(weights, str) and not request.is_json:
        # The form's field: "tenant-42=3, other=2" (a JSON body gives an object).
        weights = limits.parse_group_weight_args([w.strip() for w in weights.split(",") if w.strip()])
    return {"concurrency": body.get("concurrency"), "rate": rate, "group_concurrency": body.get("group_concurrency"),
            "group_weights": weights, "clear": clear,
            "reason": reason}  # checked by reason_for("limit_change"), console.actions' rule


def _set_limits(name: str) -> dict[str, Any]:
    data = _limits_input()
    reason = reason_for("limit_change")
    return limits.set_limits(get_conn(), name, concurrency=data["concurrency"], rate=data["rate"],
                             group_concurrency=data["group_concurrency"], group_weights=data["group_weights"],
                             clear=data["clear"], actor=actor(),
                             reason=reason)


@bp.post("/queues/<name>/limits")
@requires("operator")
def set_limits(name: str):
    try:
        _set_limits(name)
    except ValueError as exc:  # InvalidLimit, ReasonRequired (422), a bad field: the form again, as typed
        typed = {k: v for k, v in request.form.items() if k in ("concurrency", "rate", "group_concurrency", "group_weights", "clear", "reason")}
        status = 422 if isinstance(exc, ReasonRequired) else 400
        return _page(name, limits_form=typed, limits_error=str(exc)), status
    return redirect(url_for("queues.detail", name=name))


@bp.put("/api/v1/queues/<name>/limits")
@requires("operator")
@api_doc("Set, change or clear a queue's concurrency and rate limits (audited)",
         description="A limit not given keeps its value; `clear` removes both first, then sets the ones given. "
                     "`concurrency`: at most that many of the queue's jobs run at once across all workers. "
                     "`rate`: `N/s` or `N/m`, claims per second or minute, with a burst of a second's worth "
                     "(at least 1). `group_concurrency`: a fair queue, at most that many jobs of one group "
                     "(`enqueue(..., group=...)`) run at once, fleet-wide, the groups served round-robin. "
                     "`group_weights`: `{\"tenant-42\": 3}`, a group of weight w gets w turns for every turn of a "
                     "weight-1 group (1 to 100; 1 removes the weight; groups not named keep theirs; never more than "
                     "group_concurrency running). Workers apply it within a poll interval.",
         params=[Param("concurrency", where="form", type="integer", minimum=1, maximum=limits.MAX_CONCURRENCY,
                       description="most jobs of this queue running at once, fleet-wide"),
                 Param("rate", where="form", pattern=r"^\s*\d+\s*/\s*(s|sec|second|m|min|minute)\s*$",
                       description="most claims per second (N/s) or minute (N/m)"),
                 Param("group_concurrency", where="form", type="integer", minimum=1, maximum=limits.MAX_CONCURRENCY,
                       description="most jobs of one group running at once, fleet-wide (a fair queue)"),
                 Param("group_weights", where="form",
                       description="GROUP=WEIGHT, comma separated (tenant-42=3, other=2): weighted turns (1 to 100)"),
                 Param("clear", where="form", type="boolean", description="remove every limit (and weight) first"),
                 Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         body=obj({"concurrency": opt({**INT, "minimum": 1, "maximum": limits.MAX_CONCURRENCY}),
                   "rate": opt({**STR, "pattern": r"^\s*\d+\s*/\s*(s|sec|second|m|min|minute)\s*$"}),
                   "group_concurrency": opt({**INT, "minimum": 1, "maximum": limits.MAX_CONCURRENCY}),
                   "group_weights": opt({"type": "object", "additionalProperties": {**INT, "minimum": 1,
                                                                                     "maximum": limits.MAX_WEIGHT}}),
                   "clear": BOOL, "reason": STR},
                  optional=("concurrency", "rate", "group_concurrency", "group_weights", "clear")),
         responses={"422": "no reason"},
         response=obj({"ok": BOOL, "queue": STR, "before": LIMITS, "after": LIMITS,
                       "group_weights": obj({"before": WEIGHTS, "after": WEIGHTS})},
                      optional=("group_weights",)))
def api_set_limits(name: str):
    result = _set_limits(name)
    return jsonify({"ok": True, **result})
