"""Failover (issue 27): the standby is promoted under load and everything follows by itself.

A private primary with a synchronous streaming standby (synchronous_commit on, so a commit a
client saw acknowledged is on the standby too: asynchronous replication may lose the last
transactions, and docs/reliability.md says so). Workers, the scheduler and the console are
given a multi-host address (`host=primary,standby target_session_attrs=read-write`, here as a
URL with two host:port pairs). Mid-run the primary is stopped at once (as a crash would) and
the standby promoted. Then:
- every job enqueued (all committed before the crash) completes: nothing is lost;
- a job runs twice only if it was in flight when the primary died: duplicates stay within what
  the two workers held (their handler threads and one batch ahead each);
- the scheduler leads again, on the new primary, and collects;
- the console, started before the failover, answers from the new primary and its Database
  page says when this server took over (the timeline changed).

The cluster is this module's own and is stopped in a `finally`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from console import queue as q
from console.db import connect, migrate
from console.pgcluster import PrivateCluster
from tests.collector_helpers import eventually
from tests.workers import EXECUTIONS_TABLE, FAST_SETTINGS, ROOT, stop_processes

pytestmark = pytest.mark.slow

JOBS = 400
CONCURRENCY = 4
BATCH = 10
STANDBY = "failover_standby"


@pytest.fixture
def pair() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    primary = PrivateCluster(settings={"fsync": "off", "synchronous_commit": "on", "wal_keep_size": "256MB"})
    standby = None
    try:
        primary.start()
        with connect(primary.dsn) as admin:
            admin.execute("CREATE DATABASE app")
        with connect(primary.dsn_for("app")) as conn:
            migrate(conn)
            conn.execute(EXECUTIONS_TABLE)
        standby = primary.start_standby(STANDBY, settings={"wal_receiver_status_interval": "1s"})
        # Synchronous from here on (set before, every commit would wait for a standby not yet
        # there; set in the primary's own config only, so the promoted standby waits for none).
        with connect(primary.dsn) as admin:
            admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
            admin.execute("SELECT pg_reload_conf()")
            eventually(lambda: admin.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                       .fetchone()[0] == 1, timeout=30)
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")


def both(primary: PrivateCluster, standby: PrivateCluster) -> str:
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/app"
            "?target_session_attrs=read-write&connect_timeout=2")


def scalar(dsn: str, sql: str):
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return conn.execute(sql).fetchone()[0]
    except psycopg.Error:
        return None


def test_promoting_the_standby_under_load_loses_nothing_and_everyone_follows(pair, tmp_path):
    primary, standby = pair
    dsn = both(primary, standby)
    env = {**__import__("os").environ, **FAST_SETTINGS, "DATABASE_URL": dsn, "PYTHONPATH": str(ROOT),
           "SKIPLOCK_WORKER_LEASE": "3", "SKIPLOCK_WORKER_CONCURRENCY": str(CONCURRENCY),
           "SKIPLOCK_WORKER_BATCH_SIZE": str(BATCH), "SKIPLOCK_SCHEDULER_ELECTION_INTERVAL": "0.5",
           "SKIPLOCK_SCHEDULER_COLLECT_INTERVAL": "1", "SKIPLOCK_SCHEDULER_REAP_INTERVAL": "1"}
    for key in ("SKIPLOCK_CONFIG",):
        env.pop(key, None)
    with connect(primary.dsn_for("app")) as conn:
        ids = q.enqueue_many(conn, [q.NewJob("record", {"sleep": 0.05}) for _ in range(JOBS)])
    procs = [subprocess.Popen([sys.executable, "-m", "console", *args], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for args in (("worker", "--tasks", "tests.sample_tasks"), ("worker", "--tasks", "tests.sample_tasks"),
                          ("scheduler",))]
    from console.web import create_app

    app = create_app({"database.dsn": dsn, "web.secret_key": "failover", "web.production": False,
                      "web.db_wait": 5.0, "TESTING": True})
    try:
        viewer = _viewer(app, primary)
        completed = "SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'"
        eventually(lambda: (scalar(dsn, completed) or 0) >= JOBS // 4, timeout=60, interval=0.05)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM skiplock.collection_runs") or None, timeout=30)
        primary.halt(mode="immediate")  # the primary dies: no shutdown, no goodbye to the clients
        failed_at = time.monotonic()
        standby.promote()
        promoted_in = time.monotonic() - failed_at

        eventually(lambda: scalar(dsn, completed) == JOBS, timeout=120, interval=0.2)
        recovered_in = time.monotonic() - failed_at
        with connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s)", (ids,)).fetchone()[0] == JOBS
            never = conn.execute("SELECT count(*) FROM unnest(%s::bigint[]) AS j(id) WHERE NOT EXISTS "
                                 "(SELECT 1 FROM public.executions AS e WHERE e.job_id = j.id)", (ids,)).fetchone()[0]
            runs, distinct = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM public.executions").fetchone()
        assert never == 0, f"{never} jobs completed without running"
        duplicates = runs - distinct
        assert duplicates <= 2 * (CONCURRENCY + BATCH), f"{duplicates} jobs ran twice"

        # The scheduler leads on the new primary and collects there.
        leader = eventually(lambda: scalar(dsn, "SELECT count(*) FROM skiplock.scheduler_nodes WHERE is_leader "
                                                "AND last_seen > now() - interval '3 seconds'"), timeout=30)
        assert leader == 1
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM skiplock.collection_runs WHERE started_at > "
                                       "pg_postmaster_start_time()") or None, timeout=30)
        # The console started before: its pool follows, and its Database page says what happened.
        failovers = eventually(lambda: (viewer.get("/api/v1/health").get_json() or {}).get("wal", {}).get("failovers"),
                               timeout=30)
        assert [f["to"] for f in failovers] == [2] and failovers[0]["from"] == 1
        assert 'data-failover="2"' in viewer.get("/health").get_data(as_text=True)
        print(f"failover: promoted in {promoted_in:.1f} s; all {JOBS} jobs completed {recovered_in:.1f} s after the "
              f"primary died; {duplicates} ran twice (in flight at the crash)")
    finally:
        stop_processes(procs, timeout=20)
        app.extensions["skiplock"].close()


def _viewer(app, primary: PrivateCluster):
    from console.users import start_session
    from tests.web_fixtures import CSRF

    with connect(primary.dsn_for("app")) as conn:
        conn.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES ('viewer', 'x', 'viewer')")
        token = start_session(conn, "viewer", "127.0.0.1", "failover")
    client = app.test_client()
    with client.session_transaction() as session:
        session["csrf"] = CSRF
        session["sid"] = token
    return client
