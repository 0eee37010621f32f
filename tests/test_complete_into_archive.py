"""worker.complete_into_archive (issue 28 target 5): completed jobs leave the hot table in the
statement that completes them, into skiplock.jobs_archive, with real `skiplock worker`
processes against a real PostgreSQL. What must hold: every job completed is archived exactly
once and is nowhere else, the fence still refuses a late completion (tests/test_contract_fencing.py),
retries and dead letters are unchanged (a dead letter stays in the hot table to be replayed),
the attempt's log records go with the job, the console finds the job, and a kill -9 mid-drain
loses and duplicates nothing."""

from __future__ import annotations

import signal

import pytest

from console import queue as q
from tests.workers import EXECUTIONS_TABLE, wait_for

pytestmark = pytest.mark.slow

INTO_ARCHIVE = {"SKIPLOCK_WORKER_COMPLETE_INTO_ARCHIVE": "true"}


def archived_count(conn, ids: list[int]) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs_archive WHERE id = ANY(%s)", (ids,)).fetchone()[0]


def test_completed_jobs_move_to_the_archive_with_their_records_and_the_rest_is_unchanged(conn, workers, client_as):
    silent = q.enqueue_many(conn, [q.NewJob("silent", {"i": i}) for i in range(200)])
    flaky = q.enqueue(conn, "log_then_succeed", {"order": 7, "fail_first": 1}, max_attempts=3)
    doomed = q.enqueue(conn, "log_then_fail", {"order": 8}, max_attempts=1)
    proc = workers.start("--concurrency", "2", tasks="tests.logging_tasks", env=INTO_ARCHIVE)
    try:
        wait_for(lambda: archived_count(conn, [*silent, flaky]) == 201
                 and q.get_job(conn, doomed)["status"] == "failed", timeout=60, what="the jobs to finish")
    finally:
        code, err = workers.stop(proc)
    assert code == 0, err

    # Nothing completed is left in the hot table; each completed job is archived once.
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] == 0
    assert conn.execute("SELECT count(*), count(DISTINCT id), min(status), max(status), count(lease_until)"
                        " FROM skiplock.jobs_archive").fetchone() == (201, 201, "completed", "completed", 0)
    # A retry went through the hot table (attempt 1 failed, attempt 2 completed into the archive)
    # with both attempts' records.
    attempts, logs = conn.execute("SELECT attempts, attempt_logs FROM skiplock.jobs_archive WHERE id = %s",
                                  (flaky,)).fetchone()
    assert attempts == 2
    assert [(e["attempt"], e["outcome"]) for e in logs] == [(1, "failed"), (2, "completed")]
    # The dead letter stays in the hot table, where replay and purge find it.
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (doomed,)).fetchone() == ("failed",)

    # The console finds an archived completed job: its page, the API, the queue's history.
    viewer = client_as("viewer")
    page = viewer.get(f"/jobs/{flaky}")
    assert page.status_code == 200
    assert "order 7 shipped" in page.get_data(as_text=True)
    found = viewer.get(f"/api/v1/jobs/{silent[0]}").get_json()
    assert found["job"]["status"] == "completed", found
    # The worker counted what it completed, as it does without the setting.
    assert conn.execute("SELECT sum(completed) FROM skiplock.workers").fetchone()[0] == 201


def test_a_kill_9_mid_drain_loses_and_duplicates_nothing(conn, workers):
    """Two workers drain 3,000 jobs into the archive; one is killed with SIGKILL mid-drain. Its
    claims come back through the reaper; in the end every job is in the archive exactly once,
    none is left in the hot table, and each ran at least once (at-least-once: only the killed
    worker's jobs may have run twice)."""
    conn.execute(EXECUTIONS_TABLE)
    ids = q.enqueue_many(conn, [q.NewJob("record", {"i": i}) for i in range(3_000)])
    # A short lease: the killed worker's claims expire within seconds, and the reaper in the
    # test sends them back.
    args = ("--concurrency", "4", "--lease", "2")
    victim = workers.start(*args, env=INTO_ARCHIVE)
    other = workers.start(*args, env=INTO_ARCHIVE)
    try:
        wait_for(lambda: archived_count(conn, ids) >= 500, timeout=60, what="500 jobs archived")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=20)

        def drained() -> bool:
            q.reap(conn, backoff_base=0.001, backoff_cap=0.001)
            return archived_count(conn, ids) == len(ids)

        wait_for(drained, timeout=120, interval=0.5, what="every job archived")
    finally:
        code, err = workers.stop(other)
    assert code == 0, err
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM skiplock.jobs_archive").fetchone() == (3_000, 3_000)
    runs = dict(conn.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall())
    assert set(runs) == set(ids)  # every job ran
    victims = {pid for (pid,) in conn.execute("SELECT DISTINCT worker_pid FROM public.executions")} - {other.pid}
    assert victims == {victim.pid}
    twice = [job for job, n in runs.items() if n > 1]
    # Only jobs the killed worker had claimed ran twice.
    assert all(conn.execute("SELECT bool_or(worker_pid = %s) FROM public.executions WHERE job_id = %s",
                            (victim.pid, job)).fetchone()[0] for job in twice)
