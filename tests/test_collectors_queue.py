"""Queue collectors on a real database: depth by state, age, stuck leases, dead letters, the
estimate beyond the exact-count cap, and plans that never scan the jobs table."""

import time
from datetime import UTC, datetime, timedelta

from console import queue as q
from console.collectors import Options, collector_connection
from console.sqlfiles import query
from tests.collector_helpers import cycle, value


def test_depth_age_stuck_and_dead_letters_by_queue(dsn, conn):
    for _ in range(3):
        q.enqueue(conn, "noop", queue="a")
    later = datetime.now(UTC) + timedelta(hours=1)
    q.enqueue(conn, "noop", queue="a", run_at=later)
    q.enqueue(conn, "noop", queue="a", run_at=later)
    q.enqueue(conn, "noop", queue="b")
    conn.execute("UPDATE skiplock.jobs SET run_at = now() - interval '90 seconds' WHERE queue = 'b'")
    [stuck] = q.claim(conn, "w-stuck", queues=["b"], lease=0.05)
    [doomed] = q.claim(conn, "w-doomed", queues=["a"])
    q.fail(conn, doomed, q.DoNotRetry("no"))
    time.sleep(0.2)

    first = cycle(dsn)
    assert not first.errors
    assert value(first, "queue_depth", queue="a", state="eligible") == 2
    assert value(first, "queue_depth", queue="a", state="scheduled") == 2
    assert value(first, "queue_depth", queue="a", state="failed") == 1
    assert value(first, "queue_depth", queue="b", state="running") == 1
    assert value(first, "queue_depth", queue="b", state="eligible") == 0
    assert value(first, "stuck_leases", queue="b") == 1
    assert value(first, "stuck_leases", queue="a") == 0
    assert value(first, "dead_letters", queue="a") == 1
    assert value(first, "queue_depth_estimated") == 0
    assert value(first, "queue_age_seconds", queue="a") >= 0
    assert value(first, "queue_age_seconds", queue="b") == 0  # nothing eligible left in b
    assert value(first, "dead_letter_growth", queue="a") is None  # needs two cycles

    # The reaper sends the stuck job back; another dead letter arrives in a.
    q.reap(conn)
    [again] = q.claim(conn, "w-doomed", queues=["a"])
    q.fail(conn, again, q.DoNotRetry("no"))
    second = cycle(dsn)
    assert value(second, "stuck_leases", queue="b") == 0
    assert value(second, "dead_letters", queue="a") == 2
    assert value(second, "dead_letter_growth", queue="a") > 0


def test_oldest_eligible_job_sets_the_queue_age(dsn, conn):
    q.enqueue(conn, "noop", queue="old")
    conn.execute("UPDATE skiplock.jobs SET run_at = now() - interval '10 minutes'")
    report = cycle(dsn)
    assert 590 <= value(report, "queue_age_seconds", queue="old") <= 700


def test_a_backlog_beyond_the_cap_is_scaled_to_the_planner_estimate(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("noop", queue="big") for _ in range(400)])
    conn.execute("ANALYZE skiplock.jobs")
    report = cycle(dsn, Options(depth_exact_limit=50))
    assert value(report, "queue_depth_estimated") == 1
    assert 360 <= value(report, "queue_depth", queue="big", state="eligible") <= 440
    exact = cycle(dsn, Options(depth_exact_limit=1000))
    assert value(exact, "queue_depth_estimated") == 0
    assert value(exact, "queue_depth", queue="big", state="eligible") == 400


def test_dead_letters_split_by_queue_scales_to_the_exact_total(dsn, conn):
    rows = [q.NewJob("noop", queue="x" if i % 4 else "y", max_attempts=1) for i in range(40)]
    q.enqueue_many(conn, rows)
    conn.execute("UPDATE skiplock.jobs SET status = 'failed', finished_at = now() - (id || ' seconds')::interval")
    report = cycle(dsn, Options(failed_queue_limit=8))
    total = value(report, "dead_letters", queue="x") + value(report, "dead_letters", queue="y")
    assert 38 <= total <= 42


def test_queue_queries_walk_the_partial_indexes(dsn, conn):
    # Enough completed rows that a scan of the table would be the planner's worst option.
    conn.execute(
        """INSERT INTO skiplock.jobs (queue, kind, status, finished_at)
           SELECT 'q' || (i % 3), 'noop', CASE WHEN i % 50 = 0 THEN 'pending' WHEN i % 97 = 0 THEN 'failed' ELSE 'completed' END,
                  CASE WHEN i % 50 = 0 THEN NULL ELSE now() END
           FROM generate_series(1, 20000) AS i"""
    )
    conn.execute("VACUUM ANALYZE skiplock.jobs")
    opts = Options(depth_exact_limit=100)
    params = {"cap": opts.depth_exact_limit, "failed_total_cap": opts.failed_total_limit, "failed_queue_cap": opts.failed_queue_limit}
    with collector_connection(dsn, opts) as collector:  # the collectors' session settings
        plan = "\n".join(r[0] for r in collector.execute("EXPLAIN " + query("collectors_queue", "queue_snapshot"), params))
    assert "Seq Scan on jobs" not in plan and "Bitmap Heap Scan on jobs" not in plan, plan
    for index in ("jobs_claim_idx", "jobs_lease_idx", "jobs_failed_idx"):
        assert index in plan, plan
