"""Queue and kind limits in one process against a real PostgreSQL: validation, set/show/clear
(audited), the fast claim leaving limited queues and kinds alone, the limited claim keeping
concurrency and the token bucket, and the fast claim's plan still walking the claim index.

The fleet-wide behaviour with real worker processes is in tests/test_limits_workers.py.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

import console
from console import queue as q
from console.queue import limits, protocol
from console.queue.worker import Worker
from console.sqlfiles import query
from tests.workers import wait_for


def fill(conn, n: int, *, queue: str, kind: str = "noop") -> list[int]:
    with conn.transaction():
        return q.enqueue_many(conn, [q.NewJob(kind, {}, queue=queue) for _ in range(n)])


def running(conn, queue: str) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'running' AND queue = %s", (queue,)).fetchone()[0]


@pytest.mark.parametrize(("text", "message"), [
    ("10", "is not a rate"),
    ("10/h", "is not a rate"),
    ("-1/s", "is not a rate"),
    ("1.5/s", "is not a rate"),
    ("0/s", "at least 1"),
])
def test_bad_rates_are_refused_with_the_reason(text, message):
    with pytest.raises(limits.InvalidLimit, match=message):
        limits.parse_rate(text)


@pytest.mark.parametrize(("value", "message"), [(0, "at least 1"), (-2, "at least 1"), ("x", "not a whole number"),
                                                 ("2.5", "not a whole number"), (True, "whole number")])
def test_bad_concurrency_is_refused_with_the_reason(value, message):
    with pytest.raises(limits.InvalidLimit, match=message):
        limits.parse_concurrency(value)


def test_rates_parse_per_second_and_per_minute():
    assert limits.parse_rate("10/s") == limits.Rate(10, 1)
    assert limits.parse_rate(" 30 / m ") == limits.Rate(30, 60)
    assert limits.parse_rate("30/m").burst == 1.0
    assert limits.parse_rate("50/s").burst == 50.0
    assert str(limits.parse_rate("30/min")) == "30/m"


def test_set_show_clear_is_audited(conn):
    result = limits.set_limits(conn, "mail", concurrency=3, rate="20/m", actor="alice", reason="provider quota")
    assert result["before"] == {"concurrency": None, "rate": None, "burst": None, "group_concurrency": None}
    assert result["after"] == {"concurrency": 3, "rate": "20/m", "burst": 1.0, "group_concurrency": None}
    # A limit not given keeps its value.
    assert limits.set_limits(conn, "mail", concurrency=5, actor="alice")["after"]["rate"] == "20/m"
    shown = limits.queue_limits(conn)
    assert [(r["queue"], r["concurrency"], r["rate"], r["running"]) for r in shown] == [("mail", 5, "20/m", 0)]
    limits.set_limits(conn, "mail", clear=True, actor="bob", reason="quota lifted")
    assert limits.queue_limits(conn) == []
    audit = conn.execute("SELECT actor, action, target, reason, detail FROM skiplock.audit_log ORDER BY id").fetchall()
    assert [(a[0], a[1], a[2], a[3]) for a in audit] == [
        ("alice", "set limits", "queue:mail", "provider quota"),
        ("alice", "set limits", "queue:mail", None),
        ("bob", "clear limits", "queue:mail", "quota lifted"),
    ]
    assert audit[2][4] == {"before": {"concurrency": 5, "rate": "20/m", "burst": 1.0, "group_concurrency": None},
                           "after": {"concurrency": None, "rate": None, "burst": None, "group_concurrency": None}}


def test_nothing_to_set_is_refused(conn):
    with pytest.raises(limits.InvalidLimit, match="nothing to set"):
        limits.set_limits(conn, "mail", actor="alice")
    with pytest.raises(limits.InvalidLimit, match="queue"):
        limits.set_limits(conn, " ", concurrency=1, actor="alice")
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0] == 0


def test_fast_claim_leaves_limited_queues_and_kinds_alone(conn):
    fill(conn, 5, queue="lim")
    fill(conn, 5, queue="free")
    fill(conn, 3, queue="free", kind="scarce")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    limits.declare_kinds(conn, {"scarce": 1, "noop": None}, worker="w")
    claimed = q.claim(conn, "w1", limit=100)
    assert {(j.queue, j.kind) for j in claimed} == {("free", "noop")} and len(claimed) == 5
    _, more = q.complete_and_claim(conn, "w1", claimed, limit=100)
    assert more == []
    # Lifting the limit hands the queue back to the fast claim.
    limits.set_limits(conn, "lim", clear=True, actor="t")
    assert len(q.claim(conn, "w1", limit=100)) == 5


def test_limited_claim_keeps_the_concurrency(conn):
    fill(conn, 30, queue="lim")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    first = limits.claim_from_queue(conn, "lim", "w1", limit=10)
    assert len(first) == 2
    assert limits.claim_from_queue(conn, "lim", "w2", limit=10) == []
    q.complete(conn, first[0])
    again = limits.claim_from_queue(conn, "lim", "w2", limit=10)
    assert len(again) == 1 and running(conn, "lim") == 2
    # A running job whose lease expired (a killed worker) still holds its slot until reaped.
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 second' WHERE status = 'running'")
    assert limits.claim_from_queue(conn, "lim", "w2", limit=10) == []
    assert q.reap(conn)["pending"] == 2
    assert running(conn, "lim") == 0
    assert len(limits.claim_from_queue(conn, "lim", "w2", limit=10)) == 2


def test_limited_claim_keeps_the_rate(conn):
    fill(conn, 40, queue="lim")
    limits.set_limits(conn, "lim", rate="5/s", actor="t")
    before_first = time.monotonic()
    assert len(limits.claim_from_queue(conn, "lim", "w1", limit=20)) == 5  # a full bucket: the burst
    after_first = time.monotonic()
    assert limits.claim_from_queue(conn, "lim", "w1", limit=20) == []
    time.sleep(0.45)
    before_third = time.monotonic()
    refilled = len(limits.claim_from_queue(conn, "lim", "w1", limit=20))
    after_third = time.monotonic()
    # The bucket refills at 5/s from the first claim, which emptied it: about 0.45 s × 5/s,
    # floored, but bounded by the clock around the statements (a loaded machine stretches them).
    assert 2 <= refilled and math.floor(5 * (before_third - after_first)) <= refilled \
        <= math.floor(5 * (after_third - before_first)), (refilled, after_third - before_first)
    time.sleep(3)
    assert len(limits.claim_from_queue(conn, "lim", "w1", limit=20)) == 5  # capped at the burst
    # Claims over the whole test: within rate × elapsed + burst.
    span = conn.execute("SELECT extract(epoch FROM max(locked_at) - min(locked_at)) FROM skiplock.jobs"
                        " WHERE locked_at IS NOT NULL").fetchone()[0]
    assert 12 <= 5 * float(span) + 5


def test_paused_limited_queue_claims_nothing(conn):
    fill(conn, 3, queue="lim")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    q.pause(conn, "lim")
    assert limits.claim_from_queue(conn, "lim", "w1", limit=10) == []
    q.resume(conn, "lim")
    assert len(limits.claim_from_queue(conn, "lim", "w1", limit=10)) == 2


def test_kind_limit_holds_across_queues_and_with_a_queue_limit(conn):
    fill(conn, 4, queue="a", kind="scarce")
    fill(conn, 4, queue="b", kind="scarce")
    fill(conn, 4, queue="lim", kind="scarce")
    fill(conn, 4, queue="lim", kind="noop")
    limits.declare_kinds(conn, {"scarce": 3}, worker="w")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    got = limits.claim_kind(conn, "scarce", "w1", limit=10, limited_queues=["lim"])
    assert len(got) == 3 and all(j.kind == "scarce" for j in got)
    assert limits.claim_kind(conn, "scarce", "w2", limit=10, limited_queues=["lim"]) == []
    # The queue path takes only unlimited kinds from the limited queue.
    from_queue = limits.claim_from_queue(conn, "lim", "w1", limit=10)
    assert [j.kind for j in from_queue] == ["noop", "noop"]
    # Room for the kind again, but the limited queue is full: the kind's jobs come from a and b.
    q.complete_many(conn, got)
    more = limits.claim_kind(conn, "scarce", "w1", limit=10, limited_queues=["lim"])
    assert len(more) == 3 and {j.queue for j in more} <= {"a", "b"}
    q.complete_many(conn, more + from_queue)
    conn.execute("DELETE FROM skiplock.jobs WHERE queue IN ('a', 'b')")
    last = limits.claim_kind(conn, "scarce", "w1", limit=10, limited_queues=["lim"])
    assert [j.queue for j in last] == ["lim", "lim"]  # the queue's limit of 2 binds before the kind's 3


def test_declared_kinds_follow_the_code(conn):
    limits.declare_kinds(conn, {"scarce": 2, "noop": None}, worker="w1")
    assert [(r["kind"], r["concurrency"]) for r in limits.kind_limits(conn)] == [("scarce", 2)]
    limits.declare_kinds(conn, {"scarce": None}, worker="w2")  # a new deployment lifted the limit
    assert limits.kind_limits(conn) == []


def test_fast_claim_still_walks_the_claim_index(conn):
    fill(conn, 2000, queue="free")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    conn.execute("ANALYZE skiplock.jobs")
    conn.execute("ANALYZE skiplock.queues")
    for name in ("claim", "complete_and_claim"):
        sql = query("queue", name)
        params = {"worker": "w", "ids": [], "attempts": [], "queues": None, "limit": 10, "lease": 60.0,
                  "kinds": None, "skip_kinds": None}  # complete_and_claim: any kind (not a mixed worker)
        with conn.transaction():
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall())
        # The candidates walk the claim index; the limits are two hashed subplans beside it.
        assert "Index Scan using jobs_claim_idx" in plan, plan
        assert plan.count("hashed SubPlan") == 2, plan


def test_a_unit_that_gave_nothing_rests_until_poked(conn):
    """A full or empty limited queue (kind) is not retried every claim round: each try is its
    own transaction (lock, room, claim: three statements and a commit), so retrying it after
    each finished job of an unlimited queue would cost those queues that much per round."""
    fill(conn, 3, queue="lim")
    limits.set_limits(conn, "lim", concurrency=1, actor="t")
    limits.declare_kinds(conn, {"scarce": 1}, worker="w")
    claimer = limits.LimitedClaimer("w1", None, 60.0, rest=1.0)
    claimer.refresh(conn)
    assert len(claimer.claim(conn, 10, now=100.0)) == 1  # the queue's one slot; the kind has no jobs
    assert claimer.resting(100.5) == {("queue", "lim"), ("kind", "scarce")}
    claimer.poke(queue="default", kind="noop")  # an unlimited queue's job finished: nothing wakes
    assert claimer.resting(100.5) == {("queue", "lim"), ("kind", "scarce")}
    assert claimer.claim(conn, 10, now=100.5) == []
    claimer.poke(queue="lim", kind="noop")  # one of its jobs finished here
    assert claimer.resting(100.5) == {("kind", "scarce")}
    claimer.poke_new_jobs("lim")
    assert claimer.resting(100.5) == set()
    assert claimer.resting(101.5) == set()  # rests one poll interval at most


# --- a limited unit's try reads its own jobs, not the others' backlog (issue 14) ---

def backlog(conn, n: int, *, queue: str = "default", kind: str = "noop", hours_ago: float = 2.0) -> None:
    """n eligible jobs in one statement (enqueue_many would take seconds at this size)."""
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, run_at) "
                 "SELECT %s, %s, now() - make_interval(secs => %s) + g * interval '1 microsecond' "
                 "FROM generate_series(1, %s) AS g", (queue, kind, hours_ago * 3600, n))


def buffers_of(conn, name: str, params: dict) -> tuple[int, int]:
    """(shared buffers hit + read, rows) of one run of a limits.sql statement, rolled back."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("limits", name), params).fetchone()[0][0]
    top = plan["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0), top.get("Actual Rows", 0)


def test_a_limited_try_reads_its_own_jobs_not_the_unlimited_backlog(conn):
    """Without its indexes a try of a limited kind or queue walks the claim index (priority,
    run_at) past every eligible job of the others, one heap fetch each: ~300 buffers here,
    7,000-10,000 at 500,000 jobs (bench/limits_explain.py). With them (built by the scheduler
    while something is limited) it reads its own unit's head and stops."""
    backlog(conn, 20_000)
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    limits.declare_kinds(conn, {"scarce": 1}, worker="w")
    assert limits.keep_claim_indexes(conn) == {"jobs_kind_claim_idx": "built", "jobs_queue_claim_idx": "built"}
    conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    kind = {"kind": "scarce", "limit": 1, "queues": None, "worker": "w", "lease": 60.0}
    queue = {"queue": "lim", "kind": None, "limit": 2, "worker": "w", "lease": 60.0}
    # Nothing of its own: a few buffers, not the backlog.
    for name, params in (("claim_kind", kind), ("claim_queue", queue)):
        buffers, rows = buffers_of(conn, name, params)
        assert rows == 0 and buffers < 40, f"{name} with nothing eligible read {buffers} buffers"
    # Its jobs behind the whole backlog (enqueued later): found at once, still a few buffers.
    backlog(conn, 5, kind="scarce", hours_ago=1.0)
    backlog(conn, 5, queue="lim", hours_ago=1.0)
    conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    for name, params, want in (("claim_kind", kind, 1), ("claim_queue", queue, 2)):
        buffers, rows = buffers_of(conn, name, params)
        assert rows == want and buffers < 60, f"{name} read {buffers} buffers for {rows} job(s)"
    claimed = limits.claim_kind(conn, "scarce", "w", limit=5)
    assert [j.kind for j in claimed] == ["scarce"]  # its concurrency, in claim order
    assert {j.queue for j in limits.claim_from_queue(conn, "lim", "w", limit=5)} == {"lim"}


def claim_indexes(conn) -> dict[str, bool]:
    return {r[0]: r[1] for r in conn.execute(query("limits", "claim_indexes_present"),
                                             {"names": list(limits.CLAIM_INDEXES)}).fetchall()}


def test_the_limited_paths_indexes_exist_only_while_something_is_limited(conn):
    """A team without limits pays no enqueue or vacuum cost for them: no index until a queue or
    kind is limited, each built for its own kind of unit, rebuilt when a failed build left it
    invalid, dropped when the last limit of its kind goes."""
    assert limits.keep_claim_indexes(conn) == {} and claim_indexes(conn) == {}
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    assert limits.keep_claim_indexes(conn) == {"jobs_queue_claim_idx": "built"}
    assert claim_indexes(conn) == {"jobs_queue_claim_idx": True}
    assert limits.keep_claim_indexes(conn) == {}  # nothing to do: nothing done
    limits.declare_kinds(conn, {"scarce": 1}, worker="w")
    assert limits.keep_claim_indexes(conn) == {"jobs_kind_claim_idx": "built"}
    # A CREATE INDEX CONCURRENTLY that failed leaves an invalid index: it is built again.
    conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'skiplock.jobs_kind_claim_idx'::regclass")
    assert limits.keep_claim_indexes(conn) == {"jobs_kind_claim_idx": "rebuilt"}
    assert claim_indexes(conn) == {"jobs_kind_claim_idx": True, "jobs_queue_claim_idx": True}
    limits.set_limits(conn, "lim", clear=True, actor="t")
    assert limits.keep_claim_indexes(conn) == {"jobs_queue_claim_idx": "dropped"}
    limits.declare_kinds(conn, {"scarce": None}, worker="w")  # the kind lost its limit
    assert limits.keep_claim_indexes(conn) == {"jobs_kind_claim_idx": "dropped"} and claim_indexes(conn) == {}


def test_keeping_the_indexes_puts_the_callers_time_limits_back(conn):
    """The build's 15-minute statement limit and 5 s lock limit are session settings (CREATE
    INDEX CONCURRENTLY refuses a transaction): after a build, and after a run with nothing to
    do, the connection's own limits are what they were, not the server's defaults."""
    conn.execute("SET statement_timeout = '7s'")
    conn.execute("SET lock_timeout = '3s'")
    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    assert limits.keep_claim_indexes(conn) == {"jobs_queue_claim_idx": "built"}
    assert limits.keep_claim_indexes(conn) == {}
    assert conn.execute("SHOW statement_timeout").fetchone()[0] == "7s"
    assert conn.execute("SHOW lock_timeout").fetchone()[0] == "3s"


def test_the_scheduler_keeps_the_limited_paths_indexes(dsn, conn):
    from console.config import load_config
    from console.scheduler import Scheduler

    limits.set_limits(conn, "lim", concurrency=2, actor="t")
    scheduler = Scheduler(dsn, load_config(env={}))
    try:
        assert scheduler.elect() and scheduler.run_job("claim_indexes")
    finally:
        scheduler.close()
    assert claim_indexes(conn) == {"jobs_queue_claim_idx": True}


def test_due_says_whether_a_round_would_try_any_unit(conn):
    limits.set_limits(conn, "lim", concurrency=1, actor="t")
    limits.declare_kinds(conn, {"scarce": 1}, worker="w")
    claimer = limits.LimitedClaimer("w1", None, 60.0, rest=1.0)
    claimer.refresh(conn)
    assert claimer.due(100.0)
    claimer.claim(conn, 10, now=100.0)  # both empty: both rest
    assert not claimer.due(100.5)
    claimer.poke(kind="scarce")
    assert claimer.due(100.5)
    assert claimer.due(101.5) and not limits.LimitedClaimer("w2", None, 60.0).due(0.0)  # no units: never due


@console.task("limits_plain")
def _plain(job):
    pass


def test_a_worker_whose_limited_units_rest_adds_no_statement_to_the_round(dsn, conn, monkeypatch):
    """With a limited kind present but resting (nothing of it to claim), each round is what it is
    without limits: one completion (complete_many, just before the claim: docs/benchmarks.md,
    "Completing apart") and the fast claim; the limited path tries nothing."""
    limits.declare_kinds(conn, {"scarce": 1}, worker="t")
    fill(conn, 300, queue="default", kind="limits_plain")
    calls = {"complete_many": 0, "claim_kind": 0}

    def counting(name, real):
        def spy(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return spy

    # The worker calls the protocol module, not the package face that re-exports it.
    monkeypatch.setattr(protocol, "complete_many", counting("complete_many", protocol.complete_many))
    monkeypatch.setattr(limits, "claim_kind", counting("claim_kind", limits.claim_kind))
    # A long poll interval: the kind, tried at start, rests for the whole test.
    # claim_max = batch_size: claims of 5 whichever modules this process imported (a worker whose
    # process also registers async handlers keeps batch_size; one that does not would grow its claims).
    worker = Worker(dsn, concurrency=2, batch_size=5, claim_max=5, lease=60, poll_interval=60, flush_interval=0.5,
                    vacuum_interval=0, name="limits-rest")
    thread = threading.Thread(target=worker.run, name="limits-rest")
    thread.start()
    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] == 300,
                 timeout=60, what="300 jobs completed")
        seen = dict(calls)
        rounds = worker.counters.claim_calls
    finally:
        worker.stop(immediately=True)
        thread.join(timeout=20)
    assert not thread.is_alive(), "the worker did not stop within 20 s"
    assert rounds >= 300 // 5, rounds  # batches of at most 5: at least 60 claim rounds
    # The kind is tried at start and once more when the listener connects (limits re-read).
    assert seen["claim_kind"] <= 3, seen
    # One completion per round at most (a few more while the worker is idle at the end: a
    # finished batch waits BATCH_WAIT for a claim, then completes alone).
    assert seen["complete_many"] <= rounds + 3, f"{seen}, {rounds} rounds: more than one completion a round"
