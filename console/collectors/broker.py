"""Broker queues (issue 32; docs/exit-plan.md): the figures of the queues NATS JetStream serves,
under the same metric names as Skiplock's own PostgreSQL queues, labelled `backend="nats"`.

For every queue whose `skiplock.queues.backend` is 'nats' (and, after a move back to
PostgreSQL, for as long as its streams still hold jobs or dead letters), it reads through the
JetStream API, on one NATS connection per cycle:
- the work-queue stream `skiplock_jobs_<queue>` and its durable consumer `skiplock`:
  `queue_depth{state="eligible"}` = messages no worker has been given yet (the consumer's
  num_pending; the stream's messages before a worker created the consumer),
  `queue_depth{state="running"}` = messages delivered and not yet acknowledged (num_ack_pending:
  jobs running, and failed attempts waiting out their nak delay), `queue_redeliveries` = those
  of them delivered more than once (num_redelivered);
- `queue_age_seconds`: how long the head (the first message not yet delivered) has been due,
  from its `run_at` (the relay publishes a job once it is due), 0 when nothing waits;
- the dead-letter stream `skiplock_dead_<queue>`: `dead_letters` and
  `queue_depth{state="failed"}` = its messages, and `dead_letter_growth` = the dead letters
  that arrived within `[scheduler] rate_window`, per hour (from its last sequence number,
  remembered each cycle; none before a second reading), the same definition as PostgreSQL's.
A stream that does not exist yet (the relay creates both at its first publish) counts 0.

Every series carries `queue`, `system="skiplock"` and `backend="nats"`, so the overview, the
queue pages, the alert rules and `/metrics` treat a broker queue as any other queue; during a
move (jobs on both sides) a queue has a series of each backend and the pages add them up.
Not measured here (no series): scheduled jobs (a job due later waits in the PostgreSQL outbox)
and stuck leases (the server redelivers after the ack wait by itself).

Why the JetStream API rather than the server's HTTP monitoring port (`/jsz`): it needs no second
address or open monitoring port, it uses the `[broker] nats_url` (and its credentials) the relay
and the workers use, and it answers for the whole cluster from the stream's leader, where a
server's `/jsz` lists only the streams that server holds a replica of.

Bounds: the whole read (connect included) runs under the collectors' statement timeout, in a
thread with its own event loop, and no PostgreSQL transaction is open meanwhile (the collector
connection is autocommit: the one query here is its own transaction, finished before). A broker
that is down, slow or refuses fails this collector only (`collector_errors{collector="broker"}`
= 1, its series "not available" for that cycle); the rest of the cycle goes on. It imports
nats-py only when there is a broker queue to read.

`broker_figures(conn)` is what the pages read back: each broker queue's newest figures from
the stored samples, never the broker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from console import natscall, samples
from console.collectors.base import Context
from console.natscall import BrokerUnavailable
from console.queue import broker
from console.samples import Sample

BACKEND = "nats"


# Queues read at once on the one connection (each queue's three or four requests in turn): a
# hundred broker queues cost a few round trips of the network, not four hundred.
PARALLEL = 16


async def _read_queue(js: Any, queue: str, not_found: type[Exception]) -> dict[str, Any]:
    row: dict[str, Any] = {"pending": 0, "ack_pending": 0, "redelivered": 0, "dead": 0, "dead_seq": 0,
                           "head_run_at": None, "head_time": None, "exists": False}
    try:
        stream = await js.stream_info(broker.stream(queue))
    except not_found:
        stream = None
    row["exists"] = stream is not None
    next_seq = None
    if stream is not None:
        row["pending"] = stream.state.messages
        next_seq = stream.state.first_seq
        try:
            consumer = await js.consumer_info(broker.stream(queue), broker.CONSUMER)
        except not_found:
            consumer = None  # no broker worker has started yet: every message waits
        if consumer is not None:
            row["pending"] = consumer.num_pending or 0
            row["ack_pending"] = consumer.num_ack_pending or 0
            row["redelivered"] = consumer.num_redelivered or 0
            next_seq = (consumer.delivered.stream_seq if consumer.delivered else 0) + 1
    if row["pending"] and next_seq:
        # The head: the first message at or after the consumer's next sequence number.
        try:
            msg = await js.get_msg(broker.stream(queue), seq=next_seq, subject=broker.subject(queue), next=True)
        except not_found:
            msg = None
        if msg is not None:
            row["head_time"] = msg.time
            try:
                body = json.loads(msg.data or b"{}")
            except ValueError:
                body = None
            if isinstance(body, dict) and isinstance(body.get("run_at"), str):
                row["head_run_at"] = body["run_at"]
    try:
        dead = await js.stream_info(broker.dead_stream(queue))
        row["dead"], row["dead_seq"] = dead.state.messages, dead.state.last_seq
    except not_found:
        pass
    return row


async def _read(nats_url: str, queues: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    from nats.js.errors import NotFoundError

    nc = await natscall.connect(nats_url, timeout)
    try:
        js = nc.jetstream(timeout=timeout)
        gate = asyncio.Semaphore(PARALLEL)

        async def one(queue: str) -> dict[str, Any]:
            async with gate:
                return await _read_queue(js, queue, NotFoundError)

        rows = await asyncio.gather(*(one(queue) for queue in queues))
        return dict(zip(queues, rows, strict=True))
    finally:
        await nc.close()


def read_broker(nats_url: str, queues: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """{queue: figures} read from the broker within `timeout` seconds, in a thread of its own
    (the scheduler's thread may run inside an event loop, which asyncio.run refuses)."""
    return natscall.call(lambda: _read(nats_url, queues, timeout), nats_url, timeout,
                         thread_name="skiplock-broker-collector")


def _age(row: dict[str, Any], now: datetime) -> float:
    if not row["pending"]:
        return 0.0
    due = None
    if row.get("head_run_at"):
        try:
            due = datetime.fromisoformat(row["head_run_at"])
        except (TypeError, ValueError):
            due = None
    if due is None or due.tzinfo is None:
        due = row.get("head_time")
    if due is None:
        return 0.0
    return max((now - due).total_seconds(), 0.0)


def _growth(points: list[list[float]], now: float, seq: int, window: float) -> tuple[float | None, list[list[float]]]:
    """(dead letters per hour over the window, the points to keep). `points` are [time, last
    sequence number] of earlier cycles; the rate is taken from the oldest point within the
    window. None with no earlier point, or after the stream was recreated (the number fell).
    A point is kept at most every window/60 seconds, so the state stays small at any interval."""
    kept = [p for p in points if now - p[0] <= window and p[0] < now]
    rate = None
    if kept and seq >= kept[0][1]:
        span = now - kept[0][0]
        rate = (seq - kept[0][1]) * 3600.0 / span if span > 0 else None
    if kept and seq < kept[-1][1]:
        kept = []
    if not kept or now - kept[-1][0] >= window / 60.0:
        kept.append([now, seq])
    return rate, kept


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    previous = ctx.previous.get("queues", {})
    configured = broker.broker_queues(ctx.conn)
    # A queue moved back to PostgreSQL stays watched while its streams still hold anything.
    queues = sorted(set(configured) | {q for q, was in previous.items() if was.get("busy")})
    if not queues:
        ctx.remember({"queues": {}})
        return []
    if not opts.broker_url:
        raise BrokerUnavailable(f"queue(s) {', '.join(queues)} are served by NATS but [broker] nats_url is not set")
    readings = read_broker(opts.broker_url, queues, opts.statement_timeout_ms / 1000.0)
    now = ctx.now.timestamp()
    out: list[Sample] = []
    state: dict[str, Any] = {}
    for queue in queues:
        row = readings[queue]
        q = {"queue": queue, "system": "skiplock", "backend": BACKEND}
        growth, points = _growth((previous.get(queue) or {}).get("dead_seq", []), now, row["dead_seq"], opts.rate_window)
        out += [
            Sample("queue_depth", {**q, "state": "eligible"}, row["pending"]),
            Sample("queue_depth", {**q, "state": "running"}, row["ack_pending"]),
            Sample("queue_depth", {**q, "state": "failed"}, row["dead"]),
            Sample("queue_age_seconds", q, _age(row, ctx.now)),
            Sample("dead_letters", q, row["dead"]),
            Sample("queue_redeliveries", q, row["redelivered"]),
        ]
        if growth is not None:
            out.append(Sample("dead_letter_growth", q, growth))
        state[queue] = {"dead_seq": points, "busy": bool(row["pending"] or row["ack_pending"] or row["dead"])}
    ctx.detail("broker_queues", {"queues": queues, "nats_url": natscall.masked(opts.broker_url)})
    ctx.remember({"queues": state})
    return out


FIGURES = {"queue_age_seconds": "age_seconds", "dead_letters": "failed", "queue_redeliveries": "redeliveries"}


def broker_figures(conn: psycopg.Connection, *, within: timedelta = timedelta(minutes=15)) -> dict[str, dict[str, Any]]:
    """{queue: {eligible, running, failed, age_seconds, redeliveries, at}} of the broker queues
    from the newest stored samples (the pages' read; never the broker). Empty without any."""
    out: dict[str, dict[str, Any]] = {}
    for s in samples.latest_labelled(conn, ["queue_depth", *FIGURES], {"backend": BACKEND}, within=within):
        if "queue" not in s.labels:
            continue
        row = out.setdefault(s.labels["queue"], {"at": s.at})
        if s.metric == "queue_depth":
            if s.labels.get("state") in ("eligible", "running"):
                row[s.labels["state"]] = s.value
        else:
            row[FIGURES[s.metric]] = s.value
    return out
