"""Claim latency from the three sources after real worker processes ran: the workers' own
counters, pg_stat_statements deltas for the claim statements, and the rolled-back probe."""

import signal
import subprocess
import sys
import time

from console import queue as q
from console.collectors import Options
from tests.collector_helpers import cycle, eventually, value


def count(conn, status):
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = %s", (status,)).fetchone()[0]


def test_claim_latency_from_workers_pg_stat_statements_and_probe(dsn, conn, subprocess_env):
    env = {**subprocess_env, "SKIPLOCK_WORKER_FLUSH_INTERVAL": "0.3", "SKIPLOCK_WORKER_POLL_INTERVAL": "0.1",
           "SKIPLOCK_QUEUE_BACKOFF_BASE": "0.05"}
    first = cycle(dsn)
    assert value(first, "claim_latency_seconds", queue="all", source="workers", quantile="p50") is None
    probe = value(first, "claim_latency_seconds", queue="all", source="probe", quantile="last")
    assert probe is not None and probe > 0

    worker = subprocess.Popen(
        [sys.executable, "-m", "console", "worker", "--tasks", "tests.collector_tasks", "--concurrency", "2", "--batch-size", "5"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        q.enqueue_many(conn, [q.NewJob("noop") for _ in range(60)])
        eventually(lambda: count(conn, "completed") == 60)
        time.sleep(0.5)  # a counter flush after the last job
        second = cycle(dsn)  # discovers complete_and_claim in pg_stat_statements
        assert value(second, "workers_live") == 1
        assert value(second, "throughput", outcome="completed") > 0
        for quantile in ("p50", "p95", "max"):
            assert value(second, "claim_latency_seconds", queue="all", source="workers", quantile=quantile) > 0
        assert value(second, "pickup_delay_seconds", quantile="p50") >= 0
        assert value(second, "retry_rate") == 0

        q.enqueue_many(conn, [q.NewJob("noop") for _ in range(60)])
        q.enqueue_many(conn, [q.NewJob("fail_once") for _ in range(5)])
        eventually(lambda: count(conn, "completed") == 125, timeout=30)
        time.sleep(0.5)
        third = cycle(dsn)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(20)
    latency = value(third, "claim_latency_seconds", queue="all", source="pg_stat_statements", quantile="mean")
    assert latency is not None and 0 < latency < 1
    assert value(third, "claim_buffers_per_call", statement="complete_and_claim") > 0
    assert value(third, "claim_rows_per_call", statement="all") > 0
    assert value(third, "throughput", outcome="retried") > 0
    assert 0 < value(third, "retry_rate") < 1


def test_probe_claims_roll_back_and_probe_each_queue(dsn, conn):
    q.enqueue(conn, "noop", queue="one")
    q.enqueue(conn, "noop", queue="two")
    report = cycle(dsn, Options(probe_queues=5))
    for queue in ("all", "one", "two"):
        assert value(report, "claim_latency_seconds", queue=queue, source="probe", quantile="last") > 0
    # Nothing was claimed for real.
    assert count(conn, "pending") == 2
    assert conn.execute("SELECT max(attempts) FROM skiplock.jobs").fetchone()[0] == 0


def test_without_pg_stat_statements_the_claim_figures_are_not_available(make_database):
    dsn = make_database(template=None)
    from console.db import connect, migrate

    with connect(dsn) as c:
        migrate(c)
    report = cycle(dsn, only=("statements",))
    assert not report.errors
    assert value(report, "claim_latency_seconds", queue="all", source="pg_stat_statements", quantile="mean") is None
    assert "pg_stat_statements" in report.details
