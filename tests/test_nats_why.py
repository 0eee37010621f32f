"""Why isn't a broker queue moving? (console/brokerwhy.py; docs/exit-plan.md, "Why isn't it
moving?"): for a queue whose backend is nats, `skiplock why --queue`, the queue page's panel and
GET /api/v1/queues/<name>/why answer from the broker's facts, against a private nats-server
(tests/nats_helpers.py): the outbox with no relay, the stream with no broker worker, jobs
delivered and not acknowledged, redeliveries, an empty queue, and a broker that does not answer.

The relay and the worker are stood in for by what PostgreSQL and the broker see of them: the
relay's leader lock held by a test session, a worker row registered as a broker worker writes
it, and a pull consumer that fetches without acking (as a worker mid-job) or naks (a retry).
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from click.testing import CliRunner

from console import brokerwhy
from console import queue as q
from console.cli import main
from console.queue import broker
from console.sqlfiles import query
from tests import nats_helpers
from tests.nats_helpers import _run, set_backend

nats_server = nats_helpers.nats_server

QUEUE = "mail"
LIVE = 30.0


async def _relay(nats_url: str, dsn: str) -> None:
    """Publish the queue's unsent outbox rows as the relay does (the body the worker reads)."""
    import nats

    from console.queue.broker.relay import ensure_streams

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, QUEUE, 120.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM skiplock.outbox WHERE queue = %s AND sent_at IS NULL",
                                              (QUEUE,))]
            for job_id in ids:
                body = {"id": job_id, "queue": QUEUE, "kind": "record", "payload": {}, "max_attempts": 3,
                        "run_at": "2026-01-01T00:00:00+00:00", "created_at": "2026-01-01T00:00:00+00:00"}
                await js.publish(broker.subject(QUEUE), json.dumps(body).encode(),
                                 headers={broker.MSG_ID: f"job-{job_id}"})
            conn.execute("UPDATE skiplock.outbox SET sent_at = now() WHERE queue = %s", (QUEUE,))
    finally:
        await nc.close()


async def _take(nats_url: str, ack_wait: float, nak_one: bool) -> None:
    """A worker's consumer fetches two jobs and acks neither (running); with nak_one, one is
    nak'd and fetched again (a retry: delivered twice)."""
    import nats
    from nats.js import api

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_consumer(broker.stream(QUEUE), api.ConsumerConfig(
            durable_name=broker.CONSUMER, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=ack_wait,
            filter_subject=broker.subject(QUEUE)))
        sub = await js.pull_subscribe_bind(durable=broker.CONSUMER, stream=broker.stream(QUEUE))
        msgs = await sub.fetch(2, timeout=5)
        if nak_one:
            await msgs[0].nak()
            # The next fetch must come after the server has taken the nak, or it is served the
            # stream's third job instead (seen once under load). Nothing in the consumer's info
            # shows a nak taken (the job stays ack-pending until redelivered), so give it time.
            await nc.flush()
            await asyncio.sleep(0.5)
            again = await sub.fetch(1, timeout=5)
            assert again[0].metadata.num_delivered == 2
    finally:
        await nc.close()


def ask(conn, nats_url: str) -> dict:
    return brokerwhy.why_broker_queue(conn, QUEUE, nats_url=nats_url, timeout=3.0, live_within=LIVE).as_dict()


def codes(answer: dict) -> list[tuple[str, bool]]:
    return [(r["code"], r["blocking"]) for r in answer["reasons"]]


def test_a_broker_queue_is_answered_from_the_outbox_the_relay_the_stream_and_its_workers(dsn, conn, nats_server):
    set_backend(dsn, QUEUE)
    assert codes(ask(conn, nats_server)) == [("empty", False)]
    for n in range(3):
        q.enqueue(conn, "record", {"n": n}, queue=QUEUE)

    # Due jobs in the outbox, no relay: nothing reaches the broker.
    answer = ask(conn, nats_server)
    assert answer["code"] == "relay_stopped" and answer["blocked"], answer
    assert "3 jobs of queue mail are waiting in the outbox and no relay runs" in answer["verdict"]
    assert answer["figures"]["outbox_unsent"] == 3 and answer["figures"]["pending"] == 0

    # A relay holds the leader lock: the same rows are its work in progress, not a block.
    with psycopg.connect(dsn, autocommit=True) as relay:
        assert relay.execute(query("broker", "relay_lock")).fetchone()[0] is True
        answer = ask(conn, nats_server)
        assert codes(answer) == [("outbox", False)] and not answer["blocked"], answer

    # Published, and no broker worker: the stream's jobs wait for one.
    _run(_relay(nats_server, dsn))
    answer = ask(conn, nats_server)
    assert (answer["code"], answer["blocked"], answer["state"]) == ("no_worker", True, "waiting"), answer
    assert "3 jobs of queue mail are waiting in the stream skiplock_jobs_mail and no broker worker" in answer["verdict"]

    # A registered broker worker (its row, as `skiplock worker --backend nats` writes it) and a
    # consumer that took two jobs, nak'd one and took it again: a backlog, running, redelivered.
    conn.execute(query("broker", "register_broker_worker"), {
        "id": "w-nats-1", "host": "h", "pid": 1, "queues": [QUEUE], "concurrency": 2, "kinds": ["record"],
        "version": "t", "release": None})
    _run(_take(nats_server, ack_wait=60.0, nak_one=True))
    answer = ask(conn, nats_server)
    assert codes(answer) == [("redelivered", False), ("backlog", False), ("running", False)], answer["figures"]
    figures = {k: answer["figures"][k] for k in ("pending", "ack_pending", "redelivered")}
    assert figures == {"pending": 1, "ack_pending": 2, "redelivered": 1}, answer["figures"]
    assert "w-nats-1" in answer["reasons"][1]["title"]

    # The worker stopped reporting: the job left in the stream waits for a worker again.
    conn.execute("UPDATE skiplock.workers SET stopped_at = now() WHERE id = 'w-nats-1'")
    assert ask(conn, nats_server)["code"] == "no_worker"

    # The broker gone: said, and blocking; the outbox facts still stand beside it.
    nats_helpers.stop_server(nats_server)
    answer = ask(conn, nats_server)
    assert (answer["code"], answer["blocked"], answer["state"]) == ("broker_down", True, "unknown"), answer
    assert "the broker did not answer" in answer["verdict"]


def test_jobs_left_in_postgres_by_the_move_are_named_and_a_postgres_queue_is_answered_as_before(
        dsn, conn, nats_server):
    q.enqueue(conn, "record", {"n": 1}, queue=QUEUE)  # before the move: in skiplock.jobs
    q.enqueue(conn, "record", {"n": 2}, queue="billing")
    set_backend(dsn, QUEUE)
    answer = ask(conn, nats_server)
    assert codes(answer) == [("postgres_left", False)] and answer["figures"]["postgres_left"] == 1, answer
    # The PostgreSQL reading for a PostgreSQL queue, through every face.
    result = CliRunner().invoke(main, ["--dsn", dsn, "why", "--queue", "billing", "--json"],
                                env={"SKIPLOCK_BROKER_NATS_URL": nats_server}, catch_exceptions=False)
    assert result.exit_code == 0 and json.loads(result.output)["code"] == "no_worker", result.output
    assert "figures" in json.loads(result.output) and "backend" not in (json.loads(result.output)["figures"] or {})


@pytest.fixture
def web_settings(web_settings, nats_server):
    return {**web_settings, "broker.nats_url": nats_server}


def test_the_cli_the_api_and_the_queue_page_ask_the_broker_for_a_nats_queue(dsn, conn, nats_server, client_as):
    set_backend(dsn, QUEUE)
    q.enqueue(conn, "record", {"n": 1}, queue=QUEUE)
    _run(_relay(nats_server, dsn))
    result = CliRunner().invoke(main, ["--dsn", dsn, "why", "--queue", QUEUE],
                                env={"SKIPLOCK_BROKER_NATS_URL": nats_server}, catch_exceptions=False)
    assert result.exit_code == 0 and result.output.startswith("1 job of queue mail is waiting in the stream"), result.output
    viewer = client_as("viewer")
    api = viewer.get(f"/api/v1/queues/{QUEUE}/why").get_json()
    assert (api["code"], api["figures"]["backend"], api["available"]) == ("no_worker", "nats", True), api
    assert api["reasons"][0]["links"] == [{"label": "Workers: what each listens on", "path": "/workers"}]
    panel = viewer.get(f"/queues/{QUEUE}/_why").get_data(as_text=True)
    assert 'data-why-code="no_worker"' in panel and "asked of the broker" in panel


def test_move_status_of_a_queue_moved_back_asks_the_broker_what_its_stream_still_holds(dsn, conn, nats_server):
    """docs/exit-plan.md: after `--to postgres`, PostgreSQL cannot see the jobs already in the
    stream; `skiplock queues move --status` reads the broker's count (no `nats` CLI needed)."""
    set_backend(dsn, QUEUE)
    for n in range(2):
        q.enqueue(conn, "record", {"n": n}, queue=QUEUE)
    _run(_relay(nats_server, dsn))
    set_backend(dsn, QUEUE, "postgres")

    def status(*extra: str, url: str = nats_server):
        result = CliRunner().invoke(main, ["--dsn", dsn, "queues", "move", QUEUE, "--status", *extra],
                                    env={"SKIPLOCK_BROKER_NATS_URL": url}, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert "stream skiplock_jobs_mail: 2 waiting, 0 delivered and not acknowledged: keep" in status()
    assert json.loads(status("--json"))["stream"] == {"exists": True, "pending": 2, "ack_pending": 0}
    nats_helpers.stop_server(nats_server)
    assert "stream skiplock_jobs_mail: not read (NATS at" in status()
