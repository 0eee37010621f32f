"""The soak's job handlers (`skiplock worker --tasks bench.soak_tasks`).

Each handler records what it did in `soak.effects`, a table the queue never touches, through its
own autocommit connection: that is the independent witness `bench/soak.py` counts side effects
with (a job whose `ok` effect appears twice ran to the end twice). The outcome depends on the
kind, so the soak can predict every final state:

- `soak.ok`: succeeds.
- `soak.flaky`: fails its first attempt, then succeeds (exercises retries and backoff).
- `soak.dead`: raises DoNotRetry, so it is a dead letter at once.

Handlers sleep a few milliseconds to stand for I/O; no CPU is burnt.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

import console

_local = threading.local()


def _effects_conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, application_name="soak-effects",
                               connect_timeout=5)
        _local.conn = conn
    return conn


def _record(job, ok: bool) -> None:
    """Write the side effect; a database outage here fails the attempt like any I/O error."""
    try:
        _effects_conn().execute(
            "INSERT INTO soak.effects (job_id, attempt, ok) VALUES (%s, %s, %s)", (job.id, job.attempt, ok)
        )
    except psycopg.Error:
        _local.conn = None
        raise


def _work(job) -> None:
    time.sleep(float(job.payload.get("ms", 5)) / 1000.0)


@console.task("soak.ok")
def ok(job):
    _work(job)
    _record(job, True)


@console.task("soak.flaky")
def flaky(job):
    _work(job)
    if job.attempt == 1:
        _record(job, False)
        raise RuntimeError("soak: first attempts of soak.flaky fail on purpose")
    _record(job, True)


@console.task("soak.dead")
def dead(job):
    _work(job)
    _record(job, False)
    raise console.DoNotRetry("soak: soak.dead jobs are dead letters on purpose")
