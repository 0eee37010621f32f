"""The outbox relay: publishes broker queues' jobs from skiplock.outbox to NATS JetStream
(`skiplock relay`; docs/exit-plan.md, "The relay").

One leader per database: the relay that holds the session advisory lock `relay_lock`
(sql/broker.sql) on a connection of its own publishes; the others wait as standbys and try the
lock again every poll interval. A killed leader's session ends, PostgreSQL releases its lock,
and a standby takes over.

Each round, in order, never holding a transaction across a network call:
1. read up to `batch_size` unsent, due rows in id order (one short autocommit statement);
2. publish each to its queue's stream with `Nats-Msg-Id` = the row's msg_id, all of the batch
   at once, and wait for every publish ack (JetStream acknowledges a message once it is stored,
   or says it was a duplicate of one stored within the stream's de-duplication window);
3. mark the acknowledged rows sent (a second short statement).

So a kill -9 at any point loses nothing (a row is marked only after its ack) and publishes
nothing twice within the de-duplication window (`[broker] duplicate_window`): the rows of an
interrupted round are read and published again by the next leader, with the same ids. A row
whose publish failed (broker away, timeout, its stream deleted) stays unsent and is tried again
next round, after the relay looked for its queue's streams again (and created them); the rows
of the batch that were acknowledged are marked, so one bad row holds nothing up. A queue whose
streams cannot be looked up or created is left out of the reads for BLOCKED_RETRY seconds, so
its rows do not fill every batch ahead of the other queues'.

The relay wakes on the `skiplock_outbox` doorbell (enqueue's NOTIFY, delivered at commit) and
also polls; it creates a queue's streams (jobs and dead letters, `[broker] replicas` replicas
each) the first time it publishes to it, and deletes sent rows older than `[broker] outbox_keep`
in bounded batches.

On a JetStream cluster that loses a node (docs/exit-plan.md, "A JetStream cluster") the
connection moves to another server by itself, and until the streams have elected new leaders
publishes go unacknowledged and stream look-ups time out: the rows stay unsent, a round with
failures is followed by a poll interval's pause (not the next doorbell), and nothing ends the
process.

It does not run handlers, retry jobs or read the broker's state: the broker worker
(console.queue.broker.natsworker) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import nats
import psycopg
from nats.errors import (
    ConnectionClosedError,
    ConnectionReconnectingError,
    NoRespondersError,
    StaleConnectionError,
)
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError
from psycopg.rows import dict_row

from console.queue import broker
from console.sqlfiles import query

log = logging.getLogger("skiplock.relay")
nats_log = logging.getLogger("skiplock.nats")  # the broker as the relay and the broker worker see it

PRUNE_EVERY = 60.0  # seconds between two prunes of sent rows
PRUNE_BATCH = 1000
# Seconds a queue whose streams could not be looked up or created is left out of the reads
# before the relay tries again: without it, such a queue's oldest rows filled every batch and
# every other queue's jobs waited behind them.
BLOCKED_RETRY = 10.0


@dataclass
class RelaySettings:
    nats_url: str = "nats://127.0.0.1:4222"
    batch_size: int = 100
    poll_interval: float = 1.0
    publish_timeout: float = 5.0
    duplicate_window: float = 120.0
    outbox_keep: float = 3600.0
    replicas: int = 1


async def ensure_streams(js: Any, queue: str, duplicate_window: float, replicas: int = 1) -> None:
    """Create `queue`'s work-queue stream and its dead-letter stream unless they exist, each with
    `replicas` replicas ([broker] replicas). A stream that exists is left as it is: JetStream
    cannot lower or raise a stream's replicas under its consumers without the operator's say
    (`nats stream edit --replicas`), so a different count is logged, not changed."""
    for name, subject, retention in ((broker.stream(queue), broker.subject(queue), api.RetentionPolicy.WORK_QUEUE),
                                     (broker.dead_stream(queue), broker.dead_subject(queue), api.RetentionPolicy.LIMITS)):
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(api.StreamConfig(name=name, subjects=[subject], retention=retention,
                                                 storage=api.StorageType.FILE, duplicate_window=duplicate_window,
                                                 num_replicas=replicas))
            continue
        has = info.config.num_replicas or 1
        if has != replicas:
            nats_log.warning("stream %s exists with %d replica(s), not [broker] replicas = %d: it is left as it is "
                        "(change it with `nats stream edit %s --replicas %d`)", name, has, replicas, name, replicas)


def unavailable(exc: BaseException) -> bool:
    """True when `exc` says the broker is away for now rather than that the request is wrong:
    no answer in time, no server to answer (a stream or consumer without an elected leader),
    the connection lost or being made again, or JetStream's own "temporarily unavailable"."""
    if isinstance(exc, TimeoutError | NatsTimeout | NoRespondersError | ConnectionClosedError
                  | ConnectionReconnectingError | StaleConnectionError | ServiceUnavailableError | NoStreamResponseError):
        return True
    return isinstance(exc, APIError) and exc.code in (408, 503)


def jetstream_hint(exc: BaseException) -> str:
    """A hint for the log when `exc` says the server has no JetStream: a plain `nats-server`
    (Debian's service runs one so, from /etc/nats-server.conf) answers JetStream's requests with
    "no responders", which nats-py raises as ServiceUnavailableError without a code (a stream
    or consumer electing its leader answers with code 503 instead)."""
    if isinstance(exc, ServiceUnavailableError) and getattr(exc, "code", None) is None:
        return (" (the server answers, JetStream does not: start nats-server with -js, or add "
                "`jetstream { store_dir: /var/lib/nats }` to its configuration file and restart it)")
    return ""


CONNECT_WITHIN = 15.0  # seconds the first connection to NATS may take before the process gives up


async def _nats_error(exc: Exception) -> None:
    text = str(exc) or type(exc).__name__
    nats_log.warning("nats: %s", text.removeprefix("nats: "))  # one line, not the client's traceback


async def connect_nats(nats_url: str, name: str) -> Any:
    """A NATS connection that reconnects for ever once made; the first connection must succeed
    within CONNECT_WITHIN seconds, so a wrong address ends the process with a message instead
    of retrying silently for ever. Losing a server and reconnecting (to another of `nats_url`'s
    servers, or one the cluster told the client about) is logged, one line each."""
    nc: Any = None

    async def disconnected() -> None:
        if nc is not None and (nc.is_closed or nc.is_draining):
            return  # this process closing its connection, not a server lost
        nats_log.warning("nats: disconnected from %s; reconnecting", _server(nc))

    async def reconnected() -> None:
        nats_log.info("nats: reconnected to %s", _server(nc))

    nc = await asyncio.wait_for(
        nats.connect(servers=broker.servers(nats_url), name=name, max_reconnect_attempts=-1, connect_timeout=5,
                     error_cb=_nats_error, disconnected_cb=disconnected, reconnected_cb=reconnected),
        CONNECT_WITHIN)
    nats_log.info("nats: connected to %s", _server(nc))
    return nc


def _server(nc: Any) -> str:
    """The address of the server `nc` is (or was last) connected to, without credentials."""
    srv = getattr(nc, "_current_server", None)  # connected_url is None once disconnected
    url = getattr(srv, "uri", None)
    return f"{url.hostname}:{url.port}" if url is not None else "(none)"


def message(row: dict[str, Any]) -> bytes:
    """The job as the broker worker reads it (JSON; payload and headers as enqueued)."""
    return json.dumps({
        "id": row["id"],
        "queue": row["queue"],
        "kind": row["kind"],
        "payload": json.loads(row["payload"]),
        "priority": row["priority"],
        "run_at": row["run_at"].isoformat(),
        "max_attempts": row["max_attempts"],
        "idempotency_key": row["idempotency_key"],
        "headers": None if row["headers"] is None else json.loads(row["headers"]),
        "group": row["group_key"],
        "created_at": row["created_at"].isoformat(),
    }, separators=(",", ":")).encode()


class Relay:
    def __init__(self, dsn: str, settings: RelaySettings | None = None) -> None:
        self.dsn = dsn
        self.settings = settings or RelaySettings()
        self.published = 0  # rows marked sent by this process
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._streams: set[str] = set()
        self._complained: dict[str, float] = {}
        self._blocked: dict[str, float] = {}  # queue -> monotonic time its streams are tried again

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, application_name="skiplock-relay")

    async def _lead(self, lock_conn: psycopg.AsyncConnection[Any]) -> bool:
        """Wait until this process holds the relay lock; False when stopped first."""
        announced = False
        while not self._stop.is_set():
            cur = await lock_conn.execute(query("broker", "relay_lock"))
            row = await cur.fetchone()
            if row and row[0]:
                log.info("relay: leader for this database")
                return True
            if not announced:
                log.info("relay: another relay leads this database; standing by")
                announced = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.poll_interval)
        return False

    async def _listen(self) -> None:
        """Ring `_wake` at each skiplock_outbox NOTIFY (a doorbell: the loop also polls)."""
        conn = await self._connect()
        try:
            await conn.execute("LISTEN skiplock_outbox")
            async for _ in conn.notifies():
                self._wake.set()
        finally:
            await conn.close()

    async def relay_once(self, conn: psycopg.AsyncConnection[Any], js: Any) -> tuple[int, int]:
        """One round: read, publish, mark. Returns (rows read, rows marked sent)."""
        now = time.monotonic()
        self._blocked = {queue: until for queue, until in self._blocked.items() if until > now}
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query("broker", "outbox_take"),
                              {"limit": self.settings.batch_size, "skip": sorted(self._blocked)})
            rows = await cur.fetchall()
        if not rows:
            return 0, 0
        read = len(rows)
        for queue in sorted({r["queue"] for r in rows}):
            if queue not in self._streams:
                try:
                    await ensure_streams(js, queue, self.settings.duplicate_window, self.settings.replicas)
                except Exception as exc:  # broker away, or a stream it refuses: the rows wait
                    self._complain(queue, exc)
                    self._blocked[queue] = time.monotonic() + BLOCKED_RETRY
                    continue
                self._streams.add(queue)
        ready = [r for r in rows if r["queue"] in self._streams]
        if not ready:
            return read, 0
        rows = ready
        results = await asyncio.gather(*(
            js.publish(broker.subject(r["queue"]), message(r), timeout=self.settings.publish_timeout,
                       headers={broker.MSG_ID: str(r["msg_id"]), broker.JOB_ID: str(r["id"])})
            for r in rows), return_exceptions=True)
        acked = [r["id"] for r, result in zip(rows, results, strict=True) if not isinstance(result, BaseException)]
        failed = [(r["id"], result) for r, result in zip(rows, results, strict=True) if isinstance(result, BaseException)]
        if failed:
            log.warning("relay: %d of %d publishes not acknowledged (first: job %s, %s); they stay unsent",
                        len(failed), len(rows), failed[0][0], type(failed[0][1]).__name__)
            # A stream deleted under the relay answers "no responders": look for (and create)
            # the streams of these queues again next round.
            self._streams -= {r["queue"] for r, result in zip(rows, results, strict=True)
                              if isinstance(result, BaseException)}
        if acked:
            await conn.execute(query("broker", "outbox_sent"), {"ids": acked})
            self.published += len(acked)
        return read, len(acked)

    def _complain(self, queue: str, exc: BaseException) -> None:
        """Log that `queue`'s streams cannot be looked up or created, at most every 10 s."""
        now = time.monotonic()
        if now - self._complained.get(queue, float("-inf")) >= 10.0:
            self._complained[queue] = now
            log.warning("relay: cannot look up or create the streams of queue %s (%s: %s); its rows stay unsent%s",
                        queue, type(exc).__name__, str(exc) or "-", jetstream_hint(exc))

    async def _prune(self, conn: psycopg.AsyncConnection[Any]) -> int:
        total = 0
        while not self._stop.is_set():
            cur = await conn.execute(query("broker", "outbox_prune"),
                                     {"keep": self.settings.outbox_keep, "batch_size": PRUNE_BATCH})
            total += cur.rowcount
            if cur.rowcount < PRUNE_BATCH:
                break
        return total

    async def _idle(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute(query("broker", "outbox_next_due"))
        row = await cur.fetchone()
        wait = self.settings.poll_interval
        if row and row[0] is not None:
            wait = max(0.0, min(wait, float(row[0])))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)
        self._wake.clear()

    async def run(self) -> int:
        """Lead (or stand by), then relay until stopped; returns the exit code."""
        lock_conn = await self._connect()
        try:
            if not await self._lead(lock_conn):
                return 0
            try:
                nc = await connect_nats(self.settings.nats_url, "skiplock-relay")
            except Exception as exc:
                log.error("relay: cannot reach NATS at %s: %s", self.settings.nats_url, str(exc) or type(exc).__name__)
                return 1
            js = nc.jetstream(timeout=self.settings.publish_timeout)
            conn = await self._connect()
            listener = asyncio.create_task(self._listen())
            last_prune = float("-inf")
            try:
                while not self._stop.is_set():
                    if listener.done():  # the doorbell's connection died: the loop still polls
                        listener = asyncio.create_task(self._listen())
                    await lock_conn.execute("SELECT 1")  # leadership lives with this session
                    read, sent = await self.relay_once(conn, js)
                    if sent < read:
                        # The broker refused or did not answer (a stream electing its leader, a
                        # node lost): wait a poll interval before the next round, whatever the
                        # doorbell says, rather than asking again at the rate jobs arrive.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), self.settings.poll_interval)
                        self._wake.clear()
                        continue
                    if read == self.settings.batch_size:
                        continue  # more may be waiting
                    if time.monotonic() - last_prune >= PRUNE_EVERY:
                        await self._prune(conn)
                        last_prune = time.monotonic()
                    await self._idle(conn)
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
                await conn.close()
                with contextlib.suppress(Exception):
                    await nc.drain()
            log.info("relay stopped: %d job(s) published", self.published)
            return 0
        finally:
            await lock_conn.close()


def run_relay(dsn: str, settings: RelaySettings) -> int:
    """Run a relay in this process until SIGTERM/SIGINT; returns the exit code."""
    relay = Relay(dsn, settings)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.stop)
        return await relay.run()

    return asyncio.run(main())
