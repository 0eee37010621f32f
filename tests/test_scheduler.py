"""The scheduler: one leader per database, failover within one election interval after the
leader is SIGKILLed, job health in the database, hooks after collection, and sample retention."""

import itertools
import json
import logging
import os
import signal
import socket
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
from tests.workers import stop_processes


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


def test_retention_prunes_rows_of_scheduler_processes_gone_longer_than_raw_samples_are_kept(conn):
    conn.execute("""INSERT INTO skiplock.scheduler_nodes (id, host, pid, started_at, last_seen, stopped_at) VALUES
        ('crashed-long-ago', 'h', 1, now() - interval '60 hours', now() - interval '50 hours', NULL),
        ('stopped-long-ago', 'h', 2, now() - interval '60 hours', now() - interval '49 hours', now() - interval '49 hours'),
        ('crashed-lately', 'h', 3, now() - interval '10 hours', now() - interval '1 hour', NULL),
        ('live', 'h', 4, now() - interval '70 hours', now(), NULL)""")
    result = retention.run(conn, retention.RetentionSettings(batch_size=1, max_batches=1))
    assert result.deleted["scheduler_nodes"] == 1  # one bounded batch, the oldest first
    assert "crashed-long-ago" not in {r[0] for r in conn.execute("SELECT id FROM skiplock.scheduler_nodes")}
    retention.run(conn, retention.RetentionSettings(batch_size=1))
    left = {r[0] for r in conn.execute("SELECT id FROM skiplock.scheduler_nodes")}
    assert left == {"crashed-lately", "live"}  # a live node started 70 h ago stays


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
        stop_processes(procs)
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


# Sessions of the storm's scheduler older than this are terminated on every sweep: a job's
# connection dies at any point of its use (as in a restart or a failover), while the fresh
# connection a run opens in its place lives long enough to record the run.
STORM_SPARE_MS = 300
# Jobs whose health record is stopped midway now and then (not collect: its connection's
# lock_timeout would end the record's wait before the session is terminated).
STORM_TRAPS = ("reap", "periodic", "archive", "alerts_deliver", "retention")


def _end_a_health_record_midway(conn, job: str) -> list[str]:
    """Hold `job`'s health row so that its next record waits on the lock, then terminate the
    session that waits: the connection is lost in the middle of the record. [job] when it was.
    (pg_locks, not pg_stat_activity: the latter is a snapshot taken once per transaction.)"""
    with conn.transaction():
        if conn.execute("SELECT 1 FROM skiplock.scheduler_jobs WHERE job = %s FOR UPDATE", (job,)).fetchone() is None:
            return []  # not recorded yet
        until = time.monotonic() + 2
        while time.monotonic() < until:
            ended = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(l.pid)) FROM pg_locks AS l "
                "WHERE NOT l.granted AND pg_backend_pid() = ANY(pg_blocking_pids(l.pid))").fetchone()[0]
            if ended:
                return [job]
            time.sleep(0.005)
    return []


@pytest.mark.slow
def test_concurrent_jobs_under_connection_faults_neither_crash_nor_lose_a_health_record(subprocess_env, dsn, conn, tmp_path):
    """Every job at 50 ms in a child `Scheduler.run()` for 8 s while the parent terminates its
    sessions: the child must exit 0 (it died with SIGSEGV when all jobs shared one connection
    for their health records, and closed it under each other), and every run it counted must
    be in skiplock.scheduler_jobs."""
    env = {**subprocess_env, "PYTHONFAULTHANDLER": "1"}
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err:  # files, not pipes: a full pipe would stall it
        child = subprocess.Popen([sys.executable, "-m", "tests.scheduler_storm", dsn, "8"], env=env,
                                 stdout=out, stderr=err)
    dbname = conn.info.dbname
    kills, trapped = 0, []
    deadline = time.monotonic() + 90
    try:
        for sweep in itertools.count():
            if child.poll() is not None or time.monotonic() > deadline:
                break
            kills += conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'skiplock-%%' AND pid <> pg_backend_pid() "
                "AND backend_start < now() - make_interval(secs => %s)",
                (dbname, STORM_SPARE_MS / 1000.0)).fetchone()[0]
            if sweep % 10 == 5:
                trapped += _end_a_health_record_midway(conn, STORM_TRAPS[len(trapped) % len(STORM_TRAPS)])
            time.sleep(0.1)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
            pytest.fail(f"the scheduler hung (no exit within 90 s): {err_path.read_text()[-3000:]}")
    err = err_path.read_text()
    assert child.returncode == 0, f"the scheduler died (exit {child.returncode}): {err[-6000:]}"
    assert "Fatal Python error" not in err, err[-6000:]
    assert kills >= 10, f"only {kills} sessions were terminated: the faults did not happen"
    assert len(trapped) >= 3, f"only {trapped} health records were ended midway: the faults did not happen"
    attempted = json.loads(out_path.read_text().strip().splitlines()[-1])
    recorded = {job: runs for job, runs in conn.execute("SELECT job, runs FROM skiplock.scheduler_jobs")}
    assert {"collect", "reap", "archive", "periodic", "alerts_deliver"} <= set(attempted)
    lost = {job: (n, recorded.get(job, 0)) for job, n in attempted.items() if recorded.get(job, 0) != n}
    assert not lost, f"runs without their health record (attempted, recorded): {lost}; {err[-3000:]}"


# --- restarts ---------------------------------------------------------------------------------

def _node(conn, node_id: str, host: str, started_ago: float, seen_ago: float, stopped: bool = False) -> None:
    """A scheduler_nodes row as a process leaves it: started, last seen, stopped cleanly or not."""
    conn.execute(
        "INSERT INTO skiplock.scheduler_nodes (id, host, pid, started_at, last_seen, stopped_at) "
        "VALUES (%(id)s, %(host)s, %(pid)s, now() - make_interval(secs => %(started)s), "
        "now() - make_interval(secs => %(seen)s), CASE WHEN %(stopped)s THEN now() - make_interval(secs => %(seen)s) END)",
        {"id": node_id, "host": host, "pid": abs(hash(node_id)) % 100_000, "started": started_ago, "seen": seen_ago,
         "stopped": stopped})


def _restarts_sample(dsn) -> float:
    from console import collectors

    with collectors.collector_connection(dsn) as cconn:
        report = collectors.collect(cconn, only=("restarts",), store=False)
    [value] = [s.value for s in report.samples if s.metric == "scheduler_restarts"]
    return value


def test_a_restart_is_a_process_that_replaced_one_that_died_not_a_standby_nor_a_deploy(conn, dsn):
    # Host a crashed twice in the last 15 min (a1, then its replacement a2); a3 runs now.
    _node(conn, "a1", "a", started_ago=1200, seen_ago=600)
    _node(conn, "a2", "a", started_ago=590, seen_ago=300)
    _node(conn, "a3", "a", started_ago=290, seen_ago=1)
    # Host b: a second standby started next to a running one.
    _node(conn, "b1", "b", started_ago=3600, seen_ago=1)
    _node(conn, "b2", "b", started_ago=60, seen_ago=1)
    # Host g: a second standby started between two election ticks of the running one.
    _node(conn, "g1", "g", started_ago=3600, seen_ago=3)
    _node(conn, "g2", "g", started_ago=2, seen_ago=1)
    # Host c: a deploy (the old process stopped cleanly, the new one started).
    _node(conn, "c1", "c", started_ago=3600, seen_ago=300, stopped=True)
    _node(conn, "c2", "c", started_ago=290, seen_ago=1)
    # Host d: a crash and its restart, 40 min ago (outside the window).
    _node(conn, "d1", "d", started_ago=3600, seen_ago=2400)
    _node(conn, "d2", "d", started_ago=2390, seen_ago=1)
    # Host e: a crash long ago, its restart stopped cleanly since, then a start: the start
    # follows the clean stop, not the crash.
    _node(conn, "e1", "e", started_ago=7200, seen_ago=3000)
    _node(conn, "e2", "e", started_ago=2990, seen_ago=400, stopped=True)
    _node(conn, "e3", "e", started_ago=390, seen_ago=1)
    # Host f runs two schedulers; one of them crashed and was started again.
    _node(conn, "f1", "f", started_ago=3600, seen_ago=1)
    _node(conn, "f2", "f", started_ago=3500, seen_ago=120)
    _node(conn, "f3", "f", started_ago=110, seen_ago=1)
    restarts = scheduler.status(conn)["restarts"]
    assert [(r["id"], r["replaced"]) for r in restarts] == [("f3", "f2"), ("a3", "a2"), ("a2", "a1")]
    assert _restarts_sample(dsn) == 3.0


@pytest.mark.slow
def test_a_crashed_and_restarted_scheduler_fires_scheduler_restarts_and_shows_on_the_maintenance_page(
        subprocess_env, conn, client_as):
    """Two schedulers (one a standby) fire nothing; SIGSEGV to the leader, as the crash did, and a
    supervisor's restart: the alert fires and the Maintenance page names both processes."""
    env = {**subprocess_env, "SKIPLOCK_SCHEDULER_ELECTION_INTERVAL": "0.5", "SKIPLOCK_SCHEDULER_COLLECT_INTERVAL": "0.5"}

    def spawn():
        return subprocess.Popen([sys.executable, "-m", "console", "scheduler"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cycles_after(moment) -> int:
        return conn.execute("SELECT count(*) FROM skiplock.collection_runs WHERE started_at > %s", (moment,)).fetchone()[0]

    def restarts_alert():
        return conn.execute("SELECT state, value FROM skiplock.alerts WHERE rule = 'scheduler_restarts'").fetchone()

    procs = [spawn(), spawn()]
    try:
        eventually(lambda: conn.execute("SELECT count(*) FROM skiplock.scheduler_nodes").fetchone()[0] == 2, timeout=30)
        both_up = conn.execute("SELECT now()").fetchone()[0]
        eventually(lambda: cycles_after(both_up) >= 3, timeout=30)
        assert (restarts_alert() or ("ok",))[0] == "ok"  # a standby next to the leader is no restart
        leader_pid = eventually(lambda: (conn.execute(
            "SELECT pid FROM skiplock.scheduler_nodes WHERE is_leader AND stopped_at IS NULL").fetchone() or [None])[0],
            timeout=10)
        crashed = next(p for p in procs if p.pid == leader_pid)
        crashed.send_signal(signal.SIGSEGV)
        assert crashed.wait(15) == -signal.SIGSEGV
        # The crashed process counts as dead once unseen for 30 s: rather than wait, move the
        # nodes' history 31 s back (the live standby says it is alive again at its next tick).
        conn.execute("UPDATE skiplock.scheduler_nodes SET last_seen = last_seen - interval '31 seconds', "
                     "started_at = started_at - interval '31 seconds'")
        procs.append(spawn())  # the supervisor restarts it
        state = eventually(lambda: (restarts_alert() or (None,))[0] == "firing" and restarts_alert(), timeout=30)
        assert state == ("firing", 1.0)
    finally:
        stop_processes(procs)
    page = client_as("viewer").get("/maintenance").get_data(as_text=True)
    section = page.split('id="scheduler-restarts"', 1)[1].split("</table>", 1)[0]
    assert "Restarted 1 time in the last 15 minutes" in section
    assert f">{procs[2].pid}<" in section and f">{leader_pid}<" in section


def test_a_health_record_that_cannot_be_written_is_logged_with_its_reason_and_no_password(caplog):
    """The warning names the error's message, not only its class (it said `(OperationalError)`),
    and a DSN in it keeps its password out of the log."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sched = scheduler.Scheduler(f"postgresql://skiplock:hunter2secret@127.0.0.1:{port}/gone", make_config())
    sched.is_leader = True  # as if elected: the run and its record both meet the closed port
    try:
        with caplog.at_level(logging.WARNING, logger="skiplock.scheduler"):
            assert sched.run_job("reap") is False
    finally:
        sched.close()
    [line] = [r.getMessage() for r in caplog.records if "could not record the health of job reap" in r.getMessage()]
    assert "DatabaseError: cannot connect to" in line and "Connection refused" in line, line
    assert "hunter2secret" not in caplog.text
