"""Actions on queues Skiplock watches, against the real Python libraries (PGQueuer and
Procrastinate), their schemas created by their own tools, with their own workers running.

Each database gets `flaky` jobs (tests/external_workers.py) that fail for good while a switch
file exists: held as dead letters by the library's worker. Then the console acts through
console.external.actions, exactly as the faces do (preview, start bound to the preview, run),
and the library itself shows the result: a replayed job is run by its worker (one row in
`runs` per run), a purged job is gone from its own listing and recorded in its own log, a
cancelled job never runs. The race: the worker claims replayed jobs while a purge of the same
group works through it; every job ends run once or purged, never both, never twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from console.config import ExternalQueue
from console.db import connect
from console.external import actions as xa
from console.external import adapter_for
from console.maintenance.errors import PreviewMismatch
from tests import external_workers as w
from tests.collector_helpers import eventually
from tests.test_external_libraries import (  # noqa: F401
    BIN,
    ROOT,
    kill,
    library_db,
    run_async,
    scalar,
    start,
    url,
    wait_for_line,
)

pytestmark = pytest.mark.slow
ACTOR = "alice"
REASON = "INC-77: the SMTP relay is fixed"
RUNS = "CREATE TABLE runs (job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())"


def rows(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with connect(dsn) as c:
        return c.execute(statement, params).fetchall()


def act(dsn: str, adapter, action: str, selection: xa.Selection, *, batch_size: int = 500, run: bool = True):
    """What a face does: preview, start bound to the preview, run. Returns (preview, progress)."""
    with connect(dsn) as c:
        p = xa.preview(c, adapter, selection)
        op_id = xa.start(c, c, adapter, action, selection, actor=ACTOR, reason=REASON, batch_size=batch_size,
                         preview=p.bound())
        if not run:
            return p, op_id
    return p, xa.run(dsn, op_id, {adapter.name: adapter})


# --- PGQueuer -----------------------------------------------------------------------------------

PGQ = ExternalQueue(name="legacy", system="pgqueuer", actions=True, stuck_after=timedelta(minutes=5))


async def pgqueuer_failed(dsn: str) -> list[int]:
    """PGQueuer's own listing of held failed jobs (Queries.list_failed_jobs, `pgq failed`)."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return sorted(j.id for j in await Queries(PsycopgDriver(conn)).list_failed_jobs(limit=10_000))


@pytest.fixture
def pgqueuer_flaky(library_db, tmp_path):  # noqa: F811
    """A PGQueuer database with 30 flaky jobs held as failed by its own consumer, which keeps
    running; yields (dsn, switch file, consumer)."""
    dsn = library_db()
    run_async(w.pgqueuer_install(url(dsn)))
    with connect(dsn) as c:
        c.execute(RUNS)
    switch = tmp_path / "switch"
    switch.write_text("on")
    run_async(w.pgqueuer_produce(url(dsn), ["flaky"] * 30))
    consumer = start([sys.executable, "-m", "tests.external_workers", "pgqueuer-consume", url(dsn)],
                     {"FLAKY_SWITCH": str(switch)})
    try:
        wait_for_line(consumer, "CONSUMING")
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 30, timeout=60)
        yield dsn, switch, consumer
    finally:
        kill(consumer)


def test_pgqueuer_replay_is_run_by_its_own_consumer(pgqueuer_flaky):
    dsn, switch, _ = pgqueuer_flaky
    held = run_async(pgqueuer_failed(url(dsn)))
    assert len(held) == 30
    switch.unlink()  # the cause is fixed

    p, done = act(dsn, adapter_for(PGQ), "replay", xa.Selection(queue="flaky"), batch_size=7)

    assert (p.total, done["state"], done["done"], done["skipped"], done["batches"]) == (30, "done", 30, 0, 5)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 30, timeout=60)
    assert sorted(r[0] for r in rows(dsn, "SELECT job_id FROM runs")) == held  # each once, by its consumer
    assert run_async(pgqueuer_failed(url(dsn))) == []
    # its log: each job enqueued and replayed ('queued' twice), then done (the consumer logs in batches)
    eventually(lambda: rows(dsn, "SELECT status::text, count(*) FROM pgqueuer_log WHERE job_id = ANY(ARRAY(SELECT job_id "
                                 "FROM runs)) AND status IN ('queued', 'successful') GROUP BY 1 ORDER BY 1")
               == [("queued", 60), ("successful", 30)], timeout=30)
    audit = rows(dsn, "SELECT action, outcome, rows, target, reason, detail->>'system', detail->>'external', "
                      "detail->>'queue' FROM skiplock.audit_log ORDER BY id")
    assert audit == [("replay", "started", 30, f"pgqueuer:legacy/operation:{done['id']}", REASON, "pgqueuer", "legacy", "flaky"),
                     ("replay", "ok", 30, f"pgqueuer:legacy/operation:{done['id']}", REASON, "pgqueuer", "legacy", "flaky")]


def test_pgqueuer_purge_is_gone_from_its_own_listing_and_logged_deleted(pgqueuer_flaky):
    dsn, _, _ = pgqueuer_flaky
    held = run_async(pgqueuer_failed(url(dsn)))

    p, done = act(dsn, adapter_for(PGQ), "purge", xa.Selection(keys=tuple(str(i) for i in held[:10])))

    assert (p.total, done["state"], done["done"]) == (10, "done", 10)
    assert run_async(pgqueuer_failed(url(dsn))) == held[10:]
    assert sorted(r[0] for r in rows(dsn, "SELECT job_id FROM pgqueuer_log WHERE status = 'deleted'")) == held[:10]
    assert scalar(dsn, "SELECT count(*) FROM runs") == 0


def test_pgqueuer_cancel_of_a_waiting_job_and_a_stale_preview(pgqueuer_flaky):
    dsn, switch, _ = pgqueuer_flaky
    run_async(w.pgqueuer_produce(url(dsn), ["nobody-listens"] * 2))
    waiting = [r[0] for r in rows(dsn, "SELECT id FROM pgqueuer WHERE entrypoint = 'nobody-listens' ORDER BY id")]
    adapter = adapter_for(PGQ)
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [str(waiting[0]), str(run_async(pgqueuer_failed(url(dsn)))[0])], actor=ACTOR)
        assert (out.changed, out.asked) == (1, 2)  # a failed job is not waiting: left alone
        assert [r[0] for r in c.execute("SELECT id FROM pgqueuer WHERE entrypoint = 'nobody-listens'")] == waiting[1:]
        assert c.execute("SELECT status::text FROM pgqueuer_log WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                         (waiting[0],)).fetchone()[0] == "canceled"
        # A preview is bound to the jobs it counted: one more failure since, and the start is refused.
        p = xa.preview(c, adapter, xa.Selection(queue="flaky"))
        run_async(w.pgqueuer_produce(url(dsn), ["flaky"]))
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 31, timeout=30)
        with pytest.raises(PreviewMismatch, match="now matches 31 dead letters, you previewed 30"):
            xa.start(c, c, adapter, "purge", xa.Selection(queue="flaky"), actor=ACTOR, reason=REASON, preview=p.bound())
        assert c.execute("SELECT count(*) FROM skiplock.external_operations").fetchone()[0] == 0


def test_pgqueuer_race_its_consumer_claims_replayed_jobs_while_a_purge_works_the_same_group(pgqueuer_flaky):
    """Two operations over the same 30 dead letters, started from one preview and run at once in
    batches of 3: the replay hands jobs to the running consumer, which claims them at once; the
    purge meets each job either still failed (it deletes it) or already replayed, claimed or run
    (it skips it). Every job ends exactly once: run once, or purged; never both, never twice."""
    dsn, switch, _ = pgqueuer_flaky
    held = run_async(pgqueuer_failed(url(dsn)))
    switch.unlink()
    adapter = adapter_for(PGQ)
    sel = xa.Selection(queue="flaky")
    with connect(dsn) as c:
        p = xa.preview(c, adapter, sel)
        replay = xa.start(c, c, adapter, "replay", sel, actor=ACTOR, reason=REASON, batch_size=3, preview=p.bound())
        purge = xa.start(c, c, adapter, "purge", sel, actor=ACTOR, reason=REASON, batch_size=3, preview=p.bound())
    results: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda op=op: results.__setitem__(op, xa.run(dsn, op, {"legacy": adapter})))
               for op in (replay, purge)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    replayed, purged = results[replay], results[purge]
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer") == 0, timeout=60)  # all run or gone

    ran = [r[0] for r in rows(dsn, "SELECT job_id FROM runs ORDER BY job_id")]
    deleted = [r[0] for r in rows(dsn, "SELECT job_id FROM pgqueuer_log WHERE status = 'deleted' ORDER BY job_id")]
    assert len(ran) == len(set(ran)), "a job ran twice"
    assert not set(ran) & set(deleted), "a job was both run and purged"
    assert sorted(ran + deleted) == held, "a job was lost"
    assert (replayed["done"], purged["done"]) == (len(ran), len(deleted))
    assert replayed["done"] + replayed["skipped"] == purged["done"] + purged["skipped"] == 30


# --- Procrastinate ------------------------------------------------------------------------------

PROC = ExternalQueue(name="tasks", system="procrastinate", actions=True, stuck_after=timedelta(minutes=5))


async def procrastinate_jobs(dsn: str, status: str) -> list[int]:
    """Procrastinate's own listing (JobManager.list_jobs_async) of the flaky queue's jobs in `status`."""
    import procrastinate

    with w.app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
        async with w.app.open_async():
            return sorted(j.id for j in await w.app.job_manager.list_jobs_async(queue="flaky", status=status))


async def procrastinate_defer(dsn: str, name: str, n: int) -> None:
    import procrastinate

    with w.app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
        async with w.app.open_async():
            for _ in range(n):
                await w.app.tasks[name].defer_async()


@pytest.fixture
def procrastinate_flaky(library_db, tmp_path):  # noqa: F811
    dsn = library_db()
    env = {"PROCRASTINATE_DSN": url(dsn)}
    cli = [str(BIN / "procrastinate"), "--app=tests.external_workers.app"]
    subprocess.run([*cli, "schema", "--apply"], check=True, timeout=60, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    with connect(dsn) as c:
        c.execute(RUNS)
    switch = tmp_path / "switch"
    switch.write_text("on")
    run_async(procrastinate_defer(url(dsn), "flaky", 20))
    worker = start([*cli, "worker", "-q", "flaky", "--concurrency", "4"], {**env, "FLAKY_SWITCH": str(switch)})
    try:
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'") == 20, timeout=60)
        yield dsn, switch, worker
    finally:
        kill(worker)


def test_procrastinate_replay_through_retry_job_is_run_by_its_worker(procrastinate_flaky):
    dsn, switch, _ = procrastinate_flaky
    failed = run_async(procrastinate_jobs(url(dsn), "failed"))
    switch.unlink()

    p, done = act(dsn, adapter_for(PROC), "replay", xa.Selection(queue="flaky"), batch_size=6)

    assert (p.total, done["state"], done["done"], done["batches"]) == (20, "done", 20, 4)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 20, timeout=60)
    assert sorted(r[0] for r in rows(dsn, "SELECT job_id FROM runs")) == failed
    assert run_async(procrastinate_jobs(url(dsn), "succeeded")) == failed  # its own listing
    assert scalar(dsn, "SELECT count(*) FROM procrastinate_events WHERE type = 'retried'") == 20  # its trigger's record


def test_procrastinate_purge_and_cancel(procrastinate_flaky):
    dsn, _, _ = procrastinate_flaky
    failed = run_async(procrastinate_jobs(url(dsn), "failed"))
    adapter = adapter_for(PROC)

    p, done = act(dsn, adapter, "purge", xa.Selection(keys=tuple(map(str, failed[:5]))))

    assert (p.total, done["done"]) == (5, 5)
    assert run_async(procrastinate_jobs(url(dsn), "failed")) == failed[5:]
    assert rows(dsn, "SELECT count(*) FROM procrastinate_events WHERE job_id = ANY(%s)", (failed[:5],)) == [(0,)]
    run_async(procrastinate_defer(url(dsn), "waiting", 1))  # queue "idle": no worker listens
    job = scalar(dsn, "SELECT id FROM procrastinate_jobs WHERE queue_name = 'idle'")
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [str(job)], actor=ACTOR, reason="not needed any more")
    assert out.changed == 1
    assert rows(dsn, "SELECT status::text FROM procrastinate_jobs WHERE id = %s", (job,)) == [("cancelled",)]


def test_procrastinate_race_its_worker_claims_while_the_group_is_purged(procrastinate_flaky):
    dsn, switch, _ = procrastinate_flaky
    failed = run_async(procrastinate_jobs(url(dsn), "failed"))
    switch.unlink()
    adapter = adapter_for(PROC)
    sel = xa.Selection(queue="flaky")
    with connect(dsn) as c:
        p = xa.preview(c, adapter, sel)
        ops = [xa.start(c, c, adapter, action, sel, actor=ACTOR, reason=REASON, batch_size=2, preview=p.bound())
               for action in ("replay", "purge")]
    results: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda op=op: results.__setitem__(op, xa.run(dsn, op, {"tasks": adapter})))
               for op in ops]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')") == 0,
               timeout=60)
    ran = [r[0] for r in rows(dsn, "SELECT job_id FROM runs ORDER BY job_id")]
    left = run_async(procrastinate_jobs(url(dsn), "succeeded"))
    assert len(ran) == len(set(ran)), "a job ran twice"
    assert ran == left
    gone = sorted(set(failed) - set(left))
    assert rows(dsn, "SELECT id FROM procrastinate_jobs WHERE id = ANY(%s)", (gone,)) == []
    assert results[ops[0]]["done"] + results[ops[1]]["done"] == 20 == len(ran) + len(gone)


# --- the opt-in --------------------------------------------------------------------------------

def test_actions_are_refused_before_anything_connects_when_the_entry_did_not_opt_in(tmp_path):
    off = adapter_for(ExternalQueue(name="legacy", system="pgqueuer"))
    table = adapter_for(ExternalQueue(name="app", system="table", table="t", pending="true"))
    closed = None  # no connection at all: the refusal comes before any would be used
    for adapter, complaint in ((off, "actions are off for 'legacy'"), (table, "offers no replay")):
        with pytest.raises(xa.ActionsOff, match=complaint):
            xa.start(closed, closed, adapter, "replay", xa.Selection(all=True), actor=ACTOR, reason=REASON)
    with pytest.raises(xa.ActionsOff, match="actions are off"):
        xa.cancel_jobs(closed, closed, off, ["1"], actor=ACTOR)
    with pytest.raises(xa.ActionsOff, match="PGQueuer has no queue pause"):
        xa.set_paused(closed, closed, adapter_for(PGQ), "flaky", True, actor=ACTOR, reason=REASON)
    assert Path(tmp_path).exists()
