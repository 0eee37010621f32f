"""Why isn't this job (queue) running? The answer of console/why.py on the job page, the queue
page and the alert page (a panel with id `why`), and in the API.

GET /jobs/<id>/_why, /queues/<name>/_why    the panel alone (the pages poll it; the alert page loads it)
GET /api/v1/jobs/<id>/why, /api/v1/queues/<name>/why

The pages render the panel themselves on first load (`why_panel`); the fragment and the API
read the primary (console/web/database.py PRIMARY_READS): the answer turns on the workers'
heartbeats and leases as they are now, which a replica shows only as of its lag.

Each reason comes with the console pages that show its evidence (`links_for`): the audit log
for a pause, the queue's limits, the workers, the jobs ahead in claim order.

A queue whose backend is nats is answered by console.brokerwhy from the broker's facts (the
stream, its consumer, the outbox, the relay, the broker workers): its PostgreSQL facts are read
first, under the statement timeout, then the broker, with no transaction open meanwhile.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from flask import Blueprint, abort, g, jsonify, render_template

from console import brokerwhy, signals, why
from console.natscall import BrokerUnavailable
from console.queue import broker
from console.web.api import BOOL, OBJ, STR, TIME, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import run_panel
from console.web.redact import text_for

bp = Blueprint("why", __name__)

REASON = obj({"code": {"enum": list(why.ORDER) + [c for c in brokerwhy.ORDER if c not in why.ORDER]}, "blocking": BOOL, "title": STR,
              "evidence": {**OBJ, "description": "the facts the reason rests on (names differ by code)"},
              "links": arr(obj({"label": STR, "path": STR}))})
ANSWER = obj({
    "subject": {"enum": ["job", "queue"]}, "name": STR,
    "state": {**STR, "description": "a job's status (or archived); a queue's: waiting, scheduled or empty (a broker "
                                    "queue's: waiting, running, empty, or unknown when the broker did not answer)"},
    "queue": STR, "code": {**STR, "description": "the verdict's reason"}, "blocked": BOOL,
    "verdict": {**STR, "description": "the answer in one sentence: the first blocking reason"},
    "reasons": arr(REASON), "job": opt(OBJ), "figures": opt(OBJ), "checked_at": TIME,
    "available": BOOL, "error": opt(STR),
}, optional=("error",))


def _live_within() -> float:
    from console.web import state

    return signals.live_worker_within(state().config)


def _q(queue: str) -> str:
    return quote(queue, safe="")


def _jobs(**args: Any) -> str:
    return "/jobs?" + urlencode({k: v for k, v in args.items() if v not in (None, "")})


def links_for(reason: why.Reason, queue: str) -> list[dict[str, str]]:
    """The console pages with a reason's evidence, most useful first (paths within the console)."""
    e, out = reason.evidence, []
    if reason.code == "paused":
        out += [("The pause in the audit log", "/audit?" + urlencode({"action": "pause"})),
                (f"Queue {queue}: resume it there", f"/queues/{_q(queue)}")]
    elif reason.code in ("queue_concurrency", "queue_rate", "group_concurrency"):
        out += [(f"Queue {queue}'s limits", f"/queues/{_q(queue)}#queue-limits"),
                (f"Running jobs in queue {queue}", _jobs(state="running", queue=queue))]
    elif reason.code == "kind_concurrency":
        out += [(f"Running jobs of kind {e['kind']}", _jobs(state="running", kind=e["kind"]))]
    elif reason.code in ("no_worker", "kind_unhandled"):
        out += [("Workers: what each listens on", "/workers")]
    elif reason.code in ("behind", "ready"):
        out += [("Eligible jobs in claim order", _jobs(state="pending", eligible="1")), ("Workers", "/workers")]
    elif reason.code == "lease_dead":
        out += [(f"Running jobs in queue {queue} past their lease", _jobs(state="running", queue=queue, lease="expired")),
                ("Workers", "/workers")]
    elif reason.code == "running":
        out += [("Workers", "/workers")]
    elif reason.code == "scheduled" and "scheduled" in e:
        out += [(f"Pending jobs in queue {queue}", _jobs(state="pending", queue=queue))]
    elif reason.code in ("relay_stopped", "outbox", "postgres_left"):
        out += [(f"Queue {queue}'s exit plan: the relay and the drain", f"/queues/{_q(queue)}/exit-plan")]
    elif reason.code == "redelivered":
        out += [(f"Queue {queue}'s broker figures", f"/queues/{_q(queue)}"),
                ("Its dead letters", f"/deadletters/broker/{_q(queue)}")]
    return [{"label": label, "path": path} for label, path in out]


def _shaped(answer: why.Answer) -> dict[str, Any]:
    """The answer as g.user may see it: an error text in the evidence redacted like the job page's."""
    data = answer.as_dict()
    for out, reason in zip(data["reasons"], answer.reasons, strict=True):
        out["links"] = links_for(reason, answer.queue)
        if out["evidence"].get("last_error") is not None:
            out["evidence"] = {**out["evidence"], "last_error": text_for(out["evidence"]["last_error"], g.user)}
    return {**data, "available": True}


def job_answer(job_id: int) -> dict[str, Any]:
    found = run_panel(why.why_job, job_id, live_within=_live_within())
    if not found.ok:
        return {"available": False, "error": found.error, "subject": "job", "name": str(job_id)}
    if found.data is None:
        abort(404, f"there is no job {job_id} (not in the jobs table nor the archive)")
    return _shaped(found.data)


def queue_answer(name: str) -> dict[str, Any]:
    if not name.strip() or len(name) > 200:
        abort(400, "queue: a queue name of 1 to 200 characters")
    backend = run_panel(broker.backend_of, name)
    if backend.ok and backend.data == "nats":
        return _broker_answer(name)
    found = run_panel(why.why_queue, name, live_within=_live_within())
    if not found.ok:
        return {"available": False, "error": found.error, "subject": "queue", "name": name}
    return _shaped(found.data)


def _broker_answer(queue: str) -> dict[str, Any]:
    """console.brokerwhy's answer: PostgreSQL's facts under the statement timeout, then the
    broker's within [broker] publish_timeout (a broker that does not answer is a reason)."""
    from console.web import state

    pg = run_panel(brokerwhy.pg_facts, queue, live_within=_live_within())
    if not pg.ok:
        return {"available": False, "error": pg.error, "subject": "queue", "name": queue}
    config: Any = state().config  # [broker] is a section the typed Config does not list
    cfg = config.broker
    try:
        found, error = brokerwhy.broker_facts(cfg.nats_url, queue, float(cfg.publish_timeout)), None
    except BrokerUnavailable as exc:
        found, error = None, str(exc)
    return _shaped(brokerwhy.answer(queue, pg.data, found, error, live_within=_live_within()))


def why_panel(answer: dict[str, Any], refresh: str) -> dict[str, Any]:
    """The template context of templates/why/_answer.html (pages include it with this)."""
    return {"why": answer, "why_refresh": refresh}


@bp.get("/jobs/<int:job_id>/_why")
@requires("viewer")
def job_fragment(job_id: int):
    from flask import url_for

    return render_template("why/_answer.html", **why_panel(job_answer(job_id), url_for("why.job_fragment", job_id=job_id)))


@bp.get("/queues/<name>/_why")
@requires("viewer")
def queue_fragment(name: str):
    from flask import url_for

    return render_template("why/_answer.html", **why_panel(queue_answer(name), url_for("why.queue_fragment", name=name)))


@bp.get("/api/v1/jobs/<int:job_id>/why")
@requires("viewer")
@api_doc("Why isn't this job running? One computed answer with its evidence",
         description="For a pending job every rule of the claim is asked: scheduled for later, queue paused (by whom and "
                     "why, from the audit log), at a concurrency or rate limit (which, how many running, tokens), no live "
                     "worker on its queue, its kind not handled by them, behind busy workers (how many eligible jobs come "
                     "first in claim order, a lower bound past the window). A running job: a lease held by a live or a "
                     "dead worker. A finished one: finished, and whether an enqueue of its key returns it (uniqueness). "
                     "`available` is false (with `error`) when a query timed out.",
         responses={"404": "no such job"}, response=ANSWER)
def api_job(job_id: int):
    return jsonify(job_answer(job_id))


@bp.get("/api/v1/queues/<name>/why")
@requires("viewer")
@api_doc("Why isn't this queue moving? The answer for its first eligible job, or what it waits for",
         params=[Param("name", where="path", description="the queue")],
         description="The queue's own state (paused, limits, workers, leases past their expiry) and its first eligible "
                     "job's answer (`job`), or when nothing is due: the next scheduled time, or that it is empty. "
                     "`figures` has the eligible and scheduled counts among the first pending jobs of every queue "
                     "(`lower_bound` when that window was full).",
         responses={"400": "not a queue name (blank, or longer than 200 characters)"}, response=ANSWER)
def api_queue(name: str):
    return jsonify(queue_answer(name))
