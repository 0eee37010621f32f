"""`async def` handlers the worker tests run in real worker processes, beside the sync ones of
tests/sample_tasks.py (`--tasks tests.sample_tasks,tests.sample_async_tasks`: one module of each
kind in one process is the mixed case).

Each run notes what happened to it in public.async_runs (tests/async_runs.py): which job and attempt,
which process and thread, and the event ("start", "end", "cancelled"), so a test checks real
side effects, not the worker's own account.
"""

from __future__ import annotations

import asyncio
import os
import threading

import psycopg

import skiplock

NOTE = "INSERT INTO public.async_runs (job_id, attempt, worker_pid, thread, event) VALUES (%s, %s, %s, %s, %s)"


async def note(job: skiplock.Job, event: str) -> None:
    thread = threading.current_thread().name
    async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        await conn.execute(NOTE, (job.id, job.attempt, os.getpid(), thread, event))


def note_sync(job: skiplock.Job, event: str) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(NOTE, (job.id, job.attempt, os.getpid(), threading.current_thread().name, event))


def _seconds(job: skiplock.Job, key: str, default: float) -> float:
    return float(job.payload.get(key, default)) if isinstance(job.payload, dict) else default


@skiplock.task("a_record")
async def a_record(job: skiplock.Job) -> None:
    """Notes its start, awaits `sleep` seconds (`first_sleep` on attempt 1, if given), notes its end."""
    await note(job, "start")
    await asyncio.sleep(_seconds(job, "first_sleep" if job.attempt == 1 and "first_sleep" in job.payload else "sleep", 0))
    await note(job, "end")


@skiplock.task("a_flaky")
async def a_flaky(job: skiplock.Job) -> None:
    """Fails its first `fail_times` attempts, then succeeds."""
    await note(job, "start")
    if job.attempt <= int(job.payload.get("fail_times", 1)):
        raise RuntimeError(f"transient failure on attempt {job.attempt} of job {job.id}")


@skiplock.task("a_doomed")
async def a_doomed(job: skiplock.Job) -> None:
    await note(job, "start")
    raise skiplock.DoNotRetry(f"order {job.payload.get('order', 0)} cannot be shipped")


@skiplock.task("a_cancellable")
async def a_cancellable(job: skiplock.Job) -> None:
    """Awaits `sleep` seconds (60); notes a CancelledError it receives, and lets it through."""
    await note(job, "start")
    try:
        await asyncio.sleep(_seconds(job, "sleep", 60))
    except asyncio.CancelledError:
        await note(job, "cancelled")
        raise
    await note(job, "end")


@skiplock.task("a_timeout", timeout=0.5)
async def a_timeout(job: skiplock.Job) -> None:
    """Declares a 0.5 s timeout and awaits 30 s."""
    await note(job, "start")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await note(job, "cancelled")
        raise


@skiplock.task("s_timeout", timeout=0.5)
def s_timeout(job: skiplock.Job) -> None:
    """A sync handler with a 0.5 s timeout that stops when asked (it waits on its cancel event)."""
    note_sync(job, "start")
    if job.cancel_event.wait(30):
        note_sync(job, "cancelled")
        raise skiplock.Cancelled("stopped at its deadline")


@skiplock.task("s_note")
def s_note(job: skiplock.Job) -> None:
    """A sync handler beside the async ones: notes its thread, sleeps `sleep` seconds."""
    note_sync(job, "start")
    threading.Event().wait(_seconds(job, "sleep", 0))
    note_sync(job, "end")


@skiplock.task("a_scarce", concurrency=2)
async def a_scarce(job: skiplock.Job) -> None:
    """A kind with a fleet-wide concurrency of 2, declared in code."""
    await note(job, "start")
    await asyncio.sleep(_seconds(job, "sleep", 0.3))
    await note(job, "end")


_together = 0
_all_here: asyncio.Event | None = None


@skiplock.task("a_together")
async def a_together(job: skiplock.Job) -> None:
    """A barrier: completes once `n` jobs of this kind are running at once in this process, and
    fails if that has not happened within `within` seconds. So n jobs complete only when one
    process awaits n of them at the same time."""
    global _together, _all_here
    if _all_here is None:
        _all_here = asyncio.Event()
    _together += 1
    if _together >= int(job.payload["n"]):
        _all_here.set()
    try:
        await asyncio.wait_for(_all_here.wait(), timeout=_seconds(job, "within", 30))
    except TimeoutError:
        raise RuntimeError(f"only {_together} of {job.payload['n']} jobs were running at once") from None
    finally:
        _together -= 1
