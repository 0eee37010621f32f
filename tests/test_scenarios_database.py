"""Scenarios of PostgreSQL's trouble around the queue (tests/scenarios.py says what each one
checks): claims waiting on a table lock, autovacuum behind, an xmin holder of each kind a
primary alone can have (a long query, a session idle in transaction, a prepared transaction;
the standby and its slot are in test_scenarios_replica.py), a lock convoy, a MultiXact spike,
transaction-ID age, a WAL flood; and the converse, a long transaction that holds no horizon.

Every condition is made for real by sessions of this test; the console's collectors find it."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql

from console import queue as q
from tests.collector_helpers import eventually
from tests.scenarios import INTERVAL, SCALED, scenario_console
from tests.workers import WorkerProcs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.scenario]


class Loop(threading.Thread):
    """Run `step(conn)` on its own connection until stopped (a session of the scenario)."""

    def __init__(self, dsn: str, step, *, autocommit: bool = True, name: str = "scenario-loop"):
        super().__init__(daemon=True)
        self.dsn, self.step, self.autocommit, self.app = dsn, step, autocommit, name
        self.halt = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=self.autocommit, application_name=self.app) as conn:
                while not self.halt.is_set():
                    self.step(conn)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the scenario's session did not stop"


# --- claims and locks ------------------------------------------------------------------------

def test_claims_wait_on_a_table_lock(dsn, conn, tmp_path, subprocess_env):
    """A session takes a lock on the jobs table that conflicts with claims, over and over (a
    migration retried in a loop): the workers' claims wait, their p95 climbs past the threshold."""
    workers = WorkerProcs(subprocess_env)
    try:
        workers.start("--queues", "claims", "--concurrency", "2")

        def lock_a_while(c):
            with c.transaction():
                c.execute("LOCK TABLE skiplock.jobs IN SHARE ROW EXCLUSIVE MODE")
                time.sleep(0.4)
            time.sleep(0.1)

        with scenario_console(dsn, tmp_path, name="claims wait on a lock") as console:
            console.tick()
            locker = Loop(dsn, lock_a_while, autocommit=True, name="schema-migration")
            t0 = time.monotonic()
            locker.start()
            try:
                # A trickle of jobs (its enqueues wait on the lock too); between them the worker
                # polls, and every claim waits for the lock: the p95 of the next flush is past it.
                # When the workers' p95 passes the threshold depends on their flushes and claims,
                # which a loaded machine delays: the budget runs from the cycle that first sees it.
                threshold = SCALED["claim_latency_p95"]["threshold"]
                fired = console.expect_firing(
                    "claim_latency_p95", since=t0, mention="claiming a job takes", offender="check-claim-plan",
                    every=lambda: q.enqueue_many(conn, [q.NewJob("noop", queue="claims") for _ in range(5)]),
                    scenario="claims wait on a table lock",
                    holds=lambda: any(v > threshold for v in console.sampled(
                        "claim_latency_seconds", source="workers", quantile="p95")))
                assert fired.value > SCALED["claim_latency_p95"]["threshold"]
                figure = next(f for f in console.api("/api/v1/overview")["figures"] if f["key"] == "claim")
                assert figure["level"] == "warn" and figure["value"] > 0.15
            finally:
                locker.stop()
            console.expect_resolved(fired, budget=20)
    finally:
        workers.stop_all()


def test_a_lock_convoy(dsn, conn, tmp_path):
    """A session holds a row of the jobs table; three others queue behind it to update it."""
    job = q.enqueue(conn, "noop", queue="convoy")
    [claimed] = q.claim(conn, "w", queues=["convoy"])
    q.complete(conn, claimed)
    with scenario_console(dsn, tmp_path, name="lock convoy") as console:
        console.tick()
        holder = psycopg.connect(dsn, application_name="bulk-fixer")
        holder.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (job,))
        waiters = []
        t0 = time.monotonic()
        try:
            for i in range(3):
                waiter = psycopg.connect(dsn, autocommit=True, application_name=f"convoy-{i}")
                thread = threading.Thread(target=lambda c=waiter: c.execute(
                    "UPDATE skiplock.jobs SET priority = priority WHERE id = %s", (job,)), daemon=True)
                thread.start()
                waiters.append((waiter, thread))
            fired = console.expect_firing("jobs_lock_waits", since=t0 + 0.5, labels={"relation": "jobs"},
                                          mention="wait on a lock", offender=f'data-pid="{holder.info.backend_pid}"',
                                          scenario="lock convoy")
            assert fired.value == 3
            page = console.page("/health")
            assert "bulk-fixer" in page and all(f'data-pid="{w.info.backend_pid}"' in page for w, _ in waiters)
            locks = console.api("/api/v1/health")["locks"]
            assert locks["waiting"] == 3 and locks["tree"][0]["pid"] == holder.info.backend_pid
            assert locks["level"] != "good"  # the panel agrees with the alert (it was green under 5 s)
        finally:
            holder.rollback()
            holder.close()
            for waiter, thread in waiters:
                thread.join(timeout=10)
                waiter.close()
        console.expect_resolved(fired, budget=console.budget("jobs_lock_waits"))


# --- vacuum and the horizon -----------------------------------------------------------------------

def test_autovacuum_behind(dsn, conn, tmp_path):
    """Dead rows pile up in the jobs table past its autovacuum threshold and no vacuum runs
    (autovacuum is off for the table, as a careless tuning would leave it)."""
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = off)")
    with scenario_console(dsn, tmp_path, name="autovacuum behind") as console:
        console.tick()
        # The jobs table's own threshold is 5,000 dead rows (migration 001: scale factor 0).
        ids = q.enqueue_many(conn, [q.NewJob("noop", queue="churn") for _ in range(6000)])
        conn.execute("DELETE FROM skiplock.jobs WHERE id = ANY(%s)", (ids,))
        conn.execute("SELECT pg_stat_force_next_flush()")
        eventually(lambda: conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = "
                                        "'skiplock.jobs'::regclass").fetchone()[0] >= 6000)
        since = time.monotonic()
        fired = console.expect_firing("autovacuum_behind", since=since, labels={"table": "jobs"}, mention="dead rows",
                                      offender="Dead rows are above the autovacuum threshold",
                                      scenario="autovacuum behind")
        tables = console.api("/api/v1/health")["tables"]
        jobs = next(t for t in tables["tables"] if t["table"] == "jobs")
        assert jobs["dead"] >= 6000 and jobs["level"] == "warn"
        conn.execute("ALTER TABLE skiplock.jobs RESET (autovacuum_enabled)")
        conn.execute("VACUUM skiplock.jobs")
        console.expect_resolved(fired, budget=20)


def _long_query(dsn: str):
    """A report that runs for a minute in REPEATABLE READ: an active transaction's snapshot."""
    session = psycopg.connect(dsn, application_name="nightly-report")
    session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    thread = threading.Thread(target=lambda: _swallow(session, "SELECT pg_sleep(60)"), daemon=True)
    thread.start()
    wait_for(lambda: psycopg.connect(dsn, autocommit=True).execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'nightly-report' AND state = 'active'"
    ).fetchone()[0] == 1, timeout=10, what="the report to run")

    def end():
        psycopg.connect(dsn, autocommit=True).execute("SELECT pg_cancel_backend(%s)", (session.info.backend_pid,))
        thread.join(timeout=10)
        session.close()

    return session.info.backend_pid, "nightly-report", end


def _swallow(session, text: str) -> None:
    try:
        session.execute(text)
    except psycopg.Error:
        pass


def _idle_in_transaction(dsn: str):
    session = psycopg.connect(dsn, application_name="forgotten-shell")
    session.execute("SELECT txid_current()")  # an xid, then nothing: idle in transaction

    def end():
        session.rollback()
        session.close()

    return session.info.backend_pid, "forgotten-shell", end


def _prepared(dsn: str):
    gid = "scenario-2pc"
    with psycopg.connect(dsn) as session:
        session.execute("SELECT txid_current()")
        session.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))

    def end():
        psycopg.connect(dsn, autocommit=True).execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))

    return None, gid, end


@pytest.mark.parametrize("kind", ["transaction", "idle_in_transaction", "prepared_transaction"])
def test_an_xmin_holder(dsn, conn, tmp_path, kind):
    """Something holds the xmin horizon past the vacuum_blocked threshold: the alert fires, and
    the Database page its "look here" opens names the same holder as holding back vacuum (it
    used a threshold of its own and said "no sessions are holding back vacuum")."""
    make = {"transaction": _long_query, "idle_in_transaction": _idle_in_transaction, "prepared_transaction": _prepared}[kind]
    with scenario_console(dsn, tmp_path, name=f"xmin holder {kind}") as console:
        console.tick()
        t0 = time.monotonic()
        pid, who, end = make(dsn)
        try:
            fired = console.expect_firing("vacuum_blocked", since=t0 + SCALED["vacuum_blocked"]["threshold"],
                                          labels={"holder": "any"}, mention="xmin horizon",
                                          offender=f'data-holder="{pid if pid is not None else who}"',
                                          scenario=f"xmin holder: {kind}")
            holders = console.api("/api/v1/health")["holders"]
            mine = [h for h in holders["holders"] if h["kind"] == kind]
            assert mine and mine[0]["level"] in ("warn", "bad") and mine[0]["advice"], holders
            assert "No sessions are holding back vacuum" not in console.page("/health")
            assert console.metric("xmin_horizon_age_seconds", holder=kind)[0] > SCALED["vacuum_blocked"]["threshold"]
        finally:
            end()
        console.expect_resolved(fired, budget=console.budget("vacuum_blocked"))


def test_a_long_transaction_that_holds_no_horizon_fires_nothing(dsn, conn, tmp_path):
    """A session idle in a READ COMMITTED transaction that read but wrote nothing has no
    snapshot and no xid: it holds back nothing, so nothing fires and the page says so."""
    with scenario_console(dsn, tmp_path, name="harmless transaction") as console:
        session = psycopg.connect(dsn, application_name="harmless-shell")
        try:
            session.execute("SELECT count(*) FROM skiplock.jobs")  # then idle in transaction
            console.expect_quiet(SCALED["vacuum_blocked"]["threshold"] + 4 * INTERVAL)
            assert console.metric("xmin_horizon_age_seconds", holder="any") == [0.0]
            assert "No sessions are holding back vacuum" in console.page("/health")
            assert console.metric("idle_in_transaction_sessions")[0] >= 1  # it is seen, as harmless
        finally:
            session.rollback()
            session.close()


# --- MultiXact, wraparound, WAL -----------------------------------------------------------------

def test_a_multixact_spike(dsn, conn, tmp_path):
    """Sessions share-lock the same job row while another holds it share-locked (a foreign key
    to the jobs table does this): every share lock makes a new MultiXact ID."""
    job = q.enqueue(conn, "noop", queue="mx")
    [claimed] = q.claim(conn, "w", queues=["mx"])
    q.complete(conn, claimed)
    holder = psycopg.connect(dsn, application_name="fk-holder")
    holder.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR SHARE", (job,))

    def share(c):
        with c.transaction():
            c.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR SHARE", (job,))

    sharers = [Loop(dsn, share, name=f"fk-check-{i}") for i in range(2)]
    try:
        with scenario_console(dsn, tmp_path, name="multixact spike") as console:
            console.tick()
            t0 = time.monotonic()
            for s in sharers:
                s.start()
            fired = console.expect_firing("multixact_spike", since=t0 + 1.0, mention="MultiXact IDs consumed",
                                          offender="MultiXact", scenario="multixact spike")
            assert fired.value > SCALED["multixact_spike"]["threshold"]
            slru = console.api("/api/v1/health")["slru"]
            assert slru["multixact_per_s"] > SCALED["multixact_spike"]["threshold"] and slru["level"] != "good"
            for s in sharers:
                s.stop()
            console.expect_resolved(fired, budget=console.budget("multixact_spike") + 5)
    finally:
        for s in sharers:
            if s.is_alive():
                s.stop()
        holder.rollback()
        holder.close()


def test_wraparound_age(dsn, conn, tmp_path):
    """The jobs table's transaction-ID age passes the threshold (set just above its age now,
    then 300 transactions are spent): the alert fires at once, names the table, and resolves
    when VACUUM (FREEZE) has frozen it."""
    age = max(conn.execute("SELECT age(relfrozenxid) FROM pg_class WHERE oid = ANY(ARRAY["
                           "'skiplock.jobs'::regclass, 'skiplock.jobs_archive'::regclass])").fetchone())
    threshold = int(age) + 150
    with scenario_console(dsn, tmp_path, name="wraparound", overrides={"wraparound_age": {"threshold": threshold}}) as console:
        console.tick()
        with psycopg.connect(dsn, autocommit=True) as spender:
            for _ in range(300):
                spender.execute("SELECT txid_current()")
        since = time.monotonic()
        fired = console.expect_firing("wraparound_age", since=since, labels={"table": "jobs", "part": "heap"},
                                      mention="of jobs (heap)", offender="jobs", scenario="wraparound age")
        rows = console.api("/api/v1/health")["wraparound"]["rows"]
        assert any(r["xid_age"] > threshold for r in rows), rows
        conn.execute("VACUUM (FREEZE) skiplock.jobs")
        conn.execute("VACUUM (FREEZE) skiplock.jobs_archive")
        console.expect_resolved(fired, budget=console.budget("wraparound_age") + 3)


def test_a_wal_flood(dsn, conn, tmp_path):
    """A session rewrites 20 MB of rows over and over: WAL past the threshold."""
    conn.execute("CREATE TABLE public.flood (id int PRIMARY KEY, body text) WITH (fillfactor = 50)")
    conn.execute("INSERT INTO public.flood SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) AS g")

    def rewrite(c):
        # New random bodies: an update that keeps the old bytes is logged as its difference only.
        c.execute("UPDATE public.flood SET body = repeat(md5(random()::text), 31)")

    flood = Loop(dsn, rewrite, name="bulk-rewrite")
    with scenario_console(dsn, tmp_path, name="wal flood") as console:
        console.tick()
        t0 = time.monotonic()
        flood.start()
        try:
            fired = console.expect_firing("wal_rate", since=t0 + 1.0, mention="WAL written at", offender="WAL",
                                          scenario="wal flood")
            wal = console.api("/api/v1/health")["wal"]
            assert wal["wal_bytes_per_s"] > SCALED["wal_rate"]["threshold"] and wal["level"] != "good"
        finally:
            flood.stop()
        console.expect_resolved(fired, budget=console.budget("wal_rate") + 3)
