"""PGQueuer and Procrastinate watched through [[external_queues]], against the real libraries:
their schemas created by their own tools (`pgq install`, `procrastinate schema --apply`), their
own producers and workers, and their own reports (PGQueuer's Queries.queue_size, Procrastinate's
JobManager.list_queues) compared with the collectors' figures. One database per library, set up
once for the module."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from console import external
from console.collectors import Options
from console.config import ConfigError, ExternalQueue
from console.db import connect
from console.metrics import render_samples
from tests import external_workers as w
from tests.collector_helpers import cycle, eventually, value, values
from tests.conftest import dsn_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_async(coroutine):
    """asyncio.run in a thread of its own: in a worker process that already ran a Playwright
    (sync API) test, the main thread still has an event loop, and asyncio.run refuses to start
    another one there ("cannot be called from a running event loop")."""
    result: dict[str, object] = {}

    def target():
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="run-async")
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the library's coroutine did not finish within 120 s"
    if "error" in result:
        raise result["error"]
    return result.get("value")
_count = itertools.count()


@pytest.fixture(scope="module")
def library_db(admin_dsn, template_db):
    """Factory of module-lifetime databases (Skiplock migrated, for the collectors' own tables)."""
    made: list[str] = []

    def make() -> str:
        name = f"ext_{os.getpid()}_{next(_count)}"
        with connect(admin_dsn) as c:
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        made.append(name)
        return dsn_for(admin_dsn, name)

    yield make
    with connect(admin_dsn) as c:
        for name in made:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def url(dsn: str) -> str:
    """libpq key=value -> a postgresql:// URL (the libraries' CLIs want one)."""
    import psycopg

    p = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_line(proc: subprocess.Popen, marker: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if marker in line:
            return
    raise AssertionError(f"{marker!r} not printed within {timeout}s: {''.join(seen[-20:])}")


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def scalar(dsn: str, statement: str):
    with connect(dsn) as c:
        return c.execute(statement).fetchone()[0]


# --- PGQueuer -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pgqueuer_db(library_db):
    dsn = library_db()
    subprocess.run([str(BIN / "pgq"), "--pg-dsn", url(dsn), "install"], check=True, timeout=60,
                   capture_output=True, text=True)
    run_async(w.pgqueuer_produce(url(dsn), ["waiting", "waiting", "waiting", "ok", "boom", "hang"]))
    consumer = start([sys.executable, "-m", "tests.external_workers", "pgqueuer-consume", url(dsn)])
    try:
        wait_for_line(consumer, "HANGING")
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 1
                   and scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE entrypoint = 'ok'") == 0)
    finally:
        kill(consumer)  # the hanging job stays picked; its heartbeat stops
    return dsn


PGQ = ExternalQueue(name="legacy", system="pgqueuer", stuck_after=timedelta(seconds=1))


def test_pgqueuer_depth_age_stuck_and_dead_letters_match_the_library(pgqueuer_db):
    external.validate(connect(pgqueuer_db), external.adapter_for(PGQ))
    sizes = run_async(w.pgqueuer_sizes(url(pgqueuer_db)))
    lbl = {"system": "pgqueuer", "external": "legacy"}
    report = eventually(lambda: (r := cycle(pgqueuer_db, Options(external=(PGQ,))))
                        and value(r, "stuck_leases", queue="hang", **lbl) == 1 and r)
    assert report.details["external_sources"]["legacy"]["error"] is None
    assert value(report, "queue_depth", queue="waiting", state="eligible", **lbl) == sizes[("waiting", "queued")] == 3
    assert value(report, "queue_depth", queue="hang", state="running", **lbl) == sizes[("hang", "picked")] == 1
    assert value(report, "dead_letters", queue="boom", **lbl) == sizes[("boom", "failed")] == 1
    oldest = scalar(pgqueuer_db, "SELECT extract(epoch FROM now() - min(execute_after)) FROM pgqueuer WHERE status = 'queued'")
    assert abs(value(report, "queue_age_seconds", queue="waiting", **lbl) - float(oldest)) < 5
    assert value(report, "table_live_tuples", table="legacy:public.pgqueuer", system="pgqueuer") is not None
    assert 'skiplock_dead_letters{backend="postgres",external="legacy",queue="boom",system="pgqueuer"} 1.0' in render_samples(report.samples).decode()


def test_pgqueuer_throughput_from_its_log_and_claim_latency_from_its_dequeue(pgqueuer_db):
    """Two cycles around a real QueueManager finishing two `ok` jobs and failing one `boom` (and a
    `waiting` job logged as queued, never picked)."""
    lbl = {"system": "pgqueuer", "external": "legacy"}
    first = cycle(pgqueuer_db, Options(external=(PGQ,)))
    run_async(w.pgqueuer_produce(url(pgqueuer_db), ["ok", "ok", "boom", "waiting"]))
    consumer = start([sys.executable, "-m", "tests.external_workers", "pgqueuer-consume", url(pgqueuer_db)])
    try:
        eventually(lambda: scalar(pgqueuer_db, "SELECT count(*) FROM pgqueuer WHERE entrypoint = 'ok'") == 0
                   and scalar(pgqueuer_db, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 2)
    finally:
        kill(consumer)
    report = cycle(pgqueuer_db, Options(external=(PGQ,)))
    interval = (report.started_at - first.started_at).total_seconds()
    assert value(report, "throughput", outcome="completed", queue="ok", **lbl) * interval == pytest.approx(2, abs=0.01)
    assert value(report, "throughput", outcome="failed", queue="boom", **lbl) * interval == pytest.approx(1, abs=0.01)
    assert value(report, "throughput", outcome="completed", queue="waiting", **lbl) == 0
    assert value(report, "throughput", outcome="completed", queue="boom", **lbl) == 0
    assert value(report, "claim_latency_seconds", source="pg_stat_statements", **lbl) > 0  # its dequeue ran
    assert report.details["external_sources"]["legacy"]["throughput"] == "from the completion log"


def test_an_unknown_pgqueuer_schema_is_refused(pgqueuer_db):
    with connect(pgqueuer_db) as c:
        c.execute("CREATE SCHEMA old; CREATE TYPE old.pgqueuer_status AS ENUM ('queued', 'picked');"
                  "CREATE TABLE old.pgqueuer (id bigint, priority int, created timestamptz, updated timestamptz,"
                  " heartbeat timestamptz, execute_after timestamptz, status old.pgqueuer_status, entrypoint text)")
        with pytest.raises(ConfigError, match=r"'old': unknown PGQueuer schema version: status failed missing"):
            external.validate(c, external.adapter_for(ExternalQueue(name="old", system="pgqueuer", schema="old")))


# --- Procrastinate ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def procrastinate_db(library_db):
    dsn = library_db()
    env = {"PROCRASTINATE_DSN": url(dsn)}
    cli = [str(BIN / "procrastinate"), "--app=tests.external_workers.app"]
    subprocess.run([*cli, "schema", "--apply"], check=True, timeout=60, capture_output=True, text=True,
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    run_async(w.procrastinate_defer(url(dsn), ["waiting", "waiting", "ok", "boom", "hang"]))
    worker = start([*cli, "worker", "-q", "fast,slow"], env)
    try:
        wait_for_line(worker, "HANGING")
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'") == 1)
    finally:
        kill(worker)
    return dsn


PROC = ExternalQueue(name="tasks", system="procrastinate", stuck_after=timedelta(seconds=1))


def test_procrastinate_depth_age_stuck_and_dead_letters_match_the_library(procrastinate_db):
    external.validate(connect(procrastinate_db), external.adapter_for(PROC))
    queues = run_async(w.procrastinate_queues(url(procrastinate_db)))
    lbl = {"system": "procrastinate", "external": "tasks"}
    report = eventually(lambda: (r := cycle(procrastinate_db, Options(external=(PROC,))))
                        and value(r, "stuck_leases", queue="slow", **lbl) == 1 and r)
    assert report.details["external_sources"]["tasks"]["error"] is None
    assert value(report, "queue_depth", queue="idle", state="eligible", **lbl) == queues["idle"]["todo"] == 2
    assert value(report, "queue_depth", queue="slow", state="running", **lbl) == queues["slow"]["doing"] == 1
    assert value(report, "dead_letters", queue="fast", **lbl) == queues["fast"]["failed"] == 1
    oldest = scalar(procrastinate_db, """SELECT extract(epoch FROM now() - min(e.at)) FROM procrastinate_events AS e
                                         JOIN procrastinate_jobs AS j ON j.id = e.job_id
                                         WHERE j.status = 'todo' AND e.type = 'deferred'""")
    assert abs(value(report, "queue_age_seconds", queue="idle", **lbl) - float(oldest)) < 5
    assert value(report, "table_dead_tuples", table="tasks:public.procrastinate_jobs", system="procrastinate") is not None


def test_procrastinate_throughput_from_its_job_events(procrastinate_db):
    lbl = {"system": "procrastinate", "external": "tasks"}
    first = cycle(procrastinate_db, Options(external=(PROC,)))
    run_async(w.procrastinate_defer(url(procrastinate_db), ["ok", "ok", "boom", "waiting"]))
    worker = start([str(BIN / "procrastinate"), "--app=tests.external_workers.app", "worker", "-q", "fast"],
                   {"PROCRASTINATE_DSN": url(procrastinate_db)})
    try:
        eventually(lambda: scalar(procrastinate_db, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'") == 2
                   and scalar(procrastinate_db, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'") == 3)
    finally:
        kill(worker)
    report = cycle(procrastinate_db, Options(external=(PROC,)))
    interval = (report.started_at - first.started_at).total_seconds()
    assert value(report, "throughput", outcome="completed", queue="fast", **lbl) * interval == pytest.approx(2, abs=0.01)
    assert value(report, "throughput", outcome="failed", queue="fast", **lbl) * interval == pytest.approx(1, abs=0.01)
    assert value(report, "throughput", outcome="completed", queue="idle", **lbl) == 0
    # Procrastinate keeps its succeeded jobs in procrastinate_jobs: the advisor counts them.
    from console.advisor.external import run_external
    from console.config import load_config

    with connect(procrastinate_db) as c:
        kept = run_external(c, external.adapter_for(PROC), load_config(env={})).by_id("ext-completed-rows")
    assert (kept.status, kept.data["completed"]) == ("ok", 3), kept


def test_an_unknown_procrastinate_schema_is_refused(procrastinate_db):
    with connect(procrastinate_db) as c:
        c.execute("CREATE SCHEMA v2; CREATE TABLE v2.procrastinate_jobs (id bigint, queue_name text, task_name text,"
                  " status text, scheduled_at timestamptz, attempts int)")
        with pytest.raises(ConfigError, match=r"'v2': unknown Procrastinate schema version .*no column worker_id"):
            external.validate(c, external.adapter_for(ExternalQueue(name="v2", system="procrastinate", schema="v2")))


# --- graphile-worker (npm) ----------------------------------------------------------------------

GRAPHILE_TASKS = {
    "ok.js": "module.exports = async () => {};\n",
    "boom.js": "module.exports = async () => { throw new Error('boom'); };\n",
    "hang.js": "module.exports = async () => { console.log('HANGING'); await new Promise(() => {}); };\n",
}


@pytest.fixture(scope="module")
def graphile_db(library_db, tmp_path_factory):
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("graphile-worker is a Node.js library: this machine has no node/npm")
    home = tmp_path_factory.mktemp("graphile")
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "graphile-worker@0.18.0"],
                   cwd=home, check=True, timeout=300, capture_output=True)
    (home / "tasks").mkdir()
    for name, body in GRAPHILE_TASKS.items():
        (home / "tasks" / name).write_text(body)
    cli = str(home / "node_modules" / ".bin" / "graphile-worker")
    dsn = library_db()
    subprocess.run([cli, "-c", url(dsn), "--schema-only"], cwd=home, check=True, timeout=60, capture_output=True)
    with connect(dsn) as c:  # its documented SQL API for enqueueing
        c.execute("""SELECT graphile_worker.add_job('waiting', '{}'::json) FROM generate_series(1, 3);
                     SELECT graphile_worker.add_job('ok', '{}'::json);
                     SELECT graphile_worker.add_job('boom', '{}'::json, max_attempts => 1);
                     SELECT graphile_worker.add_job('hang', '{}'::json)""")
    worker = subprocess.Popen([cli, "-c", url(dsn), "--jobs", "2", "--poll-interval", "200"], cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(worker, "HANGING", timeout=60)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM graphile_worker.jobs WHERE task_identifier = 'boom' "
                                       "AND attempts >= max_attempts AND locked_at IS NULL") == 1
                   and scalar(dsn, "SELECT count(*) FROM graphile_worker.jobs WHERE task_identifier = 'ok'") == 0)
    finally:
        kill(worker)
    return dsn


GW = ExternalQueue(name="gw", system="graphile-worker", stuck_after=timedelta(seconds=1))


def test_graphile_worker_depth_age_stuck_and_dead_letters_match_the_library(graphile_db):
    external.validate(connect(graphile_db), external.adapter_for(GW))
    lbl = {"system": "graphile-worker", "external": "gw"}
    report = eventually(lambda: (r := cycle(graphile_db, Options(external=(GW,))))
                        and value(r, "stuck_leases", queue="hang", **lbl) == 1 and r)
    assert report.details["external_sources"]["gw"]["error"] is None

    def view(where: str) -> int:  # graphile_worker.jobs, the library's public view
        return scalar(graphile_db, f"SELECT count(*) FROM graphile_worker.jobs WHERE {where}")  # noqa: S608

    assert value(report, "queue_depth", queue="waiting", state="eligible", **lbl) == view(
        "task_identifier = 'waiting' AND locked_at IS NULL AND attempts < max_attempts AND run_at <= now()") == 3
    assert value(report, "queue_depth", queue="hang", state="running", **lbl) == view("locked_at IS NOT NULL") == 1
    assert value(report, "dead_letters", queue="boom", **lbl) == view("attempts >= max_attempts") == 1
    oldest = scalar(graphile_db, "SELECT extract(epoch FROM now() - min(run_at)) FROM graphile_worker.jobs "
                                 "WHERE task_identifier = 'waiting'")
    assert abs(value(report, "queue_age_seconds", queue="waiting", **lbl) - float(oldest)) < 5
    assert value(report, "table_live_tuples", table="gw:graphile_worker._private_jobs", system="graphile-worker") is not None


def test_an_unknown_graphile_worker_schema_is_refused(graphile_db):
    with connect(graphile_db) as c:
        c.execute("INSERT INTO graphile_worker.migrations (id, ts, breaking) VALUES (21, now(), false)")
        try:
            with pytest.raises(ConfigError, match=r"'gw': unknown graphile-worker schema version: migration 21"):
                external.validate(c, external.adapter_for(GW))
        finally:
            c.execute("DELETE FROM graphile_worker.migrations WHERE id = 21")


# --- pg-boss (npm) ------------------------------------------------------------------------------

PGBOSS_SCRIPT = r"""
const PgBoss = require('pg-boss');
const [mode, url] = process.argv.slice(2);
(async () => {
  const boss = new PgBoss(url);
  boss.on('error', e => console.error(e));
  await boss.start();  // creates the pgboss schema
  for (const q of ['waiting', 'ok', 'boom', 'hang']) await boss.createQueue(q);
  if (mode === 'produce') {
    for (let i = 0; i < 3; i++) await boss.send('waiting', {});
    await boss.send('ok', {});
    await boss.send('boom', {}, { retryLimit: 0 });
    await boss.send('hang', {}, { expireInSeconds: 1 });
    await boss.stop({ graceful: false, wait: true });
    console.log('PRODUCED');
  } else if (mode === 'sizes') {
    console.log(JSON.stringify({ waiting: await boss.getQueueSize('waiting') }));
    await boss.stop({ graceful: false, wait: true });
  } else {
    const opts = { pollingIntervalSeconds: 0.5 };
    await boss.work('ok', opts, async () => {});
    await boss.work('boom', opts, async () => { throw new Error('boom'); });
    await boss.work('hang', opts, async () => { console.log('HANGING'); await new Promise(() => {}); });
  }
})().catch(e => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="module")
def pgboss_db(library_db, tmp_path_factory):
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("pg-boss is a Node.js library: this machine has no node/npm")
    home = tmp_path_factory.mktemp("pgboss")
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "pg-boss@10.4.2"],
                   cwd=home, check=True, timeout=300, capture_output=True)
    (home / "boss.js").write_text(PGBOSS_SCRIPT)
    dsn = library_db()
    subprocess.run(["node", "boss.js", "produce", url(dsn)], cwd=home, check=True, timeout=60, capture_output=True)
    worker = subprocess.Popen(["node", "boss.js", "work", url(dsn)], cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(worker, "HANGING", timeout=60)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgboss.job WHERE name = 'boom' AND state = 'failed'") == 1
                   and scalar(dsn, "SELECT count(*) FROM pgboss.job WHERE name = 'ok' AND state = 'completed'") == 1)
    finally:
        kill(worker)  # the hanging job stays active past its expire_in, with no supervisor to expire it
    sizes = subprocess.run(["node", "boss.js", "sizes", url(dsn)], cwd=home, check=True, timeout=60,
                           capture_output=True, text=True).stdout
    return dsn, json.loads(sizes.strip().splitlines()[-1])


PB = ExternalQueue(name="boss", system="pg-boss")


def test_pgboss_depth_age_stuck_and_dead_letters_match_the_library(pgboss_db):
    dsn, sizes = pgboss_db
    external.validate(connect(dsn), external.adapter_for(PB))
    lbl = {"system": "pg-boss", "external": "boss"}
    report = eventually(lambda: (r := cycle(dsn, Options(external=(PB,))))
                        and value(r, "stuck_leases", queue="hang", **lbl) == 1 and r)
    assert report.details["external_sources"]["boss"]["error"] is None
    assert value(report, "queue_depth", queue="waiting", state="eligible", **lbl) == sizes["waiting"] == 3  # getQueueSize
    assert value(report, "queue_depth", queue="hang", state="running", **lbl) == 1
    assert value(report, "dead_letters", queue="boom", **lbl) == 1
    assert values(report, "queue_depth", queue="ok", state="eligible", **lbl) in ([], [0.0])  # completed rows stay in pgboss.job
    oldest = scalar(dsn, "SELECT extract(epoch FROM now() - min(start_after)) FROM pgboss.job WHERE name = 'waiting'")
    assert abs(value(report, "queue_age_seconds", queue="waiting", **lbl) - float(oldest)) < 5
    assert value(report, "table_live_tuples", table="boss:pgboss.job", system="pg-boss") is not None


def test_an_unknown_pgboss_schema_is_refused(pgboss_db):
    dsn, _ = pgboss_db
    with connect(dsn) as c:
        c.execute("UPDATE pgboss.version SET version = 25")
        try:
            with pytest.raises(ConfigError, match=r"'boss': unknown pg-boss schema version 25"):
                external.validate(c, external.adapter_for(PB))
        finally:
            c.execute("UPDATE pgboss.version SET version = 24")
