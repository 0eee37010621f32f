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
of the batch that were acknowledged are marked, so one bad row holds nothing up.

The relay wakes on the `skiplock_outbox` doorbell (enqueue's NOTIFY, delivered at commit) and
also polls; it creates a queue's streams (jobs and dead letters) the first time it publishes
to it, and deletes sent rows older than `[broker] outbox_keep` in bounded batches.

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
from nats.js import api
from nats.js.errors import NotFoundError
from psycopg.rows import dict_row

from console.queue import broker
from console.sqlfiles import query

log = logging.getLogger("skiplock.relay")

PRUNE_EVERY = 60.0  # seconds between two prunes of sent rows
PRUNE_BATCH = 1000


@dataclass
class RelaySettings:
    nats_url: str = "nats://127.0.0.1:4222"
    batch_size: int = 100
    poll_interval: float = 1.0
    publish_timeout: float = 5.0
    duplicate_window: float = 120.0
    outbox_keep: float = 3600.0


async def ensure_streams(js: Any, queue: str, duplicate_window: float) -> None:
    """Create `queue`'s work-queue stream and its dead-letter stream unless they exist."""
    for name, subject, retention in ((broker.stream(queue), broker.subject(queue), api.RetentionPolicy.WORK_QUEUE),
                                     (broker.dead_stream(queue), broker.dead_subject(queue), api.RetentionPolicy.LIMITS)):
        try:
            await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(api.StreamConfig(name=name, subjects=[subject], retention=retention,
                                                 storage=api.StorageType.FILE, duplicate_window=duplicate_window))


CONNECT_WITHIN = 15.0  # seconds the first connection to NATS may take before the process gives up


async def _nats_error(exc: Exception) -> None:
    log.warning("nats: %s", str(exc) or type(exc).__name__)  # one line, not the client's traceback


async def connect_nats(nats_url: str, name: str) -> Any:
    """A NATS connection that reconnects for ever once made; the first connection must succeed
    within CONNECT_WITHIN seconds, so a wrong address ends the process with a message instead
    of retrying silently for ever."""
    return await asyncio.wait_for(
        nats.connect(servers=broker.servers(nats_url), name=name, max_reconnect_attempts=-1, connect_timeout=5,
                     error_cb=_nats_error),
        CONNECT_WITHIN)


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
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query("broker", "outbox_take"), {"limit": self.settings.batch_size})
            rows = await cur.fetchall()
        if not rows:
            return 0, 0
        for queue in {r["queue"] for r in rows}:
            if queue not in self._streams:
                await ensure_streams(js, queue, self.settings.duplicate_window)
                self._streams.add(queue)
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
        return len(rows), len(acked)

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
                    read, _ = await self.relay_once(conn, js)
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
