"""Handlers for tests/test_upgrade.py, run by the workers of two releases at once: the previous
one, installed in a virtualenv of its own (`--tasks upgrade_tasks` with only this folder on the
path, so its `console` is the old release's), and this checkout's.

They use only what both releases have (`console.task`, a job's id, attempt and payload). Each
successful run writes one row to public.executions at its END, with the release that ran it
(UPGRADE_RELEASE): a run killed midway wrote nothing, so "one row per job" is "completed
exactly once".
"""

from __future__ import annotations

import os
import time

import psycopg

import console

RELEASE = os.environ.get("UPGRADE_RELEASE", "unknown")


def _record(job) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.executions (job_id, attempt, worker_pid, release) VALUES (%s, %s, %s, %s)",
            (job.id, job.attempt, os.getpid(), RELEASE),
        )


def _hold_until_released(job) -> None:
    """Run until the test inserts a row in public.released: a job held across the migration
    however long a loaded machine takes to get there (a fixed sleep ended before it, at load 9-11)."""
    deadline = time.monotonic() + 180
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while not conn.execute("SELECT EXISTS (SELECT 1 FROM public.released)").fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job.id} was never released")
            time.sleep(0.2)


@console.task("work")
def work(job):
    """Sleeps `sleep` seconds (`first_sleep` on the first attempt: a job whose worker is killed
    while it runs, and which is quick once rescued), or with `hold` runs until released, then
    records its run."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("hold"):
        _hold_until_released(job)
    time.sleep(float(payload.get("first_sleep" if job.attempt == 1 and "first_sleep" in payload else "sleep", 0)))
    _record(job)


@console.task("flaky_once")
def flaky_once(job):
    """Fails its first attempt (a retry waits across the upgrade), then records its run."""
    if job.attempt == 1:
        raise RuntimeError(f"transient failure of job {job.id}")
    _record(job)


@console.task("broken_until_fixed")
def broken_until_fixed(job):
    """Fails until public.fixed has a row (a dead letter before the upgrade, replayed after it)."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        fixed = conn.execute("SELECT EXISTS (SELECT 1 FROM public.fixed)").fetchone()[0]
    if not fixed:
        raise RuntimeError("the partner API is down")
    _record(job)
