"""The alert state machine, fed by real samples in a real database (console.samples.store),
stepping through time with evaluate(now=...)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import audit, samples
from console.alerts import evaluate as ev
from console.alerts.rules import RuleSet, parse_destination, parse_rule
from console.samples import Sample

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SETTINGS = ev.AlertSettings(repeat_interval=300, hysteresis=0.1, series_window=120)


def ruleset(*records, destinations=("ops",)):
    rules = {rec["name"]: parse_rule(rec) for rec in records}
    dests = {n: parse_destination({"name": n, "url": f"http://127.0.0.1:9/{n}"}) for n in destinations}
    return RuleSet(rules=rules, destinations=dests)


AGE = {"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "60s",
       "summary": "queue {queue} waited {value}s"}


def step(conn, rules, seconds, values, metric="queue_age_seconds", labels=None, settings=SETTINGS):
    """Store one collection's samples at T0+seconds and evaluate at that instant."""
    at = T0 + timedelta(seconds=seconds)
    if values is not None:
        items = values if isinstance(values, list) else [(labels or {"queue": "mail"}, values)]
        samples.store(conn, [Sample(metric, lab, val, at) for lab, val in items])
    return ev.evaluate(conn, rules, settings, now=at)


def outbox(conn):
    return conn.execute("""SELECT notification->>'event', destination, notification->'alert'->>'rule',
                                  notification->'alert'->'labels'->>'queue'
                           FROM skiplock.alert_outbox ORDER BY id""").fetchall()


def alert_state(conn, rule="queue_age", queue="mail"):
    row = conn.execute("SELECT state FROM skiplock.alerts WHERE rule = %s AND labels->>'queue' = %s",
                       (rule, queue)).fetchone()
    return row[0] if row else "ok"


def test_lifecycle_pending_firing_resolved_with_one_notification_each(conn):
    rules = ruleset(AGE, destinations=("ops", "pager"))
    step(conn, rules, 0, 150)
    assert alert_state(conn) == "pending" and outbox(conn) == []
    step(conn, rules, 30, 160)
    assert alert_state(conn) == "pending" and outbox(conn) == []
    report = step(conn, rules, 61, 170)
    assert alert_state(conn) == "firing"
    assert [t.kind for t in report.transitions] == ["firing"] and report.notifications == 2
    assert outbox(conn) == [("firing", "ops", "queue_age", "mail"), ("firing", "pager", "queue_age", "mail")]
    step(conn, rules, 90, 95)  # below the threshold but above the clear value (90): still firing
    assert alert_state(conn) == "firing" and len(outbox(conn)) == 2
    step(conn, rules, 120, 20)
    assert alert_state(conn) == "ok"
    assert [row[0] for row in outbox(conn)] == ["firing", "firing", "resolved", "resolved"]
    doc = conn.execute("SELECT notification FROM skiplock.alert_outbox WHERE destination = 'ops' ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert doc["version"] == 1 and doc["event"] == "resolved" and doc["alert"]["state"] == "ok"
    assert doc["alert"]["labels"] == {"queue": "mail", "database": "default"} and doc["alert"]["value"] == 20
    # The value that cleared it (20) is not "waited": the last reading over the threshold was 170
    # (95, in the hysteresis band, kept it firing without being over).
    assert doc["alert"]["summary"] == "Resolved. Last reading over the threshold: queue mail waited 170s"
    assert doc["alert"]["resolved_at"]
    events = [e["kind"] for e in ev.recent_events(conn)]
    assert events == ["resolved", "firing"]


def test_flapping_around_the_threshold_produces_no_storm(conn):
    rules = ruleset(AGE)
    # Crossing the threshold for less than `for` each time: never fires, nothing sent.
    for i in range(20):
        step(conn, rules, i * 20, 150 if i % 2 == 0 else 50)
    assert outbox(conn) == [] and alert_state(conn) == "ok"
    # Hovering at the threshold once firing: 101, 99, 101, 99 ... stays firing, one notification.
    hover = ruleset({**AGE, "for": "0s"})
    for i in range(20):
        step(conn, hover, 400 + i * 10, 101 if i % 2 == 0 else 99)
    assert [row[0] for row in outbox(conn)] == ["firing"]
    assert alert_state(conn) == "firing"


def test_repeat_interval_and_acknowledge_stops_repeats(conn):
    rules = ruleset({**AGE, "for": "0s"})
    step(conn, rules, 0, 500)
    step(conn, rules, 200, 500)
    assert [row[0] for row in outbox(conn)] == ["firing"]
    step(conn, rules, 301, 500)
    assert [row[0] for row in outbox(conn)] == ["firing", "repeat"]
    alert_id = conn.execute("SELECT id FROM skiplock.alerts").fetchone()[0]
    ev.acknowledge(conn, alert_id, actor="alice", note="restarting workers")
    step(conn, rules, 700, 500)
    step(conn, rules, 1100, 500)
    assert [row[0] for row in outbox(conn)] == ["firing", "repeat"]
    row = ev.get_alert(conn, alert_id)
    assert row["acknowledged_by"] == "alice" and row["ack_note"] == "restarting workers"
    assert audit.search(conn, action="alert_acknowledge")[0]["actor"] == "alice"
    # Resolving clears the acknowledgement; the next episode notifies again.
    step(conn, rules, 1200, 10)
    step(conn, rules, 1300, 500)
    assert [row[0] for row in outbox(conn)] == ["firing", "repeat", "resolved", "firing"]
    assert ev.get_alert(conn, alert_id)["acknowledged_by"] is None


def test_acknowledge_refuses_what_is_not_firing(conn):
    with pytest.raises(ev.AlertNotFound):
        ev.acknowledge(conn, 12345, actor="alice")
    rules = ruleset(AGE)
    step(conn, rules, 0, 500)  # pending
    alert_id = conn.execute("SELECT id FROM skiplock.alerts").fetchone()[0]
    with pytest.raises(ev.AlertNotFiring, match="not firing"):
        ev.acknowledge(conn, alert_id, actor="alice")


def test_silence_holds_notifications_until_it_ends(conn):
    rules = ruleset({**AGE, "for": "0s"})
    with pytest.raises(ev.AlertActionError, match="reason"):
        ev.silence(conn, rule="queue_age", labels={"queue": "mail"}, duration=timedelta(hours=1), reason=" ", actor="bob")
    with pytest.raises(ev.AlertActionError, match="has no label 'host'"):
        ev.silence(conn, rule="queue_age", labels={"host": "a"}, duration=timedelta(hours=1), reason="test run", actor="bob",
                   ruleset=rules)
    silence = ev.silence(conn, rule="queue_age", labels={"queue": "mail"}, duration=timedelta(hours=1),
                         reason="migrating the mail queue", actor="bob", ruleset=rules)
    now = conn.execute("SELECT now()").fetchone()[0]  # silences run on the database clock
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, now),
                         Sample("queue_age_seconds", {"queue": "sms"}, 500, now)])
    ev.evaluate(conn, rules, SETTINGS, now=now)
    assert [(row[0], row[3]) for row in outbox(conn)] == [("firing", "sms")]
    assert alert_state(conn, queue="mail") == "firing"  # it shows; it just does not page
    assert audit.search(conn, action="alert_silence")[0]["reason"] == "migrating the mail queue"
    ev.expire_silence(conn, silence["id"], actor="bob")
    later = now + timedelta(seconds=1)
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, later),
                         Sample("queue_age_seconds", {"queue": "sms"}, 500, later)])
    ev.evaluate(conn, rules, SETTINGS, now=later)
    assert [(row[0], row[3]) for row in outbox(conn)] == [("firing", "sms"), ("firing", "mail")]
    with pytest.raises(ev.AlertNotFound):
        ev.expire_silence(conn, silence["id"], actor="bob")


def test_missing_and_unavailable_values(conn):
    rules = ruleset({**AGE, "for": "0s"})
    step(conn, rules, 0, 500)
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, None, T0 + timedelta(seconds=10))])
    ev.evaluate(conn, rules, SETTINGS, now=T0 + timedelta(seconds=10))
    assert alert_state(conn) == "firing"  # "not available" holds the state
    ev.evaluate(conn, rules, SETTINGS, now=T0 + timedelta(seconds=200))  # nothing within the window
    assert alert_state(conn) == "ok"
    assert [row[0] for row in outbox(conn)] == ["firing", "resolved"]
    # A series missing from the newest cycle (a drained queue the collector no longer lists)
    # resolves at once, while the others carry on.
    step(conn, rules, 300, [({"queue": "mail"}, 500), ({"queue": "sms"}, 500)])
    step(conn, rules, 310, [({"queue": "sms"}, 500)])
    assert alert_state(conn, queue="mail") == "ok" and alert_state(conn, queue="sms") == "firing"
    assert [(row[0], row[3]) for row in outbox(conn)][2:] == [("firing", "mail"), ("firing", "sms"), ("resolved", "mail")]


def test_stale_collectors_hold_everything_and_fire_the_dead_mans_switch(conn):
    stale = {"name": "collectors_stale", "metric": "collection_age_seconds", "op": ">", "threshold": 60, "for": "0s"}
    rules = ruleset({**AGE, "for": "0s"}, stale)
    conn.execute("""INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms)
                    VALUES (%s, %s, 5)""", (T0, T0))
    step(conn, rules, 0, 500)
    assert alert_state(conn) == "firing" and alert_state(conn, "collectors_stale", None) == "ok"
    # No collection for 10 minutes: the queue alert is held (not resolved), the switch fires.
    report = ev.evaluate(conn, rules, SETTINGS, now=T0 + timedelta(minutes=10))
    assert "queue_age" in report.held_rules
    assert alert_state(conn) == "firing"
    stale_row = conn.execute("SELECT state, value FROM skiplock.alerts WHERE rule = 'collectors_stale'").fetchone()
    assert stale_row == ("firing", 600.0)
    # Only the derived rules run between collections (the delivery job does this): same result.
    conn.execute("""INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms)
                    VALUES (%s, %s, 5)""", (T0 + timedelta(minutes=11), T0 + timedelta(minutes=11)))
    ev.evaluate(conn, rules, SETTINGS, now=T0 + timedelta(minutes=11), only_derived=True)
    assert conn.execute("SELECT state FROM skiplock.alerts WHERE rule = 'collectors_stale'").fetchone()[0] == "ok"
    assert [row[0] for row in outbox(conn)] == ["firing", "firing", "resolved"]


def test_guarded_rule_workers_zero_while_jobs_are_eligible(conn):
    rule = {"name": "workers_zero", "metric": "workers_live", "op": "<=", "threshold": 0, "for": "0s",
            "when": {"metric": "queue_depth", "labels": {"state": "eligible"}, "op": ">", "threshold": 0}}
    rules = ruleset(rule)

    def collect(seconds, workers, eligible):
        at = T0 + timedelta(seconds=seconds)
        samples.store(conn, [Sample("workers_live", {}, workers, at),
                             Sample("queue_depth", {"queue": "mail", "state": "eligible"}, eligible, at),
                             Sample("queue_depth", {"queue": "mail", "state": "running"}, 0, at)])
        ev.evaluate(conn, rules, SETTINGS, now=at)
        row = conn.execute("SELECT state FROM skiplock.alerts WHERE rule = 'workers_zero'").fetchone()
        return row[0] if row else "ok"

    assert collect(0, 0, 0) == "ok"  # no workers, nothing to do: fine
    assert collect(10, 2, 50) == "ok"  # work and workers: fine
    assert collect(20, 0, 50) == "firing"
    assert collect(30, 0, 0) == "ok"  # drained (or the guard stopped holding)
    assert [row[0] for row in outbox(conn)] == ["firing", "resolved"]


def test_removed_rule_resolves_its_alerts(conn):
    rules = ruleset({**AGE, "for": "0s"})
    step(conn, rules, 0, 500)
    step(conn, ruleset(), 10, 500)
    assert alert_state(conn) == "ok"
    assert [row[0] for row in outbox(conn)] == ["firing", "resolved"]


def test_concurrent_evaluations_do_not_double_notify(make_database):
    import threading

    from console.db import connect

    dsn = make_database()
    rules = ruleset({**AGE, "for": "0s"})
    with connect(dsn) as conn:
        samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, T0)])

    def run():
        with connect(dsn) as own:
            ev.evaluate(own, rules, SETTINGS, now=T0)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "an evaluation hung"
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM skiplock.alert_outbox").fetchone()[0] == 1
