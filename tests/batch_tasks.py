"""Handlers for the batch handlers' process test (`--tasks tests.batch_tasks`): sync only, so
the worker is not a mixed one, with a batch kind and a plain kind side by side."""

from __future__ import annotations

import os

import psycopg

import skiplock

BATCH = 7


def _record(jobs: list[skiplock.Job], kind: str) -> None:
    """One row per call (its jobs and size) and one per job run (public.executions)."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn, conn.transaction():
        conn.execute("INSERT INTO public.batch_calls (kind, size, ids) VALUES (%s, %s, %s)",
                     (kind, len(jobs), [job.id for job in jobs]))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO public.executions (job_id, attempt, worker_pid) VALUES (%s, %s, %s)",
                            [(job.id, job.attempts, os.getpid()) for job in jobs])


@skiplock.task("batch_rows", batch=BATCH)
def batch_rows(jobs: list[skiplock.Job]) -> None:
    _record(jobs, "batch_rows")


@skiplock.task("plain_rows")
def plain_rows(job: skiplock.Job) -> None:
    _record([job], "plain_rows")
