"""console/why.py: one test per reason a job (or a queue) is not running, on a real PostgreSQL,
with real `skiplock worker` processes wherever a worker is part of the reason (no worker on the
queue, its kind not handled, busy with higher priorities, a lease held by a live or a dead
worker). Each test names the rule it guards; removing that rule turns it red.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from console import maintenance as m
from console import queue as q
from console import why
from console.queue import limits
from tests.workers import EXECUTIONS_TABLE, WorkerProcs, wait_for

LIVE = 30.0  # seconds since a worker's last report within which it is live (the console's default)


@pytest.fixture
def procs(subprocess_env, conn):
    conn.execute(EXECUTIONS_TABLE)
    workers = WorkerProcs(subprocess_env)
    yield workers
    workers.stop_all()


def codes(answer: why.Answer) -> list[str]:
    return [r.code for r in answer.reasons]


def reason(answer: why.Answer, code: str) -> why.Reason:
    return next(r for r in answer.reasons if r.code == code)


def live_worker(conn, *, queues=None) -> str:
    """A fresh registry row (a worker that reported just now), for rules that need a live worker
    but not its behaviour."""
    wid = f"fake-{time.monotonic_ns()}"
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, kinds) VALUES (%s, 'h', 1, %s, 4, NULL)",
                 (wid, queues))
    return wid


def wait_live(conn, *, queue: str | None = None, timeout: float = 30) -> None:
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers WHERE stopped_at IS NULL AND kinds IS NOT NULL"
                                  " AND (%s::text IS NULL OR %s = ANY(queues) OR queues IS NULL)",
                                  (queue, queue)).fetchone()[0],
             timeout=timeout, what="a live worker in the registry")


# --- pending jobs --------------------------------------------------------------------------

def test_a_job_due_later_is_scheduled_with_when(conn):
    live_worker(conn)
    later = datetime.now(UTC) + timedelta(hours=2)
    job = q.enqueue(conn, "report", queue="mail", run_at=later)
    answer = why.why_job(conn, job, live_within=LIVE)
    assert answer.primary.code == "scheduled" and answer.blocked
    assert reason(answer, "scheduled").evidence["run_at"] == later
    assert "scheduled for later" in answer.verdict and "in 1 h 59 min" in answer.verdict


def test_a_retry_waiting_for_its_backoff_says_so_with_the_error(conn):
    live_worker(conn)
    job_id = q.enqueue(conn, "report", queue="mail")
    [job] = q.claim(conn, "w1", queues=["mail"])
    q.fail(conn, job, RuntimeError("smtp down"), backoff_base=600, backoff_cap=600)
    answer = why.why_job(conn, job_id, live_within=LIVE)
    assert answer.primary.code == "scheduled"
    assert reason(answer, "scheduled").evidence["retry"] is True
    assert "retry" in answer.verdict and "smtp down" not in answer.verdict  # the error is evidence (redacted by faces)
    assert reason(answer, "scheduled").evidence["last_error"] == "RuntimeError: smtp down"


def test_a_paused_queue_names_who_paused_it_and_why_from_the_audit_log(conn):
    live_worker(conn)
    job = q.enqueue(conn, "report", queue="mail")
    m.pause_queue(conn, "mail", actor="alice", reason="INC-7: SMTP relay down")
    answer = why.why_job(conn, job, live_within=LIVE)
    assert answer.primary.code == "paused"
    evidence = reason(answer, "paused").evidence
    assert (evidence["paused_by"], evidence["reason"]) == ("alice", "INC-7: SMTP relay down")
    assert evidence["audit_id"] is not None
    assert "alice" in answer.verdict and "INC-7: SMTP relay down" in answer.verdict
    m.resume_queue(conn, "mail", actor="alice", reason="relay back")
    assert "paused" not in codes(why.why_job(conn, job, live_within=LIVE))


def test_a_queue_at_its_concurrency_limit_says_how_many_run(conn):
    live_worker(conn)
    limits.set_limits(conn, "mail", concurrency=2, actor="alice", reason="protect the relay")
    first = [q.enqueue(conn, "report", queue="mail") for _ in range(3)]
    assert len(limits.claim_from_queue(conn, "mail", "w1", limit=5)) == 2
    answer = why.why_job(conn, first[2], live_within=LIVE)
    assert answer.primary.code == "queue_concurrency"
    assert reason(answer, "queue_concurrency").evidence.items() >= {"limit": 2, "running": 2}.items()
    assert "2 of 2 running" in answer.verdict


def test_a_queue_out_of_tokens_names_its_rate_and_the_next_token(conn):
    live_worker(conn)
    limits.set_limits(conn, "mail", rate="1/m", actor="alice", reason="provider quota")
    jobs = [q.enqueue(conn, "report", queue="mail") for _ in range(2)]
    assert len(limits.claim_from_queue(conn, "mail", "w1", limit=5)) == 1  # the one token
    answer = why.why_job(conn, jobs[1], live_within=LIVE)
    assert answer.primary.code == "queue_rate"
    evidence = reason(answer, "queue_rate").evidence
    assert evidence["rate"] == "1/m" and evidence["tokens"] < 1 and 0 < evidence["next_token_seconds"] <= 60


def test_a_kind_at_its_concurrency_limit_says_so(conn):
    live_worker(conn)
    limits.declare_kinds(conn, {"render": 1}, worker="w1")
    jobs = [q.enqueue(conn, "render", queue="media") for _ in range(2)]
    assert len(limits.claim_kind(conn, "render", "w1", limit=5)) == 1
    answer = why.why_job(conn, jobs[1], live_within=LIVE)
    assert answer.primary.code == "kind_concurrency"
    assert reason(answer, "kind_concurrency").evidence.items() >= {"kind": "render", "limit": 1, "running": 1}.items()


def test_no_worker_at_all_and_no_worker_on_the_queue(conn, procs):
    job = q.enqueue(conn, "noop", queue="mail")
    answer = why.why_job(conn, job, live_within=LIVE)
    assert answer.primary.code == "no_worker"
    procs.start("--queues", "other", "--concurrency", "1")
    wait_live(conn, queue="other")
    answer = why.why_job(conn, job, live_within=LIVE)
    assert answer.primary.code == "no_worker"
    assert "listen on other" in answer.verdict
    assert [w["queues"] for w in reason(answer, "no_worker").evidence["live_workers"]] == [["other"]]


def test_a_kind_no_live_worker_handles_is_named_with_what_they_do_handle(conn, procs):
    procs.start("--queues", "mail", "--concurrency", "1")
    wait_live(conn, queue="mail")
    later = datetime.now(UTC) + timedelta(hours=1)  # not claimed meanwhile: it would fail with UnknownTask
    job = q.enqueue(conn, "send_fax", queue="mail", run_at=later)
    answer = why.why_job(conn, job, live_within=LIVE)
    found = reason(answer, "kind_unhandled")
    assert found.blocking and "send_fax" in found.title and "noop" in found.evidence["handled"]
    assert "kind_unhandled" not in codes(why.why_job(conn, q.enqueue(conn, "noop", queue="mail", run_at=later),
                                                     live_within=LIVE))


def test_a_kind_is_not_called_unhandled_when_a_worker_did_not_say_what_it_handles(conn):
    live_worker(conn, queues=["mail"])  # kinds NULL: an older worker, or one in another language
    later = datetime.now(UTC) + timedelta(hours=1)
    job = q.enqueue(conn, "send_fax", queue="mail", run_at=later)
    assert "kind_unhandled" not in codes(why.why_job(conn, job, live_within=LIVE))


def test_busy_workers_and_the_jobs_ahead_in_claim_order(conn, procs):
    procs.start("--queues", "mail", "--concurrency", "1", "--batch-size", "1")
    wait_live(conn, queue="mail")
    q.enqueue(conn, "slow", {"sleep": 30}, queue="mail", priority=9)
    wait_for(lambda: conn.execute("SELECT in_flight FROM skiplock.workers WHERE stopped_at IS NULL").fetchone()[0] == 1,
             timeout=30, what="the worker busy with the slow job")
    urgent = [q.enqueue(conn, "noop", queue="mail", priority=5) for _ in range(3)]
    mine = q.enqueue(conn, "noop", queue="mail", priority=0)
    elsewhere = q.enqueue(conn, "noop", queue="other", priority=7)  # not on this worker's queues: not ahead
    answer = why.why_job(conn, mine, live_within=LIVE)
    assert answer.primary.code == "behind"
    evidence = reason(answer, "behind").evidence
    assert (evidence["ahead"], evidence["higher_priority"], evidence["busy"], evidence["slots"]) == (3, 3, 1, 1)
    assert "3 eligible job(s) come before it" in answer.verdict
    # The first of the urgent ones has nothing ahead of it: it is next, not behind.
    assert why.why_job(conn, urgent[0], live_within=LIVE).primary.code == "ready"
    assert reason(why.why_job(conn, elsewhere, live_within=LIVE), "no_worker")


def test_the_position_is_bounded_by_its_window_and_says_so(conn):
    live_worker(conn)
    for _ in range(8):
        q.enqueue(conn, "noop", queue="mail", priority=5)
    mine = q.enqueue(conn, "noop", queue="mail")
    answer = why.why_job(conn, mine, live_within=LIVE, window=5)
    evidence = reason(answer, "ready").evidence
    assert (evidence["ahead"], evidence["lower_bound"]) == (5, True)
    assert "5+ eligible" in answer.verdict
    exact = reason(why.why_job(conn, mine, live_within=LIVE), "ready").evidence
    assert (exact["ahead"], exact["lower_bound"]) == (8, False)


def test_nothing_holds_back_a_due_job_with_an_idle_worker(conn):
    live_worker(conn)
    job = q.enqueue(conn, "noop", queue="mail")
    answer = why.why_job(conn, job, live_within=LIVE)
    assert (answer.primary.code, answer.blocked) == ("ready", False)
    assert "first in claim order" in answer.verdict


# --- running jobs --------------------------------------------------------------------------

def test_a_lease_held_by_a_live_worker_and_then_by_a_dead_one(conn, procs):
    proc = procs.start("--queues", "mail", "--concurrency", "1", "--lease", "60")
    wait_live(conn, queue="mail")
    job = q.enqueue(conn, "slow", {"sleep": 60}, queue="mail")
    wait_for(lambda: conn.execute("SELECT count(*) FROM public.executions WHERE job_id = %s", (job,)).fetchone()[0],
             timeout=30, what="the job to start")
    answer = why.why_job(conn, job, live_within=LIVE)
    assert (answer.state, answer.primary.code, answer.blocked) == ("running", "running", False)
    assert reason(answer, "running").evidence["worker"]["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(1.5)
    answer = why.why_job(conn, job, live_within=1.0)  # the worker has not reported for longer than that
    assert answer.primary.code == "lease_dead" and answer.blocked
    assert "has not reported" in answer.verdict and "reaper" in answer.verdict
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '5 seconds' WHERE id = %s", (job,))
    assert "lease expired" in why.why_job(conn, job, live_within=1.0).verdict


# --- finished jobs -------------------------------------------------------------------------

def test_a_finished_job_whose_key_is_held_explains_the_uniqueness_conflict(conn):
    job = q.enqueue(conn, "invoice", {"n": 1}, queue="billing", idempotency_key="inv-1", unique_for=timedelta(hours=1))
    [claimed] = q.claim(conn, "w1", queues=["billing"])
    q.complete(conn, claimed)
    again = q.enqueue(conn, "invoice", {"n": 1}, queue="billing", idempotency_key="inv-1", unique_for=timedelta(hours=1))
    assert again == job
    answer = why.why_job(conn, job, live_within=LIVE)
    assert answer.primary.code == "unique" and answer.blocked
    evidence = reason(answer, "unique").evidence
    assert evidence["idempotency_key"] == "inv-1" and evidence["window_expires_at"] is not None
    assert "finished" in codes(answer)


def test_a_finished_job_without_a_key_is_simply_finished(conn):
    job = q.enqueue(conn, "invoice", queue="billing")
    [claimed] = q.claim(conn, "w1", queues=["billing"])
    q.complete(conn, claimed)
    answer = why.why_job(conn, job, live_within=LIVE)
    assert (codes(answer), answer.blocked) == (["finished"], False)
    assert why.why_job(conn, 987654321, live_within=LIVE) is None


# --- queues --------------------------------------------------------------------------------

def test_a_queue_answers_for_its_first_eligible_job(conn):
    live_worker(conn)
    m.pause_queue(conn, "mail", actor="bob", reason="INC-9: bounce storm")
    first = q.enqueue(conn, "noop", queue="mail", priority=3)
    q.enqueue(conn, "noop", queue="mail")
    answer = why.why_queue(conn, "mail", live_within=LIVE)
    assert (answer.state, answer.primary.code) == ("waiting", "paused")
    assert answer.job["id"] == first and answer.figures["eligible"] == 2
    assert "INC-9: bounce storm" in answer.verdict


def _claiming_before_each_look(monkeypatch, conn, looks: int) -> list[int]:
    """A worker claims the queue's head between the answer's read of the head and its read of
    the head's row, `looks` times: what a busy queue's workers do. Returns the ids taken."""
    import console.browse

    taken: list[int] = []
    real = console.browse.get_job

    def get_job(c, job_id, **kwargs):
        if len(taken) < looks:
            (job,) = q.claim(conn, "racer", queues=["mail"], limit=1)
            assert job.id == job_id  # the head the answer just read
            taken.append(job.id)
        return real(c, job_id, **kwargs)

    monkeypatch.setattr(console.browse, "get_job", get_job)
    return taken


def test_a_queue_whose_head_is_claimed_while_it_is_asked_is_still_waiting(conn, dsn, monkeypatch):
    """Seen in the demo during a burst: "Nothing is waiting in queue search" beside 300 eligible
    jobs, because a worker claimed the head between the two reads. The answer looks again."""
    import psycopg

    live_worker(conn)
    ids = [q.enqueue(conn, "noop", queue="mail") for _ in range(10)]
    with psycopg.connect(dsn, autocommit=True) as asker:
        taken = _claiming_before_each_look(monkeypatch, conn, looks=2)
        answer = why.why_queue(asker, "mail", live_within=LIVE)
    assert taken == ids[:2]
    assert (answer.state, answer.job["id"], answer.figures["eligible"]) == ("waiting", ids[2], 8)


def test_a_queue_whose_head_is_taken_at_every_look_is_moving_not_empty(conn, dsn, monkeypatch):
    import psycopg

    live_worker(conn)
    for _ in range(10):
        q.enqueue(conn, "noop", queue="mail")
    with psycopg.connect(dsn, autocommit=True) as asker:
        taken = _claiming_before_each_look(monkeypatch, conn, looks=why.HEAD_TRIES)
        answer = why.why_queue(asker, "mail", live_within=LIVE)
    assert len(taken) == why.HEAD_TRIES
    assert (answer.state, answer.primary.code, answer.blocked) == ("moving", "moving", False)
    assert answer.figures["eligible"] == 10 - why.HEAD_TRIES + 1  # read before the last claim
    assert "is moving" in answer.verdict and "Nothing is waiting" not in answer.verdict


def test_a_queue_with_only_scheduled_jobs_says_when_the_next_is_due(conn):
    live_worker(conn)
    q.enqueue(conn, "noop", queue="mail", run_at=datetime.now(UTC) + timedelta(minutes=30))
    answer = why.why_queue(conn, "mail", live_within=LIVE)
    assert (answer.state, answer.primary.code) == ("scheduled", "scheduled")
    assert "the next at" in answer.verdict


def test_an_empty_queue_and_a_queue_nobody_listens_on(conn):
    answer = why.why_queue(conn, "mail", live_within=LIVE)
    assert (answer.state, answer.primary.code, answer.blocked) == ("empty", "empty", False)
    q.enqueue(conn, "noop", queue="mail")
    assert why.why_queue(conn, "mail", live_within=LIVE).primary.code == "no_worker"


def test_a_queue_whose_running_jobs_lost_their_worker_says_so(conn):
    live_worker(conn)
    q.enqueue(conn, "noop", queue="mail")
    [job] = q.claim(conn, "gone", queues=["mail"], lease=0.1)
    time.sleep(0.3)
    answer = why.why_queue(conn, "mail", live_within=LIVE)
    assert (answer.state, answer.primary.code) == ("empty", "lease_dead")
    assert reason(answer, "lease_dead").evidence["expired_leases"] == 1
    q.enqueue(conn, "noop", queue="mail")  # with a job waiting too, the lost lease still leads
    answer = why.why_queue(conn, "mail", live_within=LIVE)
    assert (answer.state, answer.primary.code) == ("waiting", "lease_dead")
    assert job


# --- bounded -------------------------------------------------------------------------------

def test_the_queries_walk_indexes_never_the_jobs_table(conn):
    """The answer reads the claim and lease indexes in windows: never a scan of the table."""
    from console.sqlfiles import query

    conn.execute("""INSERT INTO skiplock.jobs (queue, kind, status, priority, finished_at, run_at)
                    SELECT 'q' || (i % 3), 'noop',
                           CASE WHEN i % 50 = 0 THEN 'pending' WHEN i % 97 = 0 THEN 'running' ELSE 'completed' END,
                           (i % 5)::smallint, CASE WHEN i % 50 = 0 OR i % 97 = 0 THEN NULL ELSE now() END,
                           now() - (i || ' seconds')::interval
                    FROM generate_series(1, 20000) AS i""")
    conn.execute("VACUUM ANALYZE skiplock.jobs")
    params = {"priority": 2, "run_at": datetime.now(UTC), "id": 10_000, "queues": ["q1"], "own_queue_only": False,
              "window": why.WINDOW, "queue": "q1", "kind": "noop", "cap": why.RUNNING_CAP}
    for name, index in (("ahead", "jobs_claim_idx"), ("queue_head", "jobs_claim_idx"), ("running_in", "jobs_lease_idx")):
        with why._walking_indexes(conn):  # as console.why runs them
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query("why", name), params))
        assert "Seq Scan on jobs" not in plan and "Bitmap Heap Scan on jobs" not in plan, (name, plan)
        assert index in plan, (name, plan)
