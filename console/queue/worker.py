"""The worker runtime: claim in batches, run handlers outside any transaction, finish fenced.

One process runs:
- the main loop (this module's `Worker.run`), the only user of the main connection: it
  completes what finished (`complete_many`) and, right after, claims the next batch
  (`complete_and_claim` with nothing to complete: apart, a completion never waits inside a
  claim), records failures, and writes the worker's counters every `flush_interval` seconds;
- `concurrency` handler threads that run the user's functions and report back. The main loop
  hands them groups, not single jobs: the jobs of a batch whose kinds ran fast so far (under
  FAST_JOB on average here) go to one thread together, one hand-off each way for the group; when
  one job of a group has run SPLIT_AFTER, the main loop hands the group's remaining jobs to the
  pool one by one, so a kind that turns slow holds the others up by milliseconds, not by its own
  runtime. Other jobs go one per thread.
  Handlers registered `inline=True` run on the main loop's thread itself (no hand-off at all);
- while a batch of fast jobs runs, the main loop already claims the next one (prefetch: at most
  one claim beyond `concurrency`, and only while every job of the last batch was fast, so a
  prefetched job waits milliseconds, not a good part of its lease; the heartbeat extends the
  leases of everything the worker holds, waiting or running). Limited queues and kinds never
  prefetch: they are claimed only into free handler slots;
- adaptive claims: while the jobs claimed are all fast and each claim comes back full, the next
  claim takes twice as many, from `batch_size` up to `claim_max` (fewer statements: the
  server's fixed cost per statement is most of its work per no-op job); a short claim or a job
  not fast takes it back to `batch_size`;
- when the tasks module registers `async def` handlers, an event loop thread
  (console.queue.aio) that awaits their jobs, up to `async_concurrency` at once, beside the
  handler threads: the main loop hands it each claimed job of an async kind and it reports the
  outcomes back like a handler thread, so leases, heartbeats, fenced completion, retries,
  limits, counters and shutdown are the same code for both;
- batch handlers (`@task(kind, batch=N)`): the jobs of a batch kind a claim brings are cut
  into lists of at most N, each one call of the handler on one handler thread (or one task on
  the event loop), and a batch takes one slot however many jobs it holds (the batches of a
  sync kind whose calls ran fast go to one thread together, as a group of fast jobs does, and
  give the rest back to the pool the same way). When a claim brings
  a batch kind's jobs, one more claim of that kind alone fills their batches (and up to N for
  each slot left); the outcome of each job (console.queue.aio.batch_errors) goes through the
  same fenced completion, failure, retry and counters as a single job's;
- the `logging` records each run emits, kept for its attempt (console.queue.joblogs): each
  handler thread and each awaited job has its own capture; the main loop writes a failed
  attempt's records with its failure, and completes the jobs that logged with their records
  by one more statement (`complete_logged`) just before the round's complete-and-claim, so the
  jobs that log nothing complete exactly as before;
- a listener thread (LISTEN skiplock_jobs/skiplock_control/skiplock_limits) that only wakes the
  main loop: NOTIFY is a doorbell, the main loop also polls every `poll_interval`;
- a heartbeat thread that extends the leases of long-running jobs and, in the same statement,
  learns which of them an operator asked to stop (`job.cancel_requested()`);
- a vacuum thread: every `vacuum_interval` seconds, if this worker claimed jobs since its last
  look, it runs `VACUUM skiplock.jobs` unless another worker (or autovacuum) already is.

Why the worker vacuums: each claim leaves a dead entry at the head of the claim index, and
every later claim scans past all of them until a vacuum removes them; autovacuum looks at a
table at most once per `autovacuum_naptime` (a server-wide setting, 1 minute by default), long
enough for a busy queue to slow down severalfold (docs/benchmarks.md, "Sustained": the run without the worker's VACUUM).
One advisory lock keeps it to one vacuum at a time across the fleet, SKIP_LOCKED steps aside
from a running autovacuum, and VACUUM takes no row locks, so claims never wait on it.

Lost connections are retried with backoff; work finished meanwhile is completed after the
reconnect (fenced, so a job rescued in the meantime is left alone). SIGTERM stops claiming,
lets in-flight jobs finish for `shutdown_grace` seconds, releases what is left (attempt not
counted) and exits 0. After SIGKILL, the reaper rescues the jobs when their leases expire.

Queues and kinds with limits (console.queue.limits) are claimed through the limited path, each under
its own fleet-wide lock, before the fast claim fills the remaining slots; the worker re-reads
which ones are limited every LIMITS_REFRESH seconds and when skiplock_limits rings. With no
limits anywhere the loop is the same as without the feature (one more query per refresh); with
limits whose units all rest (nothing to give at their last try), too: only a round that tries a
limited unit completes its finished jobs apart from the fast claim.

It does not reap, archive or collect: the scheduler does.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence

import psycopg
from psycopg.types.json import Jsonb  # also handy for handlers: console.queue.worker.Jsonb

from console.db import (
    DatabaseError,
    MigrationError,
    SchemaMissing,
    connect,
    package_version,
    require_schema,
)
from console.histogram import Histogram
from console.queue import joblogs, limits, tasks, telemetry
from console.queue import protocol as q
from console.queue.aio import AsyncRuntime, Outcome, batch_errors, timed_out
from console.queue.resume_point import ResumePoint
from console.sqlfiles import query

log = logging.getLogger("skiplock.worker")

# Longest a finished job waits for its completion to go out with the next batch claim (just before it).
BATCH_WAIT = 0.05
# A kind whose runs took less than this on average (RUNTIME_WEIGHT for the newest run) is fast:
# its jobs are handed to a handler thread as one group, and the worker prefetches its batches.
FAST_JOB = 0.001
RUNTIME_WEIGHT = 0.2
# When one job of a group has run this long, the group's remaining jobs go back to the pool.
SPLIT_AFTER = 0.005
# A group of fast jobs holds as many as should run in about this long by their kinds' measured
# runtimes, at least batch_size and at most half the claim: a claim of 100 near-instant jobs goes
# to two threads, where ten threads woken for ten jobs each cost more than the jobs (at 16
# processes 9-17 % more jobs/s and half the claim p99: docs/benchmarks.md, "Fewer, larger groups").
GROUP_BUDGET = 0.002


def fast_group_size(count: int, batch_size: int, slowest: float) -> int:
    """How many of a claim's `count` fast jobs one handler thread gets in one hand-off: what runs
    in GROUP_BUDGET at the slowest of their kinds' measured runtimes (`slowest`, seconds), at
    least batch_size, at most half the claim (rounded up)."""
    by_budget = int(GROUP_BUDGET / slowest) if slowest > 0 else count
    return max(batch_size, min(by_budget, -(-count // 2)))


class Group:
    """Jobs one handler thread runs in turn. Its thread and the main loop both take jobs from
    the left of `jobs` (deque.popleft is atomic), so a job runs once whoever takes it.
    In a `batch` group the items are batches (lists of jobs), each one call of its kind's batch
    handler: taken whole, never split."""

    __slots__ = ("jobs", "current_since", "batch")

    def __init__(self, jobs: list[q.Job] | list[list[q.Job]], batch: bool = False) -> None:
        self.jobs: deque = deque(jobs)
        self.current_since: float | None = None  # when the job running now started
        self.batch = batch
# How _dispatch sends a job: run here, in a group of fast jobs, alone to a handler thread, or to
# the event loop.
_INLINE, _FAST, _SLOW, _ASYNC, _BATCH = 0, 1, 2, 3, 4
# How often the worker re-reads which queues and kinds have limits (a NOTIFY also triggers it;
# meanwhile the fast claim already leaves a newly limited queue alone, in the database).
LIMITS_REFRESH = 2.0


class Counters:
    """Cumulative since the process started; written whole to the registry row."""

    def __init__(self) -> None:
        self.claimed = self.completed = self.failed = self.retried = self.lost = 0
        # {queue: [completed, failed, retried]}: the collectors' per-queue throughput, so a
        # queue that finishes fast jobs is busy even when no sample catches one running.
        self.by_queue: dict[str, list[int]] = {}
        self.claim_calls = 0
        self.claim_seconds_sum = 0.0
        self.pickup_count = 0
        self.pickup_seconds_sum = 0.0
        self.claim_histogram = Histogram()
        self.pickup_histogram = Histogram()
        self.runtime_histogram = Histogram()

    def completions(self, done: list[q.Job], completed: list[int]) -> None:
        """Count the jobs of `done` that were completed (`completed`: their ids); the rest lost
        their claim (the reaper rescued them) and count as lost."""
        self.completed += len(completed)
        self.lost += len(done) - len(completed)
        if not completed:
            return
        if len(completed) == len(done):
            kept = done
        else:
            ids = set(completed)
            kept = [j for j in done if j.id in ids]
        by_queue = self.by_queue
        for job in kept:
            counts = by_queue.get(job.queue)
            if counts is None:
                by_queue[job.queue] = [1, 0, 0]
            else:
                counts[0] += 1

    def outcome(self, queue: str, status: str | None) -> None:
        """Count one failed attempt by what became of the job: 'failed' (dead letter),
        'pending' (retried), None (its claim was lost)."""
        if status is None:
            self.lost += 1
            return
        counts = self.by_queue.setdefault(queue, [0, 0, 0])
        if status == "failed":
            self.failed += 1
            counts[1] += 1
        else:
            self.retried += 1
            counts[2] += 1

    def as_params(self) -> dict:
        return {
            "queue_counts": Jsonb(self.by_queue),
            "claimed": self.claimed,
            "completed": self.completed,
            "failed": self.failed,
            "retried": self.retried,
            "lost": self.lost,
            "claim_calls": self.claim_calls,
            "claim_seconds_sum": self.claim_seconds_sum,
            "claim_histogram": self.claim_histogram.snapshot(),
            "pickup_count": self.pickup_count,
            "pickup_seconds_sum": self.pickup_seconds_sum,
            "pickup_histogram": self.pickup_histogram.snapshot(),
            "runtime_histogram": self.runtime_histogram.snapshot(),
        }


class Worker:
    def __init__(
        self,
        dsn: str,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 4,
        async_concurrency: int = 100,
        batch_size: int = 10,
        claim_max: int = 100,
        lease: float = q.DEFAULT_LEASE,
        poll_interval: float = 1.0,
        shutdown_grace: float = 30.0,
        flush_interval: float = 5.0,
        backoff_base: float = q.DEFAULT_BACKOFF_BASE,
        backoff_cap: float = q.DEFAULT_BACKOFF_CAP,
        history: int = q.DEFAULT_HISTORY,
        vacuum_interval: float = 10.0,
        complete_into_archive: bool = False,
        claim_resume_ms: float = 15.0,
        name: str | None = None,
        secret_keys: Iterable[str] = q.DEFAULT_KEYS,
        log_records: int = joblogs.DEFAULT_RECORDS,
        log_message_chars: int = joblogs.DEFAULT_MESSAGE_CHARS,
        log_attempt_chars: int = joblogs.DEFAULT_ATTEMPT_CHARS,
        release: str | None = None,
    ):
        if concurrency < 1 or async_concurrency < 1 or batch_size < 1 or lease <= 0 or poll_interval <= 0:
            raise ValueError("concurrency, async_concurrency, batch_size, lease and poll_interval must be positive")
        self.dsn = dsn
        self.queues = [x for x in (queues or []) if x] or None
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        # Jobs this worker holds at most: its handler threads, and its event loop's slots when
        # the tasks module has async handlers (decided in run(), once the module is imported).
        self.slots = concurrency
        self._async: AsyncRuntime | None = None
        self._otel: telemetry.Telemetry | None = None  # set by run() when OpenTelemetry is on
        # Sync and async handlers in one process ("mixed"): each claim asks for the kinds of the
        # runtime it fills, so a batch of sync jobs never waits for threads while the loop idles
        # (nor the reverse). _async_kinds is what the async claim asks for and the sync one skips.
        self._mixed = False
        self._async_kinds: list[str] = []
        self._async_held = 0  # jobs of async kinds held now (running on the loop)
        # Batch handlers (@task(kind, batch=N)): a batch of n jobs takes one slot, so the slots
        # in use are the jobs held less `_batch_extra` (the n - 1 of every batch running);
        # `_async_extra` is the same for the loop's batches. `_batch_extra_of`: first job's
        # (id, attempt) -> (n - 1, async?) of each batch running, settled when its outcomes come
        # back (the attempt too: a job rescued from a running batch may start another here).
        self._batch_kinds: list[str] = []
        self._batch_extra = 0
        self._async_extra = 0
        self._batch_extra_of: dict[tuple[int, int], tuple[int, bool]] = {}
        # Batch kinds whose last top-up came back short: not topped up again before (monotonic)
        self._top_up_rest: dict[str, float] = {}
        # Whether the plain claim starts at the head of the claim index or after the last one
        # (console/queue/resume_point.py: claims that walk dead entries under a horizon holder).
        self._resume = ResumePoint(slow_s=claim_resume_ms / 1000 if claim_resume_ms > 0 else float("inf"))
        self.batch_size = batch_size
        # Adaptive claims: while every job claimed is fast and each claim comes back full, the
        # next claim takes twice as many, up to claim_max; anything else takes it back to
        # batch_size. Fewer, larger statements are what cut the server's work per job (each
        # complete-and-claim costs the same fixed overhead however many jobs it carries:
        # docs/benchmarks.md, "Adaptive claims"). claim_max at or under batch_size: no growth.
        self.claim_max = max(claim_max, batch_size)
        self._claim_size = batch_size
        self.lease = lease
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.flush_interval = flush_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.history = history
        self.vacuum_interval = vacuum_interval
        self.complete_into_archive = complete_into_archive
        # Keys whose values an error's fingerprint hides (console.fingerprint): the fingerprint
        # is shown to viewers and sent in webhooks.
        self.secret_keys = frozenset(k.lower() for k in secret_keys)
        # The log records each attempt keeps (console.queue.joblogs), redacted with the same
        # keys; None (log_records 0): nothing is captured and no handler is added.
        limits_ = joblogs.LogLimits(log_records, log_message_chars, log_attempt_chars, self.secret_keys)
        if log_records < 0 or log_message_chars < 1 or log_attempt_chars < 1:
            raise ValueError("log_records must be 0 or more, log_message_chars and log_attempt_chars positive")
        self.log_limits: joblogs.LogLimits | None = limits_ if limits_.enabled else None
        self.vacuums = 0
        # What this process runs, written to its registry row (migration 024): Skiplock's version
        # ('unknown' for an uninstalled checkout) and the application's release ([worker] release,
        # set by the deploy; None when not). The timeline shows a change of either as a deploy.
        self.version = package_version() or "unknown"
        self.release = (release or "").strip() or None
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.counters = Counters()

        self._work: queue_module.Queue[Group | None] = queue_module.Queue()
        self._groups: list[Group] = []  # groups of more than one job that may still have jobs to give
        self._results: queue_module.Queue[list[Outcome]] = queue_module.Queue()
        self._runtime: dict[str, float] = {}  # kind -> moving average of its runs here (seconds)
        self._ahead = False  # every job of the last batch was fast: prefetch the next one
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._stop_now = threading.Event()
        self._stop_requested_at: float | None = None
        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[q.Job, float]] = {}  # id -> (job, monotonic start)
        self._conn: psycopg.Connection | None = None
        self._cur: psycopg.Cursor | None = None  # the main connection's claim cursor, reused per claim
        self._limits = limits.LimitedClaimer(self.id, self.queues, lease, rest=poll_interval)
        self._limits_stale = threading.Event()
        self._limits_read_at = float("-inf")
        # Finished jobs whose handler logged: completed with their records by their own
        # statement (q.complete_logged), so the others' complete-and-claim stays as it was.
        self._logged: list[Outcome] = []

    # --- control -------------------------------------------------------------------------

    def stop(self, *, immediately: bool = False) -> None:
        """Ask the worker to stop: gracefully, or at once (release in-flight jobs now)."""
        if self._stopping.is_set() or immediately:
            self._stop_now.set()
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        def on_signal(signum, _frame):
            log.info("received %s: %s", signal.Signals(signum).name,
                     "stopping now" if self._stopping.is_set() else f"finishing in-flight jobs (up to {self.shutdown_grace:g}s)")
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    # --- threads -------------------------------------------------------------------------

    def _run_one(self, job: q.Job, started: float | None = None) -> Outcome:
        """Run one job here (a handler thread, or the main loop for inline handlers), its log
        records captured for its attempt when capture is on."""
        limits_ = self.log_limits
        if limits_ is None:
            return Worker._run_plain(job, started)
        slot = joblogs.slot_for(limits_)  # this thread's, reused job after job
        slot.active = True
        try:
            outcome = Worker._run_plain(job, started)
        finally:
            capture = slot.take()
        if capture is not None:  # it logged
            outcome.logs = capture.entry(job.attempts, job.locked_by, "completed" if outcome.error is None else "failed")
        return outcome

    @staticmethod
    def _run_plain(job: q.Job, started: float | None = None) -> Outcome:
        if started is None:
            started = time.monotonic()
        error: BaseException | None = None
        timeout = tasks.timeout_for(job.kind)
        otel = telemetry.current()  # None unless the application called instrument()
        if otel is not None:
            return Worker._run_traced(otel, job, started, timeout)
        if timeout is not None:
            return Worker._run_bounded(job, started, timeout)
        try:
            tasks.handler_for(job.kind)(job)
        except BaseException as exc:  # a handler's failure is the job's, never the worker's
            error = exc
        return Outcome(job, error, time.monotonic() - started)

    @staticmethod
    def _run_traced(otel: telemetry.Telemetry, job: q.Job, started: float, timeout: float | None) -> Outcome:
        """A run inside its `process` span (current meanwhile, so the handler's spans nest under it)."""
        token = otel.run_started(job)
        outcome: Outcome | None = None
        try:
            if timeout is not None:
                outcome = Worker._run_bounded(job, started, timeout)
            else:
                error: BaseException | None = None
                try:
                    tasks.handler_for(job.kind)(job)
                except BaseException as exc:
                    error = exc
                outcome = Outcome(job, error, time.monotonic() - started)
            return outcome
        finally:
            otel.run_ended(token, None if outcome is None else outcome.error)

    @staticmethod
    def _run_bounded(job: q.Job, started: float, timeout: float) -> Outcome:
        """A sync handler with a timeout: a thread cannot be stopped from outside, so at the
        deadline the job's cancel event is set (`job.cancel_requested()` turns true) and what
        the handler raises from then on is recorded as JobTimeout; returning completes it.
        A timer thread per run: only kinds that declare a timeout pay for it."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            job.cancel_event.set()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        error: BaseException | None = None
        try:
            tasks.handler_for(job.kind)(job)
        except BaseException as exc:
            error = timed_out(job, timeout, exc) if expired.is_set() else exc
        finally:
            timer.cancel()
        return Outcome(job, error, time.monotonic() - started)

    def _run_batch(self, jobs: list[q.Job]) -> list[Outcome]:
        """One call of a sync batch handler with `jobs` (a handler thread); one outcome per job.
        Its log records, when it logged, are kept with every job of the batch."""
        limits_ = self.log_limits
        if limits_ is None:
            return Worker._run_batch_plain(jobs)
        slot = joblogs.slot_for(limits_)
        slot.active = True
        try:
            outcomes = Worker._run_batch_plain(jobs)
        finally:
            capture = slot.take()
        if capture is not None:
            for outcome in outcomes:
                outcome.logs = capture.entry(outcome.job.attempts, outcome.job.locked_by,
                                             "completed" if outcome.error is None else "failed")
        return outcomes

    @staticmethod
    def _run_batch_plain(jobs: list[q.Job]) -> list[Outcome]:
        """`handler(jobs)`, bounded by the kind's timeout as _run_bounded bounds one job (at the
        deadline every job's cancel event is set); what it returned or raised becomes each
        job's outcome (console.queue.aio.batch_errors). Each job's runtime is the whole call's.
        With OpenTelemetry each job gets its own `process` span, current during the call."""
        started = time.monotonic()
        kind = jobs[0].kind
        timeout = tasks.timeout_for(kind)
        otel = telemetry.current()
        tokens = [otel.run_started(job) for job in jobs] if otel is not None else []
        expired: threading.Event | None = None  # only a kind with a timeout pays for the event and timer
        timer: threading.Timer | None = None
        if timeout is not None:
            fired = expired = threading.Event()

            def expire() -> None:
                fired.set()
                for job in jobs:
                    job.cancel_event.set()

            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()
        error: BaseException | None = None
        try:
            tasks.handler_for(kind)(list(jobs))  # a copy: the handler may do what it likes with its list
        except BaseException as exc:  # a handler's failure is its jobs', never the worker's
            error = exc
        finally:
            if timer is not None:
                timer.cancel()
        errors = batch_errors(jobs, error, timeout if expired is not None and expired.is_set() else None)
        if otel is not None:
            for token, job_error in reversed(list(zip(tokens, errors, strict=True))):
                otel.run_ended(token, job_error)
        seconds = time.monotonic() - started
        return [Outcome(job, job_error, seconds) for job, job_error in zip(jobs, errors, strict=True)]

    def _handler_loop(self) -> None:
        run_one, monotonic = self._run_one, time.monotonic
        while True:
            group = self._work.get()
            if group is None:
                return
            outcomes: list[Outcome] = []
            jobs = group.jobs
            if group.batch:  # batches in turn, each taken whole (the main loop may take the later ones)
                while True:
                    try:
                        batch = jobs.popleft()
                    except IndexError:
                        break
                    group.current_since = monotonic()
                    outcomes += self._run_batch(batch)
                self._results.put(outcomes)  # one report per group
                self._wake.set()
                continue
            while True:
                try:
                    job = jobs.popleft()
                except IndexError:
                    break
                # the same clock reading starts the job's runtime and the group's split timer
                group.current_since = started = monotonic()
                outcomes.append(run_one(job, started))
            self._results.put(outcomes)  # one report per group
            self._wake.set()

    def _listen_loop(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                with connect(self.dsn, application_name="skiplock-worker-listen") as conn:
                    conn.execute("LISTEN skiplock_jobs")
                    conn.execute("LISTEN skiplock_control")
                    conn.execute(f"LISTEN {limits.LIMITS_CHANNEL}")
                    self._limits_stale.set()
                    delay = 0.5
                    self._wake.set()  # a (re)connect may have missed notifications: look now
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.channel == limits.LIMITS_CHANNEL:
                                self._limits_stale.set()
                                self._wake.set()
                            elif note.channel == "skiplock_jobs" and note.payload in self._limits.units.queues:
                                self._limits.poke_new_jobs(note.payload)
                                self._wake.set()
                            elif note.channel == "skiplock_control" or self.queues is None or note.payload in self.queues:
                                self._wake.set()
            except (psycopg.Error, DatabaseError) as exc:
                log.warning("listener lost its connection (%s); retrying in %.1fs", exc.__class__.__name__, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 10.0)

    def _heartbeat_loop(self) -> None:
        interval = max(self.lease / 3.0, 0.2)
        conn: psycopg.Connection | None = None
        while not self._stopping.wait(interval) or self._in_flight:
            if self._stop_now.is_set():
                break
            now = time.monotonic()
            with self._lock:
                due = [job for job, started in self._in_flight.values() if now - started >= interval]
            if not due:
                continue
            try:
                if conn is None or conn.closed:
                    conn = connect(self.dsn, application_name="skiplock-worker-heartbeat")
                q.heartbeat(conn, due, lease=self.lease)
                if self._async is not None:  # a request raises CancelledError in an async handler
                    self._async.cancel_requested(due)
            except (psycopg.Error, DatabaseError) as exc:
                log.warning("heartbeat failed (%s); will retry", exc.__class__.__name__)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _vacuum_loop(self) -> None:
        conn: psycopg.Connection | None = None
        claimed_at_last_look = 0
        while not self._stopping.wait(self.vacuum_interval):
            claimed = self.counters.claimed
            if claimed == claimed_at_last_look:
                continue  # nothing claimed here since the last look: nothing of ours to clean
            claimed_at_last_look = claimed
            try:
                if conn is None or conn.closed:
                    conn = connect(self.dsn, application_name="skiplock-worker-vacuum")
                if not conn.execute(query("queue", "try_vacuum_lock")).fetchone()[0]:
                    continue  # another worker is vacuuming right now
                try:
                    started = time.monotonic()
                    conn.execute(query("queue", "vacuum_jobs"))
                    self.vacuums += 1
                    log.debug("vacuumed skiplock.jobs in %.2fs", time.monotonic() - started)
                finally:
                    conn.execute(query("queue", "vacuum_unlock"))
            except (psycopg.Error, DatabaseError) as exc:
                log.warning("vacuum of skiplock.jobs failed (%s); will retry", exc.__class__.__name__)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _declare_kinds(self) -> bool:
        """Write this worker's kind limits, waiting out a database that goes away during
        start-up as the main loop waits out one that goes away later (a worker that exited here
        relied on its supervisor to start it again). False when stopped meanwhile. A database
        that cannot be reached at all, or has no schema, still stops start-up with its message."""
        self._connection()
        delay = 0.5
        while True:
            try:
                limits.declare_kinds(self._connection(), tasks.concurrency_limits(), worker=self.id)
                return True
            except (SchemaMissing, MigrationError):  # a reconnect cannot mend these
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError, DatabaseError) as exc:
                self._lost_connection(exc, delay, "during start-up")
                if self._stop_now.wait(delay) or self._stopping.is_set():
                    return False
                delay = min(delay * 2, 5.0)

    def _lost_connection(self, exc: BaseException, delay: float, when: str = "") -> None:
        """Say so (the error's first line) and drop the connection; the next use reconnects."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("database connection lost%s (%s); reconnecting in %.1fs", f" {when}" if when else "", first, delay)
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    # --- main loop -----------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, application_name="skiplock-worker")
            require_schema(self._conn)  # before the registry row: a clear message, not UndefinedTable
            self._conn.execute(
                query("queue", "register_worker"),
                {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "queues": self.queues,
                 "concurrency": self.slots, "kinds": sorted(tasks.registered()),
                 "version": self.version, "release": self.release},
            )
            self._cur = q.claim_cursor(self._conn)
        return self._conn

    def _flush(self, *, stopping: bool = False) -> None:
        params = self.counters.as_params()
        params.update(id=self.id, in_flight=len(self._in_flight), stopping=stopping)
        self._connection().execute(query("queue", "flush_worker"), params)

    def _refresh_limits(self, conn: psycopg.Connection) -> None:
        stale = self._limits_stale.is_set()
        if stale or time.monotonic() - self._limits_read_at >= LIMITS_REFRESH:
            self._limits_stale.clear()
            self._limits.refresh(conn)
            if stale:  # a limit changed: try every unit at once
                self._limits.poke_all()
            self._limits_read_at = time.monotonic()

    def _complete_logged(self, conn: psycopg.Connection) -> None:
        """Complete the finished jobs that logged, with their records, in one statement."""
        logged = self._logged
        if not logged:
            return
        jobs = [outcome.job for outcome in logged]
        completed = q.complete_logged(conn, jobs, [outcome.logs or {} for outcome in logged], history=self.history,
                                        into_archive=self.complete_into_archive)
        self._logged = []
        self._completions(jobs, completed)

    def _record_failures(self, conn: psycopg.Connection, failures: list[Outcome]) -> None:
        while failures:
            outcome = failures[0]
            error = outcome.error
            status = q.fail(
                conn, outcome.job, error,
                # A job an operator asked to stop is not retried, whatever the handler raised;
                # one that timed out is (a sync handler's timeout also sets its cancel event).
                retry=not (isinstance(error, q.DoNotRetry)
                           or (outcome.job.cancel_requested() and not isinstance(error, q.JobTimeout))),
                backoff_base=self.backoff_base, backoff_cap=self.backoff_cap, history=self.history,
                error_class="UnknownTask" if isinstance(error, tasks.UnknownTask) else None,
                secret_keys=self.secret_keys,
                logs=outcome.logs,
            )
            failures.pop(0)
            self.counters.outcome(outcome.job.queue, status)
            if self._otel is not None:
                self._otel.outcome(outcome.job, "lost" if status is None else "retried" if status == "pending" else status)
            log.info("job %s (%s) attempt %s failed: %s -> %s", outcome.job.id, outcome.job.kind,
                     outcome.job.attempts, type(error).__name__, status or "claim lost")

    def _dispatch(self, jobs: list[q.Job], claim_seconds: float) -> None:
        """Count the claim, hand the jobs to the pool (fast ones as one group) and run the
        inline ones here, after the pool has its share.

        Per batch, not per job, where it can be (one in-flight update, one histogram call,
        each kind classified once): on a no-op drain this bookkeeping was a fifth of the main
        loop's CPU (docs/benchmarks.md, "Worker CPU per job")."""
        counters = self.counters
        counters.claim_calls += 1
        counters.claim_seconds_sum += claim_seconds
        counters.claim_histogram.observe(claim_seconds)
        if not jobs:
            return
        if self._otel is not None:  # before any handler starts: its span links to the claim's
            self._otel.claimed(jobs, claim_seconds, self.id)
        now = time.monotonic()
        held = {job.id: (job, now) for job in jobs}
        with self._lock:
            self._in_flight.update(held)
        counters.claimed += len(jobs)
        counters.pickup_count += len(jobs)
        pickups = [(job.locked_at - job.run_at).total_seconds() for job in jobs]
        pickups = [p if p > 0.0 else 0.0 for p in pickups]
        counters.pickup_seconds_sum += sum(pickups)
        counters.pickup_histogram.observe_many(pickups)
        fast: list[q.Job] = []
        inline: list[q.Job] = []
        awaited: list[q.Job] = []
        batched: dict[str, list[q.Job]] = {}
        slow = False
        modes: dict[str, int] = {}  # kind -> _INLINE / _FAST / _SLOW / _ASYNC / _BATCH, decided once per batch
        batch_kinds = self._batch_kinds
        runtime = self._runtime
        slowest_fast = 0.0  # the longest measured runtime among this claim's fast kinds
        for job in jobs:
            kind = job.kind
            mode = modes.get(kind)
            if mode is None:
                mode = modes[kind] = _BATCH if batch_kinds and kind in batch_kinds else \
                    _INLINE if tasks.is_inline(kind) else _ASYNC if tasks.is_async(kind) else \
                    _FAST if runtime.get(kind, FAST_JOB) < FAST_JOB else _SLOW
                if mode is _FAST:
                    slowest_fast = max(slowest_fast, runtime[kind])
            if mode is _FAST:
                fast.append(job)
            elif mode is _INLINE:
                inline.append(job)
            elif mode is _ASYNC:
                awaited.append(job)
            elif mode is _BATCH:
                batched.setdefault(kind, []).append(job)
            else:
                slow = True
                self._work.put(Group([job]))
        if batched:
            slow = True  # claimed into free slots only, never ahead
            self._dispatch_batches(batched)
        if awaited:
            self._async_held += len(awaited)
            slow = True  # no prefetch: an awaited job may wait on I/O for a good part of its lease
            assert self._async is not None  # an async kind is registered, so run() started it
            self._async.submit(awaited)
        # Fast jobs go to threads a group at a time, one hand-off each way per group. At most half
        # the claim a group: one group for all of it left the next claim waiting on one thread.
        per_group = fast_group_size(len(fast), self.batch_size, slowest_fast)
        for start in range(0, len(fast), per_group):
            group = Group(fast[start:start + per_group])
            if len(group.jobs) > 1:
                self._groups.append(group)
            self._work.put(group)
        self._ahead = not slow
        if inline:
            self._results.put([self._run_one(job) for job in inline])

    def _dispatch_batches(self, batched: dict[str, list[q.Job]]) -> None:
        """Cut each batch kind's jobs into batches of at most its size, in claim order, and hand
        each batch to a handler thread (or the event loop) as one unit. The batches of a sync
        kind whose calls ran fast so far (under FAST_JOB on average) go to one thread together,
        one hand-off each way, as fast single jobs do (a hand-off per call cost a batch of one
        twice the single job's CPU: docs/benchmarks.md, "Batch handlers"); the main loop hands
        the rest of them to the pool one by one when a call runs SPLIT_AFTER. Each batch still
        counts as one slot."""
        for kind, kind_jobs in batched.items():
            size = tasks.batch_of(kind) or 1
            is_async = tasks.is_async(kind)
            together: list[list[q.Job]] | None = None
            if not is_async and len(kind_jobs) > size and self._runtime.get(kind, FAST_JOB) < FAST_JOB:
                together = []
            for start in range(0, len(kind_jobs), size):
                chunk = kind_jobs[start:start + size]
                extra = len(chunk) - 1
                self._batch_extra += extra
                self._batch_extra_of[chunk[0].id, chunk[0].attempts] = (extra, is_async)
                if is_async:
                    assert self._async is not None
                    self._async_held += len(chunk)
                    self._async_extra += extra
                    self._async.submit_batch(chunk)
                elif together is not None:
                    together.append(chunk)
                else:
                    self._work.put(Group([chunk], batch=True))
            if together:
                group = Group(together, batch=True)
                self._groups.append(group)
                self._work.put(group)

    def _split_long_groups(self) -> float | None:
        """Hand the rest of every group whose current job has run SPLIT_AFTER to the pool, one
        job per hand-off. Returns how soon to look again (None: no group left to watch); a
        group no thread has started yet is looked at every BATCH_WAIT, a started one sooner."""
        if not self._groups:
            return None
        now = time.monotonic()
        keep: list[Group] = []
        for group in self._groups:
            if not group.jobs:
                continue  # all taken: nothing left to give
            if group.current_since is not None and now - group.current_since >= SPLIT_AFTER:
                while True:
                    try:
                        item = group.jobs.popleft()  # a job, or a whole batch of a batch group
                    except IndexError:
                        break
                    self._work.put(Group([item], batch=group.batch))
                continue
            keep.append(group)
        self._groups = keep
        if not keep:
            return None
        started = [g.current_since for g in keep if g.current_since is not None]
        return max(min(started) + SPLIT_AFTER - now, 0.001) if started else BATCH_WAIT

    def _take_results(self, done: list[q.Job], failures: list[Outcome]) -> float | None:
        """Drain the handlers' reports into `done` and `failures`; returns the time the first
        finished job joined an empty `done` (None if none did)."""
        since: float | None = None
        while True:
            try:
                outcomes = self._results.get_nowait()
            except queue_module.Empty:
                return since
            with self._lock:
                for outcome in outcomes:
                    self._in_flight.pop(outcome.job.id, None)
            if self._async is not None:
                self._async_held -= sum(1 for outcome in outcomes if tasks.is_async(outcome.job.kind))
            if self._batch_extra_of:  # a batch's outcomes come back together: its slot is free
                for outcome in outcomes:
                    settled = self._batch_extra_of.pop((outcome.job.id, outcome.job.attempts), None)
                    if settled is not None:
                        self._batch_extra -= settled[0]
                        if settled[1]:
                            self._async_extra -= settled[0]
            runtime = self._runtime
            self.counters.runtime_histogram.observe_many([outcome.seconds for outcome in outcomes])
            for outcome in outcomes:
                kind = outcome.job.kind
                previous = runtime.get(kind)
                runtime[kind] = outcome.seconds if previous is None else \
                    previous + RUNTIME_WEIGHT * (outcome.seconds - previous)
                if self._limits.units:  # a slot of its queue (kind) is free now: try it
                    self._limits.poke(queue=outcome.job.queue, kind=kind)
                if outcome.error is not None:
                    failures.append(outcome)
                    continue
                if not done and not self._logged and since is None:
                    since = time.monotonic()
                if outcome.logs is None:
                    done.append(outcome.job)
                else:  # completed with its records, when `done` is (its own statement)
                    self._logged.append(outcome)

    def _free_async(self) -> int:
        return self.async_concurrency - (self._async_held - self._async_extra)

    def _next_claim_size(self, asked: int, got: int) -> int:
        """Double the claim after a full claim of fast jobs at the current size (up to
        claim_max); back to batch_size after a short claim or any job not fast (slow, async or
        batch kinds: those are claimed into free slots only). A mixed worker keeps
        batch_size: its claims are cut per runtime."""
        if self._mixed or not self._ahead or got < asked:
            return self.batch_size
        if asked >= self._claim_size:
            return min(self._claim_size * 2, self.claim_max)
        return self._claim_size

    def _busy(self) -> int:
        """Slots in use: the jobs held, a batch counting as one."""
        return len(self._in_flight) - self._batch_extra

    def _claim_mixed(self, conn: psycopg.Connection, limit: int, free: int) -> list[q.Job]:
        """The fast claim of a worker with both runtimes: async kinds into the loop's free
        slots, the other kinds into the threads' (and a batch ahead for fast sync jobs), each
        one statement."""
        free_async = self._free_async()
        free_sync = free - free_async + (self.batch_size if self._ahead else 0)
        claimed: list[q.Job] = []
        for room, kinds, skip in ((free_async, self._async_kinds, None), (free_sync, None, self._async_kinds)):
            n = min(limit - len(claimed), room)
            if n <= 0:
                continue
            _, more = q.complete_and_claim(conn, self.id, [], queues=self.queues, limit=n, lease=self.lease,
                                           cursor=self._cur, kinds=kinds, skip_kinds=skip)
            claimed += more
        return claimed

    def _top_up_batches(self, conn: psycopg.Connection, claimed: list[q.Job], free: int) -> tuple[list[q.Job], bool]:
        """Fill the batches of the batch kinds that `claimed` (this round's claims, in priority
        order) brought: one more claim per such kind (`kinds=[kind]`), for the rest of its
        batches begun and up to its batch size for each slot its runtime has left (a batch takes
        one slot). So the round's first claim stays the plain one, in the queue's order, and
        costs a worker nothing more while no batch kind's job is at the head of the queue.

        A kind's top-up that came back short (its eligible jobs ran out, as far as this claim
        could see) is not asked again for `poll_interval` while the worker has work in flight:
        a claim filtered on a kind walks the claim index past the other kinds' pending jobs,
        and a rare kind among a large backlog would cost that walk every round.
        Returns (jobs claimed, whether some top-up got all it asked for)."""
        counts: dict[str, int] = {}  # batch kind -> its jobs in `claimed`, in order of appearance
        plain_async = plain_sync = 0
        batch_kinds = self._batch_kinds
        for job in claimed:
            kind = job.kind
            if kind in batch_kinds:
                counts[kind] = counts.get(kind, 0) + 1
            elif self._async is not None and tasks.is_async(kind):
                plain_async += 1
            else:
                plain_sync += 1
        if not counts:
            return [], False
        if self._async is None:
            free_async, free_sync = 0, free
        elif self._mixed:
            free_async = self._free_async()
            free_sync = free - free_async
        else:  # async handlers only: the threads serve only unknown kinds
            free_async, free_sync = min(free, self._free_async()), 0
        sizes = {kind: tasks.batch_of(kind) or 1 for kind in counts}
        asynchronous = {kind: self._async is not None and tasks.is_async(kind) for kind in counts}
        left = {True: free_async - plain_async, False: free_sync - plain_sync}
        for kind, n in counts.items():
            left[asynchronous[kind]] -= -(-n // sizes[kind])  # the batches these jobs begin
        now = time.monotonic()
        idle = not self._in_flight
        more: list[q.Job] = []
        full = False
        for kind, n in counts.items():
            if not idle and self._top_up_rest.get(kind, 0.0) > now:
                continue
            size, runtime = sizes[kind], asynchronous[kind]
            begun = -(-n // size)
            want = (begun + max(left[runtime], 0)) * size - n
            if want <= 0:
                continue
            _, got = q.complete_and_claim(conn, self.id, [], queues=self.queues, limit=want, lease=self.lease,
                                          cursor=self._cur, kinds=[kind])
            left[runtime] -= -(-(n + len(got)) // size) - begun
            if len(got) == want:
                full = True
            else:
                self._top_up_rest[kind] = now + self.poll_interval
            more += got
        return more, full

    def _completions(self, done: list[q.Job], completed: list[int]) -> None:
        """Count what `complete_many`/`complete_and_claim` did with `done`, and end their spans."""
        self.counters.completions(done, completed)
        if self._otel is not None:
            kept = set(completed)
            for job in done:
                self._otel.outcome(job, "completed" if job.id in kept else "lost")

    def _report(self, outcomes: list[Outcome]) -> None:
        """The event loop's way back: the same results queue as the handler threads'."""
        self._results.put(outcomes)
        self._wake.set()

    def run(self) -> int:
        """Run until stopped; returns the process exit code (0 after a graceful stop)."""
        self._otel = telemetry.current()  # the tasks modules, imported by now, may have turned it on
        if self._otel is not None:
            self._otel.watch(self.counters, lambda: len(self._in_flight))
        if tasks.any_async():
            self._async_kinds = sorted(kind for kind in tasks.registered() if tasks.is_async(kind))
            # With async handlers only, the threads serve just the kinds nobody registered
            # (they fail at once, UnknownTask): the loop's slots are the worker's.
            self._mixed = len(self._async_kinds) < len(tasks.registered())
            self.slots = self.async_concurrency + (self.concurrency if self._mixed else 0)
            self._async = AsyncRuntime(self._report, hooks=None if self._otel is None else
                                       (self._otel.run_started, self._otel.run_ended), log_limits=self.log_limits)
        self._batch_kinds = tasks.batch_kinds()
        if not self._declare_kinds():
            return 0  # stopped while the database was away
        if self._async is not None:
            self._async.start()
        threads = [threading.Thread(target=self._handler_loop, name=f"handler-{i}", daemon=True) for i in range(self.concurrency)]
        threads += [
            threading.Thread(target=self._listen_loop, name="listener", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
        ]
        if self.vacuum_interval > 0:
            threads.append(threading.Thread(target=self._vacuum_loop, name="vacuum", daemon=True))
        if self.log_limits is not None:
            joblogs.install()
        for thread in threads:
            thread.start()
        log.info("worker %s started: queues=%s concurrency=%d%s lease=%gs", self.id, ",".join(self.queues or ["*"]), self.concurrency,
                 f" async_concurrency={self.async_concurrency}" if self._async else "", self.lease)

        done: list[q.Job] = []
        done_since = 0.0  # when the oldest finished-but-not-yet-completed job finished
        failures: list[Outcome] = []
        last_flush = time.monotonic()
        reconnect_delay = 0.5
        # Claim in real batches: wait for `target` free slots before claiming again, unless the
        # worker is idle or a finished job has waited BATCH_WAIT for its completion. Refilling
        # each slot as it frees would cost one round trip per job (and fragment every batch).
        target = min(self.batch_size, self.slots)
        while True:
            self._wake.clear()
            self._split_long_groups()
            since = self._take_results(done, failures)
            if since is not None:
                done_since = since

            stopping = self._stopping.is_set()
            try:
                conn = self._connection()
                self._record_failures(conn, failures)
                free = self.slots - self._busy()  # handler threads and loop slots (a batch takes one)
                room = free + (self._claim_size if self._ahead else 0)  # and one claim ahead
                finished = bool(done or self._logged)  # jobs that ran and wait for their completion
                overdue = finished and time.monotonic() - done_since >= BATCH_WAIT
                if stopping or room <= 0:
                    limit = 0
                elif room >= (self._claim_size if self._ahead else target) or not self._in_flight or overdue:
                    limit = min(self._claim_size, room)
                else:
                    limit = 0
                claimed: list[q.Job] = []
                more_waiting = False  # a claim got all it asked for: claim again at once
                if limit > 0:
                    self._refresh_limits(conn)
                    # the jobs that logged complete with their records just before the others:
                    # one more statement in such a round, never per job
                    self._complete_logged(conn)
                    started = time.monotonic()
                    # Finished jobs complete in a statement of their own, just before the claims,
                    # not inside one: a claim that still saw one of our running jobs as pending
                    # locks it to recheck it and keeps that lock to its end, and a completion
                    # inside our claim waited for it and held the claim up too. Apart, 11-16 %
                    # more jobs/s at 1, 2, 4 and 16 processes (docs/benchmarks.md, "Completing
                    # apart"). First, too, frees our slots for the limited units.
                    if done:
                        self._completions(done, q.complete_many(conn, done, into_archive=self.complete_into_archive))
                        done = []
                    # A worker with both runtimes gives limited units only what both have room
                    # for: their claims take any kind.
                    open_slots = min(free - self._free_async(), self._free_async()) if self._mixed else free
                    if self._limits.units and open_slots > 0 and self._limits.due(started):
                        # Limited first, each under its lock; limited units fill free slots
                        # only, never ahead.
                        claimed = self._limits.claim(conn, min(limit, open_slots), now=started)
                    if len(claimed) < limit:
                        if self._mixed:
                            more = self._claim_mixed(conn, limit - len(claimed), free)
                        else:
                            asked = limit - len(claimed)
                            at = time.monotonic()
                            after = self._resume.point(at)
                            _, more = q.complete_and_claim(conn, self.id, [], queues=self.queues,
                                                           limit=asked, lease=self.lease,
                                                           cursor=self._cur, after=after)
                            now = time.monotonic()
                            changed = self._resume.observe(after, more, asked, now - at, now)
                            if changed == "resuming":
                                log.warning("worker %s: a claim from the head of the queue took %.0f ms (dead entries a "
                                            "horizon holder keeps?): claiming after the last claim, from the head every "
                                            "%.1f s (docs/queue.md, \"Horizon holders\")", self.id, (now - at) * 1000,
                                            self._resume.head_at - now)
                            elif changed:
                                log.info("worker %s: claiming from the head of the queue again", self.id)
                        claimed += more
                    more_waiting = len(claimed) == limit
                    if self._batch_kinds and claimed:  # batch kinds' jobs came: fill their batches
                        more, topped_full = self._top_up_batches(conn, claimed, free)
                        claimed += more
                        more_waiting = more_waiting or topped_full
                    self._dispatch(claimed, time.monotonic() - started)
                    self._claim_size = self._next_claim_size(limit, len(claimed))
                elif finished and (stopping or overdue):
                    self._complete_logged(conn)
                    if done:
                        self._completions(done, q.complete_many(conn, done, into_archive=self.complete_into_archive))
                        done = []
                if time.monotonic() - last_flush >= self.flush_interval:
                    self._flush()
                    last_flush = time.monotonic()
                reconnect_delay = 0.5
            except (psycopg.OperationalError, psycopg.InterfaceError, DatabaseError) as exc:
                self._lost_connection(exc, reconnect_delay)
                if self._stop_now.wait(reconnect_delay):
                    break
                reconnect_delay = min(reconnect_delay * 2, 5.0)
                continue

            if stopping:
                out_of_time = self._stop_now.is_set() or (
                    time.monotonic() - (self._stop_requested_at or 0) >= self.shutdown_grace
                )
                if not self._in_flight and self._results.empty():
                    break
                if out_of_time:
                    break
                self._wake.wait(0.1)
                continue
            if claimed and more_waiting:
                continue  # more may be waiting: claim again at once
            if not self._results.empty():
                continue
            timeout = self.poll_interval
            look_again = self._split_long_groups()
            if look_again is not None:  # a group is running: look when it may need splitting
                timeout = min(timeout, look_again)
            if done or self._logged:  # finished jobs wait for their completion: not longer than BATCH_WAIT
                timeout = max(0.0, min(timeout, done_since + BATCH_WAIT - time.monotonic()))
            last_flush = self._idle(time.monotonic() + timeout, last_flush)

        try:
            return self._shutdown()
        finally:
            if self.log_limits is not None:
                joblogs.uninstall()

    def _idle(self, poll_at: float, last_flush: float) -> float:
        """Wait for the doorbell until `poll_at`, still writing the registry row every
        `flush_interval`: with a poll interval longer than the flush interval an idle worker
        would otherwise look dead to the console (live = seen within 3 flush intervals).
        A flush is not a poll: it claims nothing. Returns the time of the last flush."""
        while True:
            now = time.monotonic()
            flush_at = last_flush + self.flush_interval
            if self._wake.wait(max(0.0, min(poll_at, flush_at) - now)) or flush_at >= poll_at:
                return last_flush
            try:
                self._flush()
            except (psycopg.OperationalError, psycopg.InterfaceError, DatabaseError):
                return last_flush  # the main loop reconnects
            last_flush = time.monotonic()

    def _shutdown(self) -> int:
        # Jobs no thread has started are released below: take them out of the pool first, so
        # a thread does not start one after its release (fencing would refuse its completion,
        # but it would have run for nothing).
        for group in self._groups:
            group.jobs.clear()
        while True:
            try:
                self._work.get_nowait()
            except queue_module.Empty:
                break
        for _ in range(self.concurrency):
            self._work.put(None)
        finished: list[q.Job] = []
        failures: list[Outcome] = []
        while not self._results.empty():
            for outcome in self._results.get_nowait():
                with self._lock:
                    self._in_flight.pop(outcome.job.id, None)
                if outcome.error is not None:
                    failures.append(outcome)
                elif outcome.logs is not None:
                    self._logged.append(outcome)
                else:
                    finished.append(outcome.job)
        with self._lock:
            left = [job for job, _ in self._in_flight.values()]
        try:
            conn = self._connection()
            self._completions(finished, q.complete_many(conn, finished, into_archive=self.complete_into_archive))
            self._complete_logged(conn)
            self._record_failures(conn, failures)
            if left:
                released = q.release(conn, left)
                log.info("released %d unfinished job(s) back to pending", len(released))
                if self._otel is not None:  # a run still going ends its span here, as released
                    for job in left:
                        self._otel.outcome(job, "released")
            with self._lock:
                self._in_flight.clear()  # released (or rescued): this worker holds nothing now
            self._flush(stopping=True)
        except (psycopg.Error, DatabaseError) as exc:
            log.warning("could not release jobs at shutdown (%s); the reaper will rescue them", type(exc).__name__)
        finally:
            if self._conn is not None:
                self._conn.close()
        if self._async is not None:  # released above: let what still runs unwind, unreported
            self._async.stop()
        log.info("worker %s stopped: %d completed, %d failed, %d retried", self.id,
                 self.counters.completed, self.counters.failed, self.counters.retried)
        return 0
