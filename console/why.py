"""Why isn't this job running? One computed answer, with its evidence, for a job or a queue.

    answer = why_job(conn, 42, live_within=30.0)
    answer.verdict  -> "Queue mail is paused (by alice at 03:12 UTC: 'INC-1042: SMTP relay down') ..."
    answer.reasons  -> [Reason("paused", blocking=True, title=..., evidence={...}), ...]

Every rule the workers' claim applies is asked in turn, and each that holds the job back is a
`Reason` with the facts it rests on (who paused and why, from the audit log; which limit, how
many running, the bucket's tokens; which workers listen on the queue and which kinds they
handle; how many eligible jobs a worker claims first):

  pending   scheduled      due later (a retry's backoff, or enqueued with run_at)
            paused         its queue is paused
            queue_concurrency / queue_rate / kind_concurrency   at a limit (console/limits.py)
            no_worker      no live worker listens on its queue
            kind_unhandled the live workers that listen on it do not register its kind
            behind         eligible jobs ahead of it in claim order while every slot is busy
            ready          nothing holds it back (informational)
  running   running        held by a live worker's lease
            lease_dead     held by a worker that stopped reporting, or past its lease
  finished  finished       completed, failed (a dead letter) or archived: nothing to wait for
            unique         an enqueue of its kind and idempotency key returns this job
                           instead of creating one (the key, or its uniqueness window, is held)

For a queue the same questions are asked of the queue (paused, its limits, its workers) and of
its head, the first eligible job in claim order; an empty queue or one whose jobs are all
scheduled says so.

The verdict is the first blocking reason in the order above (a job due in an hour in a paused
queue is first "scheduled", and the pause is the second reason), or the first reason when none
blocks.

Titles never quote a job's error text or payload (a face shows them to viewers, who see those
redacted): the error is evidence (`last_error`), which the faces redact like the job page does.

Bounded: one row per question, the registry's recent workers, and windows of the claim index
(sql/why.sql); no query scans the jobs table. "Live" is the caller's threshold in seconds since
a worker's last report (console.signals.live_worker_within, as the Workers page and the
workers_live metric use).

This module reads; it changes nothing and knows nothing of HTTP or the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console.sqlfiles import query
from console.timefmt import duration

WINDOW = 10_000  # claim-index entries looked at per range for a job's position (a lower bound beyond)
HEAD_WINDOW = 50_000  # the queue figures' own bound (console.browse.PENDING_CAP)
HEAD_TRIES = 5  # reads of a queue's head before "it is moving" (the workers took it each time)
RUNNING_CAP = 50_000  # running rows counted (at most the fleet's handler threads in practice)
REAPER_NOTE = "the reaper rescues it at its next run (every 30 s by default: [scheduler] reap_interval)"

# The order in which reasons are asked, and so which one is the verdict.
ORDER = ("scheduled", "paused", "queue_concurrency", "queue_rate", "group_concurrency", "kind_concurrency", "no_worker",
         "kind_unhandled", "behind", "ready", "lease_dead", "running", "unique", "finished", "moving", "empty")


@dataclass
class Reason:
    code: str
    blocking: bool
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "blocking": self.blocking, "title": self.title, "evidence": self.evidence}


@dataclass
class Answer:
    """The answer for one subject: `subject` is "job" or "queue", `name` the job's id or the
    queue's name, `state` the job's status ("archived" for the archive) or the queue's
    ("waiting", "scheduled", "empty")."""

    subject: str
    name: str
    state: str
    queue: str
    reasons: list[Reason]
    checked_at: datetime
    job: dict[str, Any] | None = None  # the job (for a queue: its head, the first eligible in claim order)
    figures: dict[str, Any] | None = None  # a queue's eligible and scheduled counts (bounded)

    @property
    def blocked(self) -> bool:
        return any(r.blocking for r in self.reasons)

    @property
    def primary(self) -> Reason:
        return next((r for r in self.reasons if r.blocking), self.reasons[0])

    @property
    def verdict(self) -> str:
        return self.primary.title

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "name": self.name, "state": self.state, "queue": self.queue,
                "code": self.primary.code, "blocked": self.blocked, "verdict": self.verdict,
                "reasons": [r.as_dict() for r in self.reasons], "job": self.job,
                "figures": self.figures, "checked_at": self.checked_at}


# --- the facts ---------------------------------------------------------------------------------

@contextmanager
def _walking_indexes(conn: psycopg.Connection) -> Iterator[None]:
    """One transaction (a savepoint inside the caller's) whose plans walk indexes in order."""
    with conn.transaction():
        conn.execute(query("why", "walk_indexes"))
        yield


def _rows(conn: psycopg.Connection, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("why", name), params or {}).fetchall()


def _row(conn: psycopg.Connection, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    rows = _rows(conn, name, params)
    return rows[0] if rows else None


def _is_live(worker: Mapping[str, Any], live_within: float) -> bool:
    return worker["stopped_at"] is None and float(worker["seen_seconds_ago"]) <= live_within


def _listens_on(worker: Mapping[str, Any], queue: str) -> bool:
    """A worker without a queue list claims from every queue."""
    return not worker["queues"] or queue in worker["queues"]


def _worker_brief(worker: Mapping[str, Any], live_within: float) -> dict[str, Any]:
    return {"id": worker["id"], "host": worker["host"], "pid": worker["pid"],
            "queues": list(worker["queues"]) if worker["queues"] else None,
            "kinds": list(worker["kinds"]) if worker["kinds"] is not None else None,
            "concurrency": worker["concurrency"], "in_flight": worker["in_flight"],
            "last_seen": worker["last_seen"], "stopped_at": worker["stopped_at"],
            "seen_seconds_ago": round(float(worker["seen_seconds_ago"]), 1), "live": _is_live(worker, live_within)}


def _at(moment: datetime | None) -> str:
    return "an unknown time" if moment is None else moment.astimezone(UTC).strftime("%H:%M:%S UTC")


def _queue_facts(conn: psycopg.Connection, queue: str, kind: str | None) -> dict[str, Any]:
    state = _row(conn, "queue_state", {"queue": queue}) or {}
    running = _row(conn, "running_in", {"queue": queue, "kind": kind, "cap": RUNNING_CAP}) or {}
    facts = {"state": state, "running": int(running.get("queue_running") or 0),
             "expired": int(running.get("queue_expired") or 0), "kind_running": int(running.get("kind_running") or 0),
             "kind_limit": _row(conn, "kind_limit", {"kind": kind}) if kind else None, "pause": None}
    if state.get("paused"):
        facts["pause"] = _row(conn, "pause_audit", {"queue": queue, "paused_at": state.get("paused_at")})
    return facts


# --- the rules, one function each ----------------------------------------------------------

def _paused(queue: str, facts: Mapping[str, Any]) -> Reason | None:
    state = facts["state"]
    if not state.get("paused"):
        return None
    audit = facts["pause"] or {}
    by = audit.get("actor") or state.get("paused_by") or "someone"
    why = audit.get("reason")
    title = (f"Queue {queue} is paused (by {by} at {_at(state.get('paused_at'))}"
             + (f": {why!r}" if why else ", no reason recorded") + "): workers claim nothing from it until it is resumed.")
    return Reason("paused", True, title, {"queue": queue, "paused_at": state.get("paused_at"), "paused_by": by,
                                          "reason": why, "audit_id": audit.get("id")})


def _queue_limits(queue: str, facts: Mapping[str, Any]) -> list[Reason]:
    state, running, out = facts["state"], facts["running"], []
    concurrency = state.get("concurrency")
    if concurrency is not None and running >= concurrency:
        stuck = facts["expired"]
        out.append(Reason(
            "queue_concurrency", True,
            f"Queue {queue} is at its concurrency limit: {running} of {concurrency} running"
            + (f" ({stuck} of them past their lease, holding a slot until the reaper rescues them)" if stuck else "")
            + "; the next job starts when one finishes.",
            {"queue": queue, "limit": concurrency, "running": running, "expired_leases": stuck,
             "set_by": state.get("limits_set_by"), "set_at": state.get("limits_set_at")}))
    if state.get("rate_count") is not None and state.get("tokens") is not None and float(state["tokens"]) < 1:
        tokens = float(state["tokens"])
        per_second = state["rate_count"] / state["rate_period"]
        wait = (1 - tokens) / per_second
        rate = f"{state['rate_count']}/{'s' if state['rate_period'] == 1 else 'm'}"
        out.append(Reason(
            "queue_rate", True,
            f"Queue {queue} is at its rate limit ({rate}): {tokens:.2f} tokens in its bucket, the next token in "
            f"{duration(wait)}.",
            {"queue": queue, "rate": rate, "burst": state.get("burst"), "tokens": round(tokens, 3),
             "next_token_seconds": round(wait, 3), "set_by": state.get("limits_set_by"),
             "set_at": state.get("limits_set_at")}))
    return out


def _group_limit(conn: psycopg.Connection, job: Mapping[str, Any], facts: Mapping[str, Any]) -> Reason | None:
    """A fair queue's job whose group already runs its group_concurrency (docs/queue.md, "Fair queues")."""
    limit = facts["state"].get("group_concurrency")
    if limit is None:
        return None
    group = job.get("group_key")
    running = int((_row(conn, "group_running", {"queue": job["queue"], "group": group}) or {}).get("running") or 0)
    if running < limit:
        return None
    name = f"group {group!r}" if group is not None else "the jobs without a group"
    return Reason(
        "group_concurrency", True,
        f"Queue {job['queue']} is fair and {name} is at its limit: {running} of {limit} running; "
        "the group's next job starts when one of them finishes (other groups are not held up).",
        {"queue": job["queue"], "group": group, "limit": limit, "running": running,
         "set_by": facts["state"].get("limits_set_by"), "set_at": facts["state"].get("limits_set_at")})


def _kind_limit(kind: str, facts: Mapping[str, Any]) -> Reason | None:
    limit = facts["kind_limit"]
    if limit is None or facts["kind_running"] < limit["concurrency"]:
        return None
    return Reason(
        "kind_concurrency", True,
        f"Kind {kind} is at its concurrency limit: {facts['kind_running']} of {limit['concurrency']} running across the "
        f"fleet (declared in code by {limit['declared_by'] or 'a worker'}).",
        {"kind": kind, "limit": limit["concurrency"], "running": facts["kind_running"],
         "declared_by": limit["declared_by"]})


def _workers_for(queue: str, kind: str | None, workers: Sequence[Mapping[str, Any]],
                 live_within: float) -> tuple[list[Reason], list[Mapping[str, Any]]]:
    """(reasons, the live workers that listen on `queue`)."""
    live = [w for w in workers if _is_live(w, live_within)]
    serving = [w for w in live if _listens_on(w, queue)]
    if not serving:
        quiet = [w for w in workers if not _is_live(w, live_within) and _listens_on(w, queue)]
        title = f"No live worker listens on queue {queue}"
        if quiet:
            last = quiet[0]
            gone = (f"stopped at {_at(last['stopped_at'])}" if last["stopped_at"] else
                    f"has not reported for {duration(float(last['seen_seconds_ago']))}")
            title += f" (the last that did, {last['id']}, {gone})"
        if live:
            others = sorted({q for w in live for q in (w["queues"] or [])})
            title += f"; the {len(live)} live worker(s) listen on {', '.join(others)}"
        return [Reason("no_worker", True, title + ".", {
            "queue": queue, "live_workers": [_worker_brief(w, live_within) for w in live],
            "quiet_workers": [_worker_brief(w, live_within) for w in quiet], "live_within_seconds": live_within})], []
    if kind is None:
        return [], serving
    known = [w for w in serving if w["kinds"] is not None]
    # Only when every live worker on the queue said what it handles: one that did not may handle it.
    if len(known) == len(serving) and not any(kind in w["kinds"] for w in known):
        handled = sorted({k for w in known for k in w["kinds"]})
        shown = ", ".join(handled[:8]) + (", ..." if len(handled) > 8 else "")
        return [Reason(
            "kind_unhandled", True,
            f"None of the {len(serving)} live worker(s) on queue {queue} registers kind {kind}: a claim fails it with "
            f"UnknownTask (they handle {shown or 'nothing'}).",
            {"queue": queue, "kind": kind, "workers": [_worker_brief(w, live_within) for w in serving],
             "handled": handled})], serving
    return [], serving


def _position(conn: psycopg.Connection, job: Mapping[str, Any], serving: Sequence[Mapping[str, Any]],
              limited_queue: bool, window: int) -> dict[str, Any]:
    """How many eligible jobs the job's workers claim before it (bounded by `window` per range)."""
    if limited_queue:
        queues: list[str] | None = [job["queue"]]
    elif any(not w["queues"] for w in serving):
        queues = None  # some worker claims from every queue: everything ahead counts
    else:
        queues = sorted({q for w in serving for q in w["queues"]})
    row = _row(conn, "ahead", {"priority": job["priority"], "run_at": job["run_at"], "id": job["id"],
                               "queues": queues, "own_queue_only": limited_queue, "window": window}) or {}
    return {"higher": int(row.get("higher") or 0), "same": int(row.get("same") or 0),
            "lower_bound": bool(row.get("higher_full") or row.get("same_full")), "window": window,
            "queues": queues}


def _behind(job: Mapping[str, Any], position: Mapping[str, Any], serving: Sequence[Mapping[str, Any]],
            live_within: float, blocked: bool, head: bool) -> Reason:
    """Its place in claim order: "behind" when every slot of its workers is busy and others come
    first; otherwise "ready" (nothing holds it back). `head`: the job is a queue's first."""
    ahead = position["higher"] + position["same"]
    plus = "+" if position["lower_bound"] else ""
    slots = sum(int(w["concurrency"]) for w in serving)
    busy = sum(int(w["in_flight"]) for w in serving)
    evidence = {"job": job["id"], "ahead": ahead, "higher_priority": position["higher"], "same_priority": position["same"],
                "lower_bound": position["lower_bound"], "window": position["window"], "claimed_from": position["queues"],
                "workers": len(serving), "slots": slots, "busy": busy,
                "serving": [_worker_brief(w, live_within) for w in serving]}
    it = f"its first eligible job ({job['id']})" if head else "it"
    if ahead and busy >= slots and not blocked:
        return Reason(
            "behind", True,
            f"Its workers are busy: all {slots} slot(s) of the {len(serving)} live worker(s) on queue {job['queue']} are "
            f"taken, and {ahead:,}{plus} eligible job(s) come before {it} in claim order ({position['higher']:,}"
            f"{plus if position['higher'] else ''} of higher priority).", evidence)
    where = "is first in claim order" if not ahead else f"has {ahead:,}{plus} eligible job(s) ahead of it in claim order"
    whom = f"queue {job['queue']}" if head else "it"
    return Reason(
        "ready", False,
        f"Nothing holds {whom} back: {it} is due, {where}, and {len(serving)} live worker(s) listen on queue "
        f"{job['queue']} ({busy} of {slots} slot(s) busy); a worker should claim it within its poll interval.", evidence)


def _scheduled(job: Mapping[str, Any], now: datetime) -> Reason | None:
    if job["run_at"] <= now:
        return None
    retry = job["attempts"] > 0 and job.get("last_error")
    wait = (job["run_at"] - now).total_seconds()
    title = (f"It is waiting for its retry: attempt {job['attempts']} of {job['max_attempts']} failed and the next is "
             f"due at {_at(job['run_at'])}, in {duration(wait)}." if retry else
             f"It is scheduled for later: due at {_at(job['run_at'])}, in {duration(wait)}.")
    return Reason("scheduled", True, title, {"run_at": job["run_at"], "in_seconds": round(wait, 1), "retry": bool(retry),
                                             "attempts": job["attempts"], "max_attempts": job["max_attempts"],
                                             "last_error": job.get("last_error") if retry else None})


def _held(conn: psycopg.Connection, job: Mapping[str, Any], now: datetime, live_within: float) -> Reason:
    """A running job: held by a live worker's lease, or by one that is gone (or let it lapse)."""
    holder = _row(conn, "worker", {"id": job["locked_by"]}) if job.get("locked_by") else None
    lease = job.get("lease_until")
    evidence = {"worker": _worker_brief(holder, live_within) if holder else None, "locked_by": job.get("locked_by"),
                "locked_at": job.get("locked_at"), "lease_until": lease, "attempt": job["attempts"]}
    expired = lease is not None and lease < now
    if holder is not None and _is_live(holder, live_within) and not expired:
        return Reason("running", False,
                      f"It is running: worker {holder['id']} (live, last report {duration(float(holder['seen_seconds_ago']))} "
                      f"ago) claimed it at {_at(job.get('locked_at'))}, attempt {job['attempts']}; its lease runs until "
                      f"{_at(lease)} and is renewed while the handler works.", evidence)
    if holder is None:
        who = f"worker {job.get('locked_by')}, which has no registry row"
    elif holder["stopped_at"] is not None:
        who = f"worker {holder['id']}, which stopped at {_at(holder['stopped_at'])}"
    elif not _is_live(holder, live_within):
        who = f"worker {holder['id']}, which has not reported for {duration(float(holder['seen_seconds_ago']))}"
    else:
        who = f"worker {holder['id']} (live, but it did not renew this lease)"
    if expired:
        when = f"its lease expired {duration((now - lease).total_seconds())} ago and {REAPER_NOTE}"
    elif lease is not None:
        when = (f"its lease expires at {_at(lease)} (in {duration((lease - now).total_seconds())}), then "
                f"{REAPER_NOTE}")
    else:
        when = REAPER_NOTE
    return Reason("lease_dead", True, f"It is held by {who}; {when}, and it runs again as attempt {job['attempts'] + 1}.",
                  {**evidence, "expired": expired})


def _unique(conn: psycopg.Connection, job: Mapping[str, Any]) -> Reason | None:
    if not job.get("idempotency_key"):
        return None
    from console.queue import unique_window

    window = unique_window(conn, job)
    key = job["idempotency_key"]
    if window is not None and window["active"]:
        return Reason("unique", True,
                      f"An enqueue of kind {job['kind']} with key {key!r} returns this {job['status']} job instead of creating "
                      f"one: its uniqueness window is held until {_at(window['expires_at'])} ({window['expires_at']:%Y-%m-%d}).",
                      {"kind": job["kind"], "idempotency_key": key, "window_expires_at": window["expires_at"],
                       "in_jobs_table": not job.get("archived")})
    if not job.get("archived"):
        return Reason("unique", True,
                      f"An enqueue with key {key!r} returns this {job['status']} job instead of creating one, while it "
                      "stays in the jobs table (until the archiver moves it; the key is unique in the jobs table).",
                      {"kind": job["kind"], "idempotency_key": key, "window_expires_at": None, "in_jobs_table": True})
    return None


def _finished(job: Mapping[str, Any]) -> Reason:
    if job.get("archived"):
        title = f"It is not waiting: it finished ({job['status']}) and was archived."
    elif job["status"] == "completed":
        title = f"It is not waiting: it completed at {_at(job.get('finished_at'))} after {job['attempts']} attempt(s)."
    else:
        title = (f"It is not waiting: it is a dead letter (failed after {job['attempts']} of {job['max_attempts']} "
                 "attempts); replay it to run it again.")
    return Reason("finished", False, title, {"status": job["status"], "archived": bool(job.get("archived")),
                                             "finished_at": job.get("finished_at"), "attempts": job["attempts"],
                                             "last_error": job.get("last_error")})


# --- the answers ---------------------------------------------------------------------------

def _pending_reasons(conn: psycopg.Connection, job: Mapping[str, Any], workers: Sequence[Mapping[str, Any]],
                     now: datetime, live_within: float, window: int, *, head: bool = False) -> list[Reason]:
    facts = _queue_facts(conn, job["queue"], job["kind"])
    reasons = [r for r in (_scheduled(job, now), _paused(job["queue"], facts)) if r is not None]
    reasons += _queue_limits(job["queue"], facts)
    group = _group_limit(conn, job, facts)
    reasons += [group] if group else []
    kind = _kind_limit(job["kind"], facts)
    reasons += [kind] if kind else []
    found, serving = _workers_for(job["queue"], job["kind"], workers, live_within)
    reasons += found
    if serving and job["run_at"] <= now:
        limited = (facts["state"].get("concurrency") is not None or facts["state"].get("rate_count") is not None
                   or facts["state"].get("group_concurrency") is not None)
        position = _position(conn, job, serving, limited, window)
        reasons.append(_behind(job, position, serving, live_within, any(r.blocking for r in reasons), head))
    if head and facts["expired"]:
        reasons.append(_expired_in_queue(job["queue"], facts))
    return reasons


def _expired_in_queue(queue: str, facts: Mapping[str, Any]) -> Reason:
    return Reason("lease_dead", True,
                  f"{facts['expired']} of queue {queue}'s {facts['running']} running job(s) are past their lease (their "
                  f"worker stopped renewing it): {REAPER_NOTE}.",
                  {"queue": queue, "expired_leases": facts["expired"], "running": facts["running"]})


def _ordered(reasons: list[Reason]) -> list[Reason]:
    return sorted(reasons, key=lambda r: ORDER.index(r.code))


def why_job(conn: psycopg.Connection, job_id: int, *, live_within: float, window: int = WINDOW,
            now: datetime | None = None) -> Answer | None:
    """The answer for one job (in the jobs table or the archive); None when there is none."""
    with _walking_indexes(conn):
        return _why_job(conn, job_id, live_within=live_within, window=window, now=now)


def _why_job(conn: psycopg.Connection, job_id: int, *, live_within: float, window: int,
             now: datetime | None) -> Answer | None:
    from console.browse import get_job

    job = get_job(conn, job_id)
    if job is None:
        return None
    now = now or datetime.now(UTC)
    if job.get("archived"):
        state, reasons = "archived", [_finished(job)]
    elif job["status"] == "pending":
        state, reasons = "pending", _pending_reasons(conn, job, _rows(conn, "workers"), now, live_within, window)
    elif job["status"] == "running":
        state, reasons = "running", [_held(conn, job, now, live_within)]
    else:
        state, reasons = job["status"], [_finished(job)]
    unique = _unique(conn, job) if state in ("completed", "failed", "archived") else None
    reasons += [unique] if unique else []
    return Answer("job", str(job_id), state, job["queue"], _ordered(reasons), now,
                  {"id": job["id"], "kind": job["kind"], "priority": job["priority"], "run_at": job["run_at"]})


def why_queue(conn: psycopg.Connection, queue: str, *, live_within: float, window: int = WINDOW,
              head_window: int = HEAD_WINDOW, now: datetime | None = None) -> Answer:
    """The answer for one queue: its head job's (the first eligible in claim order), or, with
    nothing due, the queue's own flags, limits and workers and when its next job is due."""
    with _walking_indexes(conn):
        return _why_queue(conn, queue, live_within=live_within, window=window, head_window=head_window, now=now)


def _why_queue(conn: psycopg.Connection, queue: str, *, live_within: float, window: int, head_window: int,
               now: datetime | None) -> Answer:
    from console.browse import get_job

    now = now or datetime.now(UTC)
    # The head is exactly the job the workers claim next: between reading it and reading its row
    # a busy queue's worker often took it. Look again (a new head); only with nothing eligible is
    # the queue empty or waiting for its schedule.
    for _ in range(HEAD_TRIES):
        found = _row(conn, "queue_head", {"queue": queue, "window": head_window}) or {}
        eligible, scheduled, capped = int(found.get("eligible") or 0), int(found.get("scheduled") or 0), bool(found.get("full"))
        job = get_job(conn, found["head_id"], archive=False) if found.get("head_id") is not None else None
        if not eligible or (job is not None and job["status"] == "pending" and job["run_at"] <= now):
            break
    workers = _rows(conn, "workers")
    if eligible and (job is None or job["status"] != "pending" or job["run_at"] > now):
        reasons = [Reason(
            "moving", False,
            f"Queue {queue} is moving: {eligible:,}{'+' if capped else ''} job(s) waiting, and a worker took its first "
            f"eligible job each of the {HEAD_TRIES} times it was looked at.",
            {"eligible": eligible, "tries": HEAD_TRIES, "lower_bound": capped})]
        answer = Answer("queue", queue, "moving", queue, reasons, now, None)
        answer.figures = {"eligible": eligible, "scheduled": scheduled, "lower_bound": capped, "window": head_window}
        return answer
    if job is not None and job["status"] == "pending" and job["run_at"] <= now:
        reasons = _pending_reasons(conn, job, workers, now, live_within, window, head=True)
        head = {"id": job["id"], "kind": job["kind"], "priority": job["priority"], "run_at": job["run_at"],
                "waiting_seconds": round((now - job["run_at"]).total_seconds(), 1)}
        state = "waiting"
    else:
        facts = _queue_facts(conn, queue, None)
        reasons = [r for r in (_paused(queue, facts),) if r is not None] + _queue_limits(queue, facts)
        if scheduled:
            reasons += _workers_for(queue, None, workers, live_within)[0]
            when = found.get("next_run_at")
            reasons.append(Reason(
                "scheduled", True,
                f"Nothing in queue {queue} is due: {scheduled:,}{'+' if capped else ''} job(s) are scheduled, the next at "
                f"{_at(when)}" + (f", in {duration((when - now).total_seconds())}." if when else "."),
                {"scheduled": scheduled, "next_run_at": when, "lower_bound": capped}))
        else:
            running = facts["running"]
            reasons.append(Reason(
                "empty", False,
                f"Nothing is waiting in queue {queue}" + (f"; {running} job(s) running." if running else ".")
                + (f" (Only the first {head_window:,} pending jobs of all queues were looked at.)" if capped else ""),
                {"running": running, "lower_bound": capped}))
        if facts["expired"]:
            reasons.append(_expired_in_queue(queue, facts))
        head, state = None, "scheduled" if scheduled else "empty"
    answer = Answer("queue", queue, state, queue, _ordered(reasons), now, head)
    answer.figures = {"eligible": eligible, "scheduled": scheduled, "lower_bound": capped, "window": head_window}
    return answer


__all__ = ["ORDER", "Answer", "Reason", "why_job", "why_queue"]
