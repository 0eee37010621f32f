"""Database collectors: the blocking tree on a row lock of the jobs table, MultiXact
consumption from concurrent share locks, horizon holders of each kind, and the console's
own sessions left out of what is reported."""

import threading

import psycopg

from console import queue as q
from console.collectors.database import slru_name
from console.db import connect
from tests.collector_helpers import cycle, eventually, value


def test_a_row_lock_wait_on_jobs_shows_the_holder_at_the_root_of_the_tree(dsn, conn):
    job_id = q.enqueue(conn, "noop")
    holder = connect(dsn, application_name="skiplock-test-holder", autocommit=False)
    waiter = connect(dsn, application_name="skiplock-worker-test", autocommit=False)
    holder.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (job_id,))
    done = threading.Event()

    def blocked_update():
        try:
            waiter.execute("UPDATE skiplock.jobs SET priority = 5 WHERE id = %s", (job_id,))
            waiter.rollback()
        except psycopg.Error:
            pass
        done.set()

    thread = threading.Thread(target=blocked_update)
    thread.start()
    try:
        report = eventually(lambda: (r := cycle(dsn)) and value(r, "lock_waits", relation="jobs") == 1 and r)
        assert value(report, "lock_waits", relation="all") == 1
        assert value(report, "lock_waits", relation="jobs_archive") == 0
        assert value(report, "lock_wait_max_seconds") >= 0
        [root] = report.details["blocking_tree"]
        assert root["pid"] == holder.info.backend_pid
        assert root["application_name"] == "skiplock-test-holder"
        assert root["state"] == "idle in transaction"
        assert root["depth"] == 0
        [blocked] = root["blocks"]
        assert blocked["pid"] == waiter.info.backend_pid
        assert blocked["relation"] == "jobs"
        assert blocked["application_name"] == "skiplock-worker-test"
    finally:
        holder.rollback()
        thread.join(10)
        holder.close()
        waiter.close()
    assert done.is_set()
    assert value(cycle(dsn), "lock_waits", relation="jobs") == 0


def test_concurrent_share_locks_consume_multixacts_visible_in_the_deltas(dsn, conn):
    job_id = q.enqueue(conn, "noop")
    first = cycle(dsn)
    assert value(first, "multixact_consumption_per_second") is None  # needs two cycles
    lockers = [connect(dsn, application_name=f"skiplock-test-share-{i}", autocommit=False) for i in range(6)]
    try:
        for locker in lockers:
            locker.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR SHARE", (job_id,))
    finally:
        for locker in lockers:
            locker.rollback()
            locker.close()
    second = cycle(dsn)
    rate = value(second, "multixact_consumption_per_second")
    consumed = rate * (second.started_at - first.started_at).total_seconds()
    assert consumed >= 5 - 0.01  # the 2nd..6th locker each created a MultiXact
    assert value(second, "database_mxid_age") >= 5
    assert value(second, "lwlock_waits", event="multixact") == 0


def test_an_idle_in_transaction_session_holds_the_horizon_and_is_named(dsn):
    holder = connect(dsn, application_name="skiplock-test-idle", autocommit=False)
    try:
        holder.execute("INSERT INTO skiplock.queues (name) VALUES ('held')")  # an XID: holds the horizon
        report = eventually(lambda: (r := cycle(dsn)) and value(r, "xmin_horizon_age_seconds", holder="idle_in_transaction") > 0 and r, timeout=5)
        assert value(report, "xmin_horizon_age_xids", holder="any") >= 0
        assert value(report, "idle_in_transaction_sessions") >= 1
        [held] = [h for h in report.details["xmin_holders"] if h["pid"] == holder.info.backend_pid]
        assert held["kind"] == "idle_in_transaction"
        assert held["application_name"] == "skiplock-test-idle"
        assert "INSERT INTO skiplock.queues" in held["detail"]
    finally:
        holder.rollback()
        holder.close()


def test_the_consoles_own_sessions_are_not_reported(dsn):
    web = connect(dsn, application_name="skiplock-web", autocommit=False)
    try:
        web.execute("INSERT INTO skiplock.queues (name) VALUES ('console')")
        report = cycle(dsn)
        pids = {h["pid"] for h in report.details["xmin_holders"]}
        assert web.info.backend_pid not in pids
        assert value(report, "xmin_horizon_age_seconds", holder="idle_in_transaction") == 0
    finally:
        web.rollback()
        web.close()


def test_wal_rate_connections_and_limits(dsn, conn):
    cycle(dsn)
    conn.execute("INSERT INTO skiplock.jobs (kind) SELECT 'noop' FROM generate_series(1, 2000)")
    report = cycle(dsn)
    assert value(report, "wal_bytes_per_second") > 0
    assert value(report, "max_connections") >= 10
    assert value(report, "connections", state="all") >= 1  # this test's own connection
    assert 0 <= value(report, "notify_queue_usage") < 1
    assert value(report, "slru_blocks_hit_per_second", slru="transaction") is not None


def test_slru_names_are_normalised_across_versions():
    assert slru_name("MultiXactOffset") == slru_name("multixact_offset") == "multixact_offset"
    assert slru_name("Xact") == "transaction"
    assert slru_name("Subtrans") == "subtransaction"
    assert slru_name("CommitTs") == "commit_timestamp"


def test_the_wal_position_is_the_wal_generated_not_the_wal_written(dsn, conn):
    """The WAL rate reads the insert position: with asynchronous commits (these clusters, and any
    server with synchronous_commit = off) the write position waits for the WAL writer, and two
    collection cycles a moment apart saw a busy server write nothing. WAL of a transaction not
    yet committed is generated but not written: only the insert position has it at once."""
    from console.sqlfiles import query

    writer = connect(dsn, autocommit=False)
    try:
        writer.execute("INSERT INTO skiplock.jobs (kind) SELECT 'noop' FROM generate_series(1, 50)")
        generated = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8").fetchone()[0]
        position = conn.execute(query("collectors_database", "wal_position")).fetchone()
        assert position[2] >= generated  # lsn_bytes
    finally:
        writer.rollback()
        writer.close()
