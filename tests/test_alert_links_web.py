"""The look-here links where on-call sees an alert: the alert page (first), its JSON twin, the
alerts list API, the overview's firing-alert row and API, and every delivered webhook payload
(JSON, Slack, PagerDuty) with absolute URLs. Also the alert page's chart (with the threshold)
and "what changed just before it fired"."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

import psycopg
from markupsafe import escape

from console import queue as q
from console import samples
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from console.samples import Sample
from tests.alert_links_data import deliver, fire_default
from tests.alert_receiver import Receiver
from tests.oncall_data import make_dead_letters

EligibleSearch = "/jobs?state=pending&queue=search&eligible=1"


def three_destinations(rx: Receiver) -> dict:
    """One destination of each transport, all posting to `rx` (told apart by path)."""
    return {
        "hook": parse_destination({"name": "hook", "url": rx.url, "kind": "json"}),
        "chat": parse_destination({"name": "chat", "url": rx.url + "/slack", "kind": "slack"}),
        "pd": parse_destination({"name": "pd", "url": rx.url + "/pd", "kind": "pagerduty", "secret": "rk-123"}),
    }


def test_alert_page_shows_the_look_here_link_first(client_as, conn):
    alert_id = fire_default(conn, "queue_age", {"queue": "search"}, 420)
    html = client_as("viewer").get(f"/alerts/{alert_id}").get_data(as_text=True)
    href = f'href="{EligibleSearch.replace("&", "&amp;")}"'
    assert href in html
    assert html.index('id="look-here"') < html.index('class="figures"')  # before the rule and value
    assert html.index(href) < html.index('href="/queues/search#why"')  # the jobs first, then why the queue waits


def test_api_and_overview_carry_the_link(client_as, conn):
    alert_id = fire_default(conn, "stuck_leases", {"queue": "work"}, 2)
    client = client_as("viewer")
    one = client.get(f"/api/v1/alerts/{alert_id}").get_json()
    assert one["alert"]["look_here"][0]["path"] == "/jobs?state=running&queue=work&lease=expired"
    listed = client.get("/api/v1/alerts").get_json()["alerts"]
    assert listed[0]["look_here"][0]["path"] == "/jobs?state=running&queue=work&lease=expired"
    overview = client.get("/api/v1/overview").get_json()["alerts"]
    assert overview[0]["look_here"][0]["path"] == "/jobs?state=running&queue=work&lease=expired"
    html = client.get("/overview").get_data(as_text=True)
    row = html[html.index('id="firing-alerts"'):]
    assert 'href="/jobs?state=running&amp;queue=work&amp;lease=expired" data-look-here' in row


def test_a_new_error_group_goes_first_on_the_alert_page_and_in_every_webhook_payload(client_as, conn):
    # an old group (failing for hours) and a new one (first seen minutes ago) in billing
    q.enqueue(conn, "charge_card", {"customer": 1}, queue="billing", max_attempts=1)
    for job in q.claim(conn, "w", queues=["billing"], limit=1, lease=60):
        q.fail(conn, job, KeyError("customer record missing"))
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '3 hours' WHERE queue = 'billing'")
    make_dead_letters(conn, smtp=1, card=2, queue_smtp="mail", queue_card="billing")
    fingerprint = conn.execute("SELECT error_fingerprint FROM skiplock.jobs WHERE queue = 'billing' "
                               "AND last_error LIKE 'ValueError%%' LIMIT 1").fetchone()[0]
    settings = ev.AlertSettings(console_url="https://console.example", allow_private_destinations=True)
    with Receiver() as rx:
        destinations = three_destinations(rx)
        alert_id = fire_default(conn, "dead_letter_growth", {"queue": "billing"}, 540, destinations=destinations,
                                settings=settings)
        assert deliver(conn, destinations, settings).delivered == 3
        bodies = {r["path"]: json.loads(r["body"]) for r in rx.requests}
    links = client_as("viewer").get(f"/api/v1/alerts/{alert_id}").get_json()["alert"]["look_here"]
    new_group = "/deadletters/jobs?" + urlencode({"queue": "billing", "fingerprint": fingerprint})
    assert links[0]["path"] == new_group
    assert links[0]["label"].startswith("New error group in billing: ValueError")
    assert [link["path"] for link in links[1:]] == ["/deadletters?queue=billing#groups", "/deadletters/jobs?queue=billing"]
    # every transport carries the same list, the new group first, as absolute links
    url = "https://console.example" + new_group
    payload = bodies["/hook"]["alert"]["look_here"]
    assert [(link["label"], link["path"]) for link in payload] == [(link["label"], link["path"]) for link in links]
    assert payload[0]["url"] == url
    slack = bodies["/hook/slack"]["text"]
    assert slack.index(f"<{url.replace('&', '&amp;')}|New error group in billing: ValueError") \
        < slack.index("/deadletters?queue=billing#groups|")
    pd = bodies["/hook/pd"]["links"]
    assert pd[0]["href"] == url and pd[0]["text"] == links[0]["label"] and pd[-1]["text"] == "Runbook"
    # the lists show it first too: the alerts list API and the overview's firing-alert row
    listed = next(a for a in client_as("viewer").get("/api/v1/alerts").get_json()["alerts"] if a["id"] == alert_id)
    assert listed["look_here"][0]["path"] == new_group
    overview = client_as("viewer").get("/overview").get_data(as_text=True)
    assert f'href="{escape(new_group)}" data-look-here>New error group in billing: ValueError' in overview


def test_alert_page_charts_the_series_with_the_threshold_and_lists_what_changed(client_as, conn):
    now = conn.execute("SELECT now()").fetchone()[0]
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "search"}, 10.0 * i, now - timedelta(minutes=20 - i))
                         for i in range(20)])
    for action, minutes, target in (("pause", 10, "queue:search"), ("maintenance_settings", 45, "settings"),
                                    ("login", 5, "user:viewer")):
        conn.execute("INSERT INTO skiplock.audit_log (at, actor, action, target) VALUES (%s, 'alice', %s, %s)",
                     (now - timedelta(minutes=minutes), action, target))
    alert_id = fire_default(conn, "queue_age", {"queue": "search"}, 420)
    client = client_as("viewer")
    data = client.get(f"/api/v1/alerts/{alert_id}").get_json()
    assert data["series"]["threshold"] == 300 and data["series"]["unit"] == "seconds"
    assert len(data["series"]["points"]) >= 20 and max(p["value"] for p in data["series"]["points"]) == 420
    assert [(c["action"], c["target"]) for c in data["changes"]] == [("pause", "queue:search")]
    html = client.get(f"/alerts/{alert_id}").get_data(as_text=True)
    chart = html[html.index('id="alert-chart"'):html.index('id="alert-changes"')]
    assert "<svg" in chart and 'class="threshold"' in chart and "threshold 5 min" in chart
    changes = html[html.index('id="alert-changes"'):]
    assert "pause" in changes and "queue:search" in changes and "maintenance_settings" not in changes


def test_every_webhook_payload_carries_the_absolute_link(conn):
    settings = ev.AlertSettings(console_url="https://console.example/skiplock/", retry_base=0.1,
                                allow_private_destinations=True)  # the receiver is on loopback
    with Receiver() as rx:
        destinations = three_destinations(rx)
        fire_default(conn, "queue_age", {"queue": "search"}, 420, destinations=destinations, settings=settings)
        report = deliver(conn, destinations, settings)
        assert report.delivered == 3, report
        bodies = {r["path"]: json.loads(r["body"]) for r in rx.requests}
    url = "https://console.example/skiplock" + EligibleSearch
    document = bodies["/hook"]
    assert document["alert"]["look_here"][0] == {"label": "Eligible jobs in queue search, oldest first",
                                                 "path": EligibleSearch, "url": url}
    assert document["console_url"].startswith("https://console.example/skiplock/alerts/")
    slack = bodies["/hook/slack"]["text"]
    # Slack wants &, < and > escaped in message text, link targets included (it decodes them)
    assert f"<{url.replace('&', '&amp;')}|Eligible jobs in queue search, oldest first>" in slack
    assert slack.index(url.replace('&', '&amp;')) < slack.index("|Runbook>")
    pd = bodies["/hook/pd"]
    assert pd["links"][0] == {"href": url, "text": "Eligible jobs in queue search, oldest first"}
    assert pd["links"][-1]["text"] == "Runbook"


def test_a_locked_jobs_table_leaves_the_new_group_out_but_the_alert_still_fires(conn, dsn):
    # VACUUM FULL or a migration holds skiplock.jobs: the groups lookup gives up after the
    # evaluation's lock timeout, and the alert fires with its other links all the same.
    make_dead_letters(conn, smtp=0, card=2, queue_smtp="mail", queue_card="billing")
    settings = ev.AlertSettings(console_url="https://console.example", statement_timeout_ms=200)
    destinations = {"hook": parse_destination({"name": "hook", "url": "https://hooks.example/x", "kind": "json"})}
    with psycopg.connect(dsn) as ddl:
        ddl.execute("LOCK TABLE skiplock.jobs IN ACCESS EXCLUSIVE MODE")
        fire_default(conn, "dead_letter_growth", {"queue": "billing"}, 540, destinations=destinations, settings=settings)
    (document,) = [row[0] for row in conn.execute("SELECT notification FROM skiplock.alert_outbox")]
    assert [link["path"] for link in document["alert"]["look_here"]] == ["/deadletters?queue=billing#groups",
                                                                         "/deadletters/jobs?queue=billing"]
