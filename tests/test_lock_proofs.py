"""Promises that rest on a lock, proved in lockstep rather than by racing.

Each test pauses one real caller inside its transaction right after the statement that does
the work the lock protects (tests/lockstep.py swaps that connection's cursor class; the
product code runs unchanged), starts a second caller, checks in pg_locks that the second waits
on a lock the first holds, lets the first commit, and checks the bound once both are done.
With the lock gone the second does not wait and the bound breaks, on every run: the mutations
named in docs/reliability.md ("Promises that rest on a lock") were each run five times.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.db import connect
from console.queue import limits, periodic
from console.sqlfiles import query
from tests.collector_helpers import eventually
from tests.lockstep import Lockstep, wait_until_blocked

WINDOW = timedelta(minutes=10)


@pytest.fixture
def steps():
    return Lockstep()


@pytest.fixture
def session(dsn, steps):
    """Factory of autocommit connections, closed after the test once every pause is released
    and every call has ended (a failed assertion leaves no caller paused)."""
    made = []

    def make(name: str = "skiplock-test", **kwargs):
        c = connect(dsn, application_name=name, **kwargs)
        made.append(c)
        return c

    yield make
    steps.close(made)
    for c in made:
        c.close()


def running(conn, **where) -> int:
    clause = " AND ".join(f"{k} = %({k})s" for k in where) or "true"
    return conn.execute(f"SELECT count(*) FROM skiplock.jobs WHERE status = 'running' AND {clause}",  # noqa: S608
                        where).fetchone()[0]


def enqueue(conn, n: int, kind: str, queue: str = "default") -> None:
    for _ in range(n):
        q.enqueue(conn, kind, {}, queue=queue)


# --- queue and kind limits (console/queue/limits.py, sql/limits.sql) -------------------------------

def test_a_limited_queue_claim_waits_for_the_claim_in_progress_and_the_concurrency_holds(conn, session, steps):
    limits.set_limits(conn, "lim", concurrency=2, actor="test")
    enqueue(conn, 5, "plain", queue="lim")
    a, b = session("claimer-a"), session("claimer-b")
    paused = steps.pause_after(a, query("limits", "claim_queue"))
    first = steps.call(lambda: limits.claim_from_queue(a, "lim", "worker-a", limit=5), "claimer-a")
    paused.wait_reached()  # a holds the queue's lock and two uncommitted claims
    second = steps.call(lambda: limits.claim_from_queue(b, "lim", "worker-b", limit=5), "claimer-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["locktype"] == "advisory" and wait["blockers"] == [a.info.backend_pid], wait

    paused.release()
    assert len(first.result()) == 2
    assert second.result() == []  # it counted a's claims once a committed
    assert running(conn, queue="lim") == 2


def test_a_rate_limited_queue_claim_waits_and_spends_each_token_once(conn, session, steps):
    limits.set_limits(conn, "slow", rate="1/m", actor="test")  # a bucket of one token, one more a minute
    enqueue(conn, 3, "plain", queue="slow")
    a, b = session("claimer-a"), session("claimer-b")
    paused = steps.pause_after(a, query("limits", "claim_queue"))
    first = steps.call(lambda: limits.claim_from_queue(a, "slow", "worker-a", limit=3), "claimer-a")
    paused.wait_reached()
    second = steps.call(lambda: limits.claim_from_queue(b, "slow", "worker-b", limit=3), "claimer-b")

    # On the queue's advisory lock, not only on the bucket's row (which a second claimer reaches
    # after it has already claimed with the tokens it read before).
    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["locktype"] == "advisory" and wait["blockers"] == [a.info.backend_pid], wait

    paused.release()
    assert len(first.result()) == 1
    assert second.result() == []
    assert running(conn, queue="slow") == 1
    tokens = conn.execute("SELECT tokens FROM skiplock.queues WHERE name = 'slow'").fetchone()[0]
    assert 0 <= tokens < 1


def test_a_limited_kind_claim_waits_for_the_claim_in_progress_and_the_concurrency_holds(conn, session, steps):
    limits.declare_kinds(conn, {"render": 1}, worker="test")
    enqueue(conn, 3, "render")
    a, b = session("claimer-a"), session("claimer-b")
    paused = steps.pause_after(a, query("limits", "claim_kind"))
    first = steps.call(lambda: limits.claim_kind(a, "render", "worker-a", limit=3), "claimer-a")
    paused.wait_reached()
    second = steps.call(lambda: limits.claim_kind(b, "render", "worker-b", limit=3), "claimer-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["locktype"] == "advisory" and wait["blockers"] == [a.info.backend_pid], wait

    paused.release()
    assert len(first.result()) == 1
    assert second.result() == []
    assert running(conn, kind="render") == 1


def test_a_limited_kinds_jobs_in_a_limited_queue_wait_for_that_queues_lock_too(conn, session, steps):
    limits.set_limits(conn, "lim", concurrency=1, actor="test")
    limits.declare_kinds(conn, {"render": 5}, worker="test")  # room for the kind: the queue binds
    enqueue(conn, 1, "plain", queue="lim")
    enqueue(conn, 2, "render", queue="lim")
    a, b = session("claimer-a"), session("claimer-b")
    paused = steps.pause_after(a, query("limits", "claim_queue"))
    first = steps.call(lambda: limits.claim_from_queue(a, "lim", "worker-a", limit=5), "claimer-a")
    paused.wait_reached()  # a holds lim's lock and its one slot (the plain job)
    second = steps.call(lambda: limits.claim_kind(b, "render", "worker-b", limit=5, limited_queues=["lim"]), "claimer-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["locktype"] == "advisory" and wait["blockers"] == [a.info.backend_pid], wait

    paused.release()
    assert [j.kind for j in first.result()] == ["plain"]
    assert second.result() == []
    assert running(conn, queue="lim") == 1


# --- uniqueness windows (console/queue/producer.py _enqueue_unique) ------------------------------------

def window_rows(conn, key: str) -> list[tuple]:
    return conn.execute("SELECT job_id, created_at, expires_at FROM skiplock.unique_keys WHERE idempotency_key = %s",
                        (key,)).fetchall()


def test_a_second_enqueue_of_a_key_waits_for_the_first_and_returns_its_job(conn, session, steps):
    a = session("enqueuer-a", autocommit=False)
    b = session("enqueuer-b", autocommit=False)
    first_id = q.enqueue(a, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)  # a's transaction stays open
    second = steps.call(lambda: q.enqueue(b, "ship", {}, idempotency_key="order-7", unique_for=WINDOW), "enqueuer-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["blockers"] == [a.info.backend_pid], wait

    a.commit()
    assert second.result() == first_id
    b.commit()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE idempotency_key = 'order-7'").fetchone()[0] == 1
    [(job_id, _, _)] = window_rows(conn, "order-7")  # one window, the first job's
    assert job_id == first_id


def test_two_enqueues_taking_over_an_expired_window_make_one_job_and_one_window(conn, session, dsn, steps):
    from console import maintenance

    old = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    [job] = q.claim(conn, "w", limit=1)
    assert q.complete(conn, job)
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s", (old,))
    assert maintenance.archive_completed(conn, older_than=timedelta(hours=1), actor="test").rows == 1
    conn.execute("UPDATE skiplock.unique_keys SET expires_at = now() - interval '1 second'")

    a = session("enqueuer-a", autocommit=False)
    b = session("enqueuer-b", autocommit=False)
    first_id = q.enqueue(a, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    assert first_id != old
    second = steps.call(lambda: q.enqueue(b, "ship", {}, idempotency_key="order-7", unique_for=WINDOW), "enqueuer-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["blockers"] == [a.info.backend_pid], wait

    a.commit()
    assert second.result() == first_id
    b.commit()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE idempotency_key = 'order-7'").fetchone()[0] == 1
    [(job_id, _, _)] = window_rows(conn, "order-7")
    assert job_id == first_id


# --- periodic slots (console/queue/periodic.py enqueue_due) ----------------------------------------

T0 = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def test_a_second_scheduler_waits_on_the_schedule_and_neither_enqueues_nor_misses_a_slot_twice(conn, session, steps):
    [entry] = periodic.parse_entries([("[[periodic]] #1", {"name": "tick", "kind": "k", "every": "1m"}, "config")])
    periodic.sync(conn, [entry])
    periodic.enqueue_due(conn, [entry], now=T0)  # first sight
    later = T0 + timedelta(minutes=5, seconds=30)  # five slots due: the newest runs, four are missed
    a, b = session("scheduler-a"), session("scheduler-b")
    paused = steps.pause_after(a, query("periodic", "lock_entry"))
    first = steps.call(lambda: periodic.enqueue_due(a, [entry], now=later), "scheduler-a")
    paused.wait_reached()  # a holds the schedule's row, nothing enqueued yet
    second = steps.call(lambda: periodic.enqueue_due(b, [entry], now=later), "scheduler-b")

    wait = wait_until_blocked(conn, b.info.backend_pid, second)
    assert wait["blockers"] == [a.info.backend_pid] and "skiplock.periodic AS p" in wait["query"], wait

    paused.release()
    assert first.result().missed == {"tick": 4}
    assert second.result().enqueued == {} and second.result().missed == {}
    keys = [k for (k,) in conn.execute("SELECT idempotency_key FROM skiplock.jobs").fetchall()]
    assert keys == ["periodic:tick:2030-01-01T03:05:00+00:00"]
    assert conn.execute("SELECT missed FROM skiplock.periodic WHERE name = 'tick'").fetchone()[0] == 4
    assert conn.execute("SELECT count(*) FROM skiplock.periodic_runs").fetchone()[0] == 1


# --- one runner per bulk operation (console/maintenance/bulk.py run) --------------------------

def test_a_bulk_operation_held_by_a_runner_is_left_alone_by_a_second(conn, session, dsn, steps):
    from console.maintenance import bulk
    from tests.maintenance_data import add_failed

    add_failed(conn, 12)
    op_id = bulk.start(conn, "replay", bulk.Selection(all=True), actor="alice", batch_size=5)
    runner = session("skiplock-bulk-runner")  # a runner mid-operation: it holds the session lock
    assert runner.execute(query("deadletters", "op_try_lock"), bulk._lock_params(op_id)).fetchone()[0]

    second = bulk.run(dsn, op_id)  # returns at once, touching nothing

    assert second["state"] == "queued" and second["done"] == 0
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0] == 12
    runner.close()  # the runner's session ends (it died): the next runner works it
    assert bulk.run(dsn, op_id)["state"] == "done"
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'pending'").fetchone()[0] == 12


# --- one scheduler leader per database (console/scheduler.py elect) ---------------------------

def test_a_scheduler_does_not_lead_while_another_session_holds_the_election_lock(dsn, conn, session):
    from console import scheduler
    from console.config import load_config

    holder = session(scheduler.LEADER_APP)  # the leader, in another process
    assert holder.execute(query("scheduler", "try_lock"), {"key": scheduler.ELECTION_KEY}).fetchone()[0]
    s = scheduler.Scheduler(dsn, load_config(env={}))
    try:
        assert s.elect() is False and s.elect() is False
        assert s.run_job("reap") is False
        assert conn.execute("SELECT count(*) FROM skiplock.maintenance_runs").fetchone()[0] == 0
        holder.close()  # the leader's session ends (its backend exits a moment later): the lock goes with it
        eventually(s.elect, timeout=5, interval=0.05)
        held = conn.execute("SELECT l.pid FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.granted "
                            "AND l.objid = %s::bigint %% 4294967296", (scheduler.ELECTION_KEY,)).fetchall()
        assert held == [(s._lock_conn.info.backend_pid,)]
        assert s.run_job("reap") is True
    finally:
        s.close()
