"""The worker runtime in real processes against a real PostgreSQL: draining, retries, kill -9,
a server restart, SIGTERM, pause/resume, heartbeats and bad input.

Each handler in tests/sample_tasks.py that matters here writes one row per execution to
public.executions, so "completed exactly once" is checked by counting real side effects.
Leases, polls and backoff are set short (tests/workers.py FAST_SETTINGS) to keep this quick.
"""

from __future__ import annotations

import signal
import time

import pytest

from console import queue as q
from console.db import connect
from tests.workers import EXECUTIONS_TABLE, cli, scalar, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def db(conn):
    conn.execute(EXECUTIONS_TABLE)
    return conn


def count_status(conn, status: str) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = %s", (status,)).fetchone()[0]


def total_jobs(conn) -> int:
    return conn.execute(
        "SELECT (SELECT count(*) FROM skiplock.jobs) + (SELECT count(*) FROM skiplock.jobs_archive)"
    ).fetchone()[0]


def test_workers_drain_the_queue_completing_each_job_exactly_once(db, workers):
    ids = q.enqueue_many(db, [q.NewJob("record", {"i": i}) for i in range(300)])
    procs = [workers.start("--concurrency", "4") for _ in range(3)]
    wait_for(lambda: count_status(db, "completed") == 300, what="300 completed jobs")
    # Every worker up before they are stopped: at load 10 (two suites side by side) the third
    # was still importing when the other two had run every job, and a SIGTERM then ends a
    # process that has not yet installed its handler (-15).
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.workers WHERE stopped_at IS NULL").fetchone()[0] == 3,
             timeout=60, what="the three workers registered")

    per_job = db.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall()
    assert sorted(job_id for job_id, _ in per_job) == sorted(ids)
    assert {n for _, n in per_job} == {1}, "a job ran more than once"
    assert db.execute("SELECT count(DISTINCT worker_pid) FROM public.executions").fetchone()[0] >= 2
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed' AND attempts = 1").fetchone()[0] == 300
    assert total_jobs(db) == 300

    for proc in procs:
        code, err = workers.stop(proc)
        assert code == 0, err
    # the registry adds up: every job completed was counted by exactly one worker
    claimed, completed, stopped = db.execute(
        "SELECT sum(claimed), sum(completed), count(stopped_at) FROM skiplock.workers"
    ).fetchone()
    assert (claimed, completed, stopped) == (300, 300, 3)


def test_flaky_handlers_attempts_and_final_states_add_up(db, workers):
    jobs = [q.NewJob("flaky", {"fail_times": i % 4}, max_attempts=3) for i in range(40)]
    jobs += [q.NewJob("doomed", {"order": i}, max_attempts=3) for i in range(5)]
    ids = q.enqueue_many(db, jobs)
    procs = [workers.start("--concurrency", "4") for _ in range(2)]
    wait_for(lambda: count_status(db, "completed") + count_status(db, "failed") == 45, what="every job finished")

    rows = db.execute("SELECT id, kind, payload, status, attempts, jsonb_array_length(errors) FROM skiplock.jobs").fetchall()
    executions = dict(db.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall())
    for job_id, kind, payload, status, attempts, errors in rows:
        if kind == "doomed":  # DoNotRetry: straight to the dead letters after one attempt
            assert (status, attempts, errors) == ("failed", 1, 1)
            continue
        fail_times = payload["fail_times"]
        if fail_times < 3:
            assert (status, attempts, errors) == ("completed", fail_times + 1, fail_times), job_id
        else:
            assert (status, attempts, errors) == ("failed", 3, 3), job_id
        assert executions[job_id] == attempts, f"job {job_id}: {executions[job_id]} runs for {attempts} attempts"
    assert total_jobs(db) == len(ids)
    # On a loaded machine one worker may do all 45 before the other has started: a SIGTERM that
    # reaches a process still importing kills it (-15). A registered worker has its handlers.
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0] == 2, what="both workers registered")
    for proc in procs:
        assert workers.stop(proc)[0] == 0
    failed, retried = db.execute("SELECT sum(failed), sum(retried) FROM skiplock.workers").fetchone()
    # 10 jobs fail 3 times (2 retries + dead letter), 5 doomed; retries: 10*1 + 10*2 + 10*2
    assert failed == 15
    assert retried == 10 * 1 + 10 * 2 + 10 * 2


def test_kill_9_mid_job_the_reaper_rescues_it_and_the_late_complete_is_refused(db, workers):
    job_id = q.enqueue(db, "slow_first", {"first_sleep": 60})
    victim = workers.start("--lease", "1")
    wait_for(lambda: db.execute("SELECT count(*) FROM public.executions").fetchone()[0] == 1, what="the job to start")
    held = q.get_job(db, job_id)
    assert held["status"] == "running" and held["attempts"] == 1
    stale = q.Job(**{name: held[name] for name in q.Job.__dataclass_fields__ if name != "extra"})

    victim.kill()  # SIGKILL: no release, no last words
    victim.wait(timeout=10)
    wait_for(lambda: q.reap(db, backoff_base=0.01, backoff_cap=0.01)["pending"] == 1 or q.get_job(db, job_id)["status"] == "pending",
             timeout=10, what="the reaper to rescue the job")
    rescued = q.get_job(db, job_id)
    assert rescued["status"] == "pending" and rescued["errors"][-1]["error_class"] == "LeaseExpired"

    workers.start("--lease", "5")
    wait_for(lambda: q.get_job(db, job_id)["status"] == "completed", what="another worker to complete the job")
    done = q.get_job(db, job_id)
    assert done["attempts"] == 2 and done["locked_by"] != stale.locked_by
    # the killed worker's late calls hold a stale fencing token: all refused, nothing overwritten
    assert q.complete(db, stale) is False
    assert q.fail(db, stale, RuntimeError("late")) is None
    assert q.heartbeat(db, stale) is False
    assert q.release(db, [stale]) == []
    assert q.get_job(db, job_id)["status"] == "completed"
    assert db.execute("SELECT array_agg(attempt ORDER BY attempt) FROM public.executions").fetchone()[0] == [1, 2]


def test_workers_survive_a_postgresql_restart_and_the_queue_drains(pg_cluster, dsn, db, workers):
    if pg_cluster is None:
        pytest.skip("DATABASE_URL given: this test restarts the private cluster only")
    total = 400
    q.enqueue_many(db, [q.NewJob("record", {"i": i, "sleep": 0.01}) for i in range(total)])
    procs = [workers.start("--concurrency", "4", "--lease", "3") for _ in range(2)]
    # The fault hits running workers: both have completed jobs (on a loaded machine one worker can
    # finish 50 jobs before the other has connected; that one would then never see the restart,
    # or see it in the middle of its start-up, which is another test's business).
    wait_for(lambda: (scalar(dsn, "SELECT count(DISTINCT locked_by) FROM skiplock.jobs WHERE status = 'completed'")
                      or 0) >= 2, what="both workers to complete jobs")
    db.close()
    pg_cluster.restart()

    def drained() -> bool:
        # a claim whose commit the worker never heard about stays running until its lease ends:
        # the reaper (the scheduler's job in production) hands it back
        try:
            with connect(dsn) as conn:
                q.reap(conn, backoff_base=0.01, backoff_cap=0.05)
                return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0] == total
        except Exception:
            return False

    wait_for(drained, timeout=60, interval=0.3, what="the queue to drain after the restart")
    dead = [workers.stop(proc) for proc in procs if proc.poll() is not None]
    assert not dead, f"a worker died on the restart: {dead}"
    with connect(dsn) as conn:
        assert total_jobs(conn) == total
        assert conn.execute("SELECT count(DISTINCT job_id) FROM public.executions").fetchone()[0] == total
        assert conn.execute("SELECT count(*) FROM skiplock.workers WHERE last_seen > now() - interval '5 seconds'").fetchone()[0] == 2
    for proc in procs:
        code, err = workers.stop(proc)
        assert code == 0, err
        assert "reconnecting" in err or "lost" in err


def test_sigterm_finishes_in_flight_jobs_releases_the_rest_and_exits_0(db, workers):
    quick = q.enqueue_many(db, [q.NewJob("record", {"sleep": 0.5}, priority=10) for _ in range(2)])
    stuck = q.enqueue_many(db, [q.NewJob("record", {"sleep": 60}, priority=10) for _ in range(2)])
    waiting = q.enqueue_many(db, [q.NewJob("record", {}) for _ in range(5)])
    proc = workers.start("--concurrency", "4", env={"SKIPLOCK_WORKER_SHUTDOWN_GRACE": "3"})
    wait_for(lambda: db.execute("SELECT count(*) FROM public.executions").fetchone()[0] == 4, what="four jobs running")
    proc.send_signal(signal.SIGTERM)  # once: a second signal means "stop now"
    # The stuck jobs sleep 60 s: a worker that waited for them instead of releasing them after
    # its 3 s grace would not exit within this (generous, for a loaded machine) limit.
    _, err = proc.communicate(timeout=45)
    assert proc.returncode == 0, err
    status = {row[0]: row[1:] for row in db.execute("SELECT id, status, attempts, locked_by IS NULL FROM skiplock.jobs")}
    assert {status[i] for i in quick} == {("completed", 1, False)}
    assert {status[i] for i in stuck} == {("pending", 0, True)}, "unfinished jobs go back without counting the attempt"
    assert {status[i] for i in waiting} == {("pending", 0, True)}, "a stopping worker claims nothing new"
    row = db.execute("SELECT stopped_at IS NOT NULL, in_flight, completed FROM skiplock.workers").fetchone()
    assert row == (True, 0, 2)


def test_an_unknown_kind_fails_with_a_clear_error_and_the_worker_carries_on(db, workers):
    unknown = q.enqueue(db, "no_such_kind", {"x": 1}, max_attempts=1)
    proc = workers.start()
    wait_for(lambda: q.get_job(db, unknown)["status"] == "failed", what="the unknown kind to fail")
    job = q.get_job(db, unknown)
    assert job["errors"][-1]["error_class"] == "UnknownTask"
    assert "no handler registered for kind 'no_such_kind'" in job["last_error"]
    after = q.enqueue(db, "record", {})
    wait_for(lambda: q.get_job(db, after)["status"] == "completed", what="the next job")
    assert proc.poll() is None
    assert workers.stop(proc)[0] == 0


def test_a_paused_queue_is_not_claimed_until_resumed(db, workers):
    q.pause(db, "mail")
    mail = q.enqueue_many(db, [q.NewJob("record", {}, queue="mail") for _ in range(5)])
    other = q.enqueue_many(db, [q.NewJob("record", {}) for _ in range(5)])
    proc = workers.start()
    wait_for(lambda: count_status(db, "completed") == 5, what="the unpaused queue to drain")
    time.sleep(1.0)  # several poll intervals: a running worker still leaves the paused queue alone
    rows = db.execute("SELECT id, status, attempts FROM skiplock.jobs WHERE queue = 'mail'").fetchall()
    assert {(s, a) for _, s, a in rows} == {("pending", 0)}
    assert all(q.get_job(db, i)["status"] == "completed" for i in other)
    q.resume(db, "mail")
    wait_for(lambda: all(q.get_job(db, i)["status"] == "completed" for i in mail), timeout=10, what="resumed jobs")
    assert workers.stop(proc)[0] == 0


def test_heartbeats_keep_a_job_longer_than_its_lease_from_being_reaped(db, workers):
    job_id = q.enqueue(db, "record", {"sleep": 3.5})
    proc = workers.start("--lease", "1")
    wait_for(lambda: q.get_job(db, job_id)["status"] == "running", what="the job to start")
    rescued = 0
    deadline = time.monotonic() + 60
    while q.get_job(db, job_id)["status"] == "running":
        assert time.monotonic() < deadline, "the 3.5 s job did not finish within 60 s"
        rescued += sum(v for k, v in q.reap(db).items() if k != "batches")
        time.sleep(0.1)
    job = q.get_job(db, job_id)
    assert rescued == 0
    assert (job["status"], job["attempts"]) == ("completed", 1)
    assert db.execute("SELECT count(*) FROM public.executions").fetchone()[0] == 1
    assert workers.stop(proc)[0] == 0


# --- the command line's messages ---------------------------------------------------------------

def test_invalid_payload_is_refused_by_the_cli(db, subprocess_env):
    result = cli(subprocess_env, "enqueue", "record", "{not json")
    assert result.returncode == 2
    assert "PAYLOAD is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    ok = cli(subprocess_env, "enqueue", "record", '{"n": 1}', "--queue", "mail")
    assert ok.returncode == 0, ok.stderr
    assert q.get_job(db, int(ok.stdout.strip()))["queue"] == "mail"


@pytest.mark.parametrize("command", [["migrate"], ["worker", "--tasks", "tests.sample_tasks"], ["enqueue", "k"]])
def test_a_bad_dsn_gives_a_clear_message(subprocess_env, command):
    env = {**subprocess_env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"}
    result = cli(env, *command)
    assert result.returncode == 1, result.stderr
    assert "cannot connect to postgresql://postgres@127.0.0.1:1/nowhere" in result.stderr
    assert "Traceback" not in result.stderr
    garbled = cli(env, *command, "--dsn", "this is not a dsn")
    assert garbled.returncode == 1
    assert "invalid database address" in garbled.stderr and "Traceback" not in garbled.stderr


@pytest.mark.parametrize("command", [["worker", "--tasks", "tests.sample_tasks"], ["enqueue", "k"]])
def test_a_database_without_the_schema_says_to_run_migrate(make_database, subprocess_env, command):
    empty = make_database(template=None)
    result = cli({**subprocess_env, "DATABASE_URL": empty}, *command)
    assert result.returncode == 1, result.stderr
    assert "run `skiplock migrate` first" in result.stderr
    assert "Traceback" not in result.stderr
    with connect(empty) as conn:
        assert conn.execute("SELECT to_regnamespace('skiplock')").fetchone()[0] is None, "nothing was created"


def test_a_tasks_module_that_does_not_import_is_a_usage_error(subprocess_env):
    result = cli(subprocess_env, "worker", "--tasks", "tests.no_such_module")
    assert result.returncode == 2
    assert "--tasks: cannot import 'tests.no_such_module'" in result.stderr


def test_a_busy_worker_vacuums_the_jobs_table_itself(db, workers):
    """The claim index's dead head is cleaned by the workers within seconds, not once per
    autovacuum_naptime (docs/benchmarks.md has the sustained-throughput numbers)."""
    def manual_vacuums() -> int:
        return db.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'skiplock.jobs'::regclass").fetchone()[0]

    before = manual_vacuums()
    q.enqueue_many(db, [q.NewJob("noop", {}) for _ in range(200)])
    proc = workers.start(env={"SKIPLOCK_WORKER_VACUUM_INTERVAL": "0.3"})
    wait_for(lambda: count_status(db, "completed") == 200, what="the jobs to complete")
    wait_for(lambda: manual_vacuums() > before, timeout=10, what="the worker's VACUUM of skiplock.jobs")
    assert workers.stop(proc)[0] == 0


def test_histogram_observe_many_counts_as_observe_does():
    """The worker observes a batch's pickups and runtimes in one call: same buckets, bounds
    included (an observation equal to a bound falls in that bound's bucket)."""
    from console.histogram import Histogram

    values = [0.0, 0.00025, 0.0003, 0.001, 0.0049, 0.005, 2.5, 61.0]
    one, many = Histogram(), Histogram()
    for value in values:
        one.observe(value)
    many.observe_many(values)
    assert many.counts == one.counts and sum(many.counts) == len(values)
