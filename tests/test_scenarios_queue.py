"""Scenarios of the queue's own trouble (tests/scenarios.py says what each one checks): a
stalled queue, a burst, a paused queue with work, a limited queue at its limit, stuck leases
after a kill -9, the worker fleet gone, a periodic job that keeps failing, the scheduler gone or
crashed; and the converse, healthy busy traffic and a slow but steady queue, which fire nothing.
Failures (dead letters, error groups, retries) are in tests/test_scenarios_failures.py: the two
files run on the two xdist workers side by side.

Real worker processes (tests/workers.py) run the jobs; the queue API makes the conditions a
worker would."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from console import queue as q
from console.maintenance import pause_queue, resume_queue
from console.queue import limits
from tests.scenarios import INTERVAL, SCALED, live_workers, scenario_console, shows_all
from tests.workers import stop_processes, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.scenario]


# --- queue age ---------------------------------------------------------------------------------

def test_a_stalled_queue(dsn, conn, tmp_path, workers):
    """Jobs wait in a queue no worker serves (the only worker listens elsewhere)."""
    workers.start("--queues", "other")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="stalled queue") as console:
        console.tick()
        t0 = time.monotonic()
        ids = [q.enqueue(conn, "noop", {"n": i}, queue="stalled") for i in range(3)]
        fired = console.expect_firing("queue_age", since=t0 + SCALED["queue_age"]["threshold"], labels={"queue": "stalled"},
                                      mention="queue stalled", offender=shows_all(ids), scenario="stalled queue")
        row = next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "stalled")
        assert row["eligible"] == 3 and not row["idle"] and row["drain"]["state"] != "empty"
        assert row["level"] == "bad" and row["levels"]["age"] == "bad"  # the Queues page agrees with the alert
        overview = {r["queue"]: r for r in console.api("/api/v1/overview")["queues"]}
        assert overview["stalled"]["level"] == "bad" and overview["stalled"]["oldest_age_s"] >= 4
        assert console.alert("workers_zero") is None  # a worker is live: only the queue is stalled
        workers.start("--queues", "stalled")
        console.expect_resolved(fired, budget=20)


def test_a_burst(dsn, conn, tmp_path, workers):
    """A burst of slow jobs into a queue one handler thread serves: the head waits past 4 s."""
    workers.start("--queues", "search", "--concurrency", "1")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="burst") as console:
        console.tick()
        t0 = time.monotonic()
        q.enqueue_many(conn, [q.NewJob("record", {"sleep": 0.4}, queue="search") for _ in range(60)])
        conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                     "at timestamptz DEFAULT clock_timestamp())")
        ids = [r[0] for r in conn.execute("SELECT id FROM skiplock.jobs WHERE queue = 'search' AND status = 'pending' "
                                          "ORDER BY priority DESC, run_at, id LIMIT 3")]
        fired = console.expect_firing("queue_age", since=t0 + SCALED["queue_age"]["threshold"], labels={"queue": "search"},
                                      mention="queue search", offender=lambda html: any(f">{i}<" in html for i in ids)
                                      or ">search<" in html, scenario="burst")
        assert not next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "search")["idle"]
        console.expect_resolved(fired, budget=60)


def test_a_paused_queue_with_work(dsn, conn, tmp_path, workers):
    """An operator paused the queue and forgot: its jobs wait though a worker serves it."""
    workers.start()
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="paused queue") as console:
        pause_queue(conn, "mail", actor="alice", reason="SMTP relay maintenance")
        console.tick()
        t0 = time.monotonic()
        ids = [q.enqueue(conn, "noop", queue="mail") for _ in range(2)]
        fired = console.expect_firing("queue_age", since=t0 + SCALED["queue_age"]["threshold"], labels={"queue": "mail"},
                                      mention="queue mail", offender=shows_all(ids), scenario="paused queue")
        page = console.page("/queues/mail")  # the alert's second link: the queue says why
        assert "paused" in page and "alice" in page
        assert next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "mail")["paused"]
        resume_queue(conn, "mail", actor="alice", reason="relay back")
        console.expect_resolved(fired, budget=20)


def test_a_limited_queue_at_its_limit(dsn, conn, tmp_path, workers):
    """A concurrency limit of 1 on a queue of slow jobs: the rest wait though handlers are free."""
    limits.set_limits(conn, "reports", concurrency=1, actor="alice", reason="partner quota")
    workers.start("--concurrency", "4")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="limited queue") as console:
        console.tick()
        conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                     "at timestamptz DEFAULT clock_timestamp())")
        t0 = time.monotonic()
        ids = q.enqueue_many(conn, [q.NewJob("record", {"sleep": 2}, queue="reports") for _ in range(12)])
        fired = console.expect_firing("queue_age", since=t0 + SCALED["queue_age"]["threshold"],
                                      labels={"queue": "reports"}, mention="queue reports",
                                      offender=lambda html: sum(f">{i}<" in html for i in ids) >= 2,
                                      scenario="limited queue")
        row = next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "reports")
        assert row["limits"]["concurrency"] == 1 and row["limits"]["running"] == 1
        assert row["running"] == 1 and row["eligible"] >= 3
        limits.set_limits(conn, "reports", clear=True, actor="alice", reason="quota raised")
        console.expect_resolved(fired, budget=30)


# --- leases --------------------------------------------------------------------------------------

def test_stuck_leases_after_a_kill_9(dsn, conn, tmp_path, workers):
    """A worker is SIGKILLed holding a job; until the reaper runs its lease is expired and held."""
    workers.start("--queues", "other")  # a live worker elsewhere: this is not "no workers"
    victim = workers.start("--queues", "thumbs", env={"SKIPLOCK_WORKER_LEASE": "1"})
    live_workers(conn, 2)
    conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                 "at timestamptz DEFAULT clock_timestamp())")
    with scenario_console(dsn, tmp_path, name="kill -9") as console:
        job = q.enqueue(conn, "slow", {"sleep": 60}, queue="thumbs")
        wait_for(lambda: (q.get_job(conn, job) or {}).get("status") == "running", timeout=20, what="the job to run")
        worker_id = q.get_job(conn, job)["locked_by"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        ends_in = conn.execute("SELECT extract(epoch FROM lease_until - now()) FROM skiplock.jobs WHERE id = %s",
                               (job,)).fetchone()[0]
        since = time.monotonic() + max(float(ends_in), 0.0)
        fired = console.expect_firing("stuck_leases", since=since, labels={"queue": "thumbs"}, mention="queue thumbs",
                                      offender=f">{job}<", scenario="kill -9")
        workers_page = console.api("/api/v1/workers")
        dead = next(w for w in workers_page["workers"] if w["id"] == worker_id)
        assert dead["stale"] and dead["in_flight"] == 0 and dead["held"] == 1 and dead["lost_total"] == 0
        console.reap()  # the scheduler's reaper rescues it: the alert resolves, the loss is counted
        console.expect_resolved(fired, budget=console.budget("stuck_leases"))
        dead = next(w for w in console.api("/api/v1/workers")["workers"] if w["id"] == worker_id)
        assert dead["held"] == 0 and dead["reaped"] == 1 and dead["lost_total"] == 1
        assert 'data-lost="1"' in console.page("/workers")


# --- workers and the scheduler ---------------------------------------------------------------------

def test_the_worker_fleet_gone(dsn, conn, tmp_path, workers):
    """Every worker is killed while jobs are eligible: no live worker within the live bound."""
    fleet = [workers.start(), workers.start()]
    live_workers(conn, 2)
    with scenario_console(dsn, tmp_path, name="fleet gone") as console:
        console.tick()
        for proc in fleet:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        killed = time.monotonic()
        ids = [q.enqueue(conn, "noop", queue="orders") for _ in range(2)]
        since = killed + 2.0  # web.stale_worker_after: the last heartbeat is then too old
        fired = console.expect_firing("workers_zero", since=since, mention="no live workers",
                                      offender=lambda html: "No live worker" in html, scenario="worker fleet gone")
        workers_page = console.api("/api/v1/workers")
        assert workers_page["live"] == 0 and workers_page["stale"] == 2
        assert console.metric("workers_live") == [0.0]
        assert ids
        workers.start()
        console.expect_resolved(fired, budget=20)


def test_the_scheduler_gone(dsn, conn, tmp_path):
    """No collection cycle for longer than the threshold: the dead man's switch fires from the
    delivery job (which runs between collections), the verdict says measurements stopped."""
    with scenario_console(dsn, tmp_path, name="scheduler gone") as console:
        console.tick()
        stopped = time.monotonic()
        threshold = SCALED["collectors_stale"]["threshold"]
        deadline = stopped + threshold + console.budget("collectors_stale") + 5
        fired = None
        while time.monotonic() < deadline and fired is None:
            time.sleep(INTERVAL)
            console.deliver()  # the delivery job evaluates the dead man's switch
            fired = console.alert("collectors_stale", "firing")
        assert fired, "collectors_stale did not fire"
        seconds = time.monotonic() - (stopped + threshold)
        assert seconds <= console.budget("collectors_stale"), seconds
        print(f"scenario scheduler gone: collectors_stale fired {seconds:.1f}s after its condition held")
        verdict = console.verdict()
        assert verdict["state"] in ("degraded", "failing")
        assert sum("is `skiplock scheduler` running" in w["text"] for w in verdict["why"]) <= 1
        assert sum("No collection cycle finished" in w["text"] for w in verdict["why"]) == 1
        detail = console.api(f"/api/v1/alerts/{fired['id']}")
        assert detail["alert"]["look_here"][0]["path"].startswith("/maintenance")
        assert "Last collection" in console.page("/maintenance") or "collection" in console.page("/maintenance")
        metric = console.metric("collection_age_seconds")
        assert metric and metric[0] > threshold
        console.tick()  # the scheduler is back: the next cycle resolves it
        console.deliver()
        assert console._state(fired["id"]) == "ok"


def test_the_scheduler_crashed_and_restarted(dsn, conn, tmp_path, subprocess_env):
    """A scheduler process dies by SIGSEGV (as the shared-connection crash did) and its
    supervisor starts another on the same host: the restart is counted and alerted on, and the
    Maintenance page names both processes. A second scheduler standing by is not a restart."""
    env = {**subprocess_env, "SKIPLOCK_SCHEDULER_ELECTION_INTERVAL": "0.5"}
    procs: list[subprocess.Popen] = []

    def spawn() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "console", "scheduler"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    def registered(proc) -> bool:
        return bool(conn.execute("SELECT count(*) FROM skiplock.scheduler_nodes WHERE pid = %s", (proc.pid,)).fetchone()[0])

    try:
        with scenario_console(dsn, tmp_path, name="scheduler restarted") as console:
            standby = spawn()  # this console's scheduler leads; the process stands by
            wait_for(lambda: registered(standby), timeout=30, what="the standby to register")
            console.expect_quiet(3 * INTERVAL)  # a standby beside the leader is no restart
            standby.send_signal(signal.SIGSEGV)
            assert standby.wait(15) == -signal.SIGSEGV
            # The dead process counts once unseen for 30 s: move every node's history 31 s back
            # instead of waiting (the leader says it is alive again at its next tick).
            conn.execute("UPDATE skiplock.scheduler_nodes SET last_seen = last_seen - interval '31 seconds', "
                         "started_at = started_at - interval '31 seconds'")
            again = spawn()  # the supervisor starts it again
            wait_for(lambda: registered(again), timeout=30, what="the new process to register")
            fired = console.expect_firing("scheduler_restarts", since=time.monotonic(), mention="restarted",
                                          offender=lambda html: f">{again.pid}<" in html and f">{standby.pid}<" in html,
                                          scenario="scheduler restarted")
            assert fired.value == 1
            # Fifteen minutes later it is history: the alert resolves.
            conn.execute("UPDATE skiplock.scheduler_nodes SET started_at = started_at - interval '16 minutes', "
                         "last_seen = last_seen - interval '16 minutes'")
            console.expect_resolved(fired, budget=console.budget("scheduler_restarts") + 3)
    finally:
        stop_processes(procs)


# --- periodic -----------------------------------------------------------------------------------

PERIODIC = """
[[periodic]]
name = "nightly-report"
kind = "doomed"
every = "2s"
queue = "cron"
"""


def test_a_periodic_job_that_keeps_failing(dsn, conn, tmp_path, workers):
    """A schedule every 2 s whose every run fails for good: no success for twice its interval."""
    workers.start("--queues", "cron")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="periodic late", extra_config=PERIODIC) as console:
        t0 = time.monotonic()
        fired = console.expect_firing("periodic_late", since=t0 + 2 * 2.0, labels={"name": "nightly-report"},
                                      mention="nightly-report", offender="nightly-report",
                                      every=lambda: console.run_job("periodic"), scenario="periodic late")
        assert fired.value > 2
        assert "late" in console.page("/periodic")


# --- the converse: nothing fires --------------------------------------------------------------

# The scaled claim-latency rule (0.15 s) is about claims that wait (its own scenario locks the
# table); on a test machine running two suites, an ordinary claim's p95 reaches 0.2 s. Here the
# rule gets a lenient 1 s.
QUIET_CLAIMS = {"claim_latency_p95": {"threshold": 0.25 * 4}}

def test_healthy_busy_traffic_fires_nothing(dsn, conn, tmp_path, workers):
    """Hundreds of fast jobs a minute, a few retries that succeed (under 20 %), one dead letter:
    nothing pending or firing, the verdict healthy, and the busy queue is never called idle
    (its jobs are too fast for a sample to catch one running)."""
    workers.start("--concurrency", "4")
    live_workers(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                 "at timestamptz DEFAULT clock_timestamp())")
    with scenario_console(dsn, tmp_path, name="busy and healthy", overrides=QUIET_CLAIMS) as console:
        count = [0]

        def traffic():
            count[0] += 1
            batch = [q.NewJob("noop", {"n": i}, queue="receipts") for i in range(8)]
            if count[0] % 4 == 0:
                batch.append(q.NewJob("flaky", {"fail_times": 1}, queue="receipts"))
            q.enqueue_many(conn, batch)

        console.expect_quiet(12 * INTERVAL, every=traffic)
        rows = {r["queue"]: r for r in console.api("/api/v1/queues")["queues"]}
        assert rows["receipts"]["idle"] is False
        assert {r["queue"]: r for r in console.api("/api/v1/overview")["queues"]}["receipts"]["idle"] is False
        # The rate is per collection cycle (1 s): at load 14 (AA2) the last cycle of the quiet
        # period had no job finished in it. Traffic and cycles go on (quiet still) until one has.
        def a_busy_cycle() -> bool:
            traffic()
            console.tick()
            assert not console.alerts(), console.alerts()
            return any(v > 0 for v in console.metric("queue_throughput", queue="receipts", outcome="completed"))

        wait_for(a_busy_cycle, timeout=30, interval=INTERVAL, what="a collection cycle with a job of the busy queue finished")
        assert 0 < console.metric("retry_rate")[0] < 0.2


def test_a_slow_but_steady_queue_fires_nothing(dsn, conn, tmp_path, workers):
    """Jobs of 1.5 s arriving a little slower than two handlers finish them: each waits less
    than the threshold, the queue is busy, nothing fires."""
    workers.start("--queues", "reports", "--concurrency", "2")
    live_workers(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                 "at timestamptz DEFAULT clock_timestamp())")
    with scenario_console(dsn, tmp_path, name="slow and steady", overrides=QUIET_CLAIMS) as console:
        console.expect_quiet(10 * INTERVAL, every=lambda: q.enqueue(conn, "record", {"sleep": 1.5}, queue="reports"))
        row = next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "reports")
        assert row["idle"] is False
