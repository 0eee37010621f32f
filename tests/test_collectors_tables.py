"""Jobs-table collectors: dead tuples after churn against the table's own threshold, a vacuum
in progress, vacuum that removes nothing under a held snapshot, wraparound ages, sizes."""

import threading
import time

import psycopg
import pytest

from console.db import connect
from tests.collector_helpers import cycle, eventually, flush_stats, value


def churn(conn, rows: int) -> None:
    conn.execute(
        "INSERT INTO skiplock.jobs (queue, kind, status, finished_at) "
        "SELECT 'c', 'noop', 'completed', now() FROM generate_series(1, %s)", (rows,)
    )
    conn.execute("DELETE FROM skiplock.jobs WHERE queue = 'c'")
    flush_stats(conn)


def test_dead_tuples_after_churn_against_the_tables_own_threshold(dsn, conn):
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false, autovacuum_vacuum_threshold = 300)")
    before = cycle(dsn)
    assert value(before, "table_autovacuum_threshold", table="jobs") == 300  # reloptions, scale factor 0
    assert value(before, "table_autovacuum_behind", table="jobs") == 0
    churn(conn, 1500)
    report = eventually(lambda: (r := cycle(dsn)) and value(r, "table_dead_tuples", table="jobs") >= 1500 and r)
    assert value(report, "table_dead_ratio", table="jobs") > 0.9
    assert value(report, "table_autovacuum_behind", table="jobs") == 1
    assert value(report, "table_size_bytes", table="jobs", part="heap") > 8192
    assert value(report, "table_size_bytes", table="jobs", part="indexes") > 0
    assert value(report, "table_xid_age", table="jobs", part="heap") > 0
    assert value(report, "table_mxid_age", table="jobs") >= 0
    assert value(report, "table_dead_tuples", table="jobs_archive") == 0

    conn.execute("VACUUM skiplock.jobs")
    flush_stats(conn)
    after = eventually(lambda: (r := cycle(dsn)) and value(r, "table_vacuum_count", table="jobs", kind="vacuum") >= 1 and r)
    assert value(after, "table_dead_tuples", table="jobs") < 100
    assert value(after, "vacuum_removed_nothing", table="jobs") == 0
    assert value(after, "table_last_autovacuum_age_seconds", table="jobs") < 60


def test_a_vacuum_in_progress_is_reported_with_its_phase(dsn, conn):
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false)")
    conn.execute(
        "INSERT INTO skiplock.jobs (queue, kind, status, finished_at) "
        "SELECT 'v', 'noop', 'completed', now() FROM generate_series(1, 30000)"
    )
    conn.execute("DELETE FROM skiplock.jobs WHERE id % 2 = 0")
    vacuumer = connect(dsn, application_name="skiplock-test-vacuum")
    pid = vacuumer.info.backend_pid
    error: list[BaseException] = []

    def slow_vacuum():
        try:
            vacuumer.execute("SET vacuum_cost_delay = '50ms'")
            vacuumer.execute("SET vacuum_cost_limit = 1")
            vacuumer.execute("VACUUM skiplock.jobs")
        except psycopg.errors.QueryCanceled:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            error.append(exc)

    thread = threading.Thread(target=slow_vacuum)
    thread.start()
    try:
        report = eventually(lambda: (r := cycle(dsn)) and value(r, "vacuum_in_progress", table="jobs") == 1 and r)
        ratio = value(report, "vacuum_heap_scanned_ratio", table="jobs")
        assert 0 <= ratio < 1
        assert value(report, "vacuum_index_passes", table="jobs") == 0
        assert value(report, "table_autovacuum_behind", table="jobs") == 0  # a vacuum is on it
        [progress] = report.details["vacuum_progress"]
        assert progress["pid"] == pid and progress["table"] == "jobs" and not progress["is_auto"]
        assert progress["phase"] in ("scanning heap", "initializing")
        assert progress["wait_event"] in ("VacuumDelay", None)
    finally:
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(10)
        vacuumer.close()
    assert not error
    assert value(cycle(dsn), "vacuum_in_progress", table="jobs") == 0


def test_vacuum_that_removes_nothing_because_a_snapshot_holds_the_horizon(dsn, conn):
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false)")
    holder = connect(dsn, application_name="skiplock-test-holder", autocommit=False)
    try:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM skiplock.queues")  # takes the snapshot
        churn(conn, 2000)
        eventually(lambda: value(cycle(dsn), "table_dead_tuples", table="jobs") >= 2000)
        conn.execute("VACUUM skiplock.jobs")
        flush_stats(conn)
        report = eventually(lambda: (r := cycle(dsn)) and value(r, "table_vacuum_count", table="jobs", kind="vacuum") >= 1 and r)
        assert value(report, "table_dead_tuples", table="jobs") >= 2000
        assert value(report, "vacuum_removed_nothing", table="jobs") == 1
        holders = report.details["xmin_holders"]
        assert holders[0]["pid"] == holder.info.backend_pid
        assert holders[0]["application_name"] == "skiplock-test-holder"
        assert holders[0]["kind"] == "idle_in_transaction"
    finally:
        holder.rollback()
        holder.close()
    conn.execute("VACUUM skiplock.jobs")
    flush_stats(conn)
    cleared = eventually(lambda: (r := cycle(dsn)) and value(r, "table_dead_tuples", table="jobs") < 100 and r)
    assert value(cleared, "vacuum_removed_nothing", table="jobs") == 0


@pytest.mark.parametrize("mode", ["ACCESS EXCLUSIVE"])
def test_sizes_are_not_available_while_the_table_is_locked_exclusively(dsn, mode):
    with connect(dsn, application_name="skiplock-test-locker", autocommit=False) as locker:
        locker.execute(f"LOCK TABLE skiplock.jobs IN {mode} MODE")
        started = time.monotonic()
        report = cycle(dsn, only=("tables",))
        assert time.monotonic() - started < 10  # generous; waiting for the lock would take the whole lock_timeout and report an error
        assert not report.errors
        assert value(report, "table_size_bytes", table="jobs", part="heap") is None
        assert value(report, "table_size_bytes", table="jobs_archive", part="heap") is not None
        locker.rollback()
