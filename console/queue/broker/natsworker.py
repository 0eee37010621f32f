"""The broker worker: the same `@task` handlers, served from NATS JetStream
(`skiplock worker --backend nats --queues a,b`; docs/exit-plan.md, "The worker backend").

Per queue: the relay's work-queue stream (`skiplock_jobs_<queue>`) and one durable pull consumer
(`skiplock`) that every worker of the queue shares, so each message goes to one worker at a time.
The queue's contract maps onto JetStream like this:

| PostgreSQL backend                    | JetStream                                                    |
|---------------------------------------|--------------------------------------------------------------|
| claim (SKIP LOCKED)                   | fetch from the durable pull consumer                         |
| lease (`[worker] lease`)              | the consumer's ack wait                                      |
| heartbeat                             | `msg.in_progress()` every lease/3 while the handler runs     |
| complete                              | `ack` (double ack: waits for the server's confirmation)      |
| attempts                              | the delivery count (`num_delivered`)                         |
| fail with backoff                     | `nak(delay=backoff)` (the same `backoff_delay` with jitter)  |
| max_attempts                          | the job's own, checked by the worker (see below)             |
| dead letter (exhausted, DoNotRetry)   | published to `skiplock_dead_<queue>`, then `ack`             |
| reaper (expired lease)                | the server redelivers after the ack wait                     |

Why the worker, not the consumer's `max_deliver`, enforces max_attempts: max_attempts is per
job (an `enqueue` option), max_deliver per consumer; and a message that reaches max_deliver
stays in a work-queue stream, never delivered again and in no dead-letter set. So the consumer
has no max_deliver, and a delivery past the job's max_attempts (the earlier runs' workers died:
what the reaper turns into a dead letter) goes to the dead-letter stream without running.

Dead letters are published with `Nats-Msg-Id` = the job's msg id + ":dead", so a worker killed
between that publish and its ack does not write the dead letter twice.

The broker may be away for a while once the worker runs (a cluster's node lost: the connection
moves to another server, the stream and the consumer elect new leaders): a fetch or a consumer
set-up that fails is logged (once per 10 s per queue) and tried again, and an ack without an
answer is tried again until the ack wait runs out (after that the job is delivered again: at
least once). Only a set-up that fails for another reason before the first fetch ends the
worker, as a misconfiguration (more replicas than the cluster has nodes, say).

The worker registry (migration 031): given a database (`dsn`, the CLI's DATABASE_URL or
[database] dsn), the worker writes its row to skiplock.workers with backend 'nats' and a
heartbeat every `flush_interval` seconds (in flight, delivered, completed, failed, retried), so
the Workers page lists it with a `nats` badge. Each write is one autocommit statement on a
connection of its own, never inside a transaction and never waiting on the broker; a database
that is down or unmigrated is logged (once per 10 s) and tried again, and the worker goes on
consuming: it needs PostgreSQL for nothing else. The row says stopped when the worker stops.

What it does not do (yet): priorities, fair groups, limits, cancel requests, per-attempt logs,
the claim and pickup figures of the registry (it makes no claims of skiplock.jobs), and fencing:
a worker whose handler outlived the ack wait without heartbeats may finish a job another worker
was given meanwhile (at-least-once, as JetStream delivers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import APIError

from console.queue import broker, tasks
from console.queue import protocol as q
from console.queue.aio import timed_out
from console.queue.broker.relay import connect_nats, ensure_streams, jetstream_hint, unavailable
from console.queue.worker import Worker, package_version
from console.sqlfiles import query

log = logging.getLogger("skiplock.worker")

UNAVAILABLE_PAUSE = 0.5  # seconds between two tries while the broker is away
ACK_PATIENCE = 15.0  # seconds an unanswered ack is tried again: longer than a leader election (4-9 s)
COMPLAIN_EVERY = 10.0  # seconds between two warnings about the same queue's broker failure


class NatsWorker:
    def __init__(
        self,
        nats_url: str,
        *,
        queues: list[str],
        concurrency: int = 4,
        async_concurrency: int = 100,
        batch_size: int = 10,
        lease: float = q.DEFAULT_LEASE,
        poll_interval: float = 1.0,
        shutdown_grace: float = 30.0,
        backoff_base: float = q.DEFAULT_BACKOFF_BASE,
        backoff_cap: float = q.DEFAULT_BACKOFF_CAP,
        duplicate_window: float = 120.0,
        replicas: int = 1,
        name: str | None = None,
        dsn: str | None = None,
        flush_interval: float = 5.0,
        release: str | None = None,
    ) -> None:
        if not queues:
            raise ValueError("a broker worker needs --queues: one pull consumer per queue")
        if concurrency < 1 or async_concurrency < 1 or batch_size < 1 or lease <= 0 or poll_interval <= 0:
            raise ValueError("concurrency, async_concurrency, batch_size, lease and poll_interval must be positive")
        self.queues = [broker.check_queue(x) for x in queues]
        self.nats_url = nats_url
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.batch_size = batch_size
        self.lease = lease
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.duplicate_window = duplicate_window
        self.replicas = replicas
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.completed = self.retried = self.failed = self.delivered = 0
        self.dsn = dsn
        self.flush_interval = flush_interval
        self._registry_complained = float("-inf")
        self.release = release
        self._stop = asyncio.Event()
        self._async_slots = asyncio.Semaphore(async_concurrency)
        self._running: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="handler")
        self._js: Any = None
        self._complained: dict[str, float] = {}

    def stop(self) -> None:
        if self._stop.is_set():
            log.info("second signal: stopping now")
            for task in self._running:
                task.cancel()
        self._stop.set()

    # --- one job ----------------------------------------------------------------------------

    def _job(self, msg: Any, body: dict[str, Any]) -> q.Job:
        now = datetime.now(UTC)
        return q.Job(
            id=int(body["id"]), queue=body["queue"], kind=body["kind"], payload=body.get("payload"),
            priority=int(body.get("priority", 0)), run_at=datetime.fromisoformat(body["run_at"]),
            attempts=int(msg.metadata.num_delivered), max_attempts=int(body["max_attempts"]),
            idempotency_key=body.get("idempotency_key"), locked_by=self.id, locked_at=now,
            lease_until=now + timedelta(seconds=self.lease), created_at=datetime.fromisoformat(body["created_at"]),
            headers=body.get("headers"),
        )

    async def _heartbeat(self, msg: Any, job: q.Job) -> None:
        """Extend the ack wait while the handler runs: the broker's lease."""
        while True:
            await asyncio.sleep(self.lease / 3)
            with contextlib.suppress(Exception):  # a lost connection: the redelivery is the reaper
                await msg.in_progress()
                job.lease_until = datetime.now(UTC) + timedelta(seconds=self.lease)

    async def _run(self, job: q.Job) -> BaseException | None:
        if tasks.is_async(job.kind):
            async with self._async_slots:
                timeout = tasks.timeout_for(job.kind)
                try:
                    if timeout is None:
                        await tasks.handler_for(job.kind)(job)
                    else:
                        try:
                            await asyncio.wait_for(tasks.handler_for(job.kind)(job), timeout)
                        except TimeoutError as exc:
                            return timed_out(job, timeout, exc)
                except Exception as exc:  # a handler's failure is the job's, never the worker's
                    return exc
                return None
        loop = asyncio.get_running_loop()
        # The PostgreSQL worker's own run (timeouts, telemetry spans), on a handler thread.
        outcome = await loop.run_in_executor(self._pool, Worker._run_plain, job)
        return outcome.error

    async def _dead_letter(self, msg: Any, job: q.Job, error: BaseException | str) -> None:
        entry = q.error_entry(job, error)
        body = json.loads(msg.data)
        body.update(attempts=job.attempts, last_error=f"{entry['error_class']}: {entry['message']}"[:2000],
                    error=entry, failed_at=datetime.now(UTC).isoformat())
        msg_id = (msg.headers or {}).get(broker.MSG_ID) or f"job-{job.id}"
        await self._js.publish(broker.dead_subject(job.queue), json.dumps(body, default=str).encode(),
                               headers={broker.MSG_ID: f"{msg_id}:dead", broker.JOB_ID: str(job.id)})
        await self._ack(msg)
        self.failed += 1
        log.info("job %s (%s) is a dead letter after %d attempt(s): %s", job.id, job.kind, job.attempts,
                 entry["error_class"])

    async def _ack(self, msg: Any) -> None:
        """Acknowledge `msg` and wait for the server's confirmation, trying again for
        ACK_PATIENCE seconds (or the ack wait, if longer): while the consumer's leader is being
        elected (a node of the cluster lost) an ack gets no answer, and an ack given up on is a
        job run twice. An ack that arrives after the ack wait is still worth sending: the new
        leader may not have handed the message out again yet, and if it has, acknowledging a
        job that ran to completion ends the other delivery's claim on it, nothing worse."""
        deadline = time.monotonic() + max(self.lease, ACK_PATIENCE)
        while True:
            try:
                await msg.ack_sync(timeout=min(5.0, max(0.5, self.lease / 2)))
                return
            except Exception as exc:
                if not unavailable(exc) or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(UNAVAILABLE_PAUSE / 2)

    async def _handle(self, msg: Any) -> None:
        try:
            body = json.loads(msg.data)
            job = self._job(msg, body)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable message on %s (%s): terminated", msg.subject, exc)
            await msg.term()
            return
        if job.attempts > job.max_attempts:
            # Its earlier runs' workers died (the ack wait ran out each time): what the reaper
            # makes a dead letter of, without running it once more.
            await self._dead_letter(msg, job, f"lease expired {job.max_attempts} time(s): attempts exhausted")
            return
        beat = asyncio.create_task(self._heartbeat(msg, job))
        try:
            error = await self._run(job)
        finally:
            beat.cancel()
        if error is None:
            await self._ack(msg)
            self.completed += 1
            return
        if isinstance(error, q.DoNotRetry) or job.attempts >= job.max_attempts:
            await self._dead_letter(msg, job, error)
            return
        delay = q.backoff_delay(job.attempts, self.backoff_base, self.backoff_cap)
        await msg.nak(delay=delay)
        self.retried += 1
        log.info("job %s (%s) attempt %d failed (%s): retry in %.1f s", job.id, job.kind, job.attempts,
                 type(error).__name__, delay)

    async def _guarded(self, msg: Any) -> None:
        self.delivered += 1
        try:
            await self._handle(msg)
        except Exception as exc:  # the broker redelivers after the ack wait
            if unavailable(exc):  # the broker away (a node lost): one line, not a traceback per job
                log.warning("job message on %s: could not settle it, the broker did not answer (%s); it is "
                            "redelivered after the ack wait", msg.subject, type(exc).__name__)
                return
            log.exception("job message on %s: could not settle it; it is redelivered after the ack wait", msg.subject)

    # --- the loop ---------------------------------------------------------------------------

    async def _subscribe(self, queue: str) -> Any:
        """The queue's streams, its durable consumer and a pull subscription bound to it."""
        stream = broker.stream(queue)
        await ensure_streams(self._js, queue, self.duplicate_window, self.replicas)
        config = api.ConsumerConfig(durable_name=broker.CONSUMER, ack_policy=api.AckPolicy.EXPLICIT,
                                    ack_wait=self.lease, max_deliver=-1, filter_subject=broker.subject(queue))
        try:
            await self._js.add_consumer(stream, config)
        except APIError as exc:  # it exists with another ack wait (another lease): use it as it is
            if exc.code == 503:
                raise
            info = await self._js.consumer_info(stream, broker.CONSUMER)
            log.warning("queue %s: consumer exists with ack wait %s s, not this worker's lease %g s (%s)",
                        queue, info.config.ack_wait, self.lease, type(exc).__name__)
        return await self._js.pull_subscribe_bind(durable=broker.CONSUMER, stream=stream)

    async def _consume(self, queue: str) -> None:
        """Fetch `queue`'s messages while there are free slots, until stopped. The broker may be
        away for a while (a node of the cluster lost, its streams and consumers electing new
        leaders, the connection moving to another server): a fetch or a setup that fails is
        logged and tried again, at most every UNAVAILABLE_PAUSE seconds; only a setup that
        fails for another reason than the broker's absence, before the first fetch, ends the
        worker (a misconfiguration, such as more replicas than the cluster has nodes)."""
        sub = None
        started = False
        while not self._stop.is_set():
            if sub is None:
                try:
                    sub = await self._subscribe(queue)
                    started = True
                except Exception as exc:
                    if not started and not unavailable(exc):
                        raise
                    self._complain(queue, "cannot set up its consumer", exc)
                    await self._pause()
                    continue
            # Fetch only what can start now: a fetched message's ack wait is already running.
            slots = self.concurrency + (self.async_concurrency if tasks.any_async() else 0)
            free = slots - len(self._running)
            if free <= 0:
                await asyncio.sleep(0.01)
                continue
            try:
                msgs = await sub.fetch(min(self.batch_size, free), timeout=self.poll_interval)
            except (NatsTimeout, TimeoutError):
                continue
            except Exception as exc:  # the broker away: try again, and set the consumer up again
                self._complain(queue, "fetch failed", exc)
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                sub = None
                await self._pause()
                continue
            self._complained.pop(queue, None)
            for msg in msgs:
                task = asyncio.create_task(self._guarded(msg))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    def _complain(self, queue: str, what: str, exc: BaseException) -> None:
        """Log a broker failure of `queue` once per COMPLAIN_EVERY seconds, not once per try."""
        now = time.monotonic()
        if now - self._complained.get(queue, float("-inf")) >= COMPLAIN_EVERY:
            self._complained[queue] = now
            log.warning("queue %s: %s (%s: %s); trying again%s", queue, what, type(exc).__name__, exc,
                        jetstream_hint(exc))

    # --- the worker registry (migration 031) ---------------------------------------------------

    def _row(self) -> dict[str, Any]:
        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "queues": self.queues,
                "concurrency": self.concurrency, "kinds": sorted(tasks.registered()),
                "version": package_version() or "unknown", "release": self.release}

    def _counters(self, stopping: bool) -> dict[str, Any]:
        return {"id": self.id, "stopping": stopping, "in_flight": len(self._running), "claimed": self.delivered,
                "completed": self.completed, "failed": self.failed, "retried": self.retried}

    async def _registry_write(self, conn: Any, stopping: bool) -> Any:
        """One heartbeat (registering first on a new connection); returns the connection, or
        None after a failure, which is logged at most every COMPLAIN_EVERY seconds."""
        try:
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, application_name="skiplock-worker", connect_timeout=5,
                    options="-c statement_timeout=5000")
                await conn.execute(query("broker", "register_broker_worker"), self._row())
            await conn.execute(query("broker", "flush_broker_worker"), self._counters(stopping))
            return conn
        except Exception as exc:  # the database away or not migrated: the worker goes on
            if time.monotonic() - self._registry_complained >= COMPLAIN_EVERY:
                self._registry_complained = time.monotonic()
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("worker %s: cannot write its row to skiplock.workers (%s: %s); it goes on and tries "
                            "again (run `skiplock migrate` if the column backend is missing)", self.id,
                            type(exc).__name__, first)
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            return None

    async def _registry(self) -> Any:
        """Keep this worker's row in skiplock.workers: registered, then a heartbeat every
        flush_interval until stopped (run() writes the last one, marked stopped, once the
        running jobs are settled). Short autocommit statements on a connection of its own; a
        failure is logged and tried again, never the worker's end. Returns the connection."""
        conn: Any = None
        while not self._stop.is_set():
            conn = await self._registry_write(conn, stopping=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.flush_interval)
        return conn

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), UNAVAILABLE_PAUSE)

    async def run(self) -> int:
        try:
            nc = await connect_nats(self.nats_url, f"skiplock-worker {self.id}")
        except Exception as exc:
            log.error("worker %s: cannot reach NATS at %s: %s", self.id, self.nats_url, str(exc) or type(exc).__name__)
            return 1
        self._js = nc.jetstream()
        log.info("worker %s started (nats): queues=%s concurrency=%d lease=%gs", self.id, ",".join(self.queues),
                 self.concurrency, self.lease)
        consumers = [asyncio.create_task(self._consume(queue)) for queue in self.queues]
        registry = asyncio.create_task(self._registry()) if self.dsn else None
        stopped = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([stopped, *consumers], return_when=asyncio.FIRST_COMPLETED)
        failed = [t for t in done if t is not stopped and t.exception() is not None]
        self._stop.set()
        for task in consumers:
            task.cancel()
        deadline = time.monotonic() + self.shutdown_grace
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task in list(self._running):  # out of grace: the broker redelivers them after the ack wait
            task.cancel()
        await asyncio.gather(*consumers, *self._running, return_exceptions=True)
        if registry is not None:  # the last heartbeat: the final counters, and the row marked stopped
            conn = None
            with contextlib.suppress(Exception):
                conn = await asyncio.wait_for(registry, 10.0)
            with contextlib.suppress(Exception):
                conn = await asyncio.wait_for(self._registry_write(conn, stopping=True), 10.0)
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        with contextlib.suppress(Exception):
            # close, not drain: every message this worker settles is settled by now, and a
            # drain waits on the pull subscriptions' pending requests for its whole timeout
            await nc.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped: %d completed, %d failed, %d retried", self.id, self.completed, self.failed,
                 self.retried)
        if failed:
            log.error("worker %s: %s", self.id, failed[0].exception())
            return 1
        return 0


def run_nats_worker(worker: NatsWorker) -> int:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        return await worker.run()

    return asyncio.run(main())
