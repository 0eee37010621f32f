"""Alert history retention: old events of resolved alerts go in bounded batches; events of a
live alert and events a notification still points to stay."""

from __future__ import annotations

from datetime import timedelta

from console.alerts import outbox
from console.alerts.evaluate import AlertSettings
from console.config import load_config


def alert(conn, rule, state):
    return conn.execute("INSERT INTO skiplock.alerts (rule, labels, state) VALUES (%s, '{}', %s) RETURNING id",
                        (rule, state)).fetchone()[0]


def events(conn, alert_id, n, age):
    conn.execute("INSERT INTO skiplock.alert_events (alert_id, at, kind) "
                 "SELECT %s, now() - %s::interval, 'firing' FROM generate_series(1, %s)", (alert_id, age, n))


def count(conn, alert_id):
    return conn.execute("SELECT count(*) FROM skiplock.alert_events WHERE alert_id = %s", (alert_id,)).fetchone()[0]


def test_old_events_of_resolved_alerts_are_pruned_in_batches(conn):
    resolved, live = alert(conn, "a", "ok"), alert(conn, "b", "firing")
    events(conn, resolved, 25, "40 days")
    events(conn, resolved, 3, "1 day")
    events(conn, live, 4, "40 days")
    pointed = conn.execute("SELECT min(id) FROM skiplock.alert_events WHERE alert_id = %s", (resolved,)).fetchone()[0]
    conn.execute("INSERT INTO skiplock.alert_outbox (event_id, alert_id, destination, idempotency_key, notification) "
                 "VALUES (%s, %s, 'd', 'k', '{}')", (pointed, resolved))

    removed = outbox.prune_events(conn, keep=timedelta(days=30), batch=10, max_batches=2)
    assert removed == 20  # bounded: two batches of ten, the rest next time
    assert outbox.prune_events(conn, keep=timedelta(days=30), batch=10) == 4
    assert count(conn, resolved) == 3 + 1  # the recent ones and the one the outbox points to
    assert count(conn, live) == 4


def test_the_retention_is_a_setting_with_a_30_day_default(monkeypatch):
    assert AlertSettings.from_config(load_config(env={})).events_retention == timedelta(days=30)
    monkeypatch.setenv("SKIPLOCK_ALERTS_EVENTS_RETENTION", "7d")
    assert AlertSettings.from_config(load_config()).events_retention == timedelta(days=7)
