"""Handlers the worker tests run in real worker processes (`--tasks tests.sample_tasks`)."""

from __future__ import annotations

import os
import time

import psycopg

import console


@console.task("noop")
def noop(job):
    return None


@console.task("record")
def record(job):
    """Write one row per execution to a side table, so tests can count how often a job ran."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.executions (job_id, attempt, worker_pid) VALUES (%s, %s, %s)",
            (job.id, job.attempt, os.getpid()),
        )
    delay = float(job.payload.get("sleep", 0)) if isinstance(job.payload, dict) else 0
    if delay:
        time.sleep(delay)


@console.task("flaky")
def flaky(job):
    """Fails its first `fail_times` attempts, then succeeds."""
    record(job)
    if job.attempt <= int(job.payload.get("fail_times", 1)):
        raise RuntimeError(f"transient failure on attempt {job.attempt} of job {job.id}")


@console.task("doomed")
def doomed(job):
    raise console.DoNotRetry(f"order {job.payload.get('order', 0)} cannot be shipped")


@console.task("slow")
def slow(job):
    record(job)
    time.sleep(float(job.payload.get("sleep", 5)))


@console.task("slow_first")
def slow_first(job):
    """Sleeps `first_sleep` seconds on its first attempt only (a worker killed mid-job), then is quick."""
    record(job)
    if job.attempt == 1:
        time.sleep(float(job.payload.get("first_sleep", 30)))


@console.task("cancellable")
def cancellable(job):
    """Works until an operator requests a cancel (then raises console.Cancelled, or a RuntimeError
    with `crash_on_cancel`), or completes after `timeout` seconds without one."""
    record(job)
    deadline = time.monotonic() + float(job.payload.get("timeout", 30))
    while time.monotonic() < deadline:
        if job.cancel_event.wait(0.05) and job.cancel_requested():
            if job.payload.get("crash_on_cancel"):
                raise RuntimeError("cleanup failed while stopping")
            raise console.Cancelled(f"job {job.id} stopped at the operator's request")


@console.task("span")
def span(job):
    """Writes when it started and when it ended (public.spans), so tests can see overlaps."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.spans (job_id, attempt, queue, worker_pid, started) VALUES (%s, %s, %s, %s, clock_timestamp())",
            (job.id, job.attempt, job.queue, os.getpid()),
        )
        time.sleep(float(job.payload.get("sleep", 0.1)) if isinstance(job.payload, dict) else 0.1)
        conn.execute("UPDATE public.spans SET ended = clock_timestamp() WHERE job_id = %s AND attempt = %s", (job.id, job.attempt))


@console.task("scarce", concurrency=1)
def scarce(job):
    """A kind with a fleet-wide concurrency of 1, declared in code."""
    span(job)
