"""Issue 26, class 1: redaction holds on every value derived from a redacted one.

A secret sits in an error (`token=...`, a key of the defaults) and in another error whose key
(`session_id`) is only in this console's web.redact_keys, with its fingerprint stored as it
was before fingerprints hid secrets. A viewer must not find either secret anywhere a value is
derived from those errors or from payloads: fingerprints (pages, links, job JSON, both
exports, after a replay), group labels, search matches, audit selections and details, bulk
operations' selections, alert look-here links (page, API, lists, overview, webhook body),
periodic schedules' payloads; and may not probe them with a filter. Operators still see
everything whole, and act on the stored fingerprint.
"""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest

from console import audit
from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from console.fingerprint import fingerprint
from console.maintenance import start
from console.queue import periodic
from tests.alert_links_data import fire_default
from tests.web_fixtures import CSRF

TOKEN = "SEKRET-IN-ERROR"       # after `token=`: hidden by the defaults, in fingerprints too
SESSION = "SESSION-SEKRET-77"   # after `session_id=`: only this console's web.redact_keys names it
SECRETS = (TOKEN, SESSION)
KEYS = "password,passwd,secret,token,api_key,apikey,authorization,card_number,ssn,session_id"


@pytest.fixture
def web_settings(web_settings):
    return {**web_settings, "web.redact_keys": KEYS}


def fail_with(conn, message: str, *, queue: str = "billing", kind: str = "charge_card", payload=None) -> int:
    q.enqueue(conn, kind, payload or {"customer": 7}, queue=queue, max_attempts=1)
    [job] = q.claim(conn, "w-1", queues=[queue], limit=1, lease=60)
    q.fail(conn, job, ValueError(message))
    return job.id


@pytest.fixture
def leaky(conn):
    """Two dead letters in billing: one failed now (its fingerprint hides the token), one whose
    fingerprint was stored before fingerprints hid anything (it still holds the session id)."""
    new = fail_with(conn, f"gateway refused token={TOKEN} for customer 7")
    old = fail_with(conn, f"session lost: session_id={SESSION}")
    conn.execute("UPDATE skiplock.jobs SET error_fingerprint = %s WHERE id = %s",
                 (f"ValueError: session lost: session_id={SESSION}", old))
    return {"new": new, "old": old}


def seen(client, url: str) -> str:
    """The body, and the address a redirect (search's single match) led to."""
    response = client.get(url, follow_redirects=True)
    assert response.status_code == 200, (url, response.status_code, response.get_data(as_text=True)[:300])
    return response.request.url + "\n" + response.get_data(as_text=True)


def assert_hidden(client, urls) -> None:
    leaks = [(url, s) for url in urls for s in SECRETS if s in seen(client, url)]
    assert leaks == [], leaks


def test_the_engine_hides_the_keys_the_console_hides_by_default():
    from console.config import SETTINGS
    from console.redaction import DEFAULT_KEYS, key_set

    [setting] = [s for s in SETTINGS if (s.section, s.key) == ("web", "redact_keys")]
    assert key_set(setting.default) == DEFAULT_KEYS


def test_a_fingerprint_is_made_from_the_error_with_its_secrets_hidden(conn, leaky):
    stored = conn.execute("SELECT error_fingerprint, last_error FROM skiplock.jobs WHERE id = %s",
                          (leaky["new"],)).fetchone()
    assert stored[0] == "ValueError: gateway refused token=<redacted> for customer <n>"
    assert TOKEN in stored[1]  # the error itself is kept whole, for operators
    # quoted, JSON-ish and `key: value` forms, and keys a deployment adds
    assert fingerprint("E", '{"password": "hunter2", "id": 3}') == "E: {<str>: <redacted>, <str>: <n>}"
    assert fingerprint("E", "auth failed, Authorization: Bearer-abc") == "E: auth failed, Authorization: <redacted>"
    assert fingerprint("E", "session_id=abc", secret_keys={"session_id"}) == "E: session_id=<redacted>"
    # the worker passes the configured keys to fail()
    q.enqueue(conn, "k", {}, queue="w", max_attempts=1)
    [job] = q.claim(conn, "w-2", queues=["w"], limit=1, lease=60)
    q.fail(conn, job, RuntimeError(f"session_id={SESSION}"), secret_keys=frozenset({"session_id"}))
    assert conn.execute("SELECT error_fingerprint FROM skiplock.jobs WHERE id = %s", (job.id,)).fetchone()[0] \
        == "RuntimeError: session_id=<redacted>"


VIEWS = [
    "/deadletters", "/api/v1/deadletters",
    "/deadletters/jobs?queue=billing", "/api/v1/deadletters/jobs?queue=billing",
    "/jobs?state=failed", "/api/v1/jobs?state=failed",
    "/jobs/{new}", "/api/v1/jobs/{new}", "/jobs/{old}", "/api/v1/jobs/{old}",
    "/jobs/export.csv?state=failed", "/jobs/export.json?state=failed",
    "/api/v1/jobs/export.csv?state=failed", "/api/v1/jobs/export.json?state=failed",
    "/search?q=session", "/api/v1/search?q=session", "/search?q=token", "/api/v1/search?q=gateway",
]


def test_viewers_never_see_a_secret_in_a_fingerprint_group_label_search_or_export(client_as, leaky):
    viewer = client_as("viewer")
    assert_hidden(viewer, [u.format(**leaky) for u in VIEWS])
    groups = {g["fingerprint"]: g for g in viewer.get("/api/v1/deadletters").get_json()["groups"]}
    assert set(groups) == {"ValueError: gateway refused token=<redacted> for customer <n>",
                           "ValueError: session lost: session_id=[redacted]"}
    job = viewer.get(f"/api/v1/jobs/{leaky['old']}").get_json()["job"]
    assert job["error_fingerprint"] == "ValueError: session lost: session_id=[redacted]" and job["fingerprint_hidden"]
    # A search for the secret finds nothing: matches are made against what the viewer sees.
    assert viewer.get(f"/api/v1/search?q={SESSION}").get_json()["matches"] == []
    assert viewer.get(f"/api/v1/search?q={TOKEN}").get_json()["matches"] == []
    # Operators see the stored fingerprints (they replay and purge groups by them).
    operator_groups = {g["fingerprint"] for g in client_as("operator").get("/api/v1/deadletters").get_json()["groups"]}
    assert f"ValueError: session lost: session_id={SESSION}" in operator_groups
    assert SESSION in seen(client_as("operator"), f"/api/v1/search?q={SESSION}")


def fingerprint_links(html: str) -> list[str]:
    """The fingerprint filters of the page's links, decoded."""
    hrefs = [unescape(h) for h in re.findall(r'href="([^"]*)"', html)]
    return [v for h in hrefs for v in parse_qs(urlsplit(h).query).get("fingerprint", [])]


def test_links_never_filter_on_a_hidden_fingerprint_and_a_shown_one_still_works(client_as, leaky):
    viewer = client_as("viewer")
    shown = "ValueError: gateway refused token=<redacted> for customer <n>"
    # the hidden group's link lists the dead letters instead; the shown one filters
    assert fingerprint_links(seen(viewer, "/deadletters")) == [shown]
    assert viewer.get("/api/v1/deadletters/jobs", query_string={"fingerprint": shown}).get_json()["total"] == 1
    assert set(fingerprint_links(seen(viewer, "/jobs?state=failed"))) == {shown}
    assert fingerprint_links(seen(viewer, f"/jobs/{leaky['old']}")) == []
    assert fingerprint_links(seen(viewer, f"/jobs/{leaky['new']}")) == [shown]
    search = viewer.get("/api/v1/search?q=session").get_json()["matches"]
    assert [m["url"] for m in search if m["type"] == "error_group"] == ["/deadletters/jobs"]


@pytest.mark.parametrize("url", ["/jobs", "/api/v1/jobs", "/deadletters/jobs", "/api/v1/deadletters/jobs",
                                 "/jobs/export.csv", "/api/v1/jobs/export.json"])
def test_a_viewer_cannot_probe_a_hidden_value_with_a_filter(client_as, leaky, url):
    probes = [
        {"fingerprint": f"ValueError: session lost: session_id={SESSION}"},
        {"fingerprint": "ValueError: session lost: session_id=guess"},
        {"payload": json.dumps({"note": f"token={TOKEN}"})},  # a value written after a redacted key
        {"payload": json.dumps({"deep": [{"token": TOKEN}]})},  # a redacted key at any depth
    ]
    for probe in probes:
        response = client_as("viewer").get(url, query_string=probe)
        assert response.status_code == 403, (url, probe, response.status_code)
    assert client_as("operator").get(url, query_string=probes[0]).status_code == 200


def test_audit_rows_and_operations_quote_selections_and_details_redacted(client_as, conn, leaky):
    legacy = f"ValueError: session lost: session_id={SESSION}"
    op_id = start(conn, "replay", {"fingerprint": legacy}, actor="operator", reason="gateway back")
    audit.record(conn, actor="operator", action="enqueue", target="job:1", reason="retry by hand",
                 selection={"ids": [1]}, detail={"queue": "billing", "idempotency_key": f"token={TOKEN}",
                                                 "payload": {"api_key": TOKEN}})
    viewer = client_as("viewer")
    assert_hidden(viewer, ["/audit", "/api/v1/audit", f"/deadletters/operations/{op_id}",
                           f"/api/v1/deadletters/operations/{op_id}", "/api/v1/deadletters/operations",
                           f"/deadletters/operations/{op_id}/_progress", "/deadletters"])
    rows = {r["action"]: r for r in viewer.get("/api/v1/audit").get_json()["entries"]}
    assert rows["replay"]["selection"]["fingerprint"] == "ValueError: session lost: session_id=[redacted]"
    assert rows["enqueue"]["detail"] == {"queue": "billing", "idempotency_key": "token=[redacted]",
                                         "payload": {"api_key": "[redacted]"}}
    assert SESSION in seen(client_as("operator"), f"/api/v1/deadletters/operations/{op_id}")


def test_a_replayed_job_keeps_its_fingerprint_hidden(client_as, conn, leaky):
    operator = client_as("operator")
    for job_id in leaky.values():
        assert operator.post(f"/api/v1/jobs/{job_id}/replay", headers={"X-CSRF-Token": CSRF}).status_code == 200
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'pending'").fetchone()[0] == 2
    assert_hidden(client_as("viewer"), [u.format(**leaky) for u in (
        "/jobs/{old}", "/api/v1/jobs/{old}", "/jobs?state=pending", "/api/v1/jobs?state=pending",
        "/jobs/export.csv", "/api/v1/jobs/export.json", "/audit", "/api/v1/audit")])


def test_alert_links_and_webhook_bodies_name_a_new_group_without_its_secret(client_as, conn, leaky):
    settings = ev.AlertSettings.from_config(_config_with_keys())
    destinations = {"hook": parse_destination({"name": "hook", "url": "https://hooks.example/x", "kind": "json"})}
    alert_id = fire_default(conn, "dead_letter_growth", {"queue": "billing"}, 540, destinations=destinations,
                            settings=settings)
    body = conn.execute("SELECT notification::text FROM skiplock.alert_outbox").fetchone()[0]
    assert "New error group in billing" in body
    assert not [s for s in SECRETS if s in body], body
    links = json.loads(body)["alert"]["look_here"]
    hidden = next(link for link in links if "session_id" in link["label"])
    assert "fingerprint" not in hidden["path"]  # a hidden fingerprint is no filter: the queue's dead letters
    assert_hidden(client_as("viewer"), [f"/alerts/{alert_id}", f"/api/v1/alerts/{alert_id}", "/api/v1/alerts",
                                        "/alerts", "/overview", "/api/v1/overview"])


def _config_with_keys():
    from console.config import load_config

    return load_config(env={}, overrides={"web.redact_keys": KEYS})


def test_the_alert_page_quotes_the_audit_log_redacted(client_as, conn, leaky):
    audit.record(conn, actor="operator", action="replay", target="operation:1", reason="gateway back", rows=1,
                 selection={"fingerprint": f"ValueError: session lost: session_id={SESSION}"},
                 detail={"error": f"gateway refused token={TOKEN}"})
    alert_id = fire_default(conn, "dead_letter_growth", {"queue": "billing"}, 540)
    assert_hidden(client_as("viewer"), [f"/alerts/{alert_id}", f"/api/v1/alerts/{alert_id}"])
    assert SESSION in seen(client_as("operator"), f"/api/v1/alerts/{alert_id}")


def test_periodic_payloads_are_redacted_for_viewers(client_as, conn):
    declared = periodic.parse_entries([("[[periodic]] #1", {
        "name": "sync-crm", "kind": "crm.sync", "every": "10m",
        "payload": {"account": "acme", "api_key": TOKEN, "nested": [{"password": SESSION}]}}, "config")])
    periodic.sync(conn, declared)
    assert_hidden(client_as("viewer"), ["/api/v1/periodic", "/periodic", "/periodic/_table"])
    [row] = client_as("viewer").get("/api/v1/periodic").get_json()["schedules"]
    assert row["payload"] == {"account": "acme", "api_key": "[redacted]", "nested": [{"password": "[redacted]"}]}
    [row] = client_as("operator").get("/api/v1/periodic").get_json()["schedules"]
    assert row["payload"]["api_key"] == TOKEN
