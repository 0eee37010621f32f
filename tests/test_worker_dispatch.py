"""How the worker hands jobs to handlers (console/queue/worker.py): inline handlers on the claim
thread, fast jobs as one group to one handler thread, and a group that gives its rest back to
the pool when one of its jobs runs long. An in-process Worker in a thread, a real PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest

import console
from console import queue as q
from console.queue import tasks
from console.queue.worker import FAST_JOB, Worker, fast_group_size
from tests.workers import wait_for

INLINE_KIND = "dispatch_inline"
GROUPED_KIND = "dispatch_grouped"
_runs: list[dict] = []
_runs_lock = threading.Lock()


def _record(job, **extra) -> None:
    with _runs_lock:
        _runs.append({"id": job.id, "thread": threading.get_ident(), **extra})


@console.task(INLINE_KIND, inline=True)
def _inline(job):
    _record(job)


@console.task(GROUPED_KIND)
def _grouped(job):
    started = time.monotonic()
    time.sleep(job.payload.get("sleep", 0))
    _record(job, started=started, ended=time.monotonic())


@pytest.fixture
def running_worker(dsn):
    """A real Worker in a thread; yields (worker, the thread's ident); always stopped."""
    _runs.clear()
    worker = Worker(dsn, concurrency=4, batch_size=5, lease=60, poll_interval=0.2,
                    flush_interval=0.5, vacuum_interval=0, name="dispatch-worker")
    thread = threading.Thread(target=worker.run, name="dispatch-worker")
    thread.start()
    yield worker, thread
    worker.stop(immediately=True)
    thread.join(timeout=20)
    assert not thread.is_alive(), "the worker did not stop within 20 s"


def completed(conn, kind: str) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND status = 'completed'", (kind,)).fetchone()[0]


def test_an_inline_handler_runs_on_the_claim_thread_and_each_job_completes_once(conn, running_worker):
    _worker, thread = running_worker
    ids = q.enqueue_many(conn, [q.NewJob(INLINE_KIND, {"i": i}) for i in range(12)])
    wait_for(lambda: completed(conn, INLINE_KIND) == 12, timeout=30, what="12 inline jobs completed")
    assert sorted(r["id"] for r in _runs) == sorted(ids), "an inline job ran twice or not at all"
    assert {r["thread"] for r in _runs} == {thread.ident}, "an inline handler ran on another thread"


def test_a_group_of_fast_jobs_gives_the_rest_back_when_one_runs_long(conn, running_worker):
    worker, _thread = running_worker
    # teach the worker that this kind is fast (no sleep): its jobs then go to one thread together.
    # Its average comes from the jobs it runs: on a machine loaded past its cores a no-op can
    # measure above FAST_JOB when its thread is preempted, so batches go on until it counts as
    # fast (at load 12 twenty were not enough).
    taught = 0
    deadline = time.monotonic() + 60
    while worker._runtime.get(GROUPED_KIND, 1.0) >= FAST_JOB:
        assert time.monotonic() < deadline, f"the kind never counted as fast: {worker._runtime.get(GROUPED_KIND)}"
        q.enqueue_many(conn, [q.NewJob(GROUPED_KIND, {}) for _ in range(20)])
        taught += 20
        wait_for(lambda n=taught: completed(conn, GROUPED_KIND) == n, timeout=30, what=f"{taught} fast jobs completed")
    _runs.clear()
    # one claim of 5: the first sleeps, the four behind it do not (claim order: same run_at, id)
    slow, *fast = q.enqueue_many(conn, [q.NewJob(GROUPED_KIND, {"sleep": 0.5})] + [q.NewJob(GROUPED_KIND, {}) for _ in range(4)])
    wait_for(lambda: completed(conn, GROUPED_KIND) == taught + 5, timeout=30, what="the 5 jobs completed")
    by_id = {r["id"]: r for r in _runs}
    assert set(by_id) == {slow, *fast}
    late = [job_id for job_id in fast if by_id[job_id]["started"] >= by_id[slow]["ended"]]
    assert not late, f"jobs {late} waited behind the slow job of their group instead of going back to the pool"


@pytest.mark.parametrize(("count", "batch_size", "slowest", "expected"), [
    (100, 10, 0.000002, 50),  # near-instant jobs: two groups of half the claim, not ten of ten
    (101, 10, 0.000002, 51),  # half rounded up: still two groups
    (100, 10, 0.0001, 20),  # 0.1 ms each: what runs in 2 ms, five groups
    (100, 10, 0.0005, 10),  # 0.5 ms each: the budget says 4, never under batch_size
    (5, 5, 0.000002, 5),  # a claim of batch_size stays one group
    (100, 10, 0.0, 50),  # no runtime measured: half the claim
])
def test_fast_jobs_go_to_threads_in_groups_sized_by_their_runtime(count, batch_size, slowest, expected):
    assert fast_group_size(count, batch_size, slowest) == expected


def test_inline_must_be_a_boolean():
    with pytest.raises(ValueError, match="inline must be True or False"):
        tasks.task("dispatch_bad_inline", inline="yes")
    assert tasks.is_inline(INLINE_KIND) and not tasks.is_inline(GROUPED_KIND)


def test_a_worker_whose_connection_drops_during_start_up_reconnects_and_works(conn, dsn):
    """The database goes away between the worker's first connection and its main loop: the
    worker waits it out and reconnects, as the main loop does, instead of dying in start-up."""
    _runs.clear()
    worker = Worker(dsn, concurrency=2, batch_size=5, lease=60, poll_interval=0.2,
                    flush_interval=0.5, vacuum_interval=0, name="startup-worker")
    first = worker._connection()  # registered, as at the start of run()
    conn.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run, name="startup-worker")
    thread.start()
    try:
        ids = q.enqueue_many(conn, [q.NewJob(INLINE_KIND, {"i": i}) for i in range(3)])
        wait_for(lambda: errors or completed(conn, INLINE_KIND) == 3, timeout=30, what="3 jobs completed")
        assert not errors, f"the worker died in start-up: {errors[0]!r}"
        assert sorted(r["id"] for r in _runs) == sorted(ids)
    finally:
        worker.stop(immediately=True)
        thread.join(timeout=20)
    assert not thread.is_alive(), "the worker did not stop within 20 s"
