"""Actions on queues Skiplock watches, against the real Node.js libraries: graphile-worker
0.18.0, pg-boss 10.4.2 and BullMQ 6.7.0 on PostgreSQL, installed with npm (skipped with a
reason where Node.js is missing), their schemas created by their own tools, their own workers
running.

Each library gets `flaky` jobs that fail for good while a switch file exists (graphile-worker:
max_attempts 1; pg-boss: retryLimit 0; BullMQ: attempts 1), held as dead letters by its own
worker. The console acts through console.external.actions as the faces do (preview, start bound
to it, run), and the library shows the result: a replayed job is run by its worker (a row in
`runs` per run), a purged job is gone from its own listing (graphile_worker.jobs, pg-boss's
getJobById, BullMQ's Queue.getJob), a cancelled job never runs, a BullMQ queue paused by the
console is paused for BullMQ (Queue.isPaused) and its worker takes nothing until the resume.
The race, as for the Python libraries: a replay and a purge of the same group at once while
the worker claims what the replay hands it; every job ends run once or purged, never both.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from console.config import ExternalQueue
from console.db import connect
from console.external import actions as xa
from console.external import adapter_for
from tests.collector_helpers import eventually
from tests.test_external_libraries import kill, library_db, scalar, url, wait_for_line  # noqa: F401

pytestmark = pytest.mark.slow
ACTOR = "alice"
REASON = "INC-78: the upstream API is back"
RUNS = "CREATE TABLE runs (job_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
PACKAGES = ("graphile-worker@0.18.0", "pg-boss@10.4.2", "bullmq@6.7.0", "pg@8")


@pytest.fixture(scope="module")
def node_home(tmp_path_factory) -> Path:
    """One npm install of the three libraries (and pg, BullMQ's optional peer) for the module."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("graphile-worker, pg-boss and BullMQ are Node.js libraries: this machine has no node/npm")
    home = tmp_path_factory.mktemp("node-libraries")
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *PACKAGES],
                   cwd=home, check=True, timeout=400, capture_output=True)
    for name, body in SCRIPTS.items():
        (home / name).write_text(body)
    (home / "tasks").mkdir()
    (home / "tasks" / "flaky.js").write_text(GRAPHILE_FLAKY)
    return home


def rows(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with connect(dsn) as c:
        return c.execute(statement, params).fetchall()


def node(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    done = subprocess.run(["node", *args], cwd=home, timeout=120, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def spawn(home: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    import os

    return subprocess.Popen(args, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})


def act(dsn: str, adapter, action: str, selection: xa.Selection, *, batch_size: int = 500):
    with connect(dsn) as c:
        p = xa.preview(c, adapter, selection)
        op_id = xa.start(c, c, adapter, action, selection, actor=ACTOR, reason=REASON, batch_size=batch_size,
                         preview=p.bound())
    return p, xa.run(dsn, op_id, {adapter.name: adapter})


def race(dsn: str, adapter, selection: xa.Selection, total: int) -> tuple[dict, dict]:
    """A replay and a purge of the same previewed group, run at once in batches of 2."""
    with connect(dsn) as c:
        p = xa.preview(c, adapter, selection)
        assert p.total == total
        ops = [xa.start(c, c, adapter, a, selection, actor=ACTOR, reason=REASON, batch_size=2, preview=p.bound())
               for a in ("replay", "purge")]
    results: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda op=op: results.__setitem__(op, xa.run(dsn, op, {adapter.name: adapter})))
               for op in ops]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    replayed, purged = results[ops[0]], results[ops[1]]
    assert replayed["done"] + replayed["skipped"] == purged["done"] + purged["skipped"] == total
    assert replayed["done"] + purged["done"] == total  # each job changed by exactly one of them
    return replayed, purged


def assert_each_ran_once_or_was_purged(dsn: str, before: list[str], gone: list[str], replayed: dict) -> None:
    ran = sorted(r[0] for r in rows(dsn, "SELECT job_id FROM runs"))
    assert len(ran) == len(set(ran)), "a job ran twice"
    assert not set(ran) & set(gone), "a job was both run and purged"
    assert sorted(ran + gone) == sorted(before), "a job was lost"
    assert len(ran) == replayed["done"]


# --- graphile-worker ---------------------------------------------------------------------------

GW = ExternalQueue(name="gw", system="graphile-worker", actions=True, stuck_after=timedelta(hours=4))
GRAPHILE_FLAKY = """\
const fs = require('fs');
module.exports = async (payload, helpers) => {
  if (fs.existsSync(process.env.FLAKY_SWITCH)) throw new Error('flaky: the switch is on');
  await helpers.withPgClient(c => c.query('INSERT INTO runs (job_id) VALUES ($1)', [String(helpers.job.id)]));
};
"""


@pytest.fixture
def graphile_flaky(node_home, library_db, tmp_path):  # noqa: F811
    cli = str(node_home / "node_modules" / ".bin" / "graphile-worker")
    dsn = library_db()
    subprocess.run([cli, "-c", url(dsn), "--schema-only"], cwd=node_home, check=True, timeout=60, capture_output=True)
    switch = tmp_path / "switch"
    switch.write_text("on")
    with connect(dsn) as c:
        c.execute(RUNS)
        c.execute("SELECT graphile_worker.add_job('flaky', '{}'::json, max_attempts => 1) FROM generate_series(1, 16)")
        c.execute("SELECT graphile_worker.add_job('idle', '{}'::json, run_at => now() + interval '1 hour')")
    worker = spawn(node_home, [cli, "-c", url(dsn), "--jobs", "4", "--poll-interval", "200"], {"FLAKY_SWITCH": str(switch)})
    try:
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM graphile_worker.jobs WHERE task_identifier = 'flaky' "
                                       "AND attempts >= max_attempts AND locked_at IS NULL") == 16, timeout=60)
        yield dsn, switch, worker
    finally:
        kill(worker)


def graphile_failed(dsn: str) -> list[str]:
    """graphile_worker.jobs, its public view: the flaky jobs out of attempts."""
    return sorted(str(r[0]) for r in rows(dsn, "SELECT id FROM graphile_worker.jobs WHERE task_identifier = 'flaky' "
                                               "AND attempts >= max_attempts"))


def test_graphile_worker_replay_purge_and_cancel_through_its_admin_functions(graphile_flaky):
    dsn, switch, _ = graphile_flaky
    failed = graphile_failed(dsn)
    adapter = adapter_for(GW)
    _, purged = act(dsn, adapter, "purge", xa.Selection(keys=tuple(failed[:4])))
    assert purged["done"] == 4 and graphile_failed(dsn) == failed[4:]  # complete_jobs deleted them
    switch.unlink()

    p, done = act(dsn, adapter, "replay", xa.Selection(queue="flaky"), batch_size=5)

    assert (p.total, done["done"], done["batches"]) == (12, 12, 3)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 12, timeout=60)
    assert sorted(r[0] for r in rows(dsn, "SELECT job_id FROM runs")) == failed[4:]  # its worker ran each once
    assert graphile_failed(dsn) == []
    idle = str(scalar(dsn, "SELECT id FROM graphile_worker.jobs WHERE task_identifier = 'idle'"))
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [idle], actor=ACTOR, reason="not wanted")
    assert out.changed == 1
    assert rows(dsn, "SELECT attempts = max_attempts, last_error FROM graphile_worker.jobs WHERE id = %s", (int(idle),)) == [
        (True, "cancelled from Skiplock by alice: not wanted")]  # permanently_fail_jobs: a dead letter with the reason


def test_graphile_worker_race_its_worker_claims_while_the_group_is_purged(graphile_flaky):
    dsn, switch, _ = graphile_flaky
    failed = graphile_failed(dsn)
    switch.unlink()
    replayed, _ = race(dsn, adapter_for(GW), xa.Selection(queue="flaky"), 16)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM graphile_worker.jobs WHERE task_identifier = 'flaky'") == 0,
               timeout=60)
    ran = [r[0] for r in rows(dsn, "SELECT job_id FROM runs")]
    assert_each_ran_once_or_was_purged(dsn, failed, sorted(set(failed) - set(ran)), replayed)


# --- pg-boss -----------------------------------------------------------------------------------

PB = ExternalQueue(name="boss", system="pg-boss", actions=True)
PGBOSS = r"""
const fs = require('fs');
const PgBoss = require('pg-boss');
const [mode, url, ...args] = process.argv.slice(2);
(async () => {
  const boss = new PgBoss(url);
  boss.on('error', e => console.error(e));
  await boss.start();
  for (const q of ['flaky', 'idle']) await boss.createQueue(q);
  if (mode === 'produce') {
    for (let i = 0; i < Number(args[0]); i++) await boss.send('flaky', {}, { retryLimit: 0 });
    await boss.send('idle', {}, { startAfter: 3600 });
    await boss.stop({ graceful: false, wait: true });
  } else if (mode === 'states') {  // its own listing: getJobById
    const out = {};
    for (const id of args) { const job = await boss.getJobById('flaky', id); out[id] = job ? job.state : null; }
    console.log(JSON.stringify(out));
    await boss.stop({ graceful: false, wait: true });
  } else {
    const db = boss.getDb();
    await boss.work('flaky', { pollingIntervalSeconds: 0.5 }, async jobs => {
      if (fs.existsSync(process.env.FLAKY_SWITCH)) throw new Error('flaky: the switch is on');
      for (const job of jobs) await db.executeSql('INSERT INTO runs (job_id) VALUES ($1)', [job.id]);
    });
    console.log('WORKING');
  }
})().catch(e => { console.error(e); process.exit(1); });
"""


@pytest.fixture
def pgboss_flaky(node_home, library_db, tmp_path):  # noqa: F811
    dsn = library_db()
    switch = tmp_path / "switch"
    switch.write_text("on")
    with connect(dsn) as c:
        c.execute(RUNS)
    node(node_home, "boss.js", "produce", url(dsn), "12")
    worker = spawn(node_home, ["node", "boss.js", "work", url(dsn)], {"FLAKY_SWITCH": str(switch)})
    try:
        wait_for_line(worker, "WORKING", timeout=60)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgboss.job WHERE name = 'flaky' AND state = 'failed'") == 12,
                   timeout=60)
        yield dsn, switch, worker
    finally:
        kill(worker)


def pgboss_keys(dsn: str) -> list[str]:
    return sorted(f"flaky:{r[0]}" for r in rows(dsn, "SELECT id FROM pgboss.job WHERE name = 'flaky' AND state = 'failed'"))


def pgboss_states(home: Path, dsn: str, keys: list[str]) -> dict[str, str | None]:
    done = node(home, "boss.js", "states", url(dsn), *[k.split(":")[1] for k in keys])
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pgboss_replay_purge_and_cancel_as_its_own_methods_do(node_home, pgboss_flaky):
    dsn, switch, _ = pgboss_flaky
    keys = pgboss_keys(dsn)
    adapter = adapter_for(PB)
    _, purged = act(dsn, adapter, "purge", xa.Selection(keys=tuple(keys[:3])))
    assert purged["done"] == 3
    assert set(pgboss_states(node_home, dsn, keys[:3]).values()) == {None}  # gone for getJobById
    switch.unlink()

    p, done = act(dsn, adapter, "replay", xa.Selection(queue="flaky"), batch_size=4)

    assert (p.total, done["done"]) == (9, 9)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 9, timeout=60)
    assert sorted(f"flaky:{r[0]}" for r in rows(dsn, "SELECT job_id FROM runs")) == keys[3:]
    assert set(pgboss_states(node_home, dsn, keys[3:]).values()) == {"completed"}
    idle = rows(dsn, "SELECT name || ':' || id FROM pgboss.job WHERE name = 'idle'")[0][0]
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [idle], actor=ACTOR)
    assert out.changed == 1 and rows(dsn, "SELECT state::text FROM pgboss.job WHERE name = 'idle'") == [("cancelled",)]


def test_pgboss_race_its_worker_claims_while_the_group_is_purged(pgboss_flaky):
    dsn, switch, _ = pgboss_flaky
    keys = pgboss_keys(dsn)
    switch.unlink()
    replayed, _ = race(dsn, adapter_for(PB), xa.Selection(queue="flaky"), 12)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgboss.job WHERE name = 'flaky' AND state < 'completed'") == 0,
               timeout=60)
    ran = [f"flaky:{r[0]}" for r in rows(dsn, "SELECT job_id FROM runs")]
    gone = sorted(set(keys) - {f"flaky:{r[0]}" for r in rows(dsn, "SELECT id FROM pgboss.job WHERE name = 'flaky'")})
    assert_each_ran_once_or_was_purged(dsn, [k.split(":")[1] for k in keys], [k.split(":")[1] for k in gone], replayed)
    assert sorted(ran) == sorted(set(keys) - set(gone))


# --- BullMQ on PostgreSQL ----------------------------------------------------------------------

BQ = ExternalQueue(name="bq", system="bullmq", actions=True)
BULLMQ = r"""
const fs = require('fs');
const { Pool } = require('pg');
const { Queue, Worker, runMigrations, createPostgresBackend } = require('bullmq');
const [mode, url, ...args] = process.argv.slice(2);
const opts = { connection: url };
(async () => {
  if (mode === 'migrate') {  // its documented explicit migration step
    const pool = new Pool({ connectionString: url });
    const client = await pool.connect();
    try { await runMigrations(client); } finally { client.release(); await pool.end(); }
    console.log('MIGRATED');
    return;
  }
  const queue = new Queue('flaky', opts, createPostgresBackend);
  if (mode === 'produce') {
    for (let i = 0; i < Number(args[0]); i++) await queue.add('flaky', { i }, { attempts: 1 });
    console.log('PRODUCED');
  } else if (mode === 'add') {
    const job = await queue.add('late', { late: true }, { attempts: 1 });
    console.log(JSON.stringify({ id: job.id }));
  } else if (mode === 'states') {  // its own listing: Queue.getJob, Queue.isPaused
    const out = { paused: await queue.isPaused(), jobs: {} };
    for (const id of args) { const job = await queue.getJob(id); out.jobs[id] = job ? await job.getState() : null; }
    console.log(JSON.stringify(out));
  } else {
    const pool = new Pool({ connectionString: url });
    const worker = new Worker('flaky', async job => {
      if (fs.existsSync(process.env.FLAKY_SWITCH)) throw new Error('flaky: the switch is on');
      await pool.query('INSERT INTO runs (job_id) VALUES ($1)', [String(job.id)]);
    }, { ...opts, concurrency: 2 }, createPostgresBackend);
    worker.on('error', e => console.error(e));
    await worker.waitUntilReady();
    console.log('WORKING');
    return;
  }
  await queue.close();
})().catch(e => { console.error(e); process.exit(1); });
"""
SCRIPTS = {"boss.js": PGBOSS, "bull.js": BULLMQ}


@pytest.fixture
def bullmq_flaky(node_home, library_db, tmp_path):  # noqa: F811
    dsn = library_db()
    switch = tmp_path / "switch"
    switch.write_text("on")
    with connect(dsn) as c:
        c.execute(RUNS)
    node(node_home, "bull.js", "migrate", url(dsn))
    node(node_home, "bull.js", "produce", url(dsn), "12")
    worker = spawn(node_home, ["node", "bull.js", "work", url(dsn)], {"FLAKY_SWITCH": str(switch)})
    try:
        wait_for_line(worker, "WORKING", timeout=60)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM bullmq.job WHERE queue = 'flaky' AND state = 'failed'") == 12,
                   timeout=60)
        yield dsn, switch, worker
    finally:
        kill(worker)


def bullmq_states(home: Path, dsn: str, keys: list[str]) -> dict:
    done = node(home, "bull.js", "states", url(dsn), *[k.split(":", 1)[1] for k in keys])
    return json.loads(done.stdout.strip().splitlines()[-1])


def bullmq_failed(dsn: str) -> list[str]:
    return sorted(r[0] for r in rows(dsn, "SELECT queue || ':' || id FROM bullmq.job WHERE state = 'failed'"))


def test_bullmq_watched_and_replayed_purged_paused_through_its_own_functions(node_home, bullmq_flaky):
    from console import external
    from console.collectors import Options
    from tests.collector_helpers import cycle, value

    dsn, switch, _ = bullmq_flaky
    with connect(dsn) as c:
        external.validate(c, adapter_for(BQ))
    report = cycle(dsn, Options(external=(BQ,)))
    assert report.details["external_sources"]["bq"]["error"] is None
    lbl = {"system": "bullmq", "external": "bq", "queue": "flaky"}
    assert value(report, "dead_letters", **lbl) == 12
    assert value(report, "dead_letter_growth", **lbl) == pytest.approx(12 / 0.25)  # 12 within the 15-minute window
    keys = bullmq_failed(dsn)
    adapter = adapter_for(BQ)
    _, purged = act(dsn, adapter, "purge", xa.Selection(keys=tuple(keys[:2])))
    assert purged["done"] == 2
    assert set(bullmq_states(node_home, dsn, keys[:2])["jobs"].values()) == {None}  # gone for Queue.getJob

    with connect(dsn) as c:
        xa.set_paused(c, c, adapter, "flaky", True, actor=ACTOR, reason=REASON)
    assert bullmq_states(node_home, dsn, [])["paused"] is True  # paused for BullMQ itself
    with connect(dsn) as c:
        assert xa.paused_queues(c, adapter) == {"flaky"}
    switch.unlink()
    p, done = act(dsn, adapter, "replay", xa.Selection(queue="flaky"), batch_size=4)
    assert (p.total, done["done"]) == (10, 10)
    time.sleep(2)  # a paused queue: its worker takes none of the replayed jobs
    assert scalar(dsn, "SELECT count(*) FROM runs") == 0
    assert scalar(dsn, "SELECT count(*) FROM bullmq.job WHERE queue = 'flaky' AND state = 'waiting'") == 10
    with connect(dsn) as c:
        xa.set_paused(c, c, adapter, "flaky", False, actor=ACTOR, reason="INC-78 verified")
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 10, timeout=60)
    assert sorted(f"flaky:{r[0]}" for r in rows(dsn, "SELECT job_id FROM runs")) == keys[2:]
    assert set(bullmq_states(node_home, dsn, keys[2:])["jobs"].values()) == {"completed"}
    late = json.loads(node(node_home, "bull.js", "add", url(dsn)).stdout.strip().splitlines()[-1])["id"]
    audit = rows(dsn, "SELECT action, target, detail->>'system', detail->>'queue' FROM skiplock.audit_log "
                      "WHERE action IN ('pause', 'resume') ORDER BY id")
    assert audit == [("pause", "bullmq:bq/queue:flaky", "bullmq", "flaky"), ("resume", "bullmq:bq/queue:flaky", "bullmq", "flaky")]
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 11, timeout=30)  # the worker runs new work again
    assert late


def test_bullmq_race_its_worker_claims_while_the_group_is_purged(bullmq_flaky):
    dsn, switch, _ = bullmq_flaky
    keys = bullmq_failed(dsn)
    switch.unlink()
    replayed, _ = race(dsn, adapter_for(BQ), xa.Selection(queue="flaky"), 12)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM bullmq.job WHERE queue = 'flaky' "
                                   "AND state IN ('waiting', 'active')") == 0, timeout=60)
    left = {f"flaky:{r[0]}" for r in rows(dsn, "SELECT id FROM bullmq.job WHERE queue = 'flaky'")}
    ids = [k.split(":", 1)[1] for k in keys]
    assert_each_ran_once_or_was_purged(dsn, ids, sorted(k.split(":", 1)[1] for k in set(keys) - left), replayed)


def test_bullmq_cancel_of_a_waiting_job(node_home, bullmq_flaky):
    dsn, _, worker = bullmq_flaky
    adapter = adapter_for(BQ)
    with connect(dsn) as c:
        xa.set_paused(c, c, adapter, "flaky", True, actor=ACTOR, reason=REASON)
    late = json.loads(node(node_home, "bull.js", "add", url(dsn)).stdout.strip().splitlines()[-1])["id"]
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [f"flaky:{late}"], actor=ACTOR)
    assert out.changed == 1
    assert bullmq_states(node_home, dsn, [f"flaky:{late}"])["jobs"] == {late: None}


# --- the pause and resume forms, with and without htmx (tests/test_security_forms_without_htmx.py) --

@pytest.fixture
def bullmq_web(node_home, dsn, tmp_path, monkeypatch):
    """BullMQ migrated into the web test's own database, watched as 'bq' with actions on."""
    config = tmp_path / "skiplock.toml"
    config.write_text('[[external_queues]]\nname = "bq"\nsystem = "bullmq"\nactions = true\n')
    monkeypatch.setenv("SKIPLOCK_CONFIG", str(config))
    node(node_home, "bull.js", "migrate", url(dsn))
    node(node_home, "bull.js", "produce", url(dsn), "1")
    return dsn


@pytest.mark.parametrize("htmx", [False, True], ids=["without-htmx", "with-htmx"])
def test_bullmq_pause_and_resume_forms_with_and_without_htmx(node_home, bullmq_web, client_as, htmx):
    from tests.test_security_forms_without_htmx import _usable
    from tests.web_fixtures import CSRF

    client = client_as("operator")
    headers = {"HX-Request": "true", "X-CSRF-Token": CSRF} if htmx else {}
    for action, paused in (("pause", True), ("resume", False)):
        response = client.post(f"/external/bq/queues/flaky/{action}", data={"csrf_token": CSRF, "reason": REASON},
                               headers=headers)
        assert _usable(response, client, htmx) is None, (action, response.status_code, response.get_data(as_text=True))
        assert bullmq_states(node_home, bullmq_web, [])["paused"] is paused  # BullMQ's own Queue.isPaused
