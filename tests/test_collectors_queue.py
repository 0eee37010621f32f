"""Queue collectors on a real database: depth by state, age, stuck leases, dead letters, the
estimate beyond the exact-count cap, and plans that never scan the jobs table."""

import time
from datetime import UTC, datetime, timedelta

from console import queue as q
from console.collectors import Options, collector_connection
from console.sqlfiles import query
from tests.collector_helpers import cycle, value, values


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
    # One dead letter in the 15-minute window: 4 per hour, from the first cycle on (it used to be
    # the difference of two cycles a collection interval apart: 360 per hour with 10 s cycles).
    assert value(first, "dead_letter_growth", queue="a") == 4.0

    # The reaper sends the stuck job back; another dead letter arrives in a.
    q.reap(conn)
    [again] = q.claim(conn, "w-doomed", queues=["a"])
    q.fail(conn, again, q.DoNotRetry("no"))
    second = cycle(dsn)
    assert value(second, "stuck_leases", queue="b") == 0
    assert value(second, "dead_letters", queue="a") == 2
    assert value(second, "dead_letter_growth", queue="a") == 8.0


def test_dead_letter_growth_counts_the_arrivals_of_the_rate_window(dsn, conn):
    """Arrivals within [scheduler] rate_window per hour, whatever the collection interval: a
    dead letter older than the window, or replayed since, does not count; a stream past the
    cap is divided by the span the newest arrivals cover, not by the whole window."""
    rows = [q.NewJob("noop", queue="dl", max_attempts=1) for _ in range(12)]
    ids = q.enqueue_many(conn, rows)
    for job in q.claim(conn, "w", queues=["dl"], limit=12):
        q.fail(conn, job, q.DoNotRetry("no"))
    # Three arrived 20 minutes ago (outside a 15-minute window), one is replayed.
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '20 minutes' WHERE id = ANY(%s)", (ids[:3],))
    conn.execute("UPDATE skiplock.jobs SET status = 'pending', finished_at = NULL WHERE id = %s", (ids[3],))
    report = cycle(dsn, Options(rate_window=900))
    assert value(report, "dead_letter_growth", queue="dl") == 8 * 4.0  # 8 in 15 min
    assert value(report, "dead_letters", queue="dl") == 11
    shorter = cycle(dsn, Options(rate_window=60))
    assert value(shorter, "dead_letter_growth", queue="dl") == 8 * 60.0  # 8 in the last minute
    # Past the cap: the 5 newest arrivals (2, 4, ... 10 s ago) cover the last 10 seconds, and
    # 5 in 10 s is 1,800 per hour, not 5 in the whole window (20 per hour).
    conn.execute("""UPDATE skiplock.jobs AS j SET finished_at = now() - make_interval(secs => 2 * n.rank)
                    FROM (SELECT id, row_number() OVER (ORDER BY id) AS rank FROM skiplock.jobs
                          WHERE queue = 'dl' AND status = 'failed' AND finished_at > now() - interval '1 minute') AS n
                    WHERE j.id = n.id""")
    capped = cycle(dsn, Options(rate_window=900, failed_queue_limit=5))
    assert 5 * 3600 / 11 <= value(capped, "dead_letter_growth", queue="dl") <= 5 * 3600 / 9.5


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
    params = {"cap": opts.depth_exact_limit, "failed_total_cap": opts.failed_total_limit, "failed_queue_cap": opts.failed_queue_limit,
              "window": opts.rate_window}
    with collector_connection(dsn, opts) as collector:  # the collectors' session settings
        plan = "\n".join(r[0] for r in collector.execute("EXPLAIN " + query("collectors_queue", "queue_snapshot"), params))
    assert "Seq Scan on jobs" not in plan and "Bitmap Heap Scan on jobs" not in plan, plan
    for index in ("jobs_claim_idx", "jobs_lease_idx", "jobs_failed_idx"):
        assert index in plan, plan


def test_a_drained_queue_reports_its_zeros_once_more(dsn, conn):
    """A queue that is not in skiplock.queues and drains is reported once more with zeros, so
    the newest sample the pages read says empty; it was left at its last busy reading (the
    overview showed 43 waiting, 2 min 15 s old, after the queue_age alert had resolved)."""
    q.enqueue(conn, "noop", queue="burst")
    conn.execute("UPDATE skiplock.jobs SET run_at = now() - interval '2 minutes'")
    busy = cycle(dsn)
    assert value(busy, "queue_depth", queue="burst", state="eligible") == 1
    assert value(busy, "queue_age_seconds", queue="burst") >= 120

    [job] = q.claim(conn, "w", queues=["burst"])
    q.complete(conn, job)
    drained = cycle(dsn)
    assert value(drained, "queue_depth", queue="burst", state="eligible") == 0
    assert value(drained, "queue_age_seconds", queue="burst") == 0
    latest = {row[0]: row[1] for row in conn.execute(
        "SELECT metric, value FROM skiplock.samples_latest WHERE labels->>'queue' = 'burst'"
        " AND metric IN ('queue_age_seconds', 'queue_depth') AND coalesce(labels->>'state', 'eligible') = 'eligible'")}
    assert latest == {"queue_age_seconds": 0, "queue_depth": 0}

    # Once its zeros are stored, an empty queue nobody declared is no longer reported.
    gone = cycle(dsn)
    assert values(gone, "queue_depth", queue="burst") == []
