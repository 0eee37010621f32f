"""The queue protocol against a real PostgreSQL: enqueue, claim, fencing, retries, reaper."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from console import queue as q
from console.db import connect
from console.queue import protocol
from console.sqlfiles import query


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def status_of(conn, job_id):
    return conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]


def test_enqueue_joins_the_callers_transaction(tx_conn, conn):
    job_id = q.enqueue(tx_conn, "email", {"to": "a@example.com"})
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0  # not yet visible
    tx_conn.rollback()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    job_id = q.enqueue(tx_conn, "email", {"to": "a@example.com"})
    tx_conn.commit()
    assert status_of(conn, job_id) == "pending"


def test_enqueue_notifies_once_after_commit(tx_conn, dsn):
    with connect(dsn) as listener:
        listener.execute("LISTEN skiplock_jobs")
        for i in range(3):
            q.enqueue(tx_conn, "email", {"i": i}, queue="mail")
        assert list(listener.notifies(timeout=0.2)) == []  # nothing before commit
        tx_conn.commit()
        notes = list(listener.notifies(timeout=0.5, stop_after=5))
    assert [n.payload for n in notes] == ["mail"]


def test_idempotency_key_makes_a_second_enqueue_a_no_op(conn):
    first = q.enqueue(conn, "charge", {"order": 7}, idempotency_key="order-7")
    second = q.enqueue(conn, "charge", {"order": 7}, idempotency_key="order-7")
    assert first == second
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1


def test_enqueue_many_returns_ids_in_input_order_and_respects_keys(conn):
    existing = q.enqueue(conn, "a", {}, idempotency_key="k2")
    ids = q.enqueue_many(conn, [
        q.NewJob("a", {"n": 1}),
        q.NewJob("a", {"n": 2}, idempotency_key="k2"),
        q.NewJob("b", {"n": 3}, queue="other", priority=5),
        {"kind": "c", "payload": {"n": 4}, "idempotency_key": "k4"},
    ])
    assert ids[1] == existing
    assert len(set(ids)) == 4
    rows = conn.execute("SELECT id, kind, payload->>'n' FROM skiplock.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
    by_id = {r[0]: (r[1], r[2]) for r in rows}
    assert by_id[ids[0]] == ("a", "1") and by_id[ids[2]] == ("b", "3") and by_id[ids[3]] == ("c", "4")


def big_batch(n=q.COPY_THRESHOLD + 50):
    """A key-less batch long enough for enqueue_many's COPY path, over three queues."""
    future = datetime.now(UTC) + timedelta(hours=1)
    return [q.NewJob("bulk", {"n": i}, queue=("a", "b", "c")[i % 3], priority=i % 7,
                     run_at=future if i % 10 == 0 else None, max_attempts=None if i % 2 else 9)
            for i in range(n)]


def test_enqueue_many_copy_path_returns_ids_in_input_order_with_every_column(conn):
    jobs = big_batch()
    ids = q.enqueue_many(conn, jobs)
    assert len(ids) == len(jobs) == len(set(ids))
    rows = conn.execute(
        "SELECT id, (payload->>'n')::int, queue, priority, max_attempts, status, run_at > now() + interval '50 minutes',"
        " run_at = created_at, errors FROM skiplock.jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    for i, job_id in enumerate(ids):
        n, queue, priority, max_attempts, status, future, run_now, errors = by_id[job_id]
        assert n == i and queue == jobs[i].queue and priority == i % 7
        assert max_attempts == (q.DEFAULT_MAX_ATTEMPTS if i % 2 else 9)
        assert status == "pending" and errors == []
        assert future == (i % 10 == 0) and run_now == (i % 10 != 0)  # no run_at: the transaction's now()
    later = q.enqueue(conn, "after", {})
    assert later > max(ids)  # the sequence moved past the drawn ids


def test_enqueue_many_copy_path_keeps_tabs_newlines_and_backslashes(conn):
    odd = {"text": "a\tb\nc\\d\r\"e\u00e9", "path": "C:\\temp\\n"}
    jobs = [q.NewJob("kind\twith\\odd\nchars", odd, queue="q\\1") for _ in range(q.COPY_THRESHOLD)]
    ids = q.enqueue_many(conn, jobs)
    row = conn.execute("SELECT kind, queue, payload FROM skiplock.jobs WHERE id = %s", (ids[-1],)).fetchone()
    assert row == ("kind\twith\\odd\nchars", "q\\1", odd)


def test_enqueue_many_copy_path_joins_the_callers_transaction(tx_conn, conn):
    q.enqueue_many(tx_conn, big_batch())
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0  # not yet visible
    tx_conn.rollback()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    ids = q.enqueue_many(tx_conn, big_batch())
    tx_conn.commit()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s)", (ids,)).fetchone()[0] == len(ids)


def test_enqueue_many_copy_path_rings_once_per_queue_after_commit(tx_conn, dsn):
    with connect(dsn) as listener:
        listener.execute("LISTEN skiplock_jobs")
        q.enqueue_many(tx_conn, big_batch())
        assert list(listener.notifies(timeout=0.2)) == []  # nothing before commit
        tx_conn.commit()
        notes = list(listener.notifies(timeout=0.5, stop_after=10))
    assert sorted(n.payload for n in notes) == ["a", "b", "c"]


def test_enqueue_many_long_keyed_batch_still_dedupes(conn):
    existing = q.enqueue(conn, "k", {}, idempotency_key="key-3")
    jobs = [q.NewJob("k", {"n": i}, idempotency_key=f"key-{i}" if i % 2 else None) for i in range(q.COPY_THRESHOLD + 10)]
    ids = q.enqueue_many(conn, jobs)
    assert ids[3] == existing
    again = q.enqueue_many(conn, [j for j in jobs if j.idempotency_key])
    assert again == [ids[i] for i in range(len(jobs)) if jobs[i].idempotency_key]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == len(jobs)


def test_enqueue_many_copy_path_refuses_a_bad_payload_before_writing(conn):
    jobs = big_batch()
    jobs[-1] = q.NewJob("bulk", {"when": datetime.now()})
    with pytest.raises(q.InvalidJob, match="JSON"):
        q.enqueue_many(conn, jobs)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0


@pytest.mark.parametrize("bad, message", [
    ({"kind": "", "payload": {}}, "kind"),
    ({"kind": "x", "payload": {"when": datetime.now()}}, "JSON"),
    ({"kind": "x", "payload": {"n": float("nan")}}, "JSON"),
    ({"kind": "x", "payload": {}, "priority": 10**6}, "priority"),
    ({"kind": "x", "payload": {}, "max_attempts": 0}, "max_attempts"),
    ({"kind": "x", "payload": {}, "queue": " "}, "queue"),
])
def test_invalid_jobs_are_refused_with_a_message(conn, bad, message):
    with pytest.raises(q.InvalidJob, match=message):
        q.enqueue(conn, bad.pop("kind"), bad.pop("payload"), **bad)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0


def test_claim_orders_by_priority_then_run_at_and_skips_future_jobs(conn):
    now = datetime.now(UTC)
    low = q.enqueue(conn, "k", {}, priority=0, run_at=now - timedelta(seconds=10))
    high = q.enqueue(conn, "k", {}, priority=5)
    q.enqueue(conn, "k", {}, priority=9, run_at=now + timedelta(hours=1))
    older_low = q.enqueue(conn, "k", {}, priority=0, run_at=now - timedelta(seconds=20))
    jobs = q.claim(conn, "w1", limit=10)
    assert [j.id for j in jobs] == [high, older_low, low]
    assert all(j.attempt == 1 and j.locked_by == "w1" for j in jobs)
    assert q.claim(conn, "w2", limit=10) == []


def test_claim_refuses_to_run_inside_an_open_transaction(tx_conn):
    tx_conn.execute("SELECT 1")
    with pytest.raises(RuntimeError, match="outside an open transaction"):
        q.claim(tx_conn, "w")


def test_two_claimers_never_get_the_same_job(dsn, conn):
    q.enqueue_many(conn, [q.NewJob("k", {"i": i}) for i in range(50)])
    with connect(dsn) as a, connect(dsn) as b:
        # a holds row locks in an open transaction: b must skip them, not wait
        a.execute("BEGIN")
        held = a.execute(query("queue", "claim"), {"worker": "a", "queues": None, "limit": 20, "lease": 60.0}).fetchall()
        got_b = q.claim(b, "b", limit=50)
        a.execute("COMMIT")
    assert len(held) == 20 and len(got_b) == 30
    assert not {r[0] for r in held} & {j.id for j in got_b}


def test_claim_filters_queues_and_skips_paused_queues(conn):
    mail = q.enqueue(conn, "k", {}, queue="mail")
    q.enqueue(conn, "k", {}, queue="reports")
    q.pause(conn, "reports")
    assert q.paused_queues(conn) == ["reports"]
    assert [j.id for j in q.claim(conn, "w", queues=["mail", "reports"], limit=5)] == [mail]
    assert q.claim(conn, "w", limit=5) == []
    q.resume(conn, "reports")
    assert len(q.claim(conn, "w", limit=5)) == 1


def test_complete_is_fenced_by_owner_and_attempt(conn):
    q.enqueue(conn, "k", {})
    (job,) = q.claim(conn, "w1", lease=30)
    stale = q.Job(**{**job.__dict__, "locked_by": "someone-else"})
    assert q.complete(conn, stale) is False
    assert q.complete(conn, job) is True
    assert status_of(conn, job.id) == "completed"
    assert q.complete(conn, job) is False  # already done: a second completion changes nothing


def test_fail_retries_with_backoff_then_dead_letters_with_history(conn):
    job_id = q.enqueue(conn, "k", {}, max_attempts=2)
    (job,) = q.claim(conn, "w")
    assert q.fail(conn, job, RuntimeError("boom 1 for user 42"), backoff_base=30) == "pending"
    row = conn.execute("SELECT status, run_at > now() + interval '10 seconds', attempts, last_error, error_fingerprint FROM skiplock.jobs WHERE id=%s", (job_id,)).fetchone()
    assert row[:3] == ("pending", True, 1)
    assert row[3] == "RuntimeError: boom 1 for user 42"
    assert row[4] == "RuntimeError: boom <n> for user <n>"
    assert q.claim(conn, "w") == []  # not yet due
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE id = %s", (job_id,))
    (job,) = q.claim(conn, "w")
    assert job.attempt == 2
    assert q.fail(conn, job, RuntimeError("boom 2")) == "failed"
    status, errors, finished = conn.execute("SELECT status, errors, finished_at FROM skiplock.jobs WHERE id=%s", (job_id,)).fetchone()
    assert status == "failed" and finished is not None
    assert [e["attempt"] for e in errors] == [1, 2]
    assert errors[0]["error_class"] == "RuntimeError" and "Traceback" not in (errors[0]["traceback"] or "Traceback")


def test_do_not_retry_goes_straight_to_failed(conn):
    q.enqueue(conn, "k", {}, max_attempts=10)
    (job,) = q.claim(conn, "w")
    assert q.fail(conn, job, q.DoNotRetry("card declined")) == "failed"


def test_error_history_is_bounded(conn):
    job_id = q.enqueue(conn, "k", {}, max_attempts=50)
    for _ in range(6):
        conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE id = %s", (job_id,))
        (job,) = q.claim(conn, "w")
        q.fail(conn, job, ValueError(f"attempt {job.attempt}"), history=3)
    errors = conn.execute("SELECT errors FROM skiplock.jobs WHERE id=%s", (job_id,)).fetchone()[0]
    assert [e["attempt"] for e in errors] == [4, 5, 6]


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    for attempt in range(1, 8):
        delay = q.backoff_delay(attempt, base=2, cap=60)
        raw = min(60, 2 * 2 ** (attempt - 1))
        assert raw / 2 <= delay <= raw


def test_heartbeat_extends_only_a_held_lease(conn):
    q.enqueue(conn, "k", {})
    (job,) = q.claim(conn, "w", lease=1)
    before = job.lease_until
    assert q.heartbeat(conn, job, lease=120) is True
    assert job.lease_until > before + timedelta(seconds=60)
    other = q.Job(**{**job.__dict__, "attempts": job.attempts + 1})
    assert q.heartbeat(conn, other, lease=120) is False


def test_release_returns_jobs_without_counting_the_attempt(conn):
    job_id = q.enqueue(conn, "k", {})
    (job,) = q.claim(conn, "w")
    assert q.release(conn, [job]) == [job_id]
    assert conn.execute("SELECT status, attempts, locked_by FROM skiplock.jobs WHERE id=%s", (job_id,)).fetchone() == ("pending", 0, None)


def test_reaper_rescues_expired_leases_and_fences_the_old_owner(conn):
    keep = q.enqueue(conn, "k", {}, max_attempts=3)
    exhaust = q.enqueue(conn, "k", {}, max_attempts=1)
    jobs = {j.id: j for j in q.claim(conn, "dead-worker", limit=2, lease=0.1)}
    conn.execute("SELECT pg_sleep(0.2)")
    result = q.reap(conn, batch_size=1)
    assert result == {"pending": 1, "failed": 1, "batches": 2}
    assert status_of(conn, keep) == "pending"
    assert status_of(conn, exhaust) == "failed"
    # the late worker's completion is refused: the rescued jobs stay as the reaper left them
    assert q.complete(conn, jobs[keep]) is False
    assert q.fail(conn, jobs[exhaust], RuntimeError("late")) is None
    errors = conn.execute("SELECT errors FROM skiplock.jobs WHERE id=%s", (keep,)).fetchone()[0]
    assert errors[-1]["error_class"] == "LeaseExpired" and errors[-1]["worker"] == "dead-worker"


def test_reap_refuses_a_zero_batch(conn):
    with pytest.raises(ValueError):
        q.reap(conn, batch_size=0)


def test_complete_and_claim_completes_fenced_and_claims_next(conn):
    q.enqueue_many(conn, [q.NewJob("k", {"i": i}) for i in range(5)])
    first = q.claim(conn, "w", limit=2)
    completed, claimed = q.complete_and_claim(conn, "w", first, limit=2)
    assert sorted(completed) == sorted(j.id for j in first)
    assert len(claimed) == 2 and not {j.id for j in claimed} & set(completed)
    completed, claimed = q.complete_and_claim(conn, "w", [], limit=10)
    assert completed == [] and len(claimed) == 1


def test_complete_and_claim_on_the_workers_binary_cursor_reads_the_same_jobs(conn):
    """The worker's hot path: one binary cursor kept across calls. The jobs it reads are the
    ones a fresh text cursor reads (payload, timestamps in the session's time zone, key)."""
    ids = q.enqueue_many(conn, [q.NewJob("k", {"i": i, "s": "é"}, idempotency_key=f"key-{i}") for i in range(4)])
    cur = q.claim_cursor(conn)
    _, first = q.complete_and_claim(conn, "w", [], limit=2, cursor=cur)
    assert [c.name for c in cur.description][1:3] == ["id", "queue"]  # it ran on the given cursor
    conn.execute("UPDATE skiplock.jobs SET status = 'pending', locked_by = NULL WHERE id = ANY(%s)",
                 ([j.id for j in first],))
    _, again = q.complete_and_claim(conn, "w", [], limit=2)  # a fresh text cursor
    assert [j.id for j in first] == [j.id for j in again] == ids[:2]
    for binary, text in zip(first, again, strict=True):
        assert binary.payload == text.payload and isinstance(binary.payload, dict)
        assert binary.run_at == text.run_at and binary.run_at.utcoffset() == text.run_at.utcoffset()
        assert binary.created_at == text.created_at and binary.idempotency_key == text.idempotency_key
    completed, more = q.complete_and_claim(conn, "w", again, limit=5, cursor=cur)
    assert sorted(completed) == ids[:2] and [j.id for j in more] == ids[2:]


@pytest.mark.parametrize("text", ['{"i":1}', '{"s": "\u00e9t\u00e9 \\u00e9 \\"q\\"", "n": [1, 2.5, -3e40, null, true]}',
                                  '[]', '"x"', '12345678901234567890', ' {"a": 1} '])
def test_the_claim_cursors_payload_decoder_reads_what_json_loads_reads(text):
    import json

    assert protocol._jsonb_loads(text.encode()) == json.loads(text)


def test_the_claim_cursors_payload_decoder_refuses_what_json_loads_refuses():
    import json

    for bad in (b'{"a": 1} x', b'{"a": }', b''):
        with pytest.raises(json.JSONDecodeError):
            protocol._jsonb_loads(bad)


def test_complete_and_claim_completes_a_full_batch_of_large_ids_and_none(conn):
    """The finished ids and attempts travel as array literals: every one of a batch counts,
    ids past 2**31 included, and an empty batch completes nothing."""
    conn.execute("SELECT setval(pg_get_serial_sequence('skiplock.jobs', 'id'), 3000000000)")
    q.enqueue_many(conn, [q.NewJob("k") for _ in range(12)])
    completed, claimed = q.complete_and_claim(conn, "w", [], limit=10)
    assert completed == [] and len(claimed) == 10 and min(j.id for j in claimed) > 2**31
    completed, claimed = q.complete_and_claim(conn, "w", claimed, limit=10)
    assert len(completed) == 10 and len(claimed) == 2


def test_claim_uses_the_partial_claim_index_on_a_table_full_of_completed_rows(conn):
    conn.execute(
        """
        INSERT INTO skiplock.jobs (kind, status, finished_at)
        SELECT 'k', 'completed', now() FROM generate_series(1, 200000)
        """
    )
    q.enqueue_many(conn, [q.NewJob("k", {}) for _ in range(100)])
    conn.execute("ANALYZE skiplock.jobs")
    plan = conn.execute(
        "EXPLAIN (FORMAT JSON) " + query("queue", "claim"),
        {"worker": "w", "queues": None, "limit": 10, "lease": 30.0},
    ).fetchone()[0]
    scans = [node for node in plan_nodes(plan[0]["Plan"]) if node.get("Relation Name") == "jobs" and "Scan" in node["Node Type"]]
    assert scans, "the plan reads the jobs table"
    assert all(node["Node Type"] in {"Index Scan", "Index Only Scan"} for node in scans), scans
    # the candidates come from the claim index; the UPDATE then finds each row by primary key
    assert {node["Index Name"] for node in scans} == {"jobs_claim_idx", "jobs_pkey"}


def test_statuses_are_constrained(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO skiplock.jobs (kind, status) VALUES ('k', 'bogus')")
