"""The claim after a key (console/queue/resume_point.py): what it claims, what it leaves for the next
claim from the head, that its index scan starts at the key (so a horizon holder's dead entries
ahead of it are not walked), and that a worker in that mode loses and repeats nothing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.db import connect
from console.queue.protocol import _claim_after
from console.queue.resume_point import ResumePoint, last_key
from tests.plans import generic_plan
from tests.workers import EXECUTIONS_TABLE, wait_for


class J:
    def __init__(self, id: int, priority: int = 0, run_at: datetime | None = None):
        self.id, self.priority = id, priority
        self.run_at = run_at or datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=id)


# --- the policy --------------------------------------------------------------------------------

def test_the_last_key_is_the_last_in_the_claim_index_order_not_the_last_returned():
    t = datetime(2026, 1, 1, tzinfo=UTC)
    jobs = [J(9, priority=5, run_at=t), J(3, priority=0, run_at=t), J(4, priority=0, run_at=t), J(1, priority=0, run_at=t + timedelta(1))]
    assert last_key(jobs) == (0, t + timedelta(1), 1)  # priority DESC, then run_at, then id
    assert last_key(jobs[:3]) == (0, t, 4)


def test_a_slow_full_claim_from_the_head_resumes_and_the_head_comes_back_in_time():
    r = ResumePoint(slow_s=0.015, min_head_s=1.0, head_cost_share=0.05)
    jobs = [J(1), J(2)]
    r.observe(None, jobs, 2, 0.010, now=100.0)  # fast: stays at the head
    assert r.point(100.1) is None
    r.observe(None, jobs[:1], 2, 0.500, now=100.0)  # slow but short: the queue ran dry, nothing to resume
    assert r.point(100.1) is None
    assert r.observe(None, jobs, 2, 0.020, now=100.0) == "resuming"  # slow and full
    assert r.point(100.5) == last_key(jobs)
    assert r.point(101.0) is None  # the head again after min_head_s
    r.observe(None, jobs, 2, 0.200, now=200.0)  # a head claim of 200 ms: back no sooner than 4 s (5 %)
    assert r.point(203.9) == last_key(jobs) and r.point(204.0) is None


def test_a_larger_claim_may_take_longer_before_it_counts_as_slow():
    """Adaptive claims ask for up to 100 jobs; such a claim takes 5-15 ms with no holder at all."""
    r = ResumePoint(slow_s=0.015)
    hundred = [J(i) for i in range(1, 101)]
    r.observe(None, hundred, 100, 0.025, now=0.0)  # 15 ms and 1 % more per job asked: 30 ms, not slow
    assert r.point(0.1) is None
    assert r.observe(None, hundred, 100, 0.031, now=0.2) == "resuming"
    assert r.observe(None, [J(1), J(2)], 2, 0.016, now=9.0) is None  # still slow at 2 jobs: 15.3 ms


def test_a_short_claim_after_the_key_or_a_fast_head_ends_the_mode():
    r = ResumePoint(slow_s=0.015)
    r.observe(None, [J(1), J(2)], 2, 0.1, now=0.0)
    r.observe(last_key([J(2)]), [J(3), J(4)], 2, 0.001, now=0.1)
    assert r.point(0.2) == last_key([J(4)]) and r.resumed == 1
    r.observe(r.point(0.2), [J(5)], 2, 0.001, now=0.2)  # its priority ran out of due rows
    assert r.point(0.3) is None
    r.observe(None, [J(6), J(7)], 2, 0.1, now=0.3)
    assert r.observe(None, [J(8), J(9)], 2, 0.001, now=5.0) == "at the head"  # the head is cheap again
    assert r.point(5.1) is None


def test_a_threshold_of_zero_milliseconds_means_never():
    r = ResumePoint(slow_s=float("inf"))
    r.observe(None, [J(1)], 1, 60.0, now=0.0)
    assert r.point(0.1) is None


# --- the statement -----------------------------------------------------------------------------

def ids(jobs) -> list[int]:
    return sorted(j.id for j in jobs)


def test_a_claim_after_a_key_takes_its_priority_after_the_key_and_nothing_else(conn, dsn):
    low = q.enqueue_many(conn, [q.NewJob("k", {"i": i}) for i in range(6)])
    with connect(dsn, autocommit=False) as locker:
        locker.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (low[1],))
        _, first = q.complete_and_claim(conn, "w", [], limit=2)  # skips the locked row
        locker.rollback()
    assert ids(first) == [low[0], low[2]]
    key = last_key(first)
    high = q.enqueue(conn, "k", {"urgent": True}, priority=5)  # before the key in the index's order
    later = q.enqueue(conn, "k", {"later": True}, run_at=datetime.now(UTC) + timedelta(hours=1))
    _, after = q.complete_and_claim(conn, "w", first, limit=10, after=key)
    assert ids(after) == low[3:]  # not the skipped row, not the higher priority, not the job not yet due
    _, none_left = q.complete_and_claim(conn, "w", after, limit=10, after=last_key(after))
    assert none_left == []
    _, head = q.complete_and_claim(conn, "w", [], limit=10)  # the head claim finds what the key passed by
    assert ids(head) == sorted([high, low[1]])
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (later,)).fetchone()[0] == "pending"


def test_a_claim_after_a_key_keeps_the_plain_claims_conditions(conn):
    q.enqueue_many(conn, [q.NewJob("k", queue="paused-one") for _ in range(3)] + [q.NewJob("k", queue="other") for _ in range(3)])
    _, first = q.complete_and_claim(conn, "w", [], limit=1, queues=["other"])
    conn.execute("INSERT INTO skiplock.queues (name, paused) VALUES ('paused-one', true) "
                 "ON CONFLICT (name) DO UPDATE SET paused = true")
    _, after = q.complete_and_claim(conn, "w", [], limit=10, after=(0, datetime(2000, 1, 1, tzinfo=UTC), 0))
    assert {j.queue for j in after} == {"other"} and len(after) == 2


def _plan_buffers(conn, sql_text: str, params: dict) -> tuple[int, str]:
    """Shared buffers the generic plan of `sql_text` touched on `params` (rolled back), and the plan."""
    plan = generic_plan(conn, sql_text, params, "ANALYZE, BUFFERS, COSTS OFF, TIMING OFF")
    # the candidates' buffers: the first that the plan reports after its CTE
    part = plan.split("CTE candidates", 1)[1]
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", part.split("Buffers:", 1)[1].split("\n", 1)[0])), plan


def test_under_a_horizon_holder_the_claim_after_the_key_does_not_walk_the_dead_entries_ahead(conn, dsn):
    """What the mode is for: 20,000 jobs claimed and completed while a REPEATABLE READ session
    holds the horizon leave 20,000 entries at the head of the claim index that no scan can mark
    dead. A claim from the head walks them all (and their heap pages: buffers count a page once
    per run of entries on it, so they understate the per-entry work); the claim after the key
    starts past them."""
    q.enqueue_many(conn, [q.NewJob("k", {"i": i}) for i in range(20100)])
    conn.execute("ANALYZE skiplock.jobs")  # the plans a worker's prepared statements settle on
    holder = connect(dsn, autocommit=False)
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM skiplock.jobs")
        done: list = []
        claimed: list = []
        for _ in range(20):
            _, claimed = q.complete_and_claim(conn, "w", done, limit=1000)
            done = claimed
        q.complete_and_claim(conn, "w", done, limit=0)
        key = last_key(claimed)
        params = {"worker": "w", "ids": "{}", "attempts": "{}", "queues": None, "limit": 10, "lease": 60.0,
                  "kinds": None, "skip_kinds": None}
        head, head_plan = _plan_buffers(conn, q.protocol.query("queue", "complete_and_claim"), params)
        after, after_plan = _plan_buffers(conn, _claim_after(), {**params, "after_priority": key[0],
                                                                 "after_run_at": key[1], "after_id": key[2]})
    finally:
        holder.rollback()
        holder.close()
    assert head > 10 * after, (head, after, after_plan)
    assert "Index Cond: ((priority = $" in after_plan and "ROW(run_at, id) > ROW($" in after_plan, after_plan


# --- the worker --------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_worker_claiming_after_its_key_loses_and_repeats_nothing_and_comes_back_to_the_head(conn, dsn, workers):
    """A worker told to resume after every claim (claim_resume_ms tiny) drains a backlog. A job
    a transaction holds locked while the worker passes it (SKIP LOCKED leaves it behind the key)
    and a higher-priority job enqueued mid-drain each run exactly once, and while the backlog
    still has jobs: a claim from the head comes back within its interval."""
    conn.execute(EXECUTIONS_TABLE)
    # no-op jobs (quick), but the one to skip records its runs
    backlog = q.enqueue_many(conn, [q.NewJob("record" if i == 5 else "noop", {"i": i}) for i in range(10_000)])
    locker = connect(dsn, autocommit=False)
    locker.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (backlog[5],))
    # Claims of 5 (no adaptive growth): the backlog must outlast the head's 1 s interval, which
    # claims of 100 would drain 10,000 no-op jobs inside.
    proc = workers.start("--concurrency", "2", "--batch-size", "5",
                         env={"SKIPLOCK_WORKER_CLAIM_RESUME_MS": "0.001", "SKIPLOCK_WORKER_CLAIM_MAX": "0"})

    def ran(job_id: int) -> bool:
        return bool(conn.execute("SELECT count(*) FROM public.executions WHERE job_id = %s", (job_id,)).fetchone()[0])

    def pending() -> int:
        return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'pending'").fetchone()[0]

    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] >= 50,
                 what="50 jobs completed")
        urgent = q.enqueue(conn, "record", {"urgent": True}, priority=9)
        locker.rollback()  # the skipped job is pending again, behind the worker's key
        wait_for(lambda: ran(urgent) and ran(backlog[5]), timeout=30, what="the urgent and the skipped job ran")
        left = pending()
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] == 10_001,
                 timeout=120, what="all 10,001 jobs completed")
    finally:
        locker.close()
        code, err = workers.stop(proc)
    assert code == 0, err
    assert left > 0, "the urgent and the skipped job waited for the end of the backlog"
    per_job = dict(conn.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall())
    assert per_job == {backlog[5]: 1, urgent: 1}
    # each claimed once: a job claimed twice would show two attempts
    assert conn.execute("SELECT count(*), min(attempts), max(attempts) FROM skiplock.jobs WHERE status = 'completed'").fetchone() \
        == (10_001, 1, 1)
