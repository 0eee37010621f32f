"""The fencing contract, pinned: a completion or failure takes effect only while the claim's
token (`locked_by` and `attempts`) still matches, through every statement that finishes a job.

docs/queue.md: "a worker whose lease was rescued cannot overwrite the rescued job", and
"`locked_by`, `attempts` together [are] the fencing token of the current claim: completion,
failure, heartbeat and release only take effect while both still match". Each test below fails
when one half of that token is dropped from one statement (docs/reliability.md lists the
mutations, scripts/mutations.py re-runs them).
"""

from __future__ import annotations

import threading

import pytest

import console
from console import queue as q
from console.queue.worker import Worker
from tests.workers import wait_for

# The handler the in-process worker runs: it holds the job until the test lets it go, so the
# test can rescue the lease and hand the job to someone else while the worker still "works".
GATE_KIND = "contract_fencing_gate"
_gate = threading.Event()
_started = threading.Event()


@console.task(GATE_KIND)
def _held_until_released(job):
    _started.set()
    if not _gate.wait(timeout=30):  # a deadline even here: a broken test must not hang the run
        raise TimeoutError("the test never released the gate")


def row(conn, job_id):
    return q.get_job(conn, job_id)


def expire_and_rescue(conn, job_id):
    """The lease runs out and the reaper rescues the job, due again at once."""
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert q.reap(conn, backoff_base=0.001, backoff_cap=0.001)["pending"] == 1
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE id = %s", (job_id,))
    assert row(conn, job_id)["status"] == "pending"


@pytest.fixture
def worker_thread(dsn):
    """A real Worker (main loop, handler thread, listener) in a thread; always stopped."""
    _gate.clear()
    _started.clear()
    # A long lease and poll: no heartbeat (it starts after lease/3 = 20 s) and no poll happen
    # while the test runs, so every step below is the test's own doing.
    worker = Worker(dsn, queues=["fencing"], concurrency=1, batch_size=1, lease=60, poll_interval=30,
                    flush_interval=0.2, vacuum_interval=0, name="contract-worker")
    outcome: dict[str, int] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("code", worker.run()), name="contract-worker")
    thread.start()
    yield worker
    _gate.set()
    worker.stop(immediately=True)
    thread.join(timeout=20)
    assert not thread.is_alive(), "the worker did not stop within 20 s"


def test_a_rescued_jobs_late_completion_through_the_worker_is_refused_and_counted_lost(conn, worker_thread):
    """The worker's real completion path (`complete_and_claim` in Worker.run) with a stale token."""
    job_id = q.enqueue(conn, GATE_KIND, {"n": 1}, queue="fencing")
    assert _started.wait(timeout=10), "the worker never started the job"
    held = row(conn, job_id)
    assert (held["status"], held["locked_by"], held["attempts"]) == ("running", "contract-worker", 1)

    # While the handler still runs: the lease is rescued and another owner claims the job.
    expire_and_rescue(conn, job_id)
    (thief,) = q.claim(conn, "other-worker", queues=["fencing"], lease=60)
    assert (thief.id, thief.attempts) == (job_id, 2)

    _gate.set()  # the old owner finishes now, and completes through complete_and_claim
    wait_for(lambda: worker_thread.counters.lost + worker_thread.counters.completed >= 1, timeout=10,
             what="the worker to try to complete the job")
    assert (worker_thread.counters.lost, worker_thread.counters.completed) == (1, 0)
    after = row(conn, job_id)
    assert (after["status"], after["locked_by"], after["attempts"]) == ("running", "other-worker", 2), \
        "the stale completion overwrote the new owner's claim"
    assert after["finished_at"] is None
    # the registry row (what the console shows) carries the lost completion too
    wait_for(lambda: conn.execute("SELECT lost FROM skiplock.workers WHERE id = 'contract-worker'").fetchone()[0] == 1,
             timeout=10, what="the worker to flush lost = 1")
    # and the rightful owner can still finish it
    assert q.complete(conn, thief) is True


def same_worker_reclaim(conn):
    """Worker w claims (attempt 1), its lease is rescued, and w itself re-claims (attempt 2):
    the old and the new claim differ only in the attempt."""
    job_id = q.enqueue(conn, "k", {}, queue="fence", max_attempts=5)
    (stale,) = q.claim(conn, "w", queues=["fence"], lease=60)
    expire_and_rescue(conn, job_id)
    (live,) = q.claim(conn, "w", queues=["fence"], lease=60)
    assert (live.id, live.locked_by, live.attempts, stale.attempts) == (job_id, "w", 2, 1)
    return stale, live


def assert_untouched(conn, live):
    after = row(conn, live.id)
    assert (after["status"], after["locked_by"], after["attempts"]) == ("running", "w", live.attempts)
    assert after["finished_at"] is None and after["lease_until"] is not None


def test_same_worker_reclaim_complete_and_claim_is_fenced_by_the_attempt(conn):
    stale, live = same_worker_reclaim(conn)
    completed, claimed = q.complete_and_claim(conn, "w", [stale], queues=["fence"], limit=1)
    assert (completed, claimed) == ([], [])
    assert_untouched(conn, live)
    completed, _ = q.complete_and_claim(conn, "w", [live], queues=["fence"], limit=1)
    assert completed == [live.id]


def test_same_worker_reclaim_complete_many_is_fenced_by_the_attempt(conn):
    stale, live = same_worker_reclaim(conn)
    assert q.complete_many(conn, [stale]) == []
    assert q.complete(conn, stale) is False
    assert_untouched(conn, live)
    assert q.complete_many(conn, [live]) == [live.id]


def archived(conn, job_id):
    return conn.execute("SELECT status, attempts, locked_by FROM skiplock.jobs_archive WHERE id = %s", (job_id,)).fetchall()


def test_completing_into_the_archive_is_fenced_by_the_attempt(conn):
    """worker.complete_into_archive: a stale completion neither deletes nor archives the job;
    the live one moves it, once, completed."""
    stale, live = same_worker_reclaim(conn)
    assert q.complete_many(conn, [stale], into_archive=True) == []
    assert_untouched(conn, live)
    assert archived(conn, live.id) == []
    assert q.complete_many(conn, [live], into_archive=True) == [live.id]
    assert row(conn, live.id) is None
    assert archived(conn, live.id) == [("completed", live.attempts, "w")]
    assert q.complete_many(conn, [live], into_archive=True) == []  # twice is once
    assert len(archived(conn, live.id)) == 1


def test_completing_into_the_archive_is_fenced_by_the_owner(conn, dsn):
    stale, live = other_owner_same_attempt(conn, dsn)
    assert q.complete_many(conn, [stale], into_archive=True) == []
    after = row(conn, live.id)
    assert (after["status"], after["locked_by"], after["attempts"]) == ("running", "new-owner", 1)
    assert archived(conn, live.id) == []


def test_same_worker_reclaim_fail_is_fenced_by_the_attempt(conn):
    stale, live = same_worker_reclaim(conn)
    errors_before = row(conn, live.id)["errors"]
    assert q.fail(conn, stale, RuntimeError("late failure"), retry=True) is None
    assert q.fail(conn, stale, q.DoNotRetry("late dead letter")) is None
    assert_untouched(conn, live)
    assert row(conn, live.id)["errors"] == errors_before, "a refused failure must not add to the history"
    assert q.fail(conn, live, RuntimeError("real failure")) == "pending"


def test_same_worker_reclaim_heartbeat_and_release_are_fenced_by_the_attempt(conn):
    stale, live = same_worker_reclaim(conn)
    lease_before = row(conn, live.id)["lease_until"]
    assert q.heartbeat(conn, stale, lease=3600) is False
    assert q.release(conn, [stale]) == []
    assert_untouched(conn, live)
    assert row(conn, live.id)["lease_until"] == lease_before


def other_owner_same_attempt(conn, dsn):
    """The owner half of the token alone: a dead letter replayed by an operator starts again at
    attempt 0, so the next owner's claim has the same attempt number as the old owner's."""
    from console.maintenance import bulk

    job_id = q.enqueue(conn, "k", {}, queue="fence", max_attempts=1)
    (stale,) = q.claim(conn, "old-owner", queues=["fence"], lease=60)
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert q.reap(conn)["failed"] == 1  # exhausted: a dead letter
    bulk.replay(dsn, {"ids": [job_id]}, actor="alice", reason="fixed")
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE id = %s", (job_id,))
    (live,) = q.claim(conn, "new-owner", queues=["fence"], lease=60)
    assert (live.id, live.attempts, stale.attempts) == (job_id, 1, 1)
    return stale, live


def test_another_owner_at_the_same_attempt_is_fenced_by_the_owner(conn, dsn):
    stale, live = other_owner_same_attempt(conn, dsn)
    completed, claimed = q.complete_and_claim(conn, "old-owner", [stale], queues=["fence"], limit=1)
    assert (completed, claimed) == ([], [])
    assert q.complete_many(conn, [stale]) == []
    assert q.fail(conn, stale, RuntimeError("late")) is None
    after = row(conn, live.id)
    assert (after["status"], after["locked_by"], after["attempts"]) == ("running", "new-owner", 1)
    assert after["finished_at"] is None
    assert q.complete(conn, live) is True

