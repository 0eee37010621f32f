"""Durable delivery against real local HTTP receivers: retries, timeouts, permanent failures,
order per alert, restarts, signatures, and the three payload formats."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta

from console import samples
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts.rules import RuleSet, parse_destination, parse_rule
from console.alerts.transports import sign, verify
from console.db import connect
from console.samples import Sample
from tests.alert_receiver import Receiver

SECRET = "whsec-test-0123456789"
# allow_private_destinations: the receivers are on loopback, which the address policy refuses by default
FAST = ev.AlertSettings(repeat_interval=3600, series_window=120, delivery_timeout=0.5, retry_base=0.05,
                        retry_cap=0.2, give_up_after=3600, allow_private_destinations=True)
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RULE = {"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s",
        "runbook": "docs/alerts.md#queue_age"}


def ruleset(*receivers, kind="json", secret=SECRET):
    dests = {}
    for index, rec in enumerate(receivers):
        name = f"hook{index}"
        dests[name] = parse_destination({"name": name, "url": rec.url, "kind": kind, "secret": secret,
                                         "headers": {"X-Team": "queue-oncall"}})
    return RuleSet(rules={"queue_age": parse_rule(RULE)}, destinations=dests)


def transition(conn, rules, seconds, value, queue="mail", **others):
    """One collection cycle at T0+seconds: `queue` at `value`, plus any other queues given as
    keyword arguments (a queue missing from a cycle is gone, and its alert resolves)."""
    at = T0 + timedelta(seconds=seconds)
    values = {queue: value, **others}
    samples.store(conn, [Sample("queue_age_seconds", {"queue": name}, v, at) for name, v in values.items()])
    return ev.evaluate(conn, rules, FAST, now=at)


def drain(conn, rules, *, rounds=40, settings=FAST, lease=None):
    """Run the sender until the outbox is settled (sleeping through backoff), like the scheduler."""
    sender = outbox.Sender(conn, lambda: rules.destinations, settings, lease=lease)
    for _ in range(rounds):
        sender.run_once()
        if conn.execute("SELECT count(*) FROM skiplock.alert_outbox WHERE status = 'pending'").fetchone()[0] == 0:
            return
        time.sleep(0.06)
    raise AssertionError("outbox did not settle")


def log_rows(conn):
    return conn.execute("SELECT outcome, http_status FROM skiplock.alert_deliveries ORDER BY id").fetchall()


def test_signature_headers_and_payload(conn):
    with Receiver() as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)
        drain(conn, rules)
    [request] = receiver.requests
    body, headers = request["body"], request["headers"]
    assert verify(SECRET, headers["X-Skiplock-Signature"], body)
    assert not verify("wrong-secret", headers["X-Skiplock-Signature"], body)
    assert not verify(SECRET, headers["X-Skiplock-Signature"], body + b" ")
    t = int(headers["X-Skiplock-Signature"].split(",")[0][2:])
    assert headers["X-Skiplock-Signature"] == sign(SECRET, t, body)
    assert headers["Content-Type"] == "application/json" and headers["X-Team"] == "queue-oncall"
    assert headers["X-Skiplock-Event"] == "firing"
    doc = json.loads(body)
    assert headers["Idempotency-Key"] == doc["idempotency_key"]
    assert doc["version"] == 1 and doc["event"] == "firing"
    assert doc["alert"]["rule"] == "queue_age" and doc["alert"]["labels"] == {"queue": "mail", "database": "default"}
    assert doc["alert"]["value"] == 500 and doc["alert"]["threshold"] == 100 and doc["alert"]["op"] == ">"
    assert doc["alert"]["runbook"] == "docs/alerts.md#queue_age"
    assert log_rows(conn) == [("delivered", 200)]


def test_fails_n_times_then_succeeds_exactly_one_delivery_per_transition(conn):
    with Receiver([500, 503, 429]) as flaky, Receiver() as healthy:
        rules = ruleset(flaky, healthy)
        transition(conn, rules, 0, 500)
        drain(conn, rules)
        transition(conn, rules, 10, 1)  # resolved
        drain(conn, rules)
    assert [json.loads(r["body"])["event"] for r in flaky.delivered()] == ["firing", "resolved"]
    assert [json.loads(r["body"])["event"] for r in healthy.delivered()] == ["firing", "resolved"]
    # All four tries of the firing carried one idempotency key.
    keys = [r["headers"]["Idempotency-Key"] for r in flaky.requests[:4]]
    assert len(set(keys)) == 1 and len(flaky.requests) == 5
    status = conn.execute("SELECT destination, status, attempts FROM skiplock.alert_outbox ORDER BY id").fetchall()
    assert status == [("hook0", "delivered", 4), ("hook1", "delivered", 1),
                      ("hook0", "delivered", 1), ("hook1", "delivered", 1)]
    hook0 = conn.execute("""SELECT outcome, http_status FROM skiplock.alert_deliveries
                            WHERE destination = 'hook0' ORDER BY id""").fetchall()
    assert hook0 == [("retry", 500), ("retry", 503), ("retry", 429), ("delivered", 200), ("delivered", 200)]


def test_a_hanging_receiver_times_out_and_is_retried(conn):
    with Receiver(["hang"], hang_seconds=2) as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)
        drain(conn, rules)
    rows = conn.execute("SELECT outcome, error FROM skiplock.alert_deliveries ORDER BY id").fetchall()
    assert rows[0][0] == "retry" and "timed out after 0.5s" in rows[0][1]
    assert rows[1] == ("delivered", None)
    assert len(receiver.delivered()) == 1


def test_410_is_permanent_and_does_not_block_the_next_notification(conn):
    with Receiver([410]) as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)
        drain(conn, rules)
        transition(conn, rules, 10, 1)
        drain(conn, rules)
        outbox.Sender(conn, lambda: rules.destinations, FAST).run_once()
    assert [r["answer"] for r in receiver.requests] == [410, 200]  # the 410 was never retried
    assert conn.execute("SELECT status, attempts, last_error FROM skiplock.alert_outbox ORDER BY id").fetchall() == [
        ("failed", 1, "HTTP 410: nope"), ("delivered", 1, None)]
    assert log_rows(conn) == [("failed", 410), ("delivered", 200)]


def test_in_order_per_alert_while_the_receiver_is_down(conn):
    with Receiver([500, 500, 500, 500]) as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)  # firing
        sender = outbox.Sender(conn, lambda: rules.destinations, FAST)
        sender.run_once()
        transition(conn, rules, 10, 1)  # resolved, queued behind the failing firing
        transition(conn, rules, 20, 500, queue="sms", mail=1)  # another alert is not held up
        drain(conn, rules)
    delivered = [(json.loads(r["body"])["event"], json.loads(r["body"])["alert"]["labels"]["queue"])
                 for r in receiver.delivered()]
    assert delivered.index(("firing", "mail")) < delivered.index(("resolved", "mail"))
    assert sorted(delivered) == [("firing", "mail"), ("firing", "sms"), ("resolved", "mail")]


def test_give_up_after_the_configured_time(conn):
    settings = ev.AlertSettings(**{**FAST.__dict__, "give_up_after": 0.2})
    with Receiver(default=503) as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)
        conn.execute("UPDATE skiplock.alert_outbox SET created_at = now() - interval '1 second'")
        drain(conn, rules, settings=settings)
    row = conn.execute("SELECT status, attempts, last_error FROM skiplock.alert_outbox").fetchone()
    assert row[0] == "gave_up" and row[1] == 1 and "gave up" in row[2]
    assert log_rows(conn) == [("gave_up", 503)]


def test_nothing_lost_across_a_restart(dsn):
    """Enqueued by one process, then the scheduler restarts: a new sender on a new connection
    sends it. A sender that died holding a row (after claiming, before settling) loses it only
    until its lease ends; the row is then sent once more with the same idempotency key."""
    with Receiver() as receiver:
        rules = ruleset(receiver)
        with connect(dsn) as first:
            transition(first, rules, 0, 500)
            transition(first, rules, 10, 500, queue="sms", mail=500)
            # The first sender claims the sms notification and dies before sending.
            crashed = outbox.Sender(first, lambda: rules.destinations, FAST, lease=0.3)
            claimed = crashed._claim()
            assert claimed is not None
        time.sleep(0.4)
        with connect(dsn) as second:
            drain(second, rules)
            rows = second.execute("SELECT status, attempts FROM skiplock.alert_outbox ORDER BY id").fetchall()
    assert rows == [("delivered", 1), ("delivered", 2)] or rows == [("delivered", 2), ("delivered", 1)]
    assert sorted(json.loads(r["body"])["alert"]["labels"]["queue"] for r in receiver.delivered()) == ["mail", "sms"]


def test_slack_and_pagerduty_formats(conn):
    with Receiver() as slack_rx, Receiver() as pd_rx:
        rules = ruleset(slack_rx, kind="slack", secret=None)
        rules.destinations["pd"] = parse_destination({"name": "pd", "url": pd_rx.url, "kind": "pagerduty",
                                                      "secret": "routing-key-123"})
        transition(conn, rules, 0, 500)
        transition(conn, rules, 10, 1)
        drain(conn, rules)
    texts = [json.loads(r["body"])["text"] for r in slack_rx.requests]
    assert "FIRING" in texts[0] and "queue_age" in texts[0] and "queue=mail" in texts[0]
    assert "RESOLVED" in texts[1] and "<docs/alerts.md#queue_age|Runbook>" in texts[1]
    trigger, resolve = (json.loads(r["body"]) for r in pd_rx.requests)
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["routing_key"] == "routing-key-123" and trigger["dedup_key"] == resolve["dedup_key"]
    assert trigger["payload"]["severity"] == "warning" and trigger["payload"]["source"] == "skiplock"
    assert "X-Skiplock-Signature" not in pd_rx.requests[0]["headers"]


def test_send_test_shows_the_real_result_and_is_logged(conn):
    with Receiver([200, 401]) as receiver:
        dest = parse_destination({"name": "ops", "url": receiver.url, "secret": SECRET})
        ok = outbox.send_test(conn, dest, timeout=1, allow_private=True)
        refused = outbox.send_test(conn, dest, timeout=1, allow_private=True)
    assert ok.ok and ok.status == 200 and ok.message == "HTTP 200: ok"
    assert not refused.ok and refused.status == 401 and "permanent" in refused.message
    assert json.loads(receiver.requests[0]["body"])["event"] == "test"
    down = parse_destination({"name": "down", "url": "http://127.0.0.1:9/none"})
    result = outbox.send_test(conn, down, timeout=1, allow_private=True)
    assert not result.ok and "cannot connect" in result.message and "temporary" in result.message
    assert [row[0] for row in log_rows(conn)] == ["test_ok", "test_failed", "test_failed"]


def test_secrets_never_reach_logs_or_the_delivery_log(conn, caplog):
    caplog.set_level(logging.DEBUG)
    with Receiver(default=400) as receiver:
        url = receiver.url + "?token=url-secret-777"
        dest = parse_destination({"name": "ops", "url": url, "secret": SECRET,
                                  "headers": {"Authorization": "Bearer header-secret-888"}})
        rules = RuleSet(rules={"queue_age": parse_rule(RULE)}, destinations={"ops": dest})
        transition(conn, rules, 0, 500)
        drain(conn, rules)
    stored = str(conn.execute("SELECT * FROM skiplock.alert_deliveries").fetchall())
    stored += str(conn.execute("SELECT last_error FROM skiplock.alert_outbox").fetchall())
    for secret in (SECRET, "url-secret-777", "header-secret-888"):
        assert secret not in caplog.text and secret not in stored
    assert receiver.requests[0]["headers"]["Authorization"] == "Bearer header-secret-888"


def test_prune_removes_old_settled_rows_in_batches(conn):
    with Receiver([410]) as receiver:
        rules = ruleset(receiver)
        transition(conn, rules, 0, 500)
        transition(conn, rules, 10, 1)
        transition(conn, rules, 20, 500)
        drain(conn, rules)
    transition(conn, rules, 30, 500, queue="sms", mail=500)  # still pending: never pruned
    conn.execute("UPDATE skiplock.alert_outbox SET finished_at = now() - interval '40 days' WHERE status <> 'pending'")
    conn.execute("UPDATE skiplock.alert_deliveries SET at = now() - interval '40 days'")
    removed = outbox.prune(conn, keep=timedelta(days=30), batch=1)
    assert removed == 6  # 3 delivery rows + 3 settled notifications
    assert conn.execute("SELECT status FROM skiplock.alert_outbox").fetchall() == [("pending",)]
