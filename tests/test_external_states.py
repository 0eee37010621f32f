"""Every state of every watched library, one queue per state, counted exactly.

For each system a fresh database gets one job in each state its library has, put there by the
library itself: PGQueuer's `Queries` (enqueue, dequeue, log_jobs, retry_job,
mark_job_as_cancelled), Procrastinate's `JobManager` (defer, fetch_job, finish_job, retry_job,
cancel_job_by_id), graphile-worker's SQL API (`add_job`) and its own worker, and pg-boss's
`send`, `fetch`, `complete`, `fail` and `cancel` under Node. Each job sits in a queue named
after its state, so every figure of the collectors (queue_depth by state, queue_age_seconds,
stuck_leases, dead_letters, throughput) is compared whole with what that state must count as
(docs/external-queues.md, "Which library state is which of ours"). Where a state needs time to
pass (a heartbeat gone stale, a lock held for hours, a retry's backoff), the test moves the
library's timestamp back (or forward) in SQL rather than waiting.

The edge of "due" is checked too: at the instant a job's start time equals now() each library
either claims it or not, and the predicate says the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from console import external
from console.collectors import Options
from console.config import ExternalQueue
from console.db import connect
from tests.collector_helpers import cycle, eventually
from tests.test_external_libraries import (  # noqa: F401
    BIN,
    ROOT,
    kill,
    library_db,
    run_async,
    scalar,
    url,
    wait_for_line,
)

pytestmark = pytest.mark.slow
FIGURES = ("eligible", "scheduled", "running", "failed", "stuck", "dead")


def figures(report, system: str, name: str) -> dict[str, dict[str, float]]:
    """{queue: {eligible, scheduled, running, failed, stuck, dead}} of one source, as sampled."""
    out: dict[str, dict[str, float]] = {}
    for s in report.samples:
        if s.labels.get("system") != system or s.labels.get("external") != name or "queue" not in s.labels:
            continue
        key = {"queue_depth": s.labels.get("state"), "stuck_leases": "stuck", "dead_letters": "dead"}.get(s.metric)
        if key in FIGURES:
            out.setdefault(s.labels["queue"], {})[key] = s.value
    return out


def ages(report, system: str, name: str) -> dict[str, float]:
    return {s.labels["queue"]: s.value for s in report.samples if s.metric == "queue_age_seconds"
            and s.labels.get("system") == system and s.labels.get("external") == name}


def throughput(report, first, system: str, name: str) -> dict[str, dict[str, int]]:
    """{queue: {outcome: jobs}} finished between two cycles (rates times the interval)."""
    interval = (report.started_at - first.started_at).total_seconds()
    out: dict[str, dict[str, int]] = {}
    for s in report.samples:
        if s.metric == "throughput" and s.labels.get("system") == system and s.labels.get("external") == name:
            out.setdefault(s.labels["queue"], {})[s.labels["outcome"]] = round(s.value * interval)
    return out


def expect(**states: dict[str, float]) -> dict[str, dict[str, float]]:
    return {queue: {k: float(counts.get(k, 0)) for k in FIGURES} for queue, counts in states.items()}


def due_at_the_instant(dsn: str, entry: ExternalQueue, move: str) -> dict[str, float]:
    """Set one job's start time to now() and take the snapshot in the same transaction (now()
    stands still): {queue: eligible} of the sources' figures at that instant."""
    adapter = external.adapter_for(entry)
    with psycopg.connect(dsn) as c, c.cursor(row_factory=dict_row) as cur:
        cur.execute(move)
        snap = external.snapshot(cur, adapter, cap=1000, failed_cap=1000)
        c.rollback()
    return {f.queue: f.eligible for f in snap.queues if f.eligible or f.scheduled}


# --- PGQueuer -----------------------------------------------------------------------------------

PGQ = ExternalQueue(name="pgq", system="pgqueuer", stuck_after=timedelta(minutes=5))
PGQ_STATES = ("due", "later", "picked", "stale", "held", "retry", "ok", "exception", "canceled")


async def pgqueuer_pick(dsn: str) -> dict[str, int]:
    """Enqueue one job per state's queue and pick those that a worker would hold."""
    from pgqueuer import PsycopgDriver, Queries
    from pgqueuer.ports.repository import EntrypointExecutionParameter

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        ids = {}
        for ep in PGQ_STATES:
            [ids[ep]] = await queries.enqueue(ep, None, 0, timedelta(hours=1) if ep == "later" else None)
        picked = await queries.dequeue(
            batch_size=10, entrypoints={ep: EntrypointExecutionParameter(concurrency_limit=0)
                                        for ep in PGQ_STATES if ep not in ("due", "later")},
            queue_manager_id=uuid.uuid4(), global_concurrency_limit=None, heartbeat_timeout=timedelta(hours=1))
        assert sorted(j.entrypoint for j in picked) == sorted(set(PGQ_STATES) - {"due", "later"})
        return ids


async def pgqueuer_finish(dsn: str) -> None:
    """What its QueueManager does when the picked jobs end: log (and delete or hold) them,
    retry one with a delay, cancel one."""
    from pgqueuer import PsycopgDriver, Queries
    from pgqueuer.models import Job

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM pgqueuer WHERE status = 'picked'")
            jobs = {row["entrypoint"]: Job.model_validate(row) for row in await cur.fetchall()}
        await queries.log_jobs([(jobs["ok"], "successful", None), (jobs["exception"], "exception", None),
                                (jobs["held"], "failed", None)])  # 'failed': on_failure="hold" keeps the row
        await queries.retry_job(jobs["retry"], timedelta(hours=1), None)
        await queries.mark_job_as_cancelled([jobs["canceled"].id])


def test_pgqueuer_every_state_counts_as_exactly_one_of_ours(library_db):  # noqa: F811
    dsn = library_db()
    subprocess.run([str(BIN / "pgq"), "--pg-dsn", url(dsn), "install"],
                   check=True, timeout=60, capture_output=True, text=True)
    run_async(pgqueuer_pick(url(dsn)))
    with connect(dsn) as c:  # its heartbeat stopped an hour ago (the worker died)
        c.execute("UPDATE pgqueuer SET heartbeat = now() - interval '1 hour' WHERE entrypoint = 'stale'")
    first = cycle(dsn, Options(external=(PGQ,)))
    run_async(pgqueuer_finish(url(dsn)))

    report = cycle(dsn, Options(external=(PGQ,)))

    assert report.details["external_sources"]["pgq"]["error"] is None
    # ok, exception, canceled: gone from the table, so reported with zeros once (they ran at
    # the first cycle) and then no more.
    still = dict(due={"eligible": 1}, later={"scheduled": 1}, picked={"running": 1}, stale={"running": 1, "stuck": 1},
                 held={"failed": 1, "dead": 1}, retry={"scheduled": 1})
    assert figures(report, "pgqueuer", "pgq") == expect(**still, ok={}, exception={}, canceled={})
    assert figures(cycle(dsn, Options(external=(PGQ,))), "pgqueuer", "pgq") == expect(**still)
    age = ages(report, "pgqueuer", "pgq")
    assert 0 < age.pop("due") < 120 and set(age.values()) == {0.0}
    done = throughput(report, first, "pgqueuer", "pgq")
    assert {q: o for q, o in done.items() if any(o.values())} == {
        "ok": {"completed": 1, "failed": 0}, "exception": {"completed": 0, "failed": 1},
        "held": {"completed": 0, "failed": 1}}  # a retry logs 'queued', a cancel 'canceled': neither
    # Due: PGQueuer's dequeue takes execute_after < NOW(), so a job at the instant is not yet due.
    assert due_at_the_instant(dsn, PGQ, "UPDATE pgqueuer SET execute_after = now() WHERE entrypoint = 'later'") == {
        "due": 1, "later": 0, "retry": 0}


# --- Procrastinate ------------------------------------------------------------------------------

PROC = ExternalQueue(name="proc", system="procrastinate", stuck_after=timedelta(minutes=5))


async def procrastinate_states(dsn: str, phase: str) -> None:
    import procrastinate
    from procrastinate.jobs import Status

    from tests.external_workers import app

    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
        async with app.open_async():
            jm = app.job_manager
            if phase == "start":
                for queue in ("due", "later", "doing", "stalled", "failed", "succeeded", "cancelled", "aborted", "retry"):
                    task = app.tasks["waiting"].configure(queue=queue, schedule_in={"hours": 1} if queue == "later" else None)
                    await task.defer_async()
                worker = await jm.register_worker()
                for queue in ("doing", "failed", "succeeded", "aborted", "retry"):
                    assert await jm.fetch_job([queue], worker) is not None
                gone = await jm.register_worker()  # a worker that stops sending heartbeats
                assert await jm.fetch_job(["stalled"], gone) is not None
                return
            jobs = {j.queue: j for j in await jm.list_jobs_async()}
            await jm.finish_job(jobs["failed"], Status.FAILED, delete_job=False)
            await jm.finish_job(jobs["succeeded"], Status.SUCCEEDED, delete_job=False)
            await jm.retry_job(jobs["retry"], retry_at=datetime.now(UTC) + timedelta(hours=1))
            assert await jm.cancel_job_by_id_async(jobs["cancelled"].id)
            assert await jm.cancel_job_by_id_async(jobs["aborted"].id, abort=True)  # abort requested
            await jm.finish_job(jobs["aborted"], Status.ABORTED, delete_job=False)  # the task stopped


def test_procrastinate_every_state_counts_as_exactly_one_of_ours(library_db):  # noqa: F811
    dsn = library_db()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCRASTINATE_DSN": url(dsn)}
    subprocess.run([str(BIN / "procrastinate"), "--app=tests.external_workers.app", "schema", "--apply"],
                   check=True, timeout=60, capture_output=True, text=True, cwd=ROOT, env=env)
    run_async(procrastinate_states(url(dsn), "start"))
    with connect(dsn) as c:  # the stalled job's worker last said it was alive an hour ago
        c.execute("""UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour'
                     WHERE id = (SELECT worker_id FROM procrastinate_jobs WHERE queue_name = 'stalled')""")
    first = cycle(dsn, Options(external=(PROC,)))
    run_async(procrastinate_states(url(dsn), "finish"))

    report = cycle(dsn, Options(external=(PROC,)))

    assert report.details["external_sources"]["proc"]["error"] is None
    statuses = dict(scalar_rows(dsn, "SELECT queue_name, status::text FROM procrastinate_jobs"))
    assert statuses == {"due": "todo", "later": "todo", "doing": "doing", "stalled": "doing", "failed": "failed",
                        "succeeded": "succeeded", "cancelled": "cancelled", "aborted": "aborted", "retry": "todo"}
    # succeeded, cancelled, aborted: finished, so reported with zeros once (they ran at the
    # first cycle) and then no more.
    still = dict(due={"eligible": 1}, later={"scheduled": 1}, doing={"running": 1}, stalled={"running": 1, "stuck": 1},
                 failed={"failed": 1, "dead": 1}, retry={"scheduled": 1})
    assert figures(report, "procrastinate", "proc") == expect(**still, succeeded={}, cancelled={}, aborted={})
    assert figures(cycle(dsn, Options(external=(PROC,))), "procrastinate", "proc") == expect(**still)
    age = ages(report, "procrastinate", "proc")
    assert 0 < age.pop("due") < 120 and set(age.values()) == {0.0}
    done = throughput(report, first, "procrastinate", "proc")
    assert {q: o for q, o in done.items() if any(o.values())} == {
        "succeeded": {"completed": 1, "failed": 0, "retried": 0}, "failed": {"completed": 0, "failed": 1, "retried": 0},
        "retry": {"completed": 0, "failed": 0, "retried": 1}}  # cancelled and aborted are neither
    # Due: its fetch takes scheduled_at <= now(), so a job at the instant is due.
    assert due_at_the_instant(dsn, PROC, "UPDATE procrastinate_jobs SET scheduled_at = now() WHERE queue_name = 'later'") == {
        "due": 1, "later": 1, "retry": 0}


def scalar_rows(dsn: str, statement: str) -> list[tuple]:
    with connect(dsn) as c:
        return c.execute(statement).fetchall()


# --- graphile-worker (npm) ----------------------------------------------------------------------

GW = ExternalQueue(name="gw", system="graphile-worker", stuck_after=timedelta(hours=1))
GRAPHILE_TASKS = {
    "ok.js": "module.exports = async () => {};\n",
    "boom.js": "module.exports = async () => { throw new Error('boom'); };\n",
    "hang.js": "module.exports = async () => { console.log('HANGING'); await new Promise(() => {}); };\n",
}


def node_home(tmp_path_factory, package: str):
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip(f"{package} is a Node.js library: this machine has no node/npm")
    home = tmp_path_factory.mktemp(package.split("@")[0])
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", package],
                   cwd=home, check=True, timeout=300, capture_output=True)
    return home


def test_graphile_worker_every_state_counts_as_exactly_one_of_ours(library_db, tmp_path_factory):  # noqa: F811
    home = node_home(tmp_path_factory, "graphile-worker@0.18.0")
    (home / "tasks").mkdir()
    for name, body in GRAPHILE_TASKS.items():
        (home / "tasks" / name).write_text(body)
    cli = str(home / "node_modules" / ".bin" / "graphile-worker")
    dsn = library_db()
    subprocess.run([cli, "-c", url(dsn), "--schema-only"], cwd=home, check=True, timeout=60, capture_output=True)
    with connect(dsn) as c:  # its documented SQL API; a job's queue here is its task identifier
        c.execute("""SELECT graphile_worker.add_job('ok', '{}'::json);
                     SELECT graphile_worker.add_job('boom', '{}'::json, max_attempts => 1);
                     SELECT graphile_worker.add_job('boom', '{}'::json, max_attempts => 5, job_key => 'retrying');
                     SELECT graphile_worker.add_job('hang', '{}'::json, max_attempts => 1, job_key => 'last-attempt');
                     SELECT graphile_worker.add_job('hang', '{}'::json, job_key => 'stuck')""")
    worker = subprocess.Popen([cli, "-c", url(dsn), "--jobs", "4", "--poll-interval", "200"], cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(worker, "HANGING", timeout=60)
        eventually(lambda: scalar(dsn, """SELECT count(*) FROM graphile_worker.jobs
                                          WHERE (task_identifier = 'boom' AND attempts >= 1 AND locked_at IS NULL)
                                             OR (task_identifier = 'hang' AND locked_at IS NOT NULL)""") == 4
                   and scalar(dsn, "SELECT count(*) FROM graphile_worker.jobs WHERE task_identifier = 'ok'") == 0,
                   timeout=60)
    finally:
        kill(worker)  # the hang jobs stay locked, as after a crash
    with connect(dsn) as c:
        c.execute("""SELECT graphile_worker.add_job('waiting', '{}'::json);
                     SELECT graphile_worker.add_job('later', '{}'::json, run_at => now() + interval '1 hour');
                     -- a failed attempt waits exp(attempts) seconds: a later attempt's backoff, hours long
                     UPDATE graphile_worker._private_jobs SET run_at = now() + interval '2 hours' WHERE key = 'retrying';
                     -- one lock taken two hours ago (the library itself lets a lock go after four)
                     UPDATE graphile_worker._private_jobs SET locked_at = now() - interval '2 hours' WHERE key = 'stuck'""")
        c.execute("SELECT graphile_worker.add_job('perm', '{}'::json, job_key => 'perm')")
        c.execute("""SELECT graphile_worker.permanently_fail_jobs(ARRAY[(SELECT id FROM graphile_worker._private_jobs
                                                                           WHERE key = 'perm')], 'given up by hand')""")
        rows = c.execute("""SELECT coalesce(key, task_identifier), attempts, max_attempts, locked_at IS NOT NULL,
                                   run_at > now()
                            FROM graphile_worker.jobs ORDER BY 1""").fetchall()
    # The exhausted one's run_at moved on too (failJobs always adds the backoff): failed all the same.
    assert rows == [("boom", 1, 1, False, True), ("last-attempt", 1, 1, True, False), ("later", 0, 25, False, True),
                    ("perm", 25, 25, False, False), ("retrying", 1, 5, False, True), ("stuck", 1, 25, True, False),
                    ("waiting", 0, 25, False, False)], rows

    report = cycle(dsn, Options(external=(GW,)))

    assert report.details["external_sources"]["gw"]["error"] is None
    assert figures(report, "graphile-worker", "gw") == expect(
        waiting={"eligible": 1}, later={"scheduled": 1},
        boom={"scheduled": 1, "failed": 1, "dead": 1},  # one retrying with backoff, one out of attempts
        hang={"running": 2, "stuck": 1},  # on its last attempt it is still running, not failed
        perm={"failed": 1, "dead": 1})  # ok: deleted when it succeeded
    age = ages(report, "graphile-worker", "gw")
    assert 0 < age.pop("waiting") < 120 and set(age.values()) == {0.0}
    assert [s for s in report.samples if s.metric == "throughput" and s.labels.get("system") == "graphile-worker"] == []
    # Due: its get_job takes run_at <= now(), so a job at the instant is due.
    assert due_at_the_instant(dsn, GW, "UPDATE graphile_worker._private_jobs SET run_at = now() "
                                       "WHERE task_id = (SELECT id FROM graphile_worker._private_tasks "
                                       "WHERE identifier = 'later')") == {"waiting": 1, "later": 1, "boom": 0}


# --- pg-boss (npm) ------------------------------------------------------------------------------

PB = ExternalQueue(name="boss", system="pg-boss")
PGBOSS_STATES = r"""
const PgBoss = require('pg-boss');
const url = process.argv[2];
(async () => {
  const boss = new PgBoss(url);
  boss.on('error', e => console.error(e));
  await boss.start();  // creates the pgboss schema
  const names = ['due', 'later', 'active', 'stuck', 'retry', 'failed', 'completed', 'cancelled'];
  for (const q of names) await boss.createQueue(q);
  await boss.send('due', {});
  await boss.send('later', {}, { startAfter: 3600 });
  await boss.send('active', {}, { expireInSeconds: 3600 });
  await boss.send('stuck', {}, { expireInSeconds: 60 });
  await boss.send('retry', {}, { retryLimit: 1, retryDelay: 3600 });
  await boss.send('failed', {}, { retryLimit: 0 });
  await boss.send('completed', {});
  await boss.send('cancelled', {});
  const one = async q => (await boss.fetch(q))[0];
  await one('active');
  await one('stuck');
  await boss.fail('retry', (await one('retry')).id, { message: 'try again later' });
  await boss.fail('failed', (await one('failed')).id, { message: 'no retries left' });
  await boss.complete('completed', (await one('completed')).id);
  const [cancel] = await boss.fetch('cancelled');
  await boss.cancel('cancelled', cancel.id);
  await boss.stop({ graceful: false, wait: true });
  console.log('STATES');
})().catch(e => { console.error(e); process.exit(1); });
"""


def test_pgboss_every_state_counts_as_exactly_one_of_ours(library_db, tmp_path_factory):  # noqa: F811
    home = node_home(tmp_path_factory, "pg-boss@10.4.2")
    (home / "states.js").write_text(PGBOSS_STATES)
    dsn = library_db()
    done = subprocess.run(["node", "states.js", url(dsn)], cwd=home, timeout=120, capture_output=True, text=True)
    assert "STATES" in done.stdout, done.stdout + done.stderr
    with connect(dsn) as c:  # one job started a minute and a half ago with a minute to run: past its expiry
        c.execute("UPDATE pgboss.job SET started_on = now() - interval '90 seconds' WHERE name = 'stuck'")
        states = dict(c.execute("SELECT name, state::text FROM pgboss.job").fetchall())
    assert states == {"due": "created", "later": "created", "active": "active", "stuck": "active", "retry": "retry",
                      "failed": "failed", "completed": "completed", "cancelled": "cancelled"}

    report = cycle(dsn, Options(external=(PB,)))

    assert report.details["external_sources"]["boss"]["error"] is None
    assert figures(report, "pg-boss", "boss") == expect(
        due={"eligible": 1}, later={"scheduled": 1}, active={"running": 1}, stuck={"running": 1, "stuck": 1},
        retry={"scheduled": 1}, failed={"failed": 1, "dead": 1})  # completed, cancelled: finished
    age = ages(report, "pg-boss", "boss")
    assert 0 < age.pop("due") < 120 and set(age.values()) == {0.0}
    # Due: its fetch takes start_after < now(), so a job at the instant is not yet due.
    assert due_at_the_instant(dsn, PB, "UPDATE pgboss.job SET start_after = now() WHERE name = 'later'") == {
        "due": 1, "later": 0, "retry": 0}


# --- a hand-rolled table ------------------------------------------------------------------------

APP = ExternalQueue(name="app", system="table", table="public.app_jobs", queue_column="queue",
                    pending="status = 'new'", running="status = 'working'", failed="status = 'dead'",
                    completed="status = 'done'", enqueued_at="created_at", lease_until="locked_until")


def test_a_declared_table_counts_each_of_its_states_by_the_operators_predicates(conn, dsn):
    conn.execute("""CREATE TABLE public.app_jobs (id bigserial PRIMARY KEY, queue text NOT NULL,
                        status text NOT NULL DEFAULT 'new', created_at timestamptz NOT NULL DEFAULT now(),
                        locked_until timestamptz);
                    INSERT INTO public.app_jobs (queue, status, created_at, locked_until) VALUES
                        ('new', 'new', now() - interval '10 minutes', NULL),
                        ('working', 'working', now(), now() + interval '1 hour'),
                        ('lapsed', 'working', now(), now() - interval '1 second'),
                        ('dead', 'dead', now(), NULL),
                        ('done', 'done', now(), NULL)""")

    report = cycle(dsn, Options(external=(APP,)))

    assert report.details["external_sources"]["app"]["error"] is None
    assert figures(report, "table", "app") == expect(
        new={"eligible": 1}, working={"running": 1}, lapsed={"running": 1, "stuck": 1}, dead={"failed": 1, "dead": 1})
    age = ages(report, "table", "app")
    assert 600 <= age.pop("new") < 720 and set(age.values()) == {0.0}
    # A lease is lapsed after its instant, not at it (as Skiplock's own reaper judges).
    with psycopg.connect(dsn) as c, c.cursor(row_factory=dict_row) as cur:
        cur.execute("UPDATE public.app_jobs SET locked_until = now() WHERE queue = 'lapsed'")
        snap = external.snapshot(cur, external.adapter_for(APP), cap=1000, failed_cap=1000)
        c.rollback()
    assert {f.queue: f.stuck for f in snap.queues if f.running} == {"working": 0, "lapsed": 0}
