"""Uniqueness windows against a real PostgreSQL: `enqueue(..., unique_for=...)` returns the first
job's id inside the window, in every state that job can be in (docs/queue.md, "Uniqueness
windows"), per (kind, key); an expired window is claimed again; retention prunes expired windows."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from console import maintenance
from console import queue as q
from console.db import connect
from console.maintenance import bulk

WINDOW = timedelta(minutes=10)


def jobs_with_key(conn, key):
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE idempotency_key = %s", (key,)).fetchone()[0]


def finish(conn, job_id, status):
    """Run the job once through the real protocol to `status` (completed or failed)."""
    [job] = q.claim(conn, "test-worker", limit=1)
    assert job.id == job_id
    if status == "completed":
        assert q.complete(conn, job)
    else:
        assert q.fail(conn, job, q.DoNotRetry("no")) == "failed"


def to_state(conn, dsn, job_id, state):
    if state == "pending":
        return
    if state == "running":
        assert [j.id for j in q.claim(conn, "test-worker", limit=1)] == [job_id]
    elif state in ("completed", "failed"):
        finish(conn, job_id, state)
    elif state == "archived":
        finish(conn, job_id, "completed")
        conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s", (job_id,))
        result = maintenance.archive_completed(conn, older_than=timedelta(hours=1), actor="test")
        assert result.rows == 1
        assert maintenance.archived_job(conn, job_id) is not None
    elif state == "purged":
        finish(conn, job_id, "failed")
        assert bulk.purge(dsn, {"ids": [job_id]}, actor="operator", reason="test")["done"] == 1
    else:  # pragma: no cover
        raise AssertionError(state)
    expected_live = 0 if state in ("archived", "purged") else 1
    assert jobs_with_key(conn, "order-7") == expected_live


@pytest.mark.parametrize("state", ["pending", "running", "completed", "failed", "archived", "purged"])
def test_a_second_enqueue_inside_the_window_returns_the_first_job_in_every_state(conn, dsn, state):
    first = q.enqueue(conn, "ship", {"order": 7}, idempotency_key="order-7", unique_for=WINDOW)
    to_state(conn, dsn, first, state)

    again = q.enqueue(conn, "ship", {"order": 7}, idempotency_key="order-7", unique_for=WINDOW)

    assert again == first
    assert jobs_with_key(conn, "order-7") == (0 if state in ("archived", "purged") else 1)  # nothing new
    window = q.unique_window(conn, {"id": first, "kind": "ship", "idempotency_key": "order-7"})
    assert window is not None and window["active"]


def test_without_unique_for_the_key_is_unique_only_in_the_hot_table(conn, dsn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7")
    to_state(conn, dsn, first, "archived")
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7") != first
    assert conn.execute("SELECT count(*) FROM skiplock.unique_keys").fetchone()[0] == 0  # never touched


def test_an_expired_window_is_claimed_by_the_next_enqueue(conn, dsn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    to_state(conn, dsn, first, "archived")
    conn.execute("UPDATE skiplock.unique_keys SET expires_at = now() - interval '1 second'")

    second = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)

    assert second != first
    assert q.get_job(conn, second)["status"] == "pending"
    assert conn.execute("SELECT job_id FROM skiplock.unique_keys").fetchone()[0] == second
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == second


def test_the_window_is_per_kind(conn):
    ship = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    conn.execute("DELETE FROM skiplock.jobs")  # the hot-table key index would answer otherwise
    bill = q.enqueue(conn, "bill", {}, idempotency_key="order-7", unique_for=WINDOW)
    assert bill != ship
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == ship
    assert q.enqueue(conn, "bill", {}, idempotency_key="order-7", unique_for=WINDOW) == bill


def test_a_window_claimed_over_a_hot_job_points_at_that_job(conn, dsn):
    hot = q.enqueue(conn, "ship", {}, idempotency_key="order-7")  # no window yet
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == hot
    assert conn.execute("SELECT job_id FROM skiplock.unique_keys").fetchone()[0] == hot
    to_state(conn, dsn, hot, "archived")
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == hot


def test_a_rolled_back_enqueue_leaves_no_window(tx_conn, conn):
    q.enqueue(tx_conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    tx_conn.rollback()
    assert conn.execute("SELECT count(*) FROM skiplock.unique_keys").fetchone()[0] == 0
    job_id = q.enqueue(tx_conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    tx_conn.commit()
    assert q.get_job(conn, job_id) is not None


def test_two_concurrent_enqueues_of_one_key_make_one_job(dsn, conn):
    with connect(dsn, autocommit=False) as a, connect(dsn, autocommit=False) as b:
        first = q.enqueue(a, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
        result: dict[str, int] = {}
        t = threading.Thread(target=lambda: result.update(
            id=q.enqueue(b, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)))
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waits on the window row until the first transaction ends
        a.commit()
        t.join(10)
        assert not t.is_alive()
        b.commit()
    assert result["id"] == first
    assert jobs_with_key(conn, "order-7") == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"unique_for": WINDOW}, "needs an idempotency_key"),
    ({"unique_for": timedelta(0), "idempotency_key": "k"}, "more than 0 seconds"),
    ({"unique_for": "10m", "idempotency_key": "k"}, "must be a timedelta"),
    ({"unique_for": timedelta(days=400), "idempotency_key": "k"}, "at most 366 days"),
])
def test_bad_windows_are_refused_naming_the_argument(conn, kwargs, message):
    with pytest.raises(q.InvalidJob, match=message):
        q.enqueue(conn, "ship", {}, **kwargs)


def test_retention_prunes_expired_windows_in_batches_and_keeps_live_ones(conn):
    for i in range(5):
        q.enqueue(conn, "ship", {}, idempotency_key=f"old-{i}", unique_for=WINDOW)
    live = q.enqueue(conn, "ship", {}, idempotency_key="live", unique_for=WINDOW)
    conn.execute("UPDATE skiplock.unique_keys SET expires_at = now() - interval '1 minute' WHERE idempotency_key LIKE 'old-%'")

    result = maintenance.apply_retention(conn, retention=timedelta(days=7), batch_size=2, actor="test")

    assert result.detail["unique_keys_pruned"] == 5
    left = conn.execute("SELECT idempotency_key, job_id FROM skiplock.unique_keys").fetchall()
    assert left == [("live", live)]


def test_the_cli_takes_a_window_and_prints_the_first_jobs_id(subprocess_env, conn, dsn):
    from tests.workers import cli

    first = cli(subprocess_env, "enqueue", "ship", '{"order": 7}', "--idempotency-key", "order-7", "--unique-for", "600")
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout)
    to_state(conn, dsn, job_id, "archived")
    again = cli(subprocess_env, "enqueue", "ship", "{}", "--idempotency-key", "order-7", "--unique-for", "600")
    assert int(again.stdout) == job_id
    plain = cli(subprocess_env, "enqueue", "ship", "{}", "--unique-for", "600")
    assert plain.returncode == 2 and "needs an idempotency_key" in plain.stderr
