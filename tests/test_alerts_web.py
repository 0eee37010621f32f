"""The alerts pages and API: personas, acknowledge and silence from the page, rule and
destination validation (400 naming the problem), file rules read-only, "send test" showing the
receiver's real answer, and both transitions visible in the UI and the delivery log."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest

from console import audit, samples
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.rules import RuleSet, parse_destination, parse_rule
from console.config import load_config
from console.samples import Sample
from console.users import start_session
from tests.alert_receiver import Receiver
from tests.web_fixtures import CSRF, PASSWORD

RULE = {"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s"}


def fire(conn, value=500, queue="mail", destinations=None, **others):
    """Store one cycle's samples (`queue` at `value`, other queues as keywords) and evaluate
    (now = the database clock). Returns the alert id of `queue`."""
    now = conn.execute("SELECT now()").fetchone()[0]
    values = {queue: value, **others}
    samples.store(conn, [Sample("queue_age_seconds", {"queue": name}, v, now) for name, v in values.items()])
    rules = RuleSet(rules={"queue_age": parse_rule(RULE)}, destinations=destinations or {})
    ev.evaluate(conn, rules, ev.AlertSettings(), now=now)
    return conn.execute("SELECT id FROM skiplock.alerts WHERE labels->>'queue' = %s", (queue,)).fetchone()[0]


@pytest.fixture
def file_app(dsn, tmp_path):
    """An app whose config file defines a webhook and a rule (shown read-only)."""
    from console.web import create_app

    with Receiver([200, 401]) as receiver:
        path = tmp_path / "skiplock.toml"
        path.write_text(f"""
[alerts]
allow_private_destinations = true  # the receiver is on loopback

[[webhooks]]
name = "oncall"
url = "{receiver.url}"
secret = "file-secret-123"

[[alerts.rules]]
name = "stuck_leases"
metric = "stuck_leases"
op = ">"
threshold = 5
""")
        config = load_config(path, env={}, overrides={"database.dsn": dsn, "web.secret_key": "k"})
        app = create_app(config)
        app.config["TESTING"] = True
        app.receiver = receiver
        yield app
        app.extensions["skiplock"].close()


def client_for(app, conn, password_hash, role):
    conn.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                 (role, password_hash, role))
    client = app.test_client()
    with client.session_transaction() as session:
        session["csrf"] = CSRF
        session["sid"] = start_session(conn, role)
    return client


PAGES = ["/alerts", "/alerts/active", "/alerts/rules", "/alerts/destinations", "/alerts/deliveries",
         "/api/v1/alerts", "/api/v1/alerts/rules", "/api/v1/alerts/destinations", "/api/v1/alerts/deliveries",
         "/api/v1/alerts/events", "/api/v1/alerts/silences"]


def test_personas(client_as, conn):
    alert_id = fire(conn)
    anonymous, viewer, operator = client_as(None), client_as("viewer"), client_as("operator")
    for url in PAGES + [f"/alerts/{alert_id}", f"/api/v1/alerts/{alert_id}"]:
        assert viewer.get(url).status_code == 200, url
        assert anonymous.get(url).status_code in (302, 401), url
    assert viewer.post(f"/alerts/{alert_id}/ack", data={"csrf_token": CSRF}).status_code == 403
    assert anonymous.post(f"/api/v1/alerts/{alert_id}/ack", headers={"X-CSRF-Token": CSRF}).status_code == 401
    assert operator.post("/api/v1/alerts/rules", json=RULE, headers={"X-CSRF-Token": CSRF}).status_code == 403
    assert operator.post(f"/alerts/{alert_id}/ack", data={"note": "x"}).status_code == 403  # no CSRF token
    assert conn.execute("SELECT acknowledged_by FROM skiplock.alerts").fetchone()[0] is None


def test_firing_alert_page_acknowledge_and_silence(client_as, conn):
    alert_id = fire(conn)
    operator = client_as("operator")
    page = operator.get("/alerts").get_data(as_text=True)
    assert "1 firing" in page and "queue_age" in page and "Acknowledge" in page and "Silence" in page
    assert "<title>1 firing" in page
    fragment = operator.post(f"/alerts/{alert_id}/ack", data={"csrf_token": CSRF, "note": "on it"},
                             headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and "acknowledged by <strong>operator</strong>" in fragment.get_data(as_text=True)
    row = ev.get_alert(conn, alert_id)
    assert row["acknowledged_by"] == "operator" and row["ack_note"] == "on it"
    again = operator.post(f"/api/v1/alerts/{alert_id + 99}/ack", headers={"X-CSRF-Token": CSRF})
    assert again.status_code == 404
    bad = operator.post("/alerts/silences", data={"csrf_token": CSRF, "rule": "queue_age", "labels": "queue=mail",
                                                  "duration": "soon", "reason": "deploy"})
    assert bad.status_code == 400 and "duration" in bad.get_data(as_text=True)
    no_reason = operator.post("/api/v1/alerts/silences", json={"rule": "queue_age", "duration": "1h", "reason": ""},
                              headers={"X-CSRF-Token": CSRF})
    assert no_reason.status_code == 422 and "reason" in no_reason.get_json()["error"]
    ok = operator.post("/alerts/silences", data={"csrf_token": CSRF, "rule": "queue_age", "labels": "queue=mail",
                                                 "duration": "1h", "reason": "migrating mail"})
    assert ok.status_code == 302
    [silence] = operator.get("/api/v1/alerts/silences").get_json()["silences"]
    assert silence["reason"] == "migrating mail" and silence["created_by"] == "operator"
    assert operator.get("/api/v1/alerts").get_json()["alerts"][0]["silence_id"] == silence["id"]
    assert {a["action"] for a in audit.search(conn, actor="operator")} == {"alert_acknowledge", "alert_silence"}
    ended = operator.post(f"/api/v1/alerts/silences/{silence['id']}/expire", headers={"X-CSRF-Token": CSRF})
    assert ended.status_code == 200
    resolved = fire(conn, value=1)
    assert operator.post(f"/api/v1/alerts/{resolved}/ack", headers={"X-CSRF-Token": CSRF}).status_code == 409


def test_rule_validation_in_the_ui_and_api(client_as, conn):
    admin = client_as("admin")
    page = admin.post("/alerts/rules", data={"csrf_token": CSRF, "name": "mail_age", "metric": "queue_age_seconds",
                                             "op": ">", "threshold": "lots", "for": "1m", "enabled_present": "1",
                                             "enabled": "on", "reason": "mail is slow"})
    assert page.status_code == 400 and "alert rule &#39;mail_age&#39; (from the UI): threshold &#39;lots&#39; is not a number" in page.get_data(as_text=True)
    api = admin.post("/api/v1/alerts/rules", json={**RULE, "name": "x", "metric": "nope", "reason": "test run"}, headers={"X-CSRF-Token": CSRF})
    assert api.status_code == 400 and "unknown metric 'nope'" in api.get_json()["error"]
    api = admin.post("/api/v1/alerts/rules", json={**RULE, "labels": "queue", "reason": "test run"}, headers={"X-CSRF-Token": CSRF})
    assert api.status_code == 400 and "not key=value" in api.get_json()["error"]
    api = admin.post("/api/v1/alerts/rules", json={**RULE, "labels": {"host": "a"}, "reason": "test run"}, headers={"X-CSRF-Token": CSRF})
    assert api.status_code == 400 and "has no label 'host'" in api.get_json()["error"]
    assert conn.execute("SELECT count(*) FROM skiplock.alert_rules").fetchone()[0] == 0
    ok = admin.post("/alerts/rules", data={"csrf_token": CSRF, "name": "mail_age", "metric": "queue_age_seconds",
                                           "labels": "queue=mail", "op": ">", "threshold": "60", "for": "2m",
                                           "severity": "critical", "enabled_present": "1", "enabled": "on",
                                           "reason": "mail is slow"})
    assert ok.status_code == 302
    rules = {r["name"]: r for r in admin.get("/api/v1/alerts/rules").get_json()["rules"]}
    assert rules["mail_age"]["source"] == "ui" and rules["mail_age"]["labels"] == {"queue": "mail"}
    assert rules["queue_age"]["source"] == "default"
    assert admin.delete("/api/v1/alerts/rules/mail_age?reason=done", headers={"X-CSRF-Token": CSRF}).status_code == 200
    assert admin.delete("/api/v1/alerts/rules/mail_age?reason=done", headers={"X-CSRF-Token": CSRF}).status_code == 404


def test_file_rules_are_read_only_and_send_test_shows_the_real_answer(file_app, conn, password_hash):
    admin = client_for(file_app, conn, password_hash, "admin")
    page = admin.get("/alerts/rules").get_data(as_text=True)
    assert 'data-rule="stuck_leases" data-source="file"' in page and "defined in config file" in page
    refused = admin.post("/api/v1/alerts/rules", json={"name": "stuck_leases", "metric": "stuck_leases", "op": ">",
                                                       "threshold": 1, "reason": "test run"}, headers={"X-CSRF-Token": CSRF})
    assert refused.status_code == 400 and "defined in the config file" in refused.get_json()["error"]
    dests = admin.get("/alerts/destinations").get_data(as_text=True)
    assert "oncall" in dests and "file-secret-123" not in dests and "saved (hidden)" in dests
    ok = admin.post("/alerts/destinations/oncall/test", headers={"HX-Request": "true", "X-CSRF-Token": CSRF})
    assert ok.status_code == 200 and 'data-ok="true"' in ok.get_data(as_text=True) and "HTTP 200" in ok.get_data(as_text=True)
    failed = admin.post("/api/v1/alerts/destinations/oncall/test", headers={"X-CSRF-Token": CSRF}).get_json()
    assert failed["ok"] is False and failed["status"] == 401 and "permanent" in failed["message"]
    assert len(file_app.receiver.requests) == 2
    log = admin.get("/api/v1/alerts/deliveries").get_json()["deliveries"]
    assert [d["outcome"] for d in log] == ["test_failed", "test_ok"]
    assert admin.post("/api/v1/alerts/destinations/nope/test", headers={"X-CSRF-Token": CSRF}).status_code == 404


def test_ui_destination_secret_is_never_shown(client_as, conn):
    admin = client_as("admin")
    bad = admin.post("/alerts/destinations", data={"csrf_token": CSRF, "name": "ops", "kind": "json",
                                                   "url": "ftp://x", "secret": "ui-secret-456", "reason": "new team"})
    text = bad.get_data(as_text=True)
    assert bad.status_code == 400 and "http:// or https://" in text and "ui-secret-456" not in text
    ok = admin.post("/alerts/destinations", data={"csrf_token": CSRF, "name": "ops", "kind": "json",
                                                  "url": "https://hooks.example/ops", "secret": "ui-secret-456",
                                                  "headers": "X-Team: queue", "reason": "new team"})
    assert ok.status_code == 302
    for url in ("/alerts/destinations", "/alerts/destinations?edit=ops", "/api/v1/alerts/destinations"):
        assert "ui-secret-456" not in admin.get(url).get_data(as_text=True)
    [dest] = admin.get("/api/v1/alerts/destinations").get_json()["destinations"]
    assert dest["has_secret"] and dest["headers"] == ["X-Team"] and dest["source"] == "ui"
    assert client_as("operator").post("/alerts/destinations", data={"csrf_token": CSRF, "name": "x",
                                                                    "url": "https://h.example"}).status_code == 403


def test_both_transitions_show_in_the_ui_and_the_delivery_log(client_as, conn):
    with Receiver([503]) as receiver:
        dest = parse_destination({"name": "oncall", "url": receiver.url})
        alert_id = fire(conn, destinations={"oncall": dest})
        fire(conn, value=1, destinations={"oncall": dest})
        settings = ev.AlertSettings(retry_base=0.01, retry_cap=0.02, allow_private_destinations=True)
        sender = outbox.Sender(conn, lambda: {"oncall": dest}, settings)
        for _ in range(20):
            sender.run_once()
            if not conn.execute("SELECT count(*) FROM skiplock.alert_outbox WHERE status = 'pending'").fetchone()[0]:
                break
            time.sleep(0.03)
    viewer = client_as("viewer")
    page = viewer.get("/alerts").get_data(as_text=True)
    assert 'data-event="firing"' in page and 'data-event="resolved"' in page and 'id="all-clear"' in page
    detail = viewer.get(f"/alerts/{alert_id}").get_data(as_text=True)
    assert "resolved" in detail and "firing" in detail
    log = viewer.get("/alerts/deliveries").get_data(as_text=True)
    assert log.count('data-outcome="delivered"') == 2 and log.count('data-outcome="retry"') == 1
    events = [e["kind"] for e in viewer.get("/api/v1/alerts/events").get_json()["events"]]
    assert events == ["resolved", "firing"]
    api_log = viewer.get("/api/v1/alerts/deliveries?destination=oncall").get_json()["deliveries"]
    assert [(d["event"], d["outcome"]) for d in api_log] == [("resolved", "delivered"), ("firing", "delivered"),
                                                             ("firing", "retry")]
    assert viewer.get("/api/v1/alerts/deliveries?limit=0").status_code == 400


# The default queue_age rule (its summary, threshold 300 s, clear 60 s), firing without a wait:
# the pages render with the console's rules, so the test evaluates the same one.
QUEUE_AGE = replace(next(r for r in DEFAULT_RULES if r.name == "queue_age"), for_seconds=0.0)


def step(conn, value, destinations=None, queue="mail"):
    """One cycle of the default queue_age rule (value None: the series is gone), evaluated now."""
    now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    if value is not None:
        samples.store(conn, [Sample("queue_age_seconds", {"queue": queue}, value, now)])
    else:
        samples.store(conn, [Sample("queue_age_seconds", {"queue": "other"}, 1, now)])
    rules = RuleSet(rules={"queue_age": QUEUE_AGE}, destinations=destinations or {})
    ev.evaluate(conn, rules, ev.AlertSettings(), now=now)
    return conn.execute("SELECT id FROM skiplock.alerts WHERE labels->>'queue' = %s", (queue,)).fetchone()[0]


def test_a_resolved_alert_says_it_resolved_with_the_last_value_over_the_threshold(client_as, conn):
    """Not "has waited 0s (over 300s)": on its page, in the API and in the resolved webhook."""
    dest = parse_destination({"name": "oncall", "url": "https://hooks.example/x"})
    alert_id = step(conn, 420, {"oncall": dest})
    step(conn, 350, {"oncall": dest})
    step(conn, 100, {"oncall": dest})  # under the threshold, over the clear value (60): still firing
    step(conn, 0, {"oncall": dest})    # resolved
    said = "Resolved. Last reading over the threshold: Oldest eligible job in queue mail has waited 350s (over 300s)"
    viewer = client_as("viewer")
    page = viewer.get(f"/alerts/{alert_id}").get_data(as_text=True)
    assert said in page and "waited 0s" not in page and "waited 100s" not in page
    api = viewer.get(f"/api/v1/alerts/{alert_id}").get_json()["alert"]
    assert (api["state"], api["value"], api["last_over_value"], api["summary"]) == ("ok", 0, 350, said)
    (resolved,) = [row[0] for row in conn.execute(
        "SELECT notification FROM skiplock.alert_outbox WHERE notification->>'event' = 'resolved'")]
    assert resolved["alert"]["summary"] == said and resolved["alert"]["value"] == 0

    # The next episode starts afresh: pending shows the value now; a series that vanished
    # resolves with the last value it had over the threshold.
    step(conn, 330)
    assert viewer.get("/api/v1/alerts").get_json()["alerts"][0]["summary"] == \
        "Oldest eligible job in queue mail has waited 330s (over 300s)"
    step(conn, None)
    assert viewer.get(f"/api/v1/alerts/{alert_id}").get_json()["alert"]["summary"] == \
        "Resolved. Last reading over the threshold: Oldest eligible job in queue mail has waited 330s (over 300s)"


def test_a_resolved_alert_without_a_recorded_value_says_resolved_and_no_number(client_as, conn):
    alert_id = step(conn, 420)
    step(conn, 0)
    conn.execute("UPDATE skiplock.alerts SET last_over_value = NULL")  # resolved before migration 018
    summary = client_as("viewer").get(f"/api/v1/alerts/{alert_id}").get_json()["alert"]["summary"]
    assert summary == "Resolved: queue_age (queue=mail)"


def test_waiting_notifications_show_why_on_the_destinations_page(client_as, conn):
    """"2 waiting" said nothing about why: the newest delivery error is beside the count, and the
    destination's delivery log is one click away."""
    admin = client_as("admin")
    assert admin.post("/alerts/destinations", data={"csrf_token": CSRF, "name": "oncall", "kind": "json",
                                                    "url": "https://hooks.example/oncall",
                                                    "reason": "on-call hook"}).status_code == 302
    with Receiver([503, 503]) as receiver:
        dest = parse_destination({"name": "oncall", "url": receiver.url})
        fire(conn, destinations={"oncall": dest})
        fire(conn, billing=700, destinations={"oncall": dest})  # mail still firing, billing fires
        settings = ev.AlertSettings(retry_base=60, allow_private_destinations=True)
        assert outbox.Sender(conn, lambda: {"oncall": dest}, settings).run_once().retried == 2
    html = client_as("viewer").get("/alerts/destinations").get_data(as_text=True)
    cell = html[html.index("data-waiting>"):]
    cell = cell[:cell.index("</td>")]
    assert "2 waiting since" in cell and "2 retrying: HTTP 503" in cell
    assert 'href="/alerts/deliveries?destination=oncall">its delivery log</a>' in cell
    log = client_as("viewer").get("/alerts/deliveries?destination=oncall").get_data(as_text=True)
    assert log.count('data-outcome="retry"') == 2 and "HTTP 503" in log


def test_a_bad_config_file_rule_stops_the_app(dsn, tmp_path):
    from console.alerts.rules import RuleError
    from console.web import create_app

    path = tmp_path / "skiplock.toml"
    path.write_text('[[alerts.rules]]\nname = "typo"\nmetric = "queue_agee"\nop = ">"\nthreshold = 1\n')
    config = load_config(path, env={}, overrides={"database.dsn": dsn, "web.secret_key": "k"})
    with pytest.raises(RuleError, match="alert rule 'typo'"):
        create_app(config)



@pytest.mark.browser
def test_operator_acknowledges_and_silences_from_the_page(page, live_server, personas, conn):
    """Chromium: the firing alert is on the page and in the tab title; Acknowledge (htmx) and
    Silence record who did it, checked in the database."""
    mail = fire(conn, sms=700)
    sms = conn.execute("SELECT id FROM skiplock.alerts WHERE labels->>'queue' = 'sms'").fetchone()[0]
    page.goto(live_server + "/alerts")
    page.fill("input[name=name]", "operator")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(live_server + "/alerts")))
    assert page.title().startswith("2 firing")
    row = page.locator(f"tr[data-alert-id='{mail}']")
    row.locator("input[name=note]").fill("restarting the mail workers")
    row.locator("button[name=ack]").click()
    page.locator(f"tr[data-alert-id='{mail}']", has_text="acknowledged by").wait_for()
    assert ev.get_alert(conn, mail)["acknowledged_by"] == "operator"
    assert ev.get_alert(conn, mail)["ack_note"] == "restarting the mail workers"
    row = page.locator(f"tr[data-alert-id='{sms}']")
    row.locator("input[name=reason]").fill("sms provider maintenance")
    row.locator("button[name=silence]").click()
    page.locator(f"tr[data-alert-id='{sms}']", has_text="silenced until").wait_for()
    [silence] = ev.recent_silences(conn)
    assert silence["labels"] == {"queue": "sms"} and silence["created_by"] == "operator"
    assert silence["reason"] == "sms provider maintenance"
