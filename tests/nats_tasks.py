"""Handlers for tests/test_nats_*.py, run by `skiplock worker --backend nats` processes.

Each run writes one row to public.nats_runs (created by the test) with what it did: a run
killed midway writes nothing after its "started" row, so "one 'done' row per job" is "ran to
completion exactly once".
"""

from __future__ import annotations

import os
import time

import psycopg

import console


def _record(job, what: str) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO public.nats_runs (job_id, attempt, what, pid) VALUES (%s, %s, %s, %s)",
                     (job.id, job.attempt, what, os.getpid()))


@console.task("record")
def record(job):
    _record(job, "done")


@console.task("async_record")
async def async_record(job):
    _record(job, "done")


@console.task("always_fails")
def always_fails(job):
    _record(job, "failed")
    raise RuntimeError(f"attempt {job.attempt} of job {job.id} fails on purpose")


@console.task("no_retry")
def no_retry(job):
    _record(job, "failed")
    raise console.DoNotRetry("bad payload, never retry")


@console.task("slow_first")
def slow_first(job):
    """The first attempt says it started, then sleeps (its worker is killed meanwhile); later
    attempts finish at once."""
    if job.attempt == 1:
        _record(job, "started")
        time.sleep(float(job.payload.get("sleep", 60)))
    _record(job, "done")


@console.task("long_heartbeat")
def long_heartbeat(job):
    """Runs for several ack waits: only the worker's in-progress acks keep it from redelivery."""
    _record(job, "started")
    time.sleep(float(job.payload.get("sleep", 5)))
    _record(job, "done")
