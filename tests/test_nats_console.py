"""Broker queues in the console (issue 32, item 4; docs/exit-plan.md, "The console"): the broker
collector reads a nats queue's streams and consumer from a private nats-server
(tests/nats_helpers.py) and stores the same queue metrics as a PostgreSQL queue's, labelled
backend="nats"; /metrics, the queues list and the queue page show them; a broker that is down
fails that collector only.

The jobs are published straight to the queue's stream in the relay's own format
(console.queue.broker.relay.message, with its Nats-Msg-Id), not through a relay process, and the
"worker" is a pull subscription of the same durable consumer the broker worker uses: a test
needs seconds, not a relay and a worker started per test.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from console import queue as q
from console.alerts import links
from console.collectors import Options
from console.collectors.broker import _growth
from console.queue import broker
from tests import nats_helpers
from tests.collector_helpers import cycle, value, values
from tests.nats_helpers import _run, set_backend, stop_server

nats_server = nats_helpers.nats_server  # the fixture: a private nats-server

QUEUE = "mail"


def _job(job_id: int, run_at: datetime) -> dict:
    return {"id": job_id, "queue": QUEUE, "kind": "record", "payload": "{}", "priority": 0, "run_at": run_at,
            "max_attempts": 5, "idempotency_key": None, "headers": None, "group_key": None, "created_at": run_at}


async def _load(nats_url: str, *, jobs: int, held: int, redelivered: int, dead: int, head_due: datetime) -> None:
    """`jobs` jobs in the queue's stream (the first due at `head_due`, each next 10 s later), `held` of them fetched
    by the shared consumer and not acknowledged (running), `redelivered` of those nak'd once
    and fetched again, and `dead` dead letters in the dead-letter stream."""
    import nats
    from nats.js import api

    from console.queue.broker.relay import ensure_streams, message

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, QUEUE, 120.0)

        async def publish(first: int, last: int) -> None:
            for i in range(first, last):
                await js.publish(broker.subject(QUEUE), message(_job(i + 1, head_due + timedelta(seconds=10 * i))),
                                 headers={broker.MSG_ID: str(uuid.uuid4())})

        for i in range(dead):
            await js.publish(broker.dead_subject(QUEUE), json.dumps({"id": 100 + i, "last_error": "boom"}).encode(),
                             headers={broker.MSG_ID: f"{100 + i}:dead"})
        if not held:
            await publish(0, jobs)
            return
        await js.add_consumer(broker.stream(QUEUE), api.ConsumerConfig(
            durable_name=broker.CONSUMER, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=60, max_deliver=-1,
            filter_subject=broker.subject(QUEUE)))
        sub = await js.pull_subscribe_bind(durable=broker.CONSUMER, stream=broker.stream(QUEUE))
        # The jobs to redeliver alone in the stream first: the pull after the nak can only be
        # answered by their redelivery (the server handles a nak after the client sent it).
        await publish(0, redelivered)
        if redelivered:
            first = await sub.fetch(redelivered, timeout=5)
            for msg in first:
                await msg.nak()
            again = []
            while len(again) < redelivered:
                again += await sub.fetch(redelivered - len(again), timeout=5)
            assert [m.metadata.num_delivered for m in again] == [2] * redelivered
        await publish(redelivered, jobs)
        if held > redelivered:
            assert len(await sub.fetch(held - redelivered, timeout=5)) == held - redelivered
    finally:
        await nc.close()


def load(nats_url: str, **kwargs) -> None:
    _run(_load(nats_url, **kwargs))


def options(nats_url: str, **kwargs) -> Options:
    return Options(broker_url=nats_url, **kwargs)


def test_one_cycle_reports_a_broker_queues_depth_ack_pending_redeliveries_age_and_dead_letters(dsn, conn, nats_server):
    set_backend(dsn, QUEUE)
    q.enqueue(conn, "record", queue="reports")  # a PostgreSQL queue beside it
    due = datetime.now(UTC) - timedelta(seconds=90)
    load(nats_server, jobs=5, held=2, redelivered=1, dead=3, head_due=due)
    report = cycle(dsn, options(nats_server))
    assert report.errors == {}
    nats_q = {"queue": QUEUE, "backend": "nats"}
    assert value(report, "queue_depth", state="eligible", **nats_q) == 3
    assert value(report, "queue_depth", state="running", **nats_q) == 2
    assert value(report, "queue_depth", state="failed", **nats_q) == 3
    assert value(report, "dead_letters", **nats_q) == 3
    assert value(report, "queue_redeliveries", **nats_q) == 1
    # The head is the third job (the first two were delivered): due 70 s before the cycle.
    assert 68 <= value(report, "queue_age_seconds", **nats_q) <= 80
    assert values(report, "dead_letter_growth", **nats_q) == []  # a rate needs two readings
    # The PostgreSQL queue is the queue collector's, unlabelled; the broker adds nothing to it.
    assert value(report, "queue_depth", queue="reports", state="eligible") == 1
    assert all("backend" not in s.labels for s in report.samples if s.labels.get("queue") == "reports")
    assert value(report, "collector_errors", collector="broker") == 0


def test_without_a_worker_every_message_is_eligible_and_an_empty_queue_reads_zero(dsn, nats_server):
    set_backend(dsn, QUEUE)
    set_backend(dsn, "quiet")  # no stream yet: the relay never published to it
    load(nats_server, jobs=4, held=0, redelivered=0, dead=0, head_due=datetime.now(UTC) - timedelta(seconds=30))
    report = cycle(dsn, options(nats_server))
    assert report.errors == {}
    assert value(report, "queue_depth", queue=QUEUE, state="eligible", backend="nats") == 4
    assert value(report, "queue_depth", queue=QUEUE, state="running", backend="nats") == 0
    assert 25 <= value(report, "queue_age_seconds", queue=QUEUE, backend="nats") <= 40
    for metric, labels in (("queue_depth", {"state": "eligible"}), ("queue_age_seconds", {}), ("dead_letters", {})):
        assert value(report, metric, queue="quiet", backend="nats", **labels) == 0


def test_dead_letter_growth_is_taken_over_the_rate_window():
    # Readings every minute; 30 dead letters arrive at minute 10 and none after. Nine minutes
    # later the 15-minute window still holds them: 30 in 15 min = 120 per hour (one interval's
    # difference would say 0); once the window has passed them, 0.
    points: list[list[float]] = []
    rates = {}
    for minute in range(31):
        rates[minute], points = _growth(points, minute * 60.0, 30 if minute >= 10 else 0, window=900.0)
    assert rates[0] is None  # a rate needs two readings
    assert rates[19] == 120.0
    assert rates[30] == 0.0
    assert points[0][0] >= 30 * 60 - 900 and len(points) <= 17
    assert _growth([[0.0, 9]], 60.0, 3, 900.0) == (None, [[60.0, 3]])  # the stream was recreated
    # Cycles every 5 s keep a point every 15 s: the window stays 15 minutes in about 60 points
    # (the 30 dead letters of second 500 still count at second 1250).
    points = []
    for tick in range(251):
        rate, points = _growth(points, tick * 5.0, 30 if tick >= 100 else 0, window=900.0)
    assert rate is not None and 118 <= rate <= 124, rate  # 30 over the oldest point within 15 min
    assert len(points) <= 61 and points[0][0] >= 1250 - 900


def test_metrics_carry_the_backend_label(dsn, conn, nats_server, web_app):
    set_backend(dsn, QUEUE)
    q.enqueue(conn, "record", queue="reports")
    load(nats_server, jobs=3, held=1, redelivered=0, dead=2, head_due=datetime.now(UTC))
    assert cycle(dsn, options(nats_server)).errors == {}
    body = web_app.test_client().get("/metrics").data.decode()
    found = {f.name: f for f in text_string_to_metric_families(body)}
    depth = {(s.labels["queue"], s.labels["state"], s.labels["backend"]): s.value
             for s in found["skiplock_queue_depth"].samples}
    assert depth[(QUEUE, "eligible", "nats")] == 2
    assert depth[(QUEUE, "running", "nats")] == 1
    assert depth[("reports", "eligible", "postgres")] == 1
    dead = {(s.labels["queue"], s.labels["backend"]): s.value for s in found["skiplock_dead_letters"].samples}
    assert dead[(QUEUE, "nats")] == 2 and dead[("reports", "postgres")] == 0
    assert [s.value for s in found["skiplock_queue_redeliveries"].samples if s.labels["queue"] == QUEUE] == [0]


def test_the_queues_list_and_the_queue_page_show_the_broker_figures(dsn, conn, nats_server, web_settings, client_as):
    set_backend(dsn, QUEUE)
    q.enqueue(conn, "record", queue=QUEUE)  # enqueued after the switch: in the outbox, not in either count
    conn.execute("UPDATE skiplock.queues SET backend = 'postgres' WHERE name = %s", (QUEUE,))
    q.enqueue(conn, "record", queue=QUEUE)  # one job left on the PostgreSQL side (a move's dual run)
    conn.execute("UPDATE skiplock.queues SET backend = 'nats' WHERE name = %s", (QUEUE,))
    load(nats_server, jobs=4, held=1, redelivered=1, dead=2, head_due=datetime.now(UTC) - timedelta(seconds=5))
    assert cycle(dsn, options(nats_server)).errors == {}
    viewer = client_as("viewer")
    rows = {r["queue"]: r for r in viewer.get("/api/v1/queues").get_json()["queues"]}
    mail = rows[QUEUE]
    assert mail["backend"] == "nats"
    # Both sides added up: 3 undelivered in the stream + 1 pending in skiplock.jobs.
    assert (mail["eligible"], mail["running"], mail["failed"]) == (4, 1, 2)
    assert mail["broker"]["eligible"] == 3 and mail["broker"]["redeliveries"] == 1
    page = viewer.get(f"/queues/{QUEUE}").data.decode()
    assert 'class="badge backend"' in page and "NATS JetStream" in page
    assert "Redelivered" in page
    listing = viewer.get("/queues").data.decode()
    assert listing.count('class="badge backend"') == 1
    # The overview reads the samples: the queue's two series (nats, and postgres's leftover job) added.
    overview = {r["queue"]: r for r in viewer.get("/api/v1/overview").get_json()["queues"]}
    assert (overview[QUEUE]["eligible"], overview[QUEUE]["running"], overview[QUEUE]["failed"]) == (4, 1, 2)


def test_a_stopped_broker_fails_only_the_broker_collector(dsn, conn, nats_server):
    set_backend(dsn, QUEUE)
    load(nats_server, jobs=2, held=0, redelivered=0, dead=0, head_due=datetime.now(UTC))
    assert cycle(dsn, options(nats_server)).errors == {}
    q.enqueue(conn, "record", queue="reports")
    stop_server(nats_server)
    report = cycle(dsn, options(nats_server, statement_timeout_ms=1000))
    assert set(report.errors) == {"broker"}
    assert "NATS" in report.errors["broker"]
    assert value(report, "collector_errors", collector="broker") == 1
    assert value(report, "queue_depth", queue="reports", state="eligible") == 1
    # Its series are "not available" this cycle, not the last figures.
    assert values(report, "queue_depth", queue=QUEUE, state="eligible", backend="nats") == [None]


def test_a_broker_that_never_answers_costs_the_cycle_its_time_limit_only(dsn, conn):
    set_backend(dsn, QUEUE)
    q.enqueue(conn, "record", queue="reports")
    with socket.socket() as silent:  # accepts connections (the backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        report = cycle(dsn, options(url, statement_timeout_ms=1000))
        took = time.monotonic() - started
    assert set(report.errors) == {"broker"}, report.errors
    assert took < 4, f"the cycle took {took:.1f} s"
    assert value(report, "collector_duration_seconds", collector="broker") < 2.5
    assert value(report, "queue_depth", queue="reports", state="eligible") == 1


def test_a_broker_queues_alert_leads_to_its_queue_page_not_to_the_jobs_table():
    for metric in ("dead_letters", "queue_age_seconds", "queue_depth", "queue_redeliveries"):
        found = links.look_here(metric, {"queue": QUEUE, "backend": "nats", "system": "skiplock"})
        assert found[0].path == f"/queues/{QUEUE}#queue-broker", (metric, found)
    assert "#queue-broker" not in links.look_here("dead_letters", {"queue": QUEUE})[0].path  # PostgreSQL's: unchanged
    assert links.why_queue("queue_age_seconds", {"queue": QUEUE, "backend": "nats"}) is None


def test_a_queue_moved_back_stays_watched_while_the_broker_holds_its_jobs(dsn, nats_server):
    set_backend(dsn, QUEUE)
    load(nats_server, jobs=2, held=0, redelivered=0, dead=0, head_due=datetime.now(UTC))
    assert value(cycle(dsn, options(nats_server)), "queue_depth", queue=QUEUE, state="eligible", backend="nats") == 2
    set_backend(dsn, QUEUE, "postgres")  # the dual run: the broker workers still drain the stream
    report = cycle(dsn, options(nats_server))
    assert report.errors == {}
    assert value(report, "queue_depth", queue=QUEUE, state="eligible", backend="nats") == 2


def test_the_broker_is_read_only_for_broker_queues_and_a_missing_address_is_an_error(dsn, conn):
    q.enqueue(conn, "record", queue="reports")
    # No queue on NATS: an address nothing listens on is never contacted.
    report = cycle(dsn, options("nats://127.0.0.1:1"))
    assert report.errors == {} and value(report, "collector_errors", collector="broker") == 0
    set_backend(dsn, QUEUE)
    report = cycle(dsn, options(""))
    assert set(report.errors) == {"broker"} and "nats_url is not set" in report.errors["broker"]
