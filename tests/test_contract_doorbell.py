"""LISTEN/NOTIFY is the doorbell (contract 7 in docs/architecture.md, docs/queue.md "Running workers"), pinned with a
real `skiplock worker` process whose poll interval is 30 s: a job picked up within seconds can
only have been announced by NOTIFY, not found by a poll.

Also here: an idle worker with that long poll interval still writes its registry row every
`worker.flush_interval`, so the console does not count it dead (live = seen within three flush
intervals).
"""

from __future__ import annotations

import time

import pytest

from console import queue as q
from console.queue.limits import LIMITS_CHANNEL
from tests.workers import wait_for

pytestmark = pytest.mark.slow

SLOW_POLL = {"SKIPLOCK_WORKER_POLL_INTERVAL": "30", "SKIPLOCK_WORKER_VACUUM_INTERVAL": "0"}
PICKUP_LIMIT = 3.0  # seconds; NOTIFY takes milliseconds, a poll would take up to 30 s


def status(conn, job_id) -> str:
    return q.get_job(conn, job_id)["status"]


def listener_ready(conn) -> bool:
    """The worker's listener has run all its LISTENs (the limits channel is its last statement)."""
    return conn.execute(
        """
        SELECT count(*) FROM pg_stat_activity
        WHERE application_name = 'skiplock-worker-listen' AND query = 'LISTEN ' || %s
        """,
        (LIMITS_CHANNEL,),
    ).fetchone()[0] == 1


def settled_idle_worker(conn, workers):
    """A worker that has done its start-up claims and now sleeps towards its 30 s poll."""
    warm_up = q.enqueue(conn, "noop", {})  # before the start: the first claim takes it, no NOTIFY needed
    proc = workers.start("--concurrency", "2", env=SLOW_POLL)
    wait_for(lambda: status(conn, warm_up) == "completed", timeout=30, what="the warm-up job")
    wait_for(lambda: listener_ready(conn), timeout=10, what="the worker's LISTEN")
    time.sleep(1.0)  # the listener's connect wakes one claim; let it pass, the loop is now idle
    return proc


def test_an_enqueue_rings_the_doorbell_and_the_idle_worker_picks_it_up_at_once(conn, workers):
    proc = settled_idle_worker(conn, workers)

    job_id = q.enqueue(conn, "noop", {"rang": True})  # autocommit: NOTIFY is delivered now
    started = time.monotonic()
    wait_for(lambda: status(conn, job_id) != "pending", timeout=PICKUP_LIMIT, interval=0.02,
             what=f"pickup within {PICKUP_LIMIT}s of the enqueue (poll interval 30 s)")
    waited = time.monotonic() - started
    job = q.get_job(conn, job_id)
    pickup = (job["locked_at"] - job["run_at"]).total_seconds()
    assert pickup < PICKUP_LIMIT and waited < PICKUP_LIMIT, (pickup, waited)
    wait_for(lambda: status(conn, job_id) == "completed", timeout=10, what="the job to complete")

    # The control: the same worker does NOT see a job that arrives without a NOTIFY (a plain
    # INSERT), so polling really is slow and the pickup above was the doorbell's doing.
    time.sleep(0.5)  # the completion's own claim round has passed
    (silent,) = conn.execute(
        "INSERT INTO skiplock.jobs (kind, payload) VALUES ('noop', '{}') RETURNING id").fetchone()
    time.sleep(PICKUP_LIMIT)
    assert status(conn, silent) == "pending", "picked up without a NOTIFY: the poll is not 30 s"
    conn.execute("SELECT pg_notify('skiplock_jobs', 'default')")  # ring by hand
    wait_for(lambda: status(conn, silent) != "pending", timeout=PICKUP_LIMIT, interval=0.02,
             what="pickup after a bare NOTIFY")
    assert workers.stop(proc)[0] == 0


def test_an_idle_worker_with_a_long_poll_still_reports_every_flush_interval(conn, workers):
    proc = settled_idle_worker(conn, workers)  # FAST_SETTINGS: flush every 0.5 s

    def seen() -> float:
        return conn.execute(
            "SELECT extract(epoch FROM last_seen) FROM skiplock.workers WHERE stopped_at IS NULL").fetchone()[0]

    first = seen()
    wait_for(lambda: seen() > float(first) + 1.0, timeout=5, what="last_seen to advance while idle")
    assert workers.stop(proc)[0] == 0
