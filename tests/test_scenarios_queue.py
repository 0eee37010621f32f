"""Scenarios of the queue's own trouble (tests/scenarios.py says what each one checks): a
stalled queue, a burst, a paused queue with work, a limited queue at its limit, stuck leases
after a kill -9, a dead-letter stream at 1.5x and 5x the threshold, a poison kind, a retry
storm, the worker fleet gone, a periodic job that keeps failing, the scheduler gone; and the
converse, healthy busy traffic and a slow but steady queue, which fire nothing.

Real worker processes (tests/workers.py) run the jobs; the queue API makes the conditions a
worker would (a failed attempt is `console.queue.fail`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from console import queue as q
from console.maintenance import pause_queue, resume_queue
from console.queue import limits
from tests.scenarios import INTERVAL, RATE_WINDOW, SCALED, scenario_console
from tests.workers import WorkerProcs, stop_processes, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.scenario]


@pytest.fixture
def workers(subprocess_env):
    procs = WorkerProcs(subprocess_env)
    yield procs
    procs.stop_all()


def live_workers(conn, n: int = 1) -> None:
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers WHERE last_seen > now() - interval '2 seconds' "
                                  "AND stopped_at IS NULL").fetchone()[0] >= n, timeout=30, what=f"{n} live worker(s)")


def job_ids(conn, queue: str) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM skiplock.jobs WHERE queue = %s ORDER BY id", (queue,))]


def shows_all(ids: list[int]):
    return lambda html: all(f">{i}<" in html for i in ids)


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


# --- dead letters -------------------------------------------------------------------------------

def claim_this(conn, job_id: int, queue: str) -> q.Job:
    """Claim the job just enqueued, as a worker would. The collector's probe claim (a claim it
    rolls back, sql/collectors_statements.sql) may hold the row for a moment, and SKIP LOCKED
    then skips it: try again, as a worker's next poll would."""
    deadline = time.monotonic() + 5
    while True:
        found = [j for j in q.claim(conn, "stream-worker", queues=[queue], limit=5) if j.id == job_id]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"job {job_id} could not be claimed"
        time.sleep(0.02)


class Stream(threading.Thread):
    """Dead letters into `queue` at exactly `per_hour` (a thread on its own connection), as a
    failing dependency sends them: one every 3600/per_hour seconds until `stop()`."""

    def __init__(self, dsn: str, queue: str, per_hour: float, error: str):
        super().__init__(daemon=True)
        self.dsn, self.queue, self.gap, self.error = dsn, queue, 3600.0 / per_hour, error
        self.times: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            start = time.monotonic()
            while not self._stop_event.is_set():
                job_id = q.enqueue(conn, "charge_card", {"n": len(self.times)}, queue=self.queue, max_attempts=1)
                q.fail(conn, claim_this(conn, job_id, self.queue), q.DoNotRetry(self.error), retry=False)
                self.times.append(time.monotonic())
                self._stop_event.wait(max(0.0, start + len(self.times) * self.gap - time.monotonic()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def crossed(self, threshold_per_hour: float) -> float | None:
        """When the count in the rate window first went past the threshold (None: not yet)."""
        need = threshold_per_hour * RATE_WINDOW / 3600.0
        times = list(self.times)
        for i, t in enumerate(times):
            if sum(1 for u in times[: i + 1] if t - u < RATE_WINDOW) > need:
                return t
        return None


@pytest.mark.parametrize("times", [1.5, 5.0])
def test_a_dead_letter_stream(dsn, conn, tmp_path, times):
    """Card charges declined at 1.5x and 5x the threshold: the alert fires and holds (the rate
    over the window does not fall to 0 between two dead letters), the verdict says it once, the
    new error group is where "look here" goes; it resolves once the stream stops for a window."""
    threshold = SCALED["dead_letter_growth"]["threshold"]
    with scenario_console(dsn, tmp_path, name=f"dead letters {times}x") as console:
        console.tick()
        stream = Stream(dsn, "payments", threshold * times, "CardDeclined: card 4242 declined by issuer")
        stream.start()
        try:
            since = console.run(lambda: stream.crossed(threshold), budget=RATE_WINDOW + 10,
                                what="the rate to cross the threshold")
            fired = console.expect_firing("dead_letter_growth", since=since, labels={"queue": "payments"},
                                          mention="queue payments", offender="card 4242 declined",
                                          scenario=f"dead-letter stream at {times}x")
            first_link = console.api(f"/api/v1/alerts/{fired.id}")["alert"]["look_here"][0]
            assert first_link["path"].startswith("/deadletters/jobs?queue=payments&fingerprint=")  # the new group
            # It holds: the rate over the window stays past the threshold at every cycle.
            observed = []
            for _ in range(4):
                console.tick()
                observed += console.metric("dead_letter_growth", queue="payments")
                time.sleep(INTERVAL)
            assert all(v > threshold for v in observed), observed
            assert console.alert("dead_letter_growth", "firing", queue="payments")
            figure = next(f for f in console.api("/api/v1/overview")["figures"] if f["key"] == "dead_letters")
            assert figure["level"] == "warn" and figure["note"].startswith("+")
            row = next(r for r in console.api("/api/v1/queues")["queues"] if r["queue"] == "payments")
            assert row["levels"]["dead_letters"] == "warn" and row["dead_letter_growth"] > threshold
        finally:
            stream.stop()
        console.expect_resolved(fired, budget=RATE_WINDOW + 2 * INTERVAL + 5)


def test_one_dead_letter_is_not_a_stream(dsn, conn, tmp_path):
    """One dead letter is 180 per hour over a 20 s window, under the threshold of 720: nothing
    fires, and the overview does not say "360 jobs/h" (the one-interval rate did)."""
    with scenario_console(dsn, tmp_path, name="one dead letter") as console:
        job_id = q.enqueue(conn, "charge_card", queue="payments", max_attempts=1)
        q.fail(conn, claim_this(conn, job_id, "payments"), q.DoNotRetry("CardDeclined: once"), retry=False)
        console.expect_quiet(4 * INTERVAL, verdict="healthy")
        assert console.metric("dead_letter_growth", queue="payments") == [3600.0 / RATE_WINDOW]


def test_a_poison_kind(dsn, conn, tmp_path, workers):
    """A kind whose every run fails for good, run by a real worker: its error group is new."""
    workers.start("--queues", "shipping")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="poison kind") as console:
        arrivals: list[float] = []

        def enqueue_poison():
            if not arrivals or time.monotonic() - arrivals[-1] >= 1.0:
                q.enqueue(conn, "doomed", {"order": 7000 + len(arrivals)}, queue="shipping")
                arrivals.append(time.monotonic())

        threshold = SCALED["dead_letter_growth"]["threshold"]
        need = int(threshold * RATE_WINDOW / 3600.0) + 1  # the arrival that crosses it
        console.run(lambda: len(arrivals) >= need, budget=30, every=enqueue_poison, what="the poison to arrive")
        since = arrivals[need - 1] + 0.5  # a worker fails it within half a second
        fired = console.expect_firing("dead_letter_growth", since=since, labels={"queue": "shipping"},
                                      mention="queue shipping", offender="cannot be shipped", every=enqueue_poison,
                                      scenario="poison kind")
        assert fired.value >= threshold
        console.expect_resolved(fired, budget=RATE_WINDOW + 2 * INTERVAL + 5)


# --- retries -----------------------------------------------------------------------------------

def test_a_retry_storm(dsn, conn, tmp_path, workers):
    """Every job fails its first attempt (a dependency times out) and then succeeds: half the
    finished attempts are retries, over the threshold of 20 %. The backoff (2-4 s) keeps some
    waiting for their retry, which is what "look here" lists."""
    workers.start("--queues", "webhooks", env={"SKIPLOCK_QUEUE_BACKOFF_BASE": "4", "SKIPLOCK_QUEUE_BACKOFF_CAP": "4"})
    live_workers(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS public.executions (job_id bigint, attempt int, worker_pid int, "
                 "at timestamptz DEFAULT clock_timestamp())")
    with scenario_console(dsn, tmp_path, name="retry storm") as console:
        console.tick()
        sent: list[int] = []

        def enqueue_flaky():
            sent.extend(q.enqueue_many(conn, [q.NewJob("flaky", {"fail_times": 1}, queue="webhooks") for _ in range(3)]))

        t0 = time.monotonic()
        enqueue_flaky()
        fired = console.expect_firing("retry_rate", since=t0 + 0.5, mention="were retried",
                                      offender="transient failure on attempt 1", every=enqueue_flaky,
                                      scenario="retry storm")
        assert 0.2 < fired.value < 1  # one retry per two finished attempts, once the retries have run
        # The workers finish the rest; with nothing retried for a window, it resolves.
        console.expect_resolved(fired, budget=RATE_WINDOW + 2 * INTERVAL + 10)


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
        assert any(v > 0 for v in console.metric("queue_throughput", queue="receipts", outcome="completed"))
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
