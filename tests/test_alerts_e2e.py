"""The issue's done-when, at small scale: stopping the workers makes the queue-age alert fire
and reach a local webhook receiver, restarting them resolves it, and both transitions are in the
database's history, the console's alerts page and its delivery log.

Real pieces throughout: `skiplock worker` subprocesses, the scheduler's own `collect` and
`alerts_deliver` jobs run directly (`Scheduler.run_job`), the collectors, a threaded HTTP
receiver. Short `for` and thresholds keep it to a few seconds.
"""

from __future__ import annotations

import json
import time

import pytest

from console import queue as q
from console import scheduler
from console.alerts.transports import verify
from console.config import load_config
from tests.alert_receiver import Receiver
from tests.workers import WorkerProcs, wait_for

SECRET = "e2e-signing-secret"

pytestmark = pytest.mark.slow


def _config(tmp_path, receiver_url: str):
    path = tmp_path / "skiplock.toml"
    path.write_text(f"""
[alerts]
allow_private_destinations = true  # the receiver is on loopback
series_window = 60
delivery_timeout = 2
retry_base = 0.1
retry_cap = 0.5

[[webhooks]]
name = "oncall"
url = "{receiver_url}"
secret = "{SECRET}"

[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
labels = {{ queue = "e2e" }}
op = ">"
threshold = 2
clear = 1
for = "1s"
severity = "critical"
summary = "queue {{queue}} head waited {{value}}s"
""")
    return load_config(path, env={})


def _queue_age_bodies(receiver):
    out = []
    for request in receiver.delivered():
        doc = json.loads(request["body"])
        if doc["alert"]["rule"] == "queue_age":
            assert verify(SECRET, request["headers"]["X-Skiplock-Signature"], request["body"])
            out.append(doc)
    return out


def test_stopping_workers_fires_queue_age_and_restarting_resolves_it(dsn, conn, subprocess_env, tmp_path, client_as):
    workers = WorkerProcs(subprocess_env)
    with Receiver() as receiver:
        config = _config(tmp_path, receiver.url)
        node = scheduler.Scheduler(dsn, config)
        try:
            assert node.elect()
            worker = workers.start("--queues", "e2e")
            first = q.enqueue(conn, "noop", {}, queue="e2e")
            wait_for(lambda: conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (first,)).fetchone()[0]
                     == "completed", what="the first job to complete")
            assert node.run_job("collect")
            assert conn.execute("SELECT count(*) FROM skiplock.alerts WHERE state <> 'ok'").fetchone()[0] == 0

            # The workers stop; work piles up and waits.
            code, _ = workers.stop(worker)
            assert code == 0
            ids = [q.enqueue(conn, "noop", {}, queue="e2e") for _ in range(3)]
            time.sleep(2.3)
            assert node.run_job("collect")
            state = conn.execute("SELECT state FROM skiplock.alerts WHERE rule = 'queue_age'").fetchone()[0]
            assert state == "pending"  # waiting out `for`
            time.sleep(1.1)
            assert node.run_job("collect")
            assert conn.execute("SELECT state FROM skiplock.alerts WHERE rule = 'queue_age'").fetchone()[0] == "firing"
            assert node.run_job("alerts_deliver")
            fired = _queue_age_bodies(receiver)
            assert [d["event"] for d in fired] == ["firing"]
            assert fired[0]["alert"]["labels"] == {"queue": "e2e", "system": "skiplock", "database": "default"} and fired[0]["alert"]["value"] > 2
            assert fired[0]["alert"]["severity"] == "critical"

            # The workers come back, drain the queue, and the alert resolves.
            workers.start("--queues", "e2e")
            wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND status = 'completed'",
                                          (ids,)).fetchone()[0] == 3, what="the backlog to drain")
            assert node.run_job("collect")
            assert conn.execute("SELECT state FROM skiplock.alerts WHERE rule = 'queue_age'").fetchone()[0] == "ok"
            assert node.run_job("alerts_deliver")
            events = [d["event"] for d in _queue_age_bodies(receiver)]
            assert events == ["firing", "resolved"]
        finally:
            node.close()
            workers.stop_all()

    history = conn.execute("""SELECT e.kind FROM skiplock.alert_events AS e JOIN skiplock.alerts AS a ON a.id = e.alert_id
                              WHERE a.rule = 'queue_age' ORDER BY e.id""").fetchall()
    assert history == [("firing",), ("resolved",)]
    log = conn.execute("""SELECT d.outcome, o.notification->>'event' FROM skiplock.alert_deliveries AS d
                          JOIN skiplock.alert_outbox AS o ON o.id = d.outbox_id
                          WHERE o.notification->'alert'->>'rule' = 'queue_age' ORDER BY d.id""").fetchall()
    assert log == [("delivered", "firing"), ("delivered", "resolved")]
    jobs = {j["job"] for j in scheduler.status(conn)["jobs"]}
    assert "alerts_deliver" in jobs and any(j.endswith("AlertJobs.after_collection") for j in jobs)

    # ... and in the console: the transitions on the alerts page, both deliveries in the log.
    viewer = client_as("viewer")
    page = viewer.get("/alerts").get_data(as_text=True)
    assert 'data-event="firing"' in page and 'data-event="resolved"' in page and "queue=e2e" in page
    deliveries = viewer.get("/api/v1/alerts/deliveries").get_json()["deliveries"]
    assert [(d["rule"], d["event"], d["outcome"]) for d in deliveries if d["rule"] == "queue_age"] == [
        ("queue_age", "resolved", "delivered"), ("queue_age", "firing", "delivered")]
    assert viewer.get("/alerts/deliveries").get_data(as_text=True).count('data-outcome="delivered"') >= 2


def test_dead_mans_switch_fires_from_the_delivery_job_when_collection_stops(dsn, conn):
    with Receiver() as receiver:
        path_config = load_config(env={}, overrides={"alerts.retry_base": 0.1,
                                                          "alerts.allow_private_destinations": True})
        path_config.tables["webhooks"] = [{"name": "oncall", "url": receiver.url}]
        node = scheduler.Scheduler(dsn, path_config)
        try:
            assert node.elect()
            # The last collection finished ten minutes ago and nothing has run since.
            conn.execute("""INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms)
                            VALUES (now() - interval '10 minutes', now() - interval '10 minutes', 5)""")
            assert node.run_job("alerts_deliver")
        finally:
            node.close()
    stale = [json.loads(r["body"]) for r in receiver.delivered()]
    assert [(d["event"], d["alert"]["rule"]) for d in stale] == [("firing", "collectors_stale")]
    assert stale[0]["alert"]["value"] >= 600
