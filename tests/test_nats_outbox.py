"""Broker queues, the PostgreSQL side (issue 32; docs/exit-plan.md): `enqueue(conn, ...)` writes a
nats queue's job to skiplock.outbox in the caller's transaction, from every path of the producer;
other queues are untouched. No broker is needed here; tests/test_nats_broker.py runs the relay
and the worker against a real nats-server.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from click.testing import CliRunner

from console import queue as q
from console.cli import main
from console.config import ConfigError, load_config
from console.queue import broker
from tests.nats_helpers import ROOT, set_backend


def counts(conn) -> tuple[int, int]:
    return conn.execute("SELECT (SELECT count(*) FROM skiplock.jobs), (SELECT count(*) FROM skiplock.outbox)").fetchone()


def test_a_nats_queues_job_is_in_the_outbox_iff_the_transaction_commits(dsn, tx_conn):
    set_backend(dsn, "mail")
    rolled_back = q.enqueue(tx_conn, "record", {"n": 1}, queue="mail")
    tx_conn.rollback()
    committed = q.enqueue(tx_conn, "record", {"n": 2}, queue="mail", max_attempts=3)
    other = q.enqueue(tx_conn, "record", {"n": 3}, queue="reports")  # no row: postgres
    tx_conn.commit()
    rows = tx_conn.execute("SELECT id, queue, kind, payload, max_attempts, sent_at FROM skiplock.outbox").fetchall()
    tx_conn.commit()
    assert rows == [(committed, "mail", "record", {"n": 2}, 3, None)]
    assert rolled_back != committed
    assert q.get_job(tx_conn, committed) is None and q.get_job(tx_conn, other)["queue"] == "reports"


def test_ids_come_from_one_sequence_and_a_mixed_batch_keeps_input_order(dsn, conn):
    set_backend(dsn, "mail")
    ids = q.enqueue_many(conn, [q.NewJob("a", queue="mail"), q.NewJob("b", queue="reports"),
                                q.NewJob("c", queue="mail"), {"kind": "d", "queue": "reports"}])
    assert ids == sorted(ids) and len(set(ids)) == 4
    kinds = dict(conn.execute("SELECT id, kind FROM skiplock.jobs UNION ALL SELECT id, kind FROM skiplock.outbox").fetchall())
    assert [kinds[i] for i in ids] == ["a", "b", "c", "d"]
    assert counts(conn) == (2, 2)


def test_a_long_batch_that_would_go_by_copy_is_routed_too(dsn, conn):
    set_backend(dsn, "mail")
    jobs = [q.NewJob("a", {"i": i}, queue="mail" if i % 2 else "reports") for i in range(q.COPY_THRESHOLD)]
    ids = q.enqueue_many(conn, jobs)
    assert len(set(ids)) == q.COPY_THRESHOLD
    assert counts(conn) == (q.COPY_THRESHOLD // 2, q.COPY_THRESHOLD // 2)
    only_postgres = q.enqueue_many(conn, [q.NewJob("a", queue="reports") for _ in range(q.COPY_THRESHOLD)])
    assert len(only_postgres) == q.COPY_THRESHOLD and counts(conn) == (q.COPY_THRESHOLD * 3 // 2, q.COPY_THRESHOLD // 2)


def test_an_idempotency_key_holds_across_both_tables_and_with_a_window(dsn, conn):
    set_backend(dsn, "mail")
    first = q.enqueue(conn, "a", queue="mail", idempotency_key="order-1")
    assert q.enqueue(conn, "a", queue="mail", idempotency_key="order-1") == first
    set_backend(dsn, "mail", "postgres")  # moved back: the key still names the outbox's job
    assert q.enqueue(conn, "a", queue="mail", idempotency_key="order-1") == first
    assert q.enqueue_many(conn, [{"kind": "a", "queue": "mail", "idempotency_key": "order-1"}]) == [first]
    set_backend(dsn, "mail")
    windowed = q.enqueue(conn, "a", queue="mail", idempotency_key="order-2", unique_for=timedelta(minutes=5))
    assert q.enqueue(conn, "a", queue="mail", idempotency_key="order-2", unique_for=timedelta(minutes=5)) == windowed
    assert conn.execute("SELECT count(*) FROM skiplock.outbox WHERE idempotency_key = 'order-2'").fetchone()[0] == 1
    assert counts(conn) == (0, 2)


def test_the_backend_switch_is_audited_and_refuses_what_a_broker_cannot_carry(dsn, conn):
    runner = CliRunner()
    result = runner.invoke(main, ["queues", "backend", "mail", "nats", "--dsn", dsn, "--reason", "INC-7: exit plan"])
    assert result.exit_code == 0, result.output
    assert "new jobs go to nats (was: postgres)" in result.output
    assert broker.backend_of(conn, "mail") == "nats"
    audit = conn.execute("SELECT action, target, reason, detail FROM skiplock.audit_log ORDER BY id DESC LIMIT 1").fetchone()
    assert audit == ("set backend", "queue:mail", "INC-7: exit plan", {"before": "postgres", "after": "nats"})
    bad = runner.invoke(main, ["queues", "backend", "mail.eu", "nats", "--dsn", dsn, "--reason", "INC-7: exit plan"])
    assert bad.exit_code == 2 and "cannot be served by a broker" in bad.output
    assert broker.backend_of(conn, "mail.eu") == "postgres"
    worker = runner.invoke(main, ["worker", "--backend", "nats", "--tasks", "tests.nats_tasks", "--dsn", dsn])
    assert worker.exit_code == 2 and "--backend nats needs --queues" in worker.output


def test_bad_broker_settings_are_refused_with_the_settings_name():
    with pytest.raises(ConfigError, match=r"broker.nats_url .*must be nats://host:port"):
        load_config(env={"SKIPLOCK_BROKER_NATS_URL": "http://127.0.0.1:4222"})
    with pytest.raises(ConfigError, match=r"broker.duplicate_window"):
        load_config(env={"SKIPLOCK_BROKER_DUPLICATE_WINDOW": "0s"})
    for bad in ("0", "6"):  # JetStream keeps 1 to 5 replicas of a stream
        with pytest.raises(ConfigError, match=r"broker.replicas .*must be from 1 to 5"):
            load_config(env={"SKIPLOCK_BROKER_REPLICAS": bad})
    assert load_config(env={"SKIPLOCK_BROKER_REPLICAS": "3"}).broker.replicas == 3
    assert load_config(env={"SKIPLOCK_BROKER_NATS_URL": "nats://a:4222, nats://b:4222"}).broker.nats_url


def test_the_engine_imports_no_nats_client_until_a_broker_is_used():
    code = ("import sys, skiplock, console.queue.producer, console.queue.worker, console.queue.broker, console.cli; "
            "assert not [m for m in sys.modules if m == 'nats' or m.startswith('nats.')], 'nats imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_an_unreachable_nats_ends_the_broker_worker_and_the_relay_with_a_message(dsn):
    """In a process of its own, as the CLI runs them: both entry points run asyncio.run in the
    main thread, which in an xdist worker that has run a Playwright test already has a loop."""
    from tests.nats_helpers import _free_port

    nowhere = f"nats://127.0.0.1:{_free_port()}"
    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            "from console.queue.broker import relay\n"
            "from console.queue.broker.natsworker import NatsWorker, run_nats_worker\n"
            "relay.CONNECT_WITHIN = 1.0\n"
            f"worker = run_nats_worker(NatsWorker({nowhere!r}, queues=['mail'], lease=2))\n"
            f"relayed = relay.run_relay({dsn!r}, relay.RelaySettings(nats_url={nowhere!r}))\n"
            "print(worker, relayed)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.stdout.split() == ["1", "1"], (result.stdout, result.stderr)
    assert f"cannot reach NATS at {nowhere}: TimeoutError" in result.stderr
    assert "relay: cannot reach NATS" in result.stderr


def test_the_relay_reads_only_due_unsent_rows_and_prunes_only_old_sent_ones(dsn, conn):
    from datetime import UTC, datetime

    from console.sqlfiles import query

    set_backend(dsn, "mail")
    due = q.enqueue(conn, "a", queue="mail")
    later = q.enqueue(conn, "a", queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    old_sent = q.enqueue(conn, "a", queue="mail")
    new_sent = q.enqueue(conn, "a", queue="mail")
    conn.execute("UPDATE skiplock.outbox SET sent_at = now() - interval '2 hours' WHERE id = %s", (old_sent,))
    conn.execute("UPDATE skiplock.outbox SET sent_at = now() WHERE id = %s", (new_sent,))
    taken = [r[0] for r in conn.execute(query("broker", "outbox_take"), {"limit": 10, "skip": []}).fetchall()]
    assert taken == [due]  # not the one waiting for its run_at, not the sent ones
    assert 3500 < conn.execute(query("broker", "outbox_next_due")).fetchone()[0] <= 3600  # `later`, not `due`
    deleted = conn.execute(query("broker", "outbox_prune"), {"keep": 3600, "batch_size": 10}).rowcount
    assert deleted == 1
    left = {r[0] for r in conn.execute("SELECT id FROM skiplock.outbox").fetchall()}
    assert left == {due, later, new_sent}
