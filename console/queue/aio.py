"""The worker's asyncio runtime: `async def` handlers awaited on one event loop thread.

`console.queue.worker.Worker` starts it when the tasks module registers an async handler.
The worker's main loop stays the one that claims, completes and fails (the same statements,
fencing, counters and limits as for threaded handlers): it hands each claimed job of an async
kind to `submit`, and this runtime reports each run back as an `Outcome` on the same results
queue the handler threads use. So this module knows nothing of SQL, leases or retries; it
only runs coroutines and says how they ended.

What a run can end with, besides returning or raising:
- a cancel request (the heartbeat learnt an operator asked this run to stop): the task is
  cancelled, so the handler sees `asyncio.CancelledError` at the await it is in; if it lets it
  through, the attempt is recorded as `Cancelled` (a dead letter, not retried), and if it
  swallows it and returns, the job completes (a request is a request), as for a sync handler;
- its task's timeout: `asyncio.timeout` cancels it at the deadline and the attempt is recorded
  as `JobTimeout` (retried with backoff);
- the worker's shutdown: after the grace period the main loop releases what is left (attempt
  given back) and `stop` cancels the tasks so their `finally` blocks run; what they report
  then is ignored (fencing would refuse it anyway).

Why one loop thread, not one loop per handler thread or a loop in the main thread: the main
loop blocks on psycopg's sync connection between rounds, and a single loop is what lets
hundreds of I/O-bound handlers wait at once at the cost of one thread. A handler that blocks
(a sync driver, `time.sleep`, heavy CPU) stops every other async job in the process: give such
work to `asyncio.to_thread`, or write it as a sync handler, which runs on the thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from console.queue import joblogs, tasks
from console.queue import protocol as q

log = logging.getLogger("skiplock.worker")


@dataclass(slots=True)
class Outcome:
    """How one run ended: `error` None for a normal return; `seconds` its runtime; `logs` the
    attempt's log records (console.queue.joblogs), None when it logged nothing or capture is off."""

    job: q.Job
    error: BaseException | None
    seconds: float
    logs: dict[str, Any] | None = None


# What a run reports to the worker: a list of outcomes at a time (one put per loop pass).
Report = Callable[[list[Outcome]], None]
# Hooks the worker may set around each run (console.queue.telemetry): start returns a token
# that is given back to end with the outcome's error.
RunHooks = tuple[Callable[[q.Job], Any], Callable[[Any, BaseException | None], None]]


class AsyncRuntime:
    """One event loop in its own thread, running the async jobs the worker submits."""

    def __init__(self, report: Report, *, hooks: RunHooks | None = None, log_limits: joblogs.LogLimits | None = None) -> None:
        self._report = report
        self._hooks = hooks
        # Each task runs in its own copy of the context: the capture it sets is its own.
        self._log_limits = log_limits if log_limits is not None and log_limits.enabled else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="asyncio", daemon=True)
        # (job id, attempt) -> its task (loop thread only): a run the reaper rescued and this
        # worker claimed again is another task, until the first one ends
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._finished: list[Outcome] = []  # reported once per loop pass, not per job
        self._report_scheduled = False
        self._stopping = False

    # --- from the worker's threads --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, jobs: Sequence[q.Job]) -> None:
        """Start a task per job (one hand-off to the loop for the whole list)."""
        self._loop.call_soon_threadsafe(self._start_all, list(jobs))

    def submit_batch(self, jobs: Sequence[q.Job]) -> None:
        """Start one task that awaits the kind's batch handler with all of `jobs`."""
        self._loop.call_soon_threadsafe(self._start_batch, list(jobs))

    def cancel_requested(self, jobs: Sequence[q.Job]) -> None:
        """Cancel the tasks of those `jobs` an operator asked to stop (the heartbeat learnt it).
        A batch's task is never cancelled for one of its jobs: the others would go with it (the
        handler sees the request in that job's `cancel_requested()`)."""
        wanted = [job for job in jobs if tasks.is_async(job.kind) and job.cancel_requested()
                  and not job.extra.get("cancel_delivered") and tasks.batch_of(job.kind) is None]
        for job in wanted:
            job.extra["cancel_delivered"] = True
        if wanted:
            self._loop.call_soon_threadsafe(self._cancel, [(job.id, job.attempts) for job in wanted])

    def stop(self, *, wait: float = 1.0) -> None:
        """Cancel what still runs, give it `wait` seconds to unwind, and stop the loop."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._cancel_all(wait), self._loop)
        try:
            future.result(timeout=wait + 1.0)
        except Exception as exc:  # a handler that will not unwind: the thread is a daemon
            log.warning("async handlers still running at exit (%s)", type(exc).__name__)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=1.0)

    # --- on the loop thread ---------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _start_all(self, jobs: list[q.Job]) -> None:
        loop = self._loop
        for job in jobs:
            self._tasks[job.id, job.attempts] = loop.create_task(self._run(job), name=f"skiplock-job-{job.id}")

    def _start_batch(self, jobs: list[q.Job]) -> None:
        # Filed under its first job's run: shutdown cancels it with the others, and a cancel
        # request never reaches it (cancel_requested leaves batch kinds alone).
        first = jobs[0]
        self._tasks[first.id, first.attempts] = self._loop.create_task(self._run_batch(jobs), name=f"skiplock-batch-{first.id}")

    def _cancel(self, runs: list[tuple[int, int]]) -> None:
        for run in runs:
            task = self._tasks.get(run)
            if task is not None:
                task.cancel("cancel requested by an operator")

    async def _cancel_all(self, wait: float) -> None:
        self._stopping = True
        running = list(self._tasks.values())
        for task in running:
            task.cancel("the worker is stopping")
        if running:
            await asyncio.wait(running, timeout=wait)

    async def _run(self, job: q.Job) -> None:
        started = time.monotonic()
        slot = None if self._log_limits is None else joblogs.Slot(self._log_limits, active=True)
        if slot is not None:
            joblogs.current.set(slot)  # this task's context only: no reset needed
        token = self._hooks[0](job) if self._hooks else None
        error: BaseException | None = None
        timeout = tasks.timeout_for(job.kind)
        deadline: asyncio.Timeout | None = None
        try:
            handler = tasks.handler_for(job.kind)
            coroutine: Coroutine[Any, Any, Any] = handler(job)
            if timeout is None:
                await coroutine
            else:
                async with asyncio.timeout(timeout) as deadline:
                    await coroutine
        except asyncio.CancelledError as exc:
            # The loop cancels a task for two reasons only: an operator's request, or shutdown.
            if job.cancel_requested():
                error = q.Cancelled(f"job {job.id} cancelled at the operator's request")
                error.__cause__ = exc
            else:
                error = exc
        except BaseException as exc:  # a handler's failure is the job's, never the worker's
            # asyncio.timeout turns its own cancellation into TimeoutError; a TimeoutError the
            # handler raised itself (an HTTP client's) stays what it is.
            error = timed_out(job, timeout, exc) if deadline is not None and deadline.expired() and timeout else exc
        finally:
            self._tasks.pop((job.id, job.attempts), None)
        if self._hooks:
            self._hooks[1](token, error)
        if self._stopping:
            return  # released by the worker already: nothing to report
        capture = None if slot is None else slot.take()  # nothing logged after the run is the job's
        logs = None if capture is None else capture.entry(job.attempts, job.locked_by, "completed" if error is None else "failed")
        self._finished.append(Outcome(job, error, time.monotonic() - started, logs))
        if not self._report_scheduled:
            self._report_scheduled = True
            self._loop.call_soon(self._flush_reports)

    async def _run_batch(self, jobs: list[q.Job]) -> None:
        """`_run` for a batch: one awaited call, one outcome per job (batch_errors)."""
        started = time.monotonic()
        slot = None if self._log_limits is None else joblogs.Slot(self._log_limits, active=True)
        if slot is not None:
            joblogs.current.set(slot)
        tokens = [self._hooks[0](job) for job in jobs] if self._hooks else []
        error: BaseException | None = None
        kind, first = jobs[0].kind, jobs[0]
        timeout = tasks.timeout_for(kind)
        deadline: asyncio.Timeout | None = None
        try:
            handler = tasks.handler_for(kind)
            coroutine: Coroutine[Any, Any, Any] = handler(list(jobs))
            if timeout is None:
                await coroutine
            else:
                async with asyncio.timeout(timeout) as deadline:
                    await coroutine
        except BaseException as exc:  # CancelledError here is the worker's shutdown: unreported
            error = exc
        finally:
            self._tasks.pop((first.id, first.attempts), None)
        expired = deadline is not None and deadline.expired() and timeout is not None
        errors = batch_errors(jobs, error, timeout if expired else None)
        if self._hooks:
            for token, job_error in reversed(list(zip(tokens, errors, strict=True))):
                self._hooks[1](token, job_error)
        if self._stopping:
            return
        capture = None if slot is None else slot.take()
        seconds = time.monotonic() - started
        for job, job_error in zip(jobs, errors, strict=True):
            logs = None if capture is None else capture.entry(job.attempts, job.locked_by,
                                                              "completed" if job_error is None else "failed")
            self._finished.append(Outcome(job, job_error, seconds, logs))
        if not self._report_scheduled:
            self._report_scheduled = True
            self._loop.call_soon(self._flush_reports)

    def _flush_reports(self) -> None:
        self._report_scheduled = False
        finished, self._finished = self._finished, []
        if finished:
            self._report(finished)


def timed_out(job: q.Job, timeout: float, cause: BaseException | None) -> q.JobTimeout:
    """The JobTimeout a run that outlived `timeout` is recorded as (both runtimes)."""
    error = q.JobTimeout(f"job {job.id} ({job.kind}) ran longer than its {timeout:g} s timeout")
    error.__cause__ = cause
    return error


def batch_errors(jobs: Sequence[q.Job], error: BaseException | None, timeout: float | None = None) -> list[BaseException | None]:
    """What a batch handler's call means for each job of `jobs` (both runtimes), in order:
    None (complete it) or the exception to fail it with.

    - returned (`error` None): every job completes;
    - `BatchFailure({job.id: exc})`: the named jobs fail with their exception, the others
      complete; a name that is not a job of this batch fails every job with a ValueError
      (the BatchFailure its cause), as a handler bug must not complete jobs silently;
    - anything else: every job fails with it (`DoNotRetry` makes them all dead letters).
    `timeout`: the call outlived the kind's timeout (seconds), and each failure is recorded as
    `JobTimeout` (retried), its cause the handler's exception; returning still completes."""
    if error is None:
        return [None] * len(jobs)
    if isinstance(error, q.BatchFailure):
        ids = {job.id for job in jobs}
        strangers = sorted(set(error.errors) - ids)
        if strangers:
            wrong = ValueError(f"BatchFailure names job(s) {', '.join(map(str, strangers[:10]))} that are not in this "
                               f"batch of {len(jobs)} (ids {min(ids)}..{max(ids)}); every job of the batch fails")
            wrong.__cause__ = error
            errors: list[BaseException | None] = [wrong] * len(jobs)
        else:
            errors = [error.errors.get(job.id) for job in jobs]
    else:
        errors = [error] * len(jobs)
    if timeout is not None:
        errors = [None if e is None else timed_out(job, timeout, e) for job, e in zip(jobs, errors, strict=True)]
    return errors
