"""The scheduler: one leader per database, failover within one election interval after the
leader is SIGKILLed, job health in the database, hooks after collection, and sample retention."""

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console import samples, scheduler
from console.collectors import retention
from console.config import load_config
from console.db import connect
from console.samples import Sample
from tests.collector_helpers import eventually


def make_config(**overrides):
    return load_config(env={}, overrides={f"scheduler.{k}": v for k, v in overrides.items()})


@pytest.fixture
def make_scheduler(dsn):
    made = []

    def make(**overrides):
        s = scheduler.Scheduler(dsn, make_config(**overrides))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_only_one_of_two_schedulers_leads_and_only_the_leader_runs_jobs(make_scheduler, conn):
    first, second = make_scheduler(), make_scheduler()
    assert first.elect() is True
    assert second.elect() is False
    assert second.run_job("collect") is False  # a standby does nothing
    assert conn.execute("SELECT count(*) FROM skiplock.collection_runs").fetchone()[0] == 0
    assert first.run_job("collect") is True
    assert samples.last_collection(conn)["leader"] == first.node_id
    state = scheduler.status(conn)
    assert state["leader"]["id"] == first.node_id
    assert {n["id"] for n in state["nodes"]} == {first.node_id, second.node_id}
    [collect] = [j for j in state["jobs"] if j["job"] == "collect"]
    assert collect["runs"] == 1 and collect["last_error"] is None and collect["leader"] == first.node_id
    # The leader closes: its session ends, the lock is free, the standby wins the next tick.
    first.close()
    eventually(second.elect, timeout=5, interval=0.05)
    assert second.run_job("collect") is True
    assert samples.last_collection(conn)["leader"] == second.node_id


def test_a_failing_job_is_recorded_with_its_error_and_the_next_run_works(make_scheduler, conn):
    s = make_scheduler()
    s.elect()
    conn.execute("ALTER TABLE skiplock.jobs RENAME TO jobs_gone")
    try:
        assert s.run_job("reap") is False
    finally:
        conn.execute("ALTER TABLE skiplock.jobs_gone RENAME TO jobs")
    [reap] = [j for j in scheduler.status(conn)["jobs"] if j["job"] == "reap"]
    assert "UndefinedTable" in reap["last_error"] and reap["failures"] == 1 and reap["last_ok_at"] is None
    assert s.run_job("reap") is True
    [reap] = [j for j in scheduler.status(conn)["jobs"] if j["job"] == "reap"]
    assert reap["last_error"] is None and reap["runs"] == 2 and reap["failures"] == 1


def test_a_health_row_that_cannot_be_written_is_logged_with_its_reason(make_scheduler, conn, caplog):
    """Not "(OperationalError)" 84 times: the log line says what went wrong."""
    s = make_scheduler()
    s.elect()
    conn.execute("ALTER TABLE skiplock.scheduler_jobs RENAME TO scheduler_jobs_gone")
    try:
        with caplog.at_level("WARNING", logger="skiplock.scheduler"):
            assert s.run_job("reap") is True  # the job itself ran; only its health row failed
    finally:
        conn.execute("ALTER TABLE skiplock.scheduler_jobs_gone RENAME TO scheduler_jobs")
    assert ('could not record the health of job reap: UndefinedTable: relation "skiplock.scheduler_jobs" '
            'does not exist') in caplog.text


def test_the_reaper_job_rescues_stuck_leases(make_scheduler, conn):
    job_id = q.enqueue(conn, "noop")
    q.claim(conn, "gone", lease=0.01)
    time.sleep(0.05)
    s = make_scheduler()
    s.elect()
    assert s.run_job("reap")
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "pending"


def test_a_scheduled_reap_is_a_maintenance_run_like_a_manual_one(make_scheduler, conn):
    # one path for both: the scheduler's reap goes through console.maintenance.reap, which
    # records the run (actor "scheduler") that the maintenance page and the advisor read
    q.enqueue_many(conn, [q.NewJob("noop") for _ in range(3)])
    q.claim(conn, "gone", limit=3, lease=0.01)
    time.sleep(0.05)
    s = make_scheduler()
    s.elect()
    assert s.run_job("reap")
    row = conn.execute("SELECT actor, outcome, rows, detail FROM skiplock.maintenance_runs WHERE task = 'reap'").fetchall()
    assert [(a, o, n, d["pending"], d["failed"]) for a, o, n, d in row] == [("scheduler", "ok", 3, 3, 0)]


def test_hooks_run_after_each_collection_and_a_failing_hook_is_recorded(make_scheduler, conn, monkeypatch):
    seen = []

    def good(hook_conn, report):
        seen.append((report.run_id, hook_conn.execute("SELECT 1").fetchone()[0]))

    def bad(hook_conn, report):
        raise RuntimeError("alert rules broke")

    monkeypatch.setattr(scheduler, "AFTER_COLLECTION", [])
    scheduler.after_collection(bad)
    scheduler.after_collection(good)
    s = make_scheduler()
    s.elect()
    assert s.run_job("collect") is True
    run_id = conn.execute("SELECT max(id) FROM skiplock.collection_runs").fetchone()[0]
    assert seen == [(run_id, 1)]  # the good hook ran after the bad one failed
    jobs = {j["job"]: j for j in scheduler.status(conn)["jobs"]}
    bad_name = [name for name in jobs if name.endswith(".bad")][0]
    assert "alert rules broke" in jobs[bad_name]["last_error"]


def test_the_archiver_job_moves_old_completed_jobs(make_scheduler, conn):
    q.enqueue_many(conn, [q.NewJob("noop") for _ in range(5)])
    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() - interval '2 hours'")
    s = make_scheduler()
    s.elect()
    assert s.run_job("archive"), [j for j in scheduler.status(conn)["jobs"] if j["job"] == "archive"]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] == 5


def test_retention_rolls_up_then_deletes_in_bounded_batches(conn):
    now = conn.execute("SELECT now()").fetchone()[0]
    old = (now - timedelta(hours=50)).replace(minute=10, second=0, microsecond=0)
    rows = []
    for minute in range(3):
        for second in (0, 15, 30, 45):
            rows.append(Sample("queue_depth", {"queue": "a", "state": "eligible"}, minute * 10 + second / 15, old + timedelta(minutes=minute, seconds=second)))
    rows.append(Sample("queue_depth", {"queue": "a", "state": "eligible"}, 99.0, now - timedelta(minutes=5)))
    samples.store(conn, rows)
    settings = retention.RetentionSettings(batch_size=5, max_batches=1)
    result = retention.run(conn, settings)
    assert result.minute_windows >= 1
    assert result.deleted["raw"] == 5  # one bounded batch of the 12 expired rows
    minute_rows = conn.execute(
        "SELECT bucket, min_value, max_value, avg_value, last_value, samples FROM skiplock.samples_rollup "
        "WHERE resolution = 'minute' ORDER BY bucket").fetchall()
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in minute_rows[:3]] == [
        (0, 3, 1.5, 3, 4), (10, 13, 11.5, 13, 4), (20, 23, 21.5, 23, 4)]
    hour = conn.execute("SELECT min_value, max_value, avg_value, samples FROM skiplock.samples_rollup "
                        "WHERE resolution = 'hour' AND bucket = %s", (old.replace(minute=0),)).fetchone()
    assert hour == (0, 23, 11.5, 12)
    retention.run(conn, retention.RetentionSettings(batch_size=5, max_batches=10))
    remaining = conn.execute("SELECT value FROM skiplock.samples").fetchall()
    assert remaining == [(99.0,)]  # the recent sample stays; every expired one is gone
    # Rolled-up history is still readable for long windows.
    points = samples.series(conn, "queue_depth", since=timedelta(days=3))  # read from the hour rollup
    assert (old.replace(minute=0), 11.5) in [(p["at"], p["value"]) for p in points]


def _leader(conn):
    row = conn.execute("SELECT id, pid, leader_since FROM skiplock.scheduler_nodes WHERE is_leader AND stopped_at IS NULL").fetchone()
    return row


@pytest.mark.slow
def test_a_standby_takes_over_within_one_interval_after_the_leader_is_killed(subprocess_env, conn):
    election = 1.0
    env = {**subprocess_env, "SKIPLOCK_SCHEDULER_ELECTION_INTERVAL": str(election),
           "SKIPLOCK_SCHEDULER_COLLECT_INTERVAL": "0.5", "SKIPLOCK_SCHEDULER_REAP_INTERVAL": "0.5"}
    procs = [subprocess.Popen([sys.executable, "-m", "console", "scheduler"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        first = eventually(lambda: _leader(conn), timeout=20)
        eventually(lambda: conn.execute("SELECT count(*) FROM skiplock.collection_runs WHERE leader = %s", (first[0],)).fetchone()[0] >= 2)
        leader_proc = next(p for p in procs if p.pid == first[1])
        standby_proc = next(p for p in procs if p.pid != first[1])
        # Only the leader collects.
        leaders = {r[0] for r in conn.execute("SELECT DISTINCT leader FROM skiplock.collection_runs")}
        assert leaders == {first[0]}
        killed_at = datetime.now(UTC)
        leader_proc.send_signal(signal.SIGKILL)
        leader_proc.wait(10)

        def new_leader():
            row = conn.execute("SELECT id, pid, leader_since FROM skiplock.scheduler_nodes WHERE is_leader AND pid = %s",
                               (standby_proc.pid,)).fetchone()
            return row

        second = eventually(new_leader, timeout=15, interval=0.05)
        takeover = (second[2] - killed_at).total_seconds()
        # Nominally one election interval. The bound is generous, for a loaded 2-core machine, and
        # still far below what a broken failover would take (waiting out a stale leader's row).
        assert takeover <= election * 10, f"takeover took {takeover:.2f}s"
        eventually(lambda: conn.execute("SELECT count(*) FROM skiplock.collection_runs WHERE leader = %s", (second[0],)).fetchone()[0] >= 1)
        # The job's health row is written when the whole job (cycle + hooks) has finished.
        collect = eventually(lambda: next((j for j in scheduler.status(conn)["jobs"]
                                           if j["job"] == "collect" and j["leader"] == second[0]), None))
        assert collect["last_error"] is None
        jobs = {j["job"]: j for j in scheduler.status(conn)["jobs"]}
        assert jobs["reap"]["runs"] >= 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    assert all(p.returncode in (0, -signal.SIGKILL) for p in procs), [p.stderr.read().decode()[-2000:] for p in procs]
    # A graceful stop is recorded.
    assert conn.execute("SELECT count(*) FROM skiplock.scheduler_nodes WHERE stopped_at IS NOT NULL").fetchone()[0] == 1


def test_scheduler_refuses_an_unmigrated_database(make_database, python_exe):
    env = {**os.environ, "DATABASE_URL": make_database(template=None)}
    result = subprocess.run([python_exe, "-m", "console", "scheduler"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "skiplock migrate" in result.stderr and "Traceback" not in result.stderr


def test_after_a_postgresql_restart_the_next_runs_reconnect_instead_of_failing(pg_cluster, make_scheduler, dsn):
    """Cached job connections die with the server; the next run of each job must reconnect and
    succeed rather than fail once on the stale connection (seen as one warning per job after
    every restart in the soak)."""
    if pg_cluster is None:
        pytest.skip("DATABASE_URL given: this test restarts the private cluster only")
    s = make_scheduler()
    assert s.elect() is True
    assert s.run_job("reap") is True and s.run_job("collect") is True
    pg_cluster.restart()
    eventually(s.elect, timeout=30, interval=0.1)  # the election session died too: lead again
    assert s.run_job("reap") is True, "the first reap after the restart failed on a stale connection"
    assert s.run_job("collect") is True
    with connect(dsn) as conn:
        [reap] = [j for j in scheduler.status(conn)["jobs"] if j["job"] == "reap"]
    assert reap["failures"] == 0 and reap["last_error"] is None
