"""Archival, archive partitions, retention, reaping and the maintenance-run rows, against a
real PostgreSQL. End states are read back from the tables."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from console import audit
from console import queue as q
from console.config import load_config
from console.maintenance import (
    InvalidSettings,
    MaintenanceSettings,
    apply_retention,
    archive_completed,
    archive_size,
    archived_job,
    pause_queue,
    reap,
    resume_queue,
    runs,
)
from console.maintenance.archive import partitions
from console.sqlfiles import query
from tests.maintenance_data import add_completed, add_failed, live_and_archived_ids


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def run_row(conn, run_id):
    return conn.execute(
        "SELECT task, actor, batches, rows, slowest_batch_ms, outcome, error, finished_at FROM skiplock.maintenance_runs WHERE id = %s",
        (run_id,),
    ).fetchone()


def test_archive_moves_only_old_completed_jobs_in_bounded_batches(conn):
    old = add_completed(conn, 250, age=timedelta(hours=3))
    recent = add_completed(conn, 20, age=timedelta(minutes=5))
    failed = add_failed(conn, 5, age=timedelta(hours=5))
    pending = q.enqueue(conn, "later", {})

    result = archive_completed(conn, older_than=timedelta(hours=1), batch_size=100, pause_ms=0)

    assert (result.outcome, result.rows, result.batches) == ("ok", 250, 3)
    live, archived = live_and_archived_ids(conn)
    assert archived == sorted(old)
    assert live == sorted(recent + failed + [pending])
    assert len(set(archived)) == len(archived)
    task, actor, batches, rows, slowest, outcome, error, finished = run_row(conn, result.run_id)
    assert (task, actor, batches, rows, outcome, error) == ("archive", "scheduler", 3, 250, "ok", None)
    assert slowest > 0 and finished is not None
    # every column came along, and the rows sit in a day partition, not the default one
    job = archived_job(conn, old[0])
    assert job["status"] == "completed" and job["payload"] == {"n": 1} and job["purged"] is False
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive_default").fetchone()[0] == 0
    assert archive_size(conn)["partitions"] >= 2
    # a scheduler run is not an operator action
    assert audit.search(conn, action="archive") == []


def test_delete_mode_removes_without_a_copy(conn):
    add_completed(conn, 30, age=timedelta(days=2))
    result = archive_completed(conn, older_than=timedelta(hours=1), mode="delete", batch_size=7, pause_ms=0)
    assert (result.rows, result.batches) == (30, 5)
    assert live_and_archived_ids(conn) == ([], [])


def test_operator_archive_is_audited_and_max_batches_bounds_a_run(conn):
    add_completed(conn, 50, age=timedelta(hours=2))
    result = archive_completed(conn, older_than=timedelta(0), batch_size=10, max_batches=2, pause_ms=0,
                               actor="cli:alice", reason="disk filling up")
    assert result.rows == 20
    live, archived = live_and_archived_ids(conn)
    assert (len(live), len(archived)) == (30, 20)
    [row] = audit.search(conn, action="archive")
    assert (row["actor"], row["reason"], row["rows"], row["outcome"]) == ("cli:alice", "disk filling up", 20, "ok")


def test_stop_event_ends_the_run_between_batches(conn):
    add_completed(conn, 100, age=timedelta(hours=2))
    stop = threading.Event()
    stop.set()
    result = archive_completed(conn, older_than=timedelta(0), batch_size=10, stop=stop)
    assert result.outcome == "cancelled" and result.rows == 0
    assert run_row(conn, result.run_id)[5] == "cancelled"


def test_the_batch_query_walks_the_completed_index_not_the_table(conn):
    add_completed(conn, 2000, age=timedelta(hours=2))
    for _ in range(200):
        q.enqueue(conn, "other", {})
    conn.execute("ANALYZE skiplock.jobs")
    with conn.transaction():
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + query("maintenance", "archive_batch"),
            {"cutoff": datetime.now(UTC), "batch_size": 100, "after_finished_at": "-infinity", "after_id": 0},
        ).fetchone()[0][0]["Plan"]
    scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in plan_nodes(plan)
             if n.get("Relation Name") == "jobs"]
    assert ("Index Scan", "jobs", "jobs_completed_idx") in scans, scans
    assert not any(node == "Seq Scan" for node, _, _ in scans), scans


BAD_SETTINGS = [
    ({"batch_size": 0}, "batch size"),
    ({"batch_size": -5}, "batch size"),
    ({"rate": -1.0}, "rate"),
    ({"rate": 0}, "rate"),
    ({"mode": "shred"}, "mode"),
    ({"older_than": timedelta(seconds=-1)}, "older_than"),
]


def test_bad_settings_are_refused_and_nothing_is_touched(conn):
    add_completed(conn, 10, age=timedelta(hours=2))
    for kwargs, message in BAD_SETTINGS:
        with pytest.raises(InvalidSettings, match=message):
            archive_completed(conn, **{"older_than": timedelta(0), **kwargs})
    assert len(live_and_archived_ids(conn)[0]) == 10
    assert conn.execute("SELECT count(*) FROM skiplock.maintenance_runs").fetchone()[0] == 0


def test_partitions_are_created_ahead_and_retention_drops_whole_old_days(conn):
    today = datetime.now(UTC).date()
    add_completed(conn, 40, age=timedelta(days=10))
    add_completed(conn, 30, age=timedelta(days=3))
    add_completed(conn, 20, age=timedelta(hours=2))
    archive_completed(conn, older_than=timedelta(hours=1), batch_size=25, pause_ms=0, days_ahead=3)
    names = {p["name"] for p in partitions(conn)}
    for delta in (-10, -3, 0, 1, 2, 3):
        assert f"jobs_archive_p{today + timedelta(days=delta):%Y%m%d}" in names
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] == 90

    result = apply_retention(conn, retention=timedelta(days=5), batch_size=10, pause_ms=0, days_ahead=3)

    assert result.outcome == "ok"
    old_day = f"jobs_archive_p{today - timedelta(days=10):%Y%m%d}"
    assert old_day in result.detail["partitions_dropped"]
    assert old_day not in {p["name"] for p in partitions(conn)}
    ages = conn.execute("SELECT min(finished_at) FROM skiplock.jobs_archive").fetchone()[0]
    assert ages > datetime.now(UTC) - timedelta(days=5)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] == 50
    assert run_row(conn, result.run_id)[0] == "retention"


def test_retention_deletes_straddling_and_default_partition_rows_in_batches(conn):
    # Archived rows with no day partition land in the default partition (never refused).
    conn.execute("""
        INSERT INTO skiplock.jobs_archive (id, queue, kind, payload, status, priority, run_at, attempts,
                                           max_attempts, errors, created_at, finished_at)
        SELECT g, 'q', 'k', '{}', 'completed', 0, now(), 1, 5, '[]', now(), now() - interval '400 days' + g * interval '1 second'
        FROM generate_series(1, 35) AS g
    """)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive_default").fetchone()[0] == 35
    result = apply_retention(conn, retention=timedelta(days=30), batch_size=10, pause_ms=0)
    assert (result.rows, result.batches) == (35, 4)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] == 0


def test_retention_refuses_a_zero_batch(conn):
    with pytest.raises(InvalidSettings):
        apply_retention(conn, retention=timedelta(days=1), batch_size=0)


def test_reap_now_rescues_expired_leases_records_a_run_and_audits(conn):
    ids = [q.enqueue(conn, "slow", {}, max_attempts=1 if i % 2 else 3) for i in range(6)]
    q.claim(conn, "w1", limit=6, lease=0.01)
    conn.execute("SELECT pg_sleep(0.05)")
    result = reap(conn, actor="cli:bob", reason="worker host died", batch_size=4)
    assert result.rows == 6 and result.batches == 2
    assert result.detail == {"pending": 3, "failed": 3}
    statuses = dict(conn.execute("SELECT id, status FROM skiplock.jobs").fetchall())
    assert sorted(statuses) == sorted(ids)
    [row] = audit.search(conn, action="reap")
    assert (row["actor"], row["rows"], row["reason"]) == ("cli:bob", 6, "worker host died")
    assert runs.last_by_task(conn)["reap"]["rows"] == 6


def test_pause_and_resume_are_audited(conn):
    pause_queue(conn, "mail", actor="alice", reason="SMTP outage")
    assert q.paused_queues(conn) == ["mail"]
    resume_queue(conn, "mail", actor="alice")
    assert q.paused_queues(conn) == []
    actions = [(r["action"], r["target"], r["reason"]) for r in audit.search(conn)]
    assert actions == [("resume", "queue:mail", None), ("pause", "queue:mail", "SMTP outage")]
    with pytest.raises(InvalidSettings):
        pause_queue(conn, " ", actor="alice")


def test_an_abandoned_run_is_marked_by_the_next_one(conn, dsn):
    from console.db import connect

    other = connect(dsn)
    run_id = runs.start(other, "archive", "scheduler")
    other.close()  # as if the process died mid-run
    conn.execute("SELECT pg_sleep(0.1)")
    runs.start(conn, "retention", "scheduler")
    assert run_row(conn, run_id)[5] == "abandoned"


def test_settings_from_config():
    cfg = load_config(env={"SKIPLOCK_MAINTENANCE_ARCHIVE_AFTER": "2d", "SKIPLOCK_MAINTENANCE_RATE": "500"})
    s = MaintenanceSettings.from_config(cfg)
    assert s.archive_after == timedelta(days=2) and s.rate == 500.0 and s.bulk_rate is None
    assert s.archive_kwargs()["older_than"] == timedelta(days=2)


def test_retention_prunes_old_maintenance_run_rows(conn):
    old = runs.start(conn, "archive", "scheduler")
    runs.finish(conn, old, "ok")
    conn.execute("UPDATE skiplock.maintenance_runs SET started_at = now() - interval '40 days' WHERE id = %s", (old,))
    result = apply_retention(conn, retention=timedelta(days=30), pause_ms=0)
    assert result.detail["runs_pruned"] == 1
    assert [r["id"] for r in runs.recent(conn)] == [result.run_id]
