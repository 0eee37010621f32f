"""The reaper's contract, pinned (contract 5 in docs/architecture.md, docs/queue.md "A job's life" and "Crashes"):

- a running job whose lease has not expired is left exactly as it is;
- an expired lease with attempts left goes back to pending with `run_at` pushed out by the
  backoff rule (base·2^(attempt-1), capped, times a jitter in [0.5, 1]); the attempt stays
  counted ("a lost lease does not" give it back), and a LeaseExpired entry joins the history;
- an expired lease with no attempts left becomes a dead letter (`failed`, finished_at set).
"""

from __future__ import annotations

from datetime import timedelta

from console import queue as q

BASE, CAP = 100.0, 1000.0  # seconds: large enough that the bounds below are far from noise


def running(conn, *, attempts: int, max_attempts: int, expired: bool, worker: str = "w") -> int:
    """A claimed job at the given attempt, its lease expired a second ago or due in an hour."""
    job_id = q.enqueue(conn, "k", {"attempts": attempts}, max_attempts=max_attempts, queue=f"reaper-{worker}")
    (job,) = q.claim(conn, worker, queues=[f"reaper-{worker}"], lease=3600)
    conn.execute(
        "UPDATE skiplock.jobs SET attempts = %s, lease_until = now() + %s WHERE id = %s",
        (attempts, timedelta(seconds=-1) if expired else timedelta(hours=1), job.id),
    )
    return job_id


def snapshot(conn, job_id):
    return q.get_job(conn, job_id)


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def test_live_leases_are_left_alone(conn):
    live = [running(conn, attempts=a, max_attempts=m, expired=False, worker=f"live{a}")
            for a, m in ((1, 5), (5, 5))]
    before = {job_id: snapshot(conn, job_id) for job_id in live}
    assert q.reap(conn, backoff_base=BASE, backoff_cap=CAP) == {"pending": 0, "failed": 0, "batches": 0}
    for job_id in live:
        assert snapshot(conn, job_id) == before[job_id], "the reaper touched a live lease"


def test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed(conn):
    live = running(conn, attempts=2, max_attempts=5, expired=False, worker="live")
    first = [running(conn, attempts=1, max_attempts=5, expired=True, worker=f"a{i}") for i in range(8)]
    third = running(conn, attempts=3, max_attempts=5, expired=True, worker="third")
    capped = running(conn, attempts=9, max_attempts=20, expired=True, worker="capped")
    exhausted = running(conn, attempts=3, max_attempts=3, expired=True, worker="exhausted")
    before = {job_id: snapshot(conn, job_id) for job_id in [live, *first, third, capped, exhausted]}

    t0 = db_now(conn)
    result = q.reap(conn, backoff_base=BASE, backoff_cap=CAP)
    t1 = db_now(conn)
    assert result == {"pending": 10, "failed": 1, "batches": 1}

    def assert_backoff(job_id, attempt):
        raw = min(CAP, BASE * 2 ** (attempt - 1))
        job = snapshot(conn, job_id)
        assert job["status"] == "pending"
        # run_at = (the reap's now(), between t0 and t1) + delay, delay in [raw/2, raw]
        assert job["run_at"] - t0 >= timedelta(seconds=raw / 2), (attempt, job["run_at"] - t0)
        assert job["run_at"] - t1 <= timedelta(seconds=raw), (attempt, job["run_at"] - t1)
        return job["run_at"] - t0

    delays = [assert_backoff(job_id, 1) for job_id in first]
    assert len(set(delays)) > 1, "no jitter: every rescued job is due at the same instant"
    assert_backoff(third, 3)  # 400 s raw
    assert_backoff(capped, 9)  # 25 600 s raw, capped at 1000

    for job_id in [*first, third, capped]:
        job, old = snapshot(conn, job_id), before[job_id]
        assert job["attempts"] == old["attempts"], "a lost lease does not give the attempt back"
        assert job["lease_until"] is None and job["finished_at"] is None
        assert job["last_error"] == f"LeaseExpired: lease expired while held by {old['locked_by']}"
        entry = job["errors"][-1]
        assert (entry["error_class"], entry["attempt"], entry["worker"]) == ("LeaseExpired", old["attempts"], old["locked_by"])
        assert len(job["errors"]) == len(old["errors"]) + 1

    dead = snapshot(conn, exhausted)
    assert dead["status"] == "failed" and dead["attempts"] == 3
    assert dead["finished_at"] is not None and dead["lease_until"] is None
    assert dead["run_at"] == before[exhausted]["run_at"], "a dead letter is not rescheduled"
    assert dead["errors"][-1]["error_class"] == "LeaseExpired"

    assert snapshot(conn, live) == before[live], "the live lease beside them was touched"
    # the rescued jobs are not due yet: nobody can claim them before their backoff ends
    assert q.claim(conn, "next", limit=50) == []
