"""Adaptive claims (console/queue/worker.py, worker.claim_max): while every job a worker claims
is fast and each claim comes back full, the next claim takes twice as many, up to claim_max;
a short claim or a job that is not fast takes it back to batch_size. A real worker process (and
Worker objects for the rules), a real PostgreSQL. The jobs one statement claimed share their
`locked_at` (now() of that statement's transaction), which is how the tests see each claim's size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import console
from console import queue as q
from console.queue.worker import Worker
from tests.claims_tasks import KIND
from tests.workers import wait_for

THREADED = "claims_threaded_noop"


@console.task(THREADED)
def _threaded_noop(job):
    return None


def claim_sizes(conn) -> list[int]:
    rows = conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s GROUP BY locked_at ORDER BY locked_at",
                        (KIND,)).fetchall()
    return [n for (n,) in rows]


@pytest.mark.parametrize(("claim_max", "first_claims"), [(80, [4, 10, 20, 40, 80]), (0, [4, 10, 10, 10, 10])])
def test_claims_double_while_full_and_fast_up_to_claim_max(conn, workers, claim_max, first_claims):
    """A worker process whose tasks module has one inline no-op kind (tests/claims_tasks.py): in
    the test process other modules register async handlers, and a worker with both runtimes
    keeps batch_size."""
    conn.autocommit = True
    conn.execute("INSERT INTO skiplock.jobs (kind, payload) SELECT %s, '{}' FROM generate_series(1, 1000)", (KIND,))
    proc = workers.start("--concurrency", "4", "--batch-size", "10", tasks="tests.claims_tasks",
                         env={"SKIPLOCK_WORKER_CLAIM_MAX": str(claim_max)})
    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND status = 'completed'",
                                      (KIND,)).fetchone()[0] == 1000, timeout=60, what="1,000 jobs completed")
    finally:
        code, err = workers.stop(proc)
    assert code == 0, err
    sizes = claim_sizes(conn)
    # The first claim of an idle worker fills its 4 free threads only (nothing claimed yet is
    # known to be fast, so nothing ahead); from the next one the jobs are known fast.
    assert sizes[:5] == first_claims
    assert max(sizes) == max(first_claims) and sum(sizes) == 1000
    # each job ran once: one attempt each
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND attempts <> 1", (KIND,)).fetchone()[0] == 0


def test_a_short_claim_or_a_job_not_fast_takes_the_claim_back_to_batch_size(dsn):
    worker = Worker(dsn, batch_size=10, claim_max=60)
    worker._claim_size, worker._ahead = 20, True
    assert worker._next_claim_size(20, 20) == 40  # full and fast: doubles
    worker._claim_size = 40
    assert worker._next_claim_size(40, 40) == 60  # capped at claim_max
    worker._claim_size = 60
    assert worker._next_claim_size(12, 12) == 60  # full, but asked for less than the size (room): kept
    assert worker._next_claim_size(60, 59) == 10  # short: the backlog is thin
    worker._ahead = False
    assert worker._next_claim_size(60, 60) == 10  # a job that was not fast (slow, async, batch)
    worker._ahead, worker._mixed = True, True
    assert worker._next_claim_size(60, 60) == 10  # a mixed worker's claims are cut per runtime
    assert Worker(dsn, batch_size=10, claim_max=3).claim_max == 10  # under batch_size: no growth


def _dispatched_groups(worker: Worker, count: int) -> list[list[int]]:
    now = datetime.now(UTC)
    jobs = [q.Job(id=i, queue="default", kind=THREADED, payload={}, priority=0, run_at=now, attempts=1, max_attempts=5,
                  idempotency_key=None, locked_by=worker.id, locked_at=now, lease_until=now + timedelta(minutes=1),
                  created_at=now) for i in range(count)]
    worker._dispatch(jobs, 0.001)
    groups = []
    while not worker._work.empty():
        groups.append([job.id for job in worker._work.get_nowait().jobs])
    return groups


def test_a_large_claim_of_nearly_fast_jobs_goes_to_the_threads_batch_size_at_a_time(dsn):
    """One group per thread would run a claim of 100 jobs of just under a millisecond on one
    thread while the others wait; cut at batch_size, the claim spreads over them as claims of 10
    did."""
    worker = Worker(dsn, batch_size=10, claim_max=100)
    worker._runtime[THREADED] = 0.0009  # fast, barely (FAST_JOB is 1 ms)
    assert _dispatched_groups(worker, 25) == [list(range(0, 10)), list(range(10, 20)), list(range(20, 25))]
    assert worker._ahead  # all fast: the next claim may be prefetched


def test_a_large_claim_of_near_instant_jobs_goes_to_two_threads(dsn):
    """Ten threads woken for ten no-op jobs each cost more than the jobs: such a claim goes out
    in two halves (docs/benchmarks.md, "Fewer, larger groups")."""
    worker = Worker(dsn, batch_size=10, claim_max=100)
    worker._runtime[THREADED] = 0.000003
    assert _dispatched_groups(worker, 100) == [list(range(0, 50)), list(range(50, 100))]
    assert worker._ahead


def test_finished_jobs_complete_in_a_statement_of_their_own_not_inside_the_next_claim(conn, workers):
    """A completion inside a claim waited there for the lock another claim's recheck holds on the
    job, and held the claim up (docs/benchmarks.md, "Completing apart"). A statement's now() is
    its transaction's start, so a batch completed inside a claim has the finished_at of the jobs
    that claim took (their locked_at); completed apart, it shares it with none."""
    conn.autocommit = True
    conn.execute("INSERT INTO skiplock.jobs (kind, payload) SELECT %s, '{}' FROM generate_series(1, 300)", (KIND,))
    proc = workers.start("--concurrency", "4", "--batch-size", "10", tasks="tests.claims_tasks")
    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND status = 'completed'",
                                      (KIND,)).fetchone()[0] == 300, timeout=60, what="300 jobs completed")
    finally:
        code, err = workers.stop(proc)
    assert code == 0, err
    assert len(claim_sizes(conn)) >= 4  # several claims, so several completions came between them
    shared = conn.execute("""SELECT count(*) FROM skiplock.jobs AS f
                             WHERE f.kind = %s AND EXISTS (SELECT 1 FROM skiplock.jobs AS c
                                                           WHERE c.kind = %s AND c.locked_at = f.finished_at)""",
                          (KIND, KIND)).fetchone()[0]
    assert shared == 0
