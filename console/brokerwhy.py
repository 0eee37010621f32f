"""Why isn't a broker queue moving? console/why.py's question for a queue NATS JetStream serves
(issue 32; docs/exit-plan.md, "Why isn't it moving?"), answered from the broker's facts instead
of skiplock.jobs' claim index, which a broker queue's new jobs never enter.

    answer = why_broker_queue(conn, "mail", nats_url=..., timeout=5.0, live_within=30.0)

The facts, read in two steps so that no PostgreSQL transaction is open while NATS is called:
`pg_facts(conn, queue)` (the outbox's unsent rows of the queue, who holds the relay's leader
lock, the broker workers registered on the queue and heard from within `live_within` seconds,
the jobs the queue left in skiplock.jobs before it moved), then `broker_facts(...)` (the
collector's own read of the work-queue stream and its durable consumer: waiting, delivered and
not acknowledged, redelivered, the dead-letter stream). `answer(...)` turns them into a
`why.Answer` with these reasons, in this order (the verdict is the first blocking one):

  broker_down     the broker did not answer: nothing can be said of the stream, and nothing moves
  relay_stopped   due jobs wait in the outbox and no relay holds the leader lock: none is published
  no_worker       jobs wait in the stream and no broker worker of the queue reported lately
  outbox          the relay has due jobs still to publish (it runs): how many, the oldest's age
  redelivered     delivered jobs that were delivered more than once (failing and retried, or
                  their worker died before its ack)
  backlog         jobs wait in the stream and broker workers consume it
  running         jobs delivered and not yet acknowledged (running, or waiting out a retry's delay)
  postgres_left   jobs the queue left in skiplock.jobs when it moved: PostgreSQL workers run them
  empty           nothing waits or runs on the broker, nothing due in the outbox

What it cannot see, and so never claims: whether a broker worker without a database (it does
not register) consumes the queue, so `no_worker` says so; and a pause (the broker worker does
not honour one). It reads; it changes nothing and knows nothing of HTTP or the CLI.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import exitplan
from console.natscall import BrokerUnavailable
from console.queue import broker
from console.sqlfiles import query
from console.timefmt import duration
from console.why import Answer, Reason

ORDER = ("broker_down", "relay_stopped", "no_worker", "outbox", "redelivered", "backlog", "running",
         "postgres_left", "empty")


def pg_facts(conn: psycopg.Connection, queue: str, *, live_within: float) -> dict[str, Any]:
    """What PostgreSQL knows of the broker queue: {outbox, jobs (left in skiplock.jobs), relay
    (the leader lock's holders), workers (registered, heard from within live_within s)}."""
    state = exitplan.dual_run(conn, queue)
    with conn.cursor(row_factory=dict_row) as cur:
        workers = cur.execute(query("broker", "live_broker_workers"), {"queue": queue, "within": live_within}).fetchall()
    return {"outbox": state["outbox"], "jobs": state["jobs"], "relay": exitplan.relay_leaders(conn), "workers": workers}


# The stream's figures are read by exitplan (its `--status` reads them too; it cannot import this
# module, which builds on it).
broker_facts = exitplan.broker_facts


def _n(count: int, what: str) -> str:
    return f"{count:,} {what}{'' if count == 1 else 's'}"


def _are(count: int) -> str:
    return "is" if count == 1 else "are"


def answer(queue: str, pg: dict[str, Any], found: dict[str, Any] | None, error: str | None = None, *,
           live_within: float, now: datetime | None = None) -> Answer:
    """The answer from the facts (`found` None with `error`: the broker did not answer)."""
    now = now or datetime.now(UTC)
    outbox, jobs, relay, workers = pg["outbox"], pg["jobs"], pg["relay"], pg["workers"]
    due = max(int(outbox["unsent"]) - int(outbox["waiting"]), 0)
    plus = "+" if outbox.get("capped") else ""
    reasons: list[Reason] = []
    if found is None:
        reasons.append(Reason("broker_down", True,
                              f"Queue {queue} is served by NATS, and the broker did not answer ({error}): nothing "
                              "can be read of its stream, and no job of it moves until the broker answers.",
                              {"error": error, "stream": broker.stream(queue)}))
    if due and not relay:
        reasons.append(Reason("relay_stopped", True,
                              f"{_n(due, 'job')}{plus} of queue {queue} {_are(due)} waiting in the outbox and no relay runs (no "
                              "session holds the relay's leader lock): none reaches the broker until `skiplock relay` "
                              "runs.", {"due": due, "oldest": outbox.get("oldest"), "lower_bound": bool(plus)}))
    elif due:
        oldest = outbox.get("oldest")
        age = (now - datetime.fromisoformat(oldest)).total_seconds() if oldest else None
        reasons.append(Reason("outbox", False,
                              f"The relay (pid {relay[0]['pid']}) has {_n(due, 'job')}{plus} of queue {queue} still to "
                              "publish" + (f", the oldest written {duration(max(age, 0.0))} ago." if age is not None
                                           else "."),
                              {"due": due, "oldest": oldest, "relay_pid": relay[0]["pid"], "lower_bound": bool(plus)}))
    figures: dict[str, Any] = {"backend": "nats", "outbox_unsent": outbox["unsent"], "outbox_waiting": outbox["waiting"],
                               "postgres_left": jobs["pending"] + jobs["scheduled"] + jobs["running"]}
    state = "unknown"
    if found is not None:
        pending, in_flight, again = int(found["pending"]), int(found["ack_pending"]), int(found["redelivered"])
        figures.update(pending=pending, ack_pending=in_flight, redelivered=again, dead=int(found["dead"]))
        stream = broker.stream(queue)
        if pending and not workers:
            reasons.append(Reason("no_worker", True,
                                  f"{_n(pending, 'job')} of queue {queue} {_are(pending)} waiting in the stream {stream} and no broker "
                                  f"worker of the queue reported in the last {duration(live_within)}: start "
                                  f"`skiplock worker --backend nats --queues {queue}` (a broker worker without a "
                                  "database does not register: if one runs so, check its log).",
                                  {"pending": pending, "live_within": live_within}))
        if again:
            reasons.append(Reason("redelivered", False,
                                  f"{_n(again, 'job')} of queue {queue} {'was' if again == 1 else 'were'} delivered more than "
                                  "once: a handler failed and the job waits out a retry's delay, or a worker died "
                                  "before its ack and the broker gave the job out again after the ack wait.",
                                  {"redelivered": again, "ack_pending": in_flight}))
        if pending and workers:
            reasons.append(Reason("backlog", False,
                                  f"{_n(pending, 'job')} of queue {queue} {_are(pending)} waiting in the stream {stream}; "
                                  f"{_n(len(workers), 'broker worker')} {'consumes' if len(workers) == 1 else 'consume'} it "
                                  f"({', '.join(w['id'] for w in workers)}).",
                                  {"pending": pending, "workers": [w["id"] for w in workers]}))
        if in_flight:
            reasons.append(Reason("running", False,
                                  f"{_n(in_flight, 'job')} of queue {queue} {_are(in_flight)} delivered and not yet acknowledged "
                                  "(running, or waiting out a retry's delay).", {"ack_pending": in_flight}))
        state = "waiting" if pending else "running" if in_flight else "empty"
    left = figures["postgres_left"]
    if left:
        reasons.append(Reason("postgres_left", False,
                              f"{_n(left, 'job')} of queue {queue} {'was' if left == 1 else 'were'} enqueued before it moved to "
                              "NATS and stay in skiplock.jobs: the PostgreSQL workers of the queue run them (`skiplock why --queue` "
                              "reads the broker now; `skiplock queues move --status` shows the drain).",
                              {"pending": jobs["pending"], "scheduled": jobs["scheduled"], "running": jobs["running"]}))
    if found is not None and not reasons:
        waiting = int(outbox["waiting"])
        reasons.append(Reason("empty", False,
                              f"Nothing waits or runs in queue {queue} on the broker, and nothing is due in the outbox"
                              + (f" ({_n(waiting, 'job')} {_are(waiting)} waiting there for a later run_at)." if waiting else "."),
                              {"outbox_waiting": waiting}))
    reasons.sort(key=lambda r: ORDER.index(r.code))
    result = Answer("queue", queue, state, queue, reasons, now, None)
    result.figures = figures
    return result


def why_broker_queue(conn: psycopg.Connection, queue: str, *, nats_url: str, timeout: float, live_within: float,
                     now: datetime | None = None) -> Answer:
    """The whole answer on one connection (the CLI's): `conn` must be autocommit (no transaction
    is open while the broker is read)."""
    pg = pg_facts(conn, queue, live_within=live_within)
    try:
        found, error = broker_facts(nats_url, queue, timeout), None
    except BrokerUnavailable as exc:
        found, error = None, str(exc)
    return answer(queue, pg, found, error, live_within=live_within, now=now)


__all__ = ["ORDER", "answer", "broker_facts", "pg_facts", "why_broker_queue"]
