"""The worker's asyncio runtime in real processes against a real PostgreSQL: `async def` handlers
get the same leases, heartbeats, fenced completion, retries, cancellation, timeouts, limits and
graceful shutdown as threaded ones, hundreds of them wait at once in one process, and sync and
async handlers share a worker, each runtime filled to its own slots.

Handlers are in tests/sample_async_tasks.py; each run notes its events in public.async_runs.
"""

from __future__ import annotations

import signal
import time

import pytest

from console import queue as q
from tests.async_runs import RUNS_TABLE
from tests.workers import wait_for

pytestmark = pytest.mark.slow

MIXED = "tests.sample_tasks,tests.sample_async_tasks"



@pytest.fixture
def db(conn):
    conn.execute(RUNS_TABLE)
    return conn


def status_of(db, job_id: int) -> str:
    return q.get_job(db, job_id)["status"]


def events(db, job_id: int | None = None) -> list[tuple]:
    return db.execute(
        "SELECT job_id, attempt, event, thread FROM public.async_runs"
        " WHERE %(id)s::bigint IS NULL OR job_id = %(id)s ORDER BY at", {"id": job_id}).fetchall()


def finished(db, ids: list[int]) -> bool:
    return db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND status IN ('completed', 'failed')",
                      (ids,)).fetchone()[0] == len(ids)


def test_one_process_awaits_hundreds_of_jobs_at_once(db, workers):
    # a_together completes only once n of its jobs run at the same time in one process
    n = 150
    ids = q.enqueue_many(db, [q.NewJob("a_together", {"n": n, "within": 30}, max_attempts=1) for _ in range(n)])
    proc = workers.start("--async-concurrency", str(n), "--batch-size", "50", tasks="tests.sample_async_tasks")
    wait_for(lambda: finished(db, ids), timeout=60, what=f"{n} jobs to finish")
    rows = db.execute("SELECT status, attempts, count(*) FROM skiplock.jobs GROUP BY 1, 2").fetchall()
    assert rows == [("completed", 1, n)], rows
    code, err = workers.stop(proc)
    assert code == 0, err
    # its slots: the loop's n and the 4 handler threads (the module has sync handlers too)
    assert db.execute("SELECT claimed, completed, concurrency FROM skiplock.workers").fetchone() == (n, n, n + 4)


def test_async_retries_backoff_and_dead_letters_add_up(db, workers):
    jobs = [q.NewJob("a_flaky", {"fail_times": i % 4}, max_attempts=3) for i in range(30)]
    jobs += [q.NewJob("a_doomed", {"order": i}, max_attempts=3) for i in range(5)]
    ids = q.enqueue_many(db, jobs)
    proc = workers.start(tasks="tests.sample_async_tasks")
    wait_for(lambda: finished(db, ids), what="every job to finish")
    runs = dict(db.execute("SELECT job_id, count(*) FROM public.async_runs GROUP BY job_id").fetchall())
    for job_id, kind, payload, status, attempts, errors in db.execute(
            "SELECT id, kind, payload, status, attempts, jsonb_array_length(errors) FROM skiplock.jobs"):
        if kind == "a_doomed":  # DoNotRetry: a dead letter after one attempt
            assert (status, attempts, errors, runs[job_id]) == ("failed", 1, 1, 1)
        elif payload["fail_times"] < 3:
            assert (status, attempts, errors, runs[job_id]) == ("completed", payload["fail_times"] + 1,
                                                                payload["fail_times"], payload["fail_times"] + 1)
        else:  # three failures: attempts spent
            assert (status, attempts, errors, runs[job_id]) == ("failed", 3, 3, 3)
    assert workers.stop(proc)[0] == 0
    counts = db.execute("SELECT completed, failed, retried, queue_counts FROM skiplock.workers").fetchone()
    # 30 flaky: fail_times 0,1,2 complete (24 jobs, 8+16=24 retries... counted below), 3 -> dead
    completed = sum(1 for i in range(30) if i % 4 < 3)
    retried = sum(min(i % 4, 2) for i in range(30))
    dead = sum(1 for i in range(30) if i % 4 == 3) + 5
    assert counts[:3] == (completed, dead, retried)
    assert counts[3] == {"default": [completed, dead, retried]}


def test_a_cancel_request_raises_cancelled_error_in_the_handler(db, workers):
    job_id = q.enqueue(db, "a_cancellable", {"sleep": 60}, max_attempts=3)
    proc = workers.start("--lease", "1.5", tasks="tests.sample_async_tasks")
    wait_for(lambda: events(db, job_id), what="the job to start")
    assert q.request_cancel(db, job_id) is not None
    # the heartbeat (every lease/3 = 0.5 s) learns it; the handler sees CancelledError at its await
    wait_for(lambda: status_of(db, job_id) == "failed", timeout=20, what="the cancelled job to fail")
    job = q.get_job(db, job_id)
    assert job["attempts"] == 1, "a job an operator asked to stop is not retried"
    assert job["errors"][-1]["error_class"] == "Cancelled"
    assert [e for _, _, e, _ in events(db, job_id)] == ["start", "cancelled"]
    assert workers.stop(proc)[0] == 0


def test_timeouts_cancel_an_async_handler_and_stop_a_sync_one_and_are_retried(db, workers):
    awaited = q.enqueue(db, "a_timeout", {}, max_attempts=2)
    threaded = q.enqueue(db, "s_timeout", {}, max_attempts=2)
    proc = workers.start(tasks=MIXED)
    wait_for(lambda: finished(db, [awaited, threaded]), timeout=30, what="both jobs to run out of attempts")
    for job_id in (awaited, threaded):
        job = q.get_job(db, job_id)
        assert (job["status"], job["attempts"]) == ("failed", 2), "a timed-out attempt is retried"
        assert [e["error_class"] for e in job["errors"]] == ["JobTimeout", "JobTimeout"]
        assert "ran longer than its 0.5 s timeout" in job["last_error"]
        assert [e for _, _, e, _ in events(db, job_id)] == ["start", "cancelled"] * 2
    assert workers.stop(proc)[0] == 0


def test_heartbeats_keep_an_async_job_longer_than_its_lease(db, workers):
    job_id = q.enqueue(db, "a_record", {"sleep": 3.5})
    proc = workers.start("--lease", "1", tasks="tests.sample_async_tasks")
    wait_for(lambda: status_of(db, job_id) == "running", what="the job to start")
    rescued = 0
    deadline = time.monotonic() + 60
    while status_of(db, job_id) == "running":
        assert time.monotonic() < deadline, "the 3.5 s job did not finish within 60 s"
        rescued += sum(v for k, v in q.reap(db).items() if k != "batches")
        time.sleep(0.1)
    job = q.get_job(db, job_id)
    assert rescued == 0
    assert (job["status"], job["attempts"]) == ("completed", 1)
    assert [e for _, _, e, _ in events(db, job_id)] == ["start", "end"]
    assert workers.stop(proc)[0] == 0


def test_a_rescued_async_run_cannot_complete_the_job(db, workers):
    # attempt 1 is rescued by the reaper while it still runs, attempt 2 starts, and attempt 1
    # ends while attempt 2 runs: its completion must be refused (fenced), so the job completes
    # only when attempt 2 ends
    job_id = q.enqueue(db, "a_record", {"first_sleep": 3, "sleep": 5})
    proc = workers.start(tasks="tests.sample_async_tasks")
    wait_for(lambda: events(db, job_id), what="attempt 1 to start")
    db.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert q.reap(db, backoff_base=0.01, backoff_cap=0.01)["pending"] == 1
    wait_for(lambda: status_of(db, job_id) == "completed", timeout=30, what="the job to complete")
    wait_for(lambda: len(events(db, job_id)) == 4, timeout=30, what="both runs to end")
    at = {(attempt, event): when for attempt, event, when in db.execute(
        "SELECT attempt, event, at FROM public.async_runs WHERE job_id = %s", (job_id,))}
    assert at[(2, "start")] < at[(1, "end")] < at[(2, "end")], f"the runs did not overlap as planned: {at}"
    finished_at, attempts = db.execute("SELECT finished_at, attempts FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()
    assert attempts == 2 and finished_at >= at[(2, "end")], "the rescued attempt's completion was accepted"
    assert workers.stop(proc)[0] == 0
    assert db.execute("SELECT lost, completed FROM skiplock.workers").fetchone() == (1, 1)


def test_a_kind_concurrency_holds_for_async_handlers(db, workers):
    procs = [workers.start(tasks="tests.sample_async_tasks") for _ in range(2)]
    # Both up before the jobs come: under load one process was still starting when the other had
    # run all eight, and the SIGTERM below reached it before its handler was set (exit -15).
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.workers WHERE stopped_at IS NULL").fetchone()[0] == 2,
             timeout=60, what="both workers registered")
    ids = q.enqueue_many(db, [q.NewJob("a_scarce", {"sleep": 0.3}) for _ in range(8)])
    wait_for(lambda: finished(db, ids), timeout=60, what="the limited jobs to finish")
    assert {status_of(db, i) for i in ids} == {"completed"}
    spans = db.execute("""
        SELECT s.at, e.at FROM public.async_runs AS s
        JOIN public.async_runs AS e ON e.job_id = s.job_id AND e.attempt = s.attempt AND e.event = 'end'
        WHERE s.event = 'start'""").fetchall()
    assert len(spans) == 8
    most = max(sum(1 for start, end in spans if start <= instant < end) for instant, _ in spans)
    assert most <= 2, f"{most} a_scarce jobs ran at once under a concurrency of 2"
    for proc in procs:
        assert workers.stop(proc)[0] == 0


def test_sigterm_lets_async_jobs_finish_then_releases_and_cancels_the_rest(db, workers):
    quick = q.enqueue_many(db, [q.NewJob("a_record", {"sleep": 0.5}, priority=10) for _ in range(2)])
    stuck = q.enqueue_many(db, [q.NewJob("a_cancellable", {"sleep": 60}, priority=10) for _ in range(2)])
    waiting = q.enqueue_many(db, [q.NewJob("a_record", {}) for _ in range(5)])
    proc = workers.start("--async-concurrency", "4", tasks="tests.sample_async_tasks",
                         env={"SKIPLOCK_WORKER_SHUTDOWN_GRACE": "3"})
    wait_for(lambda: len({j for j, _, e, _ in events(db) if e == "start"}) == 4, what="four jobs running")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=45)
    assert proc.returncode == 0, err
    status = {row[0]: row[1:] for row in db.execute("SELECT id, status, attempts, locked_by IS NULL FROM skiplock.jobs")}
    assert {status[i] for i in quick} == {("completed", 1, False)}
    assert {status[i] for i in stuck} == {("pending", 0, True)}, "unfinished jobs go back without counting the attempt"
    assert {status[i] for i in waiting} == {("pending", 0, True)}, "a stopping worker claims nothing new"
    # after their release the stuck handlers were cancelled, so their cleanup ran
    assert sorted(j for j, _, e, _ in events(db) if e == "cancelled") == sorted(stuck)
    assert db.execute("SELECT stopped_at IS NOT NULL, in_flight, completed FROM skiplock.workers").fetchone() == (True, 0, 2)


def test_sync_and_async_handlers_share_a_worker_each_in_its_own_runtime(db, workers):
    # one handler thread: a sync job must never be claimed while it is busy, however many loop
    # slots are free (the mixed claim asks each runtime's kinds for its own free slots)
    sync_ids = q.enqueue_many(db, [q.NewJob("s_note", {"sleep": 0.4}) for _ in range(5)])
    async_ids = q.enqueue_many(db, [q.NewJob("a_record", {"sleep": 0.4}) for _ in range(20)])
    proc = workers.start("--concurrency", "1", "--async-concurrency", "20", tasks=MIXED)
    most_sync_held = 0
    deadline = time.monotonic() + 60
    while not finished(db, sync_ids + async_ids):
        assert time.monotonic() < deadline, "the jobs did not finish within 60 s"
        held = db.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 's_note' AND status = 'running'").fetchone()[0]
        most_sync_held = max(most_sync_held, held)
        time.sleep(0.05)
    assert most_sync_held == 1, f"{most_sync_held} sync jobs held by a worker with one handler thread"
    threads = {kind: {t for j, _, _, t in events(db) if j in ids} for kind, ids in (("sync", sync_ids), ("async", async_ids))}
    assert threads == {"sync": {"handler-0"}, "async": {"asyncio"}}
    assert {status_of(db, i) for i in sync_ids + async_ids} == {"completed"}
    assert workers.stop(proc)[0] == 0
