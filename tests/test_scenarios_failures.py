"""Scenarios of failing jobs (tests/scenarios.py says what each one checks): a dead-letter
stream at 1.5x and 5x the threshold and one dead letter that is not a stream, a poison kind,
new and regressed error groups and a known group failing now and then, a retry storm.

Real worker processes (tests/workers.py) run the jobs; the queue API makes the conditions a
worker would (a failed attempt is `console.queue.fail`)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from console import errorgroups
from console import queue as q
from tests.maintenance_data import add_failed
from tests.scenarios import INTERVAL, RATE_WINDOW, SCALED, live_workers, scenario_console

pytestmark = [pytest.mark.slow, pytest.mark.scenario]


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
    fires, and the overview does not say "360 jobs/h" (the one-interval rate did). Its error is
    a new error group, which new_error_group rightly fires on (its own scenario,
    test_new_and_regressed_error_groups): switched off here, where the rate is the question."""
    with scenario_console(dsn, tmp_path, name="one dead letter", overrides={"new_error_group": {"enabled": False}}) as console:
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


# --- what changed: new and regressed error groups ------------------------------------------------

NEW_FOR = 8.0  # [scheduler] error_group_new_for of this scenario: how long a group counts as new or back
RETURNING = "DoNotRetry: InvoiceError: tax service answered <n>"
IGNORED = "DoNotRetry: LedgerError: duplicate entry <n>"


def fail_now(conn, queue: str, kind: str, message: str) -> int:
    """One job of `kind` that fails for good now, as a worker would fail it."""
    job_id = q.enqueue(conn, kind, {"n": 1}, queue=queue, max_attempts=1)
    q.fail(conn, claim_this(conn, job_id, queue), q.DoNotRetry(message), retry=False)
    return job_id


def test_new_and_regressed_error_groups(dsn, conn, tmp_path, workers):
    """A poison kind that fails for the first time (a real worker runs it) fires new_error_group;
    a group last seen two days ago that fails again fires it as regressed; a group an operator
    ignores does not, though it is back too; and the poison, which keeps failing steadily, does
    not fire again once its time as new is over (the alert resolves and stays resolved)."""
    add_failed(conn, 2, queue="billing", kind="invoice", fingerprint=RETURNING, age=timedelta(days=2))
    add_failed(conn, 2, queue="billing", kind="ledger", fingerprint=IGNORED, age=timedelta(days=2))
    errorgroups.ignore(conn, IGNORED, actor="alice", reason="INC-7: the partner retries these itself")
    workers.start("--queues", "shipping")
    live_workers(conn)
    with scenario_console(dsn, tmp_path, name="error groups",
                          settings={"scheduler.error_group_new_for": f"{NEW_FOR:g}s"}) as console:
        console.tick()  # the collector starts watching: what failed before is history
        poison_sent: list[float] = []

        def poison():
            q.enqueue(conn, "doomed", {"order": 7000 + len(poison_sent)}, queue="shipping")
            poison_sent.append(time.monotonic())

        poison()
        new = console.expect_firing("new_error_group", since=poison_sent[0] + 0.5, labels={"change": "new"},
                                    mention="of a new error group", offender="cannot be shipped",
                                    scenario="a poison kind: a new error group")
        assert new.labels["fingerprint"] == "DoNotRetry: order <n> cannot be shipped" and new.value == 1

        # Two old groups come back; the ignored one says nothing.
        back = time.monotonic()
        fail_now(conn, "billing", "invoice", "InvoiceError: tax service answered 503")
        fail_now(conn, "billing", "ledger", "LedgerError: duplicate entry 88")
        regressed = console.expect_firing("new_error_group", since=back, labels={"change": "regressed"},
                                          mention="of a regressed error group", offender="tax service answered 503",
                                          scenario="an old group back after two days")
        assert regressed.labels["fingerprint"] == RETURNING
        groups = {g["fingerprint"]: g for g in console.api("/api/v1/deadletters")["groups"]}
        assert groups[RETURNING]["state"] == "regressed" and groups[IGNORED]["state"] == "ignored"
        assert not [a for a in console.alerts() if a["labels"].get("fingerprint") == IGNORED]

        # The poison keeps failing, steadily: its alert ends with its time as new and never comes back.
        console.expect_resolved(new, budget=NEW_FOR + 4 * INTERVAL + 5, every=poison)
        console.run(lambda: len(poison_sent) >= 20, budget=30, every=poison, what="the poison to keep failing")
        assert [a["labels"]["change"] for a in console.alerts() if a["rule"] == "new_error_group"] in ([], ["regressed"])
        fired = conn.execute("SELECT count(*) FROM skiplock.alert_events WHERE alert_id = %s AND kind = 'firing'",
                             (new.id,)).fetchone()[0]
        assert fired == 1, "the poison's group fired again while it kept failing"
        assert not [a for a in console.alerts() if a["labels"].get("fingerprint") == IGNORED]


def test_a_known_error_group_failing_now_and_then_fires_nothing(dsn, conn, tmp_path):
    """The converse: a group whose dead letters are an hour old (within error_group_quiet, and
    from before the console watched: only the dead-letter set knows it) fails again every few
    seconds, under dead_letter_growth's threshold. It is neither new nor regressed: nothing
    fires, and the verdict reads healthy."""
    add_failed(conn, 3, queue="billing", kind="invoice", fingerprint=RETURNING, age=timedelta(hours=1))
    with scenario_console(dsn, tmp_path, name="known error group") as console:
        console.tick()  # the collector starts watching
        sent = [0]

        def now_and_then():
            sent[0] += 1
            if sent[0] % 6 == 1:  # one every 6 s: at most 4 in the 20 s window, under the scaled > 720/h
                fail_now(conn, "billing", "invoice", f"InvoiceError: tax service answered {500 + sent[0]}")

        console.expect_quiet(10 * INTERVAL, every=now_and_then)
        groups = {g["fingerprint"]: g for g in console.api("/api/v1/deadletters")["groups"]}
        assert groups[RETURNING]["count"] >= 5 and groups[RETURNING]["state"] is None
        assert errorgroups.get(conn, RETURNING)["change"] is None  # remembered, and no change


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
        # The retries are the worker processes' (after a 4 s backoff), which a loaded machine
        # delays: the budget runs from the cycle that first sees the rate past its threshold.
        rule = console.rule("retry_rate")
        fired = console.expect_firing("retry_rate", since=t0 + 0.5, mention="were retried",
                                      offender="transient failure on attempt 1", every=enqueue_flaky,
                                      scenario="retry storm",
                                      holds=lambda: any(rule.condition(v) for v in console.sampled("retry_rate")))
        assert 0.2 < fired.value < 1  # one retry per two finished attempts, once the retries have run
        # The workers finish the rest; with nothing retried for a window, it resolves.
        console.expect_resolved(fired, budget=RATE_WINDOW + 2 * INTERVAL + 10)
