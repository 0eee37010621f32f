"""Batch handlers (`@task("kind", batch=N)`, issue 28 item 4): a real Worker in a thread against a
real PostgreSQL. The handlers here record every call (its jobs' ids and attempts), so "at most N
a call" and "completed exactly once" are checked against what really ran, and the jobs' rows
say what the worker made of each outcome: completed, retried, dead letter, or left alone
because its claim was lost (fencing)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from contextlib import contextmanager

import pytest
from psycopg.types.json import Jsonb

import skiplock
from console import queue as q
from console.queue import tasks
from console.queue.worker import FAST_JOB, Worker
from console.sqlfiles import query
from tests.plans import generic_plan
from tests.workers import wait_for

SIZE = 5  # batch_record's batch
_calls: list[tuple[str, list[tuple[int, int]]]] = []  # (kind, [(job id, attempt), ...]) per call
_calls_lock = threading.Lock()
_release = threading.Event()  # batch_hold's handler waits for it (with a deadline)
_holding = threading.Event()  # set while batch_hold's handler waits


def _record(kind: str, jobs: list[skiplock.Job]) -> None:
    with _calls_lock:
        _calls.append((kind, [(job.id, job.attempts) for job in jobs]))


@skiplock.task("batch_record", batch=SIZE)
def batch_record(jobs: list[skiplock.Job]) -> None:
    """Fails, through BatchFailure, the jobs whose payload asks it for their first
    `fail_times` attempts; completes the others."""
    _record("batch_record", jobs)
    failing = {job.id: RuntimeError(f"job {job.id} attempt {job.attempts} failed on purpose")
               for job in jobs if job.attempts <= job.payload.get("fail_times", 0)}
    if failing:
        raise skiplock.BatchFailure(failing)


@skiplock.task("batch_boom", batch=4)
def batch_boom(jobs):
    _record("batch_boom", jobs)
    raise RuntimeError("the whole batch failed")


@skiplock.task("batch_never", batch=4)
def batch_never(jobs):
    _record("batch_never", jobs)
    raise skiplock.DoNotRetry("none of these can ever work")


@skiplock.task("batch_stranger", batch=4)
def batch_stranger(jobs):
    _record("batch_stranger", jobs)
    raise skiplock.BatchFailure({max(job.id for job in jobs) + 10_000: RuntimeError("not one of mine")})


@skiplock.task("batch_hold", batch=10)
def batch_hold(jobs):
    _record("batch_hold", jobs)
    _holding.set()
    assert _release.wait(30), "the test never released the batch"


@skiplock.task("batch_async", batch=3)
async def batch_async(jobs):
    await asyncio.sleep(0.01)
    _record("batch_async", jobs)


@skiplock.task("batch_logs", batch=4)
def batch_logs(jobs):
    logging.getLogger("tests.batch").warning("handling a batch of %d", len(jobs))
    _record("batch_logs", jobs)


@skiplock.task("batch_slow", batch=3, timeout=0.3)
def batch_slow(jobs):
    _record("batch_slow", jobs)
    # every job's cancel event is set at the deadline of the whole call
    assert jobs[-1].cancel_event.wait(20), "the timeout never fired"
    raise RuntimeError("stopped at the deadline")


@skiplock.task("batch_async_cancel", batch=3)
async def batch_async_cancel(jobs):
    """Waits (with a deadline) until an operator asked one of its jobs to stop, then fails just
    that one, as Cancelled; the others complete."""
    _record("batch_async_cancel", jobs)
    deadline = asyncio.get_running_loop().time() + 20
    while not any(job.cancel_requested() for job in jobs):
        assert asyncio.get_running_loop().time() < deadline, "no cancel request reached the batch"
        await asyncio.sleep(0.05)
    raise skiplock.BatchFailure({job.id: skiplock.Cancelled("asked to stop") for job in jobs if job.cancel_requested()})


@skiplock.task("batch_async_slow", batch=3, timeout=0.3)
async def batch_async_slow(jobs):
    _record("batch_async_slow", jobs)
    await asyncio.sleep(20)


_quick: list[dict] = []  # batch_quick's calls: its job, the thread, when it started and ended


@skiplock.task("batch_quick", batch=1)
def batch_quick(jobs):
    """A no-op batch of one, or a sleep when the payload asks for it."""
    started = time.monotonic()
    time.sleep(jobs[0].payload.get("sleep", 0))
    with _calls_lock:
        _quick.append({"id": jobs[0].id, "thread": threading.get_ident(), "started": started, "ended": time.monotonic()})


@pytest.fixture(autouse=True)
def _fresh():
    with _calls_lock:
        _calls.clear()
        _quick.clear()
    _release.clear()
    _holding.clear()
    yield
    _release.set()  # a handler still waiting lets go


@contextmanager
def running(dsn: str, **settings):
    """A real Worker in a thread (short backoff, no vacuum thread); always stopped."""
    options = dict(concurrency=2, batch_size=10, lease=60, poll_interval=0.2, flush_interval=0.5,
                   vacuum_interval=0, backoff_base=0.01, backoff_cap=0.05, name="batch-worker")
    options.update(settings)
    worker = Worker(dsn, **options)
    thread = threading.Thread(target=worker.run, name="batch-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(immediately=True)
        thread.join(timeout=20)
        assert not thread.is_alive(), "the worker did not stop within 20 s"


def rows(conn, kind: str) -> dict[int, dict]:
    out = conn.execute(
        "SELECT id, status, attempts, jsonb_array_length(errors), errors -> -1 ->> 'error_class', locked_by"
        " FROM skiplock.jobs WHERE kind = %s", (kind,)).fetchall()
    return {r[0]: {"status": r[1], "attempts": r[2], "errors": r[3], "error_class": r[4], "locked_by": r[5]} for r in out}


def finished(conn, kind: str, n: int) -> bool:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND status IN ('completed', 'failed')",
                        (kind,)).fetchone()[0] == n


def calls(kind: str) -> list[list[tuple[int, int]]]:
    with _calls_lock:
        return [jobs for k, jobs in _calls if k == kind]


def runs_per_job(kind: str) -> dict[int, list[int]]:
    per_job: dict[int, list[int]] = {}
    for jobs in calls(kind):
        for job_id, attempt in jobs:
            per_job.setdefault(job_id, []).append(attempt)
    return per_job


def test_a_batch_handler_gets_lists_no_longer_than_its_batch_and_completes_each_job_once(dsn, conn):
    ids = q.enqueue_many(conn, [q.NewJob("batch_record", {"i": i}) for i in range(53)])
    with running(dsn) as worker:
        wait_for(lambda: finished(conn, "batch_record", 53), timeout=60, what="53 batch jobs finished")
        # each batch gave its one slot back: nothing held, every slot free again
        wait_for(lambda: worker._busy() == 0 and worker._batch_extra == 0, timeout=10, what="the batches' slots freed")
    sizes = [len(jobs) for jobs in calls("batch_record")]
    assert max(sizes) <= SIZE, f"a call got more than {SIZE} jobs: {sizes}"
    assert max(sizes) > 1, f"the jobs were never handed over together: {sizes}"
    assert runs_per_job("batch_record") == {job_id: [1] for job_id in ids}, "a job ran twice, or not at all"
    assert {(r["status"], r["attempts"], r["errors"]) for r in rows(conn, "batch_record").values()} == {("completed", 1, 0)}


def test_batch_failure_retries_only_the_jobs_it_names_and_dead_letters_only_the_exhausted_one(dsn, conn):
    jobs = [q.NewJob("batch_record", {"i": i}, max_attempts=3) for i in range(10)]
    jobs[3] = q.NewJob("batch_record", {"fail_times": 1}, max_attempts=3)   # fails once, then completes
    jobs[7] = q.NewJob("batch_record", {"fail_times": 99}, max_attempts=3)  # fails every attempt
    ids = q.enqueue_many(conn, jobs)
    once, doomed = ids[3], ids[7]
    with running(dsn):
        wait_for(lambda: finished(conn, "batch_record", 10), timeout=60, what="10 batch jobs finished")
    state = rows(conn, "batch_record")
    assert (state[once]["status"], state[once]["attempts"], state[once]["errors"]) == ("completed", 2, 1)
    assert (state[doomed]["status"], state[doomed]["attempts"], state[doomed]["errors"]) == ("failed", 3, 3)
    assert state[doomed]["error_class"] == "RuntimeError"
    for job_id in set(ids) - {once, doomed}:
        assert (state[job_id]["status"], state[job_id]["attempts"], state[job_id]["errors"]) == ("completed", 1, 0), job_id
    per_job = runs_per_job("batch_record")
    assert per_job[once] == [1, 2] and per_job[doomed] == [1, 2, 3]
    assert all(per_job[job_id] == [1] for job_id in set(ids) - {once, doomed}), "a job that did not fail ran again"


def test_any_other_exception_fails_every_job_of_the_batch_each_retried_until_exhausted(dsn, conn):
    ids = q.enqueue_many(conn, [q.NewJob("batch_boom", {"i": i}, max_attempts=2) for i in range(6)])
    with running(dsn) as worker:
        wait_for(lambda: finished(conn, "batch_boom", 6), timeout=60, what="6 batch jobs finished")
        wait_for(lambda: worker.counters.failed == 6, timeout=10, what="the worker to count 6 dead letters")
    state = rows(conn, "batch_boom")
    assert {(r["status"], r["attempts"], r["errors"], r["error_class"]) for r in state.values()} == {("failed", 2, 2, "RuntimeError")}
    assert runs_per_job("batch_boom") == {job_id: [1, 2] for job_id in ids}
    assert worker.counters.retried == 6


def test_do_not_retry_from_a_batch_handler_dead_letters_every_job_at_once(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("batch_never", {"i": i}, max_attempts=5) for i in range(7)])
    with running(dsn):
        wait_for(lambda: finished(conn, "batch_never", 7), timeout=60, what="7 batch jobs finished")
    state = rows(conn, "batch_never")
    assert {(r["status"], r["attempts"], r["errors"], r["error_class"]) for r in state.values()} == {("failed", 1, 1, "DoNotRetry")}


def test_a_batch_failure_naming_a_job_not_in_the_batch_fails_the_whole_batch(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("batch_stranger", {"i": i}, max_attempts=1) for i in range(3)])
    with running(dsn):
        wait_for(lambda: finished(conn, "batch_stranger", 3), timeout=60, what="3 batch jobs finished")
    state = rows(conn, "batch_stranger")
    assert {(r["status"], r["error_class"]) for r in state.values()} == {("failed", "ValueError")}


def test_a_job_of_the_batch_whose_lease_was_lost_is_not_completed_by_it(dsn, conn):
    """The reaper rescues one job of a running batch and another worker claims it; when the
    batch returns, its other jobs complete and the rescued one stays the other worker's."""
    ids = q.enqueue_many(conn, [q.NewJob("batch_hold", {"i": i}) for i in range(4)])
    with running(dsn, concurrency=1) as worker:
        wait_for(_holding.is_set, timeout=30, what="the batch to start")
        assert calls("batch_hold") == [[(job_id, 1) for job_id in ids]]
        stolen = ids[2]
        conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (stolen,))
        assert q.reap(conn, backoff_base=0.0, backoff_cap=0.0)["pending"] == 1
        thief = q.claim(conn, "thief-worker", limit=10)
        assert [job.id for job in thief] == [stolen] and thief[0].attempts == 2
        _release.set()
        wait_for(lambda: worker.counters.completed + worker.counters.lost == 4, timeout=30, what="the batch's outcome")
        state = rows(conn, "batch_hold")
        assert worker.counters.lost == 1 and worker.counters.completed == 3
    assert (state[stolen]["status"], state[stolen]["attempts"], state[stolen]["locked_by"]) == ("running", 2, "thief-worker")
    assert all(state[job_id]["status"] == "completed" for job_id in ids if job_id != stolen)
    assert q.complete(conn, thief[0]) is True  # the thief's claim is intact


def test_an_async_batch_handler_is_awaited_with_lists_of_at_most_its_batch(dsn, conn):
    ids = q.enqueue_many(conn, [q.NewJob("batch_async", {"i": i}) for i in range(11)])
    with running(dsn, async_concurrency=4):
        wait_for(lambda: finished(conn, "batch_async", 11), timeout=60, what="11 async batch jobs finished")
    sizes = [len(jobs) for jobs in calls("batch_async")]
    assert max(sizes) <= 3 and max(sizes) > 1, sizes
    assert runs_per_job("batch_async") == {job_id: [1] for job_id in ids}
    assert {r["status"] for r in rows(conn, "batch_async").values()} == {"completed"}


def test_a_batch_call_logs_are_kept_with_every_job_of_the_batch(dsn, conn):
    ids = q.enqueue_many(conn, [q.NewJob("batch_logs", {"i": i}) for i in range(4)])
    with running(dsn, concurrency=1):
        wait_for(lambda: finished(conn, "batch_logs", 4), timeout=60, what="4 batch jobs finished")
    sizes = {len(jobs) for jobs in calls("batch_logs")}
    logs = dict(conn.execute("SELECT id, attempt_logs FROM skiplock.jobs WHERE kind = 'batch_logs'").fetchall())
    for job_id in ids:
        entry = logs[job_id][-1]
        assert entry["outcome"] == "completed" and entry["attempt"] == 1
        assert [r["message"] for r in entry["records"]] in ([f"handling a batch of {n}"] for n in sizes)


def test_the_timeout_bounds_the_whole_batch_call(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("batch_slow", {"i": i}, max_attempts=1) for i in range(3)])
    with running(dsn, concurrency=1):
        wait_for(lambda: finished(conn, "batch_slow", 3), timeout=60, what="3 batch jobs finished")
    assert {(r["status"], r["error_class"]) for r in rows(conn, "batch_slow").values()} == {("failed", "JobTimeout")}


def test_an_async_batch_call_is_cancelled_at_its_timeout_and_every_job_fails_as_job_timeout(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("batch_async_slow", {"i": i}, max_attempts=1) for i in range(3)])
    started = time.monotonic()
    with running(dsn):
        wait_for(lambda: finished(conn, "batch_async_slow", 3), timeout=30, what="3 async batch jobs finished")
    assert time.monotonic() - started < 15, "the batch ran its 20 s: the timeout did not cancel it"
    assert {(r["status"], r["error_class"]) for r in rows(conn, "batch_async_slow").values()} == {("failed", "JobTimeout")}


def test_a_cancel_request_for_one_job_reaches_it_without_cancelling_its_async_batch(dsn, conn):
    """The request is for the batch's first job, under whose run the loop files the batch's task."""
    ids = q.enqueue_many(conn, [q.NewJob("batch_async_cancel", {"i": i}) for i in range(3)])
    with running(dsn, lease=1.5):  # heartbeats every 0.5 s carry the request
        wait_for(lambda: calls("batch_async_cancel"), timeout=30, what="the batch to start")
        assert calls("batch_async_cancel")[0] == [(job_id, 1) for job_id in ids]
        assert q.request_cancel(conn, ids[0]) is not None
        wait_for(lambda: finished(conn, "batch_async_cancel", 3), timeout=30, what="the batch's outcome")
    state = rows(conn, "batch_async_cancel")
    assert (state[ids[0]]["status"], state[ids[0]]["error_class"]) == ("failed", "Cancelled")
    assert state[ids[1]]["status"] == state[ids[2]]["status"] == "completed", state
    assert len(calls("batch_async_cancel")) == 1, "the batch ran again"


@pytest.mark.parametrize("batch", [0, -3, True, False, 2.5, "10", tasks.MAX_BATCH + 1])
def test_batch_must_be_a_positive_whole_number_within_bounds(batch):
    with pytest.raises(ValueError, match="batch must be"):
        skiplock.task("batch_bad", batch=batch)


def test_batch_refuses_inline_and_concurrency():
    with pytest.raises(ValueError, match="cannot be inline"):
        skiplock.task("batch_bad", batch=10, inline=True)
    with pytest.raises(ValueError, match="batch and concurrency cannot be combined"):
        skiplock.task("batch_bad", batch=10, concurrency=2)
    assert "batch_bad" not in tasks.registered()


def test_batch_failure_takes_a_mapping_of_job_ids_to_exceptions():
    assert skiplock.BatchFailure({1: RuntimeError("x")}).errors.keys() == {1}
    with pytest.raises(TypeError, match="keys are job ids"):
        skiplock.BatchFailure({"1": RuntimeError("x")})
    with pytest.raises(TypeError, match="must be an exception"):
        skiplock.BatchFailure({1: "failed"})
    with pytest.raises(TypeError, match="mapping"):
        skiplock.BatchFailure([RuntimeError("x")])


def test_a_batch_kind_registers_its_size_and_a_plain_kind_has_none():
    assert tasks.batch_of("batch_record") == SIZE and tasks.batch_of("batch_async") == 3
    assert "batch_record" in tasks.batch_kinds()
    skiplock.task("batch_plain_again")(lambda job: None)
    try:
        assert tasks.batch_of("batch_plain_again") is None
    finally:
        tasks._registry.pop("batch_plain_again", None)
        tasks._concurrency.pop("batch_plain_again", None)



def _teach_fast(conn, worker) -> int:
    """Run batch_quick's no-op until the worker counts the kind as fast (its calls' moving
    average under FAST_JOB; on a machine loaded past its cores a preempted no-op can measure
    above it, so this goes on until it does). Returns how many jobs it ran."""
    taught = 0
    deadline = time.monotonic() + 60
    while worker._runtime.get("batch_quick", 1.0) >= FAST_JOB:
        assert time.monotonic() < deadline, f"the kind never counted as fast: {worker._runtime.get('batch_quick')}"
        q.enqueue_many(conn, [q.NewJob("batch_quick", {}) for _ in range(20)])
        taught += 20
        wait_for(lambda n=taught: completed(conn, "batch_quick") == n, timeout=30, what=f"{taught} quick jobs completed")
    with _calls_lock:
        _quick.clear()
    return taught


def completed(conn, kind: str) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = %s AND status = 'completed'", (kind,)).fetchone()[0]


def test_fast_batches_of_one_claim_go_to_one_handler_thread_together(dsn, conn):
    """batch=1 cost twice the single-job handler's CPU: one hand-off to a thread per call. The
    batches of a kind whose calls run fast go to one thread together, as fast single jobs do."""
    with running(dsn, concurrency=8, batch_size=10) as worker:
        taught = _teach_fast(conn, worker)
        ids = q.enqueue_many(conn, [q.NewJob("batch_quick", {}) for _ in range(8)])  # one claim of 8
        wait_for(lambda: completed(conn, "batch_quick") == taught + 8, timeout=30, what="the 8 jobs completed")
    with _calls_lock:
        runs = list(_quick)
    assert sorted(r["id"] for r in runs) == sorted(ids), "a job ran twice or not at all"
    assert len({r["thread"] for r in runs}) == 1, f"8 fast batches went to {len({r['thread'] for r in runs})} threads"


def test_a_group_of_fast_batches_gives_the_rest_back_when_one_call_runs_long(dsn, conn):
    with running(dsn, concurrency=4, batch_size=10) as worker:
        taught = _teach_fast(conn, worker)
        # one claim of 4 batches of one: the first call sleeps, the three behind it do not
        slow, *fast = q.enqueue_many(conn, [q.NewJob("batch_quick", {"sleep": 0.5})] + [q.NewJob("batch_quick", {}) for _ in range(3)])
        wait_for(lambda: completed(conn, "batch_quick") == taught + 4, timeout=30, what="the 4 jobs completed")
    with _calls_lock:
        by_id = {r["id"]: r for r in _quick}
    assert set(by_id) == {slow, *fast}, "a job ran twice or not at all"
    late = [job_id for job_id in fast if by_id[job_id]["started"] >= by_id[slow]["ended"]]
    assert not late, f"batches {late} waited behind the long call of their group instead of going back to the pool"


# The fenced statements a worker runs on the jobs it holds (sql/queue.sql), each with its
# parameters for worker `w` and the jobs `done` it names (fail: the first of them).
_FENCED = {
    "complete_and_claim": lambda w, done: {"worker": w, "ids": [j.id for j in done], "attempts": [j.attempts for j in done],
                                           "queues": None, "limit": 0, "lease": 60.0, "kinds": None, "skip_kinds": None},
    "complete_many": lambda w, done: {"worker": w, "ids": [j.id for j in done], "attempts": [j.attempts for j in done]},
    "heartbeat": lambda w, done: {"worker": w, "ids": [j.id for j in done], "attempts": [j.attempts for j in done],
                                  "lease": 60.0},
    "release": lambda w, done: {"worker": w, "ids": [j.id for j in done], "attempts": [j.attempts for j in done]},
    "complete_logged": lambda w, done: {"worker": w, "history": 5, "done": Jsonb(
        [{"id": j.id, "attempt": j.attempts, "entry": {"records": []}} for j in done])},
    "fail": lambda w, done: {"worker": w, "id": done[0].id, "attempt": done[0].attempts, "retry": True, "delay": 1.0,
                             "last_error": "x", "fingerprint": "f", "history": 5, "entry": Jsonb({}), "logs": None},
}


def _generic_plan(conn, name: str, params: dict) -> str:
    """EXPLAIN ANALYZE of the named statement's generic plan, run on `params` and rolled back."""
    return generic_plan(conn, query("queue", name), params)


@pytest.mark.parametrize("name", sorted(_FENCED))
def test_a_fenced_statement_costs_the_jobs_it_names_not_every_job_the_worker_holds(conn, name):
    """The batch=1000 stall (bench/batch_throughput.py: a worker holding ten batches of 1,000
    completed nothing for 15 s): the statistics of a queue table hold almost no running rows, so
    with the fence as constants the generic plan went through jobs_lease_idx and compared every
    job the worker holds with every job of the list (held x finished rows). The fence must be
    compared per id of the list (the primary key, or a hash of the list): no plan row read and thrown
    away per held job."""
    q.enqueue_many(conn, [q.NewJob("batch_record", {"i": i}) for i in range(1500)])
    conn.execute("ANALYZE skiplock.jobs")  # what autovacuum sees on a queue table: all pending, none running
    held = q.claim(conn, "holder", limit=1500, lease=60)
    assert len(held) == 1500
    plan = _generic_plan(conn, name, _FENCED[name]("holder", held[:500]))
    thrown = sum(int(n) for n in re.findall(r"Rows Removed by (?:Join )?Filter: (\d+)", plan))
    # (on a table this small a hash join over a scan of it is as good as the primary key)
    assert "jobs_lease_idx" not in plan and thrown < 100, f"{name} reads the jobs the worker holds:\n{plan}"


@pytest.mark.slow
def test_worker_processes_run_a_batch_kind_beside_a_plain_one_each_job_once(conn, workers):
    """Real `skiplock worker` processes with sync handlers only (tests/batch_tasks.py): the
    plain claim and the batch kind's top-up share the queue, and every job runs once."""
    from tests.batch_tasks import BATCH
    from tests.workers import EXECUTIONS_TABLE

    conn.execute(EXECUTIONS_TABLE)
    conn.execute("CREATE TABLE public.batch_calls (kind text NOT NULL, size integer NOT NULL, ids bigint[] NOT NULL)")
    jobs = [q.NewJob("batch_rows" if i % 3 else "plain_rows", {"i": i}) for i in range(90)]
    ids = q.enqueue_many(conn, jobs)
    procs = [workers.start("--concurrency", "2", tasks="tests.batch_tasks") for _ in range(2)]
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] == 90,
             timeout=90, what="90 jobs completed by two worker processes")
    runs = conn.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall()
    assert sorted(job_id for job_id, _ in runs) == sorted(ids) and {n for _, n in runs} == {1}, "a job ran twice or not at all"
    sizes = dict(conn.execute("SELECT kind, array_agg(size) FROM public.batch_calls GROUP BY kind").fetchall())
    assert set(sizes["plain_rows"]) == {1}
    assert max(sizes["batch_rows"]) <= BATCH and max(sizes["batch_rows"]) > 1, sizes["batch_rows"]
    assert conn.execute("SELECT count(*) FROM public.batch_calls WHERE kind = 'batch_rows' AND size > 1").fetchone()[0] >= 1
    # a SIGTERM that reaches a process still importing kills it (-15): a registered one has its handlers
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0] == 2, what="both workers registered")
    for proc in procs:
        code, err = workers.stop(proc)
        assert code == 0, err
