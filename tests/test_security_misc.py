"""Browser-side defences that need no browser: the dead-letter payload filter stays inside its
attribute (and "Replay all" submits it intact), runbook links are http(s) or site paths in the
UI and the API and never a link otherwise, and CSV exports neutralise formula cells."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from html.parser import HTMLParser

import pytest

from console import queue as q
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.samples import Sample, store
from tests.web_fixtures import CSRF

# Flask's tojson escapes < > & ' but not ": this value used to close value="..." and add
# htmx attributes that fire on load (and carry the page's CSRF header).
BREAKOUT = 'x" hx-trigger="load" hx-get="/healthz" hx-on::before-request="alert(1)" y="'


class Elements(HTMLParser):
    """Every start tag with its attributes, as the browser will see them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Elements()
    parser.feed(html)
    return parser.tags


@pytest.fixture
def bad_dead_letter(conn):
    job_id = q.enqueue(conn, "send_mail", {"subject": BREAKOUT, "to": "a@example.com"}, queue="mail", max_attempts=1)
    q.enqueue(conn, "send_mail", {"subject": "fine"}, queue="mail", max_attempts=1)
    for job in q.claim(conn, "w", queues=["mail"], limit=10, lease=60):
        q.fail(conn, job, "SMTP refused")
    return job_id


def test_payload_filter_stays_in_its_attribute_and_replay_all_submits_it(client_as, bad_dead_letter):
    operator = client_as("operator")
    payload = json.dumps({"subject": BREAKOUT})
    page = operator.get("/deadletters/jobs", query_string={"payload": payload})
    assert page.status_code == 200
    tags = elements(page.get_data(as_text=True))
    injected = [(t, a) for t, a in tags
                if a.get("hx-get") == "/healthz" or "y" in a or any(k.startswith(("on", "hx-on")) for k in a)]
    assert injected == []
    hidden = {a["name"]: a["value"] for t, a in tags if t == "input" and a.get("type") == "hidden" and a.get("name") != "next"}
    assert json.loads(hidden["payload"]) == {"subject": BREAKOUT}

    # "Replay all 1…" posts the form's fields as they are: the preview finds exactly that job
    preview = operator.post("/api/v1/deadletters/preview", data={**hidden, "action": "replay", "csrf_token": CSRF})
    assert preview.status_code == 200, preview.get_data(as_text=True)
    assert preview.get_json()["total"] == 1
    assert [j["id"] for j in preview.get_json()["sample"]] == [bad_dead_letter]


def test_the_older_link_keeps_the_payload_filter_as_json(client_as, conn):
    """Page two of a payload filter: the link carries JSON, not a Python repr that gives a 400."""
    for _ in range(101):
        q.enqueue(conn, "send_mail", {"batch": "b-7"}, queue="mail", max_attempts=1)
    for job in q.claim(conn, "w", queues=["mail"], limit=200, lease=60):
        q.fail(conn, job, "SMTP refused")
    viewer = client_as("viewer")
    first = viewer.get("/deadletters/jobs", query_string={"payload": '{"batch": "b-7"}'})
    older = [a["href"] for t, a in elements(first.get_data(as_text=True)) if t == "a" and "before=" in (a.get("href") or "")]
    assert len(older) == 1
    second = viewer.get(older[0])
    assert second.status_code == 200, second.get_data(as_text=True)
    assert len([t for t, a in elements(second.get_data(as_text=True)) if t == "tr" and "data-job" in a]) == 1


def test_runbook_must_be_http_or_a_site_path_in_the_ui_and_api(client_as, conn):
    admin = client_as("admin")
    form = {"csrf_token": CSRF, "name": "mail_age", "metric": "queue_age_seconds", "op": ">", "threshold": "60",
            "for": "1m", "runbook": "javascript:alert(document.cookie)", "enabled_present": "1", "enabled": "on",
            "reason": "runbook test"}
    page = admin.post("/alerts/rules", data=form)
    assert page.status_code == 400
    assert "runbook must be an http:// or https:// URL or a site path (scheme javascript: is not allowed)" in page.get_data(as_text=True)
    api = admin.post("/api/v1/alerts/rules", json={"name": "mail_age", "metric": "queue_age_seconds", "op": ">",
                                                   "threshold": 60, "runbook": "//evil.example/x",
                                                   "reason": "runbook test"},
                     headers={"X-CSRF-Token": CSRF})
    assert api.status_code == 400 and "leaves the site" in api.get_json()["error"]
    assert conn.execute("SELECT count(*) FROM skiplock.alert_rules").fetchone()[0] == 0
    ok = admin.post("/alerts/rules", data={**form, "runbook": "https://wiki.example/runbooks/mail-age"})
    assert ok.status_code == 302


def test_an_unsafe_runbook_is_never_rendered_as_a_link(client_as, conn, monkeypatch):
    """Defence in depth: were a rule to reach a page with a javascript: runbook (validation
    bypassed), the templates show no link."""
    real_load = r.load

    def load_with_bad_runbooks(*args, **kwargs):
        ruleset = real_load(*args, **kwargs)
        bad = {name: dataclasses.replace(rule, runbook="javascript:alert(1)") for name, rule in ruleset.rules.items()}
        return dataclasses.replace(ruleset, rules=bad)

    monkeypatch.setattr(r, "load", load_with_bad_runbooks)
    now = conn.execute("SELECT now()").fetchone()[0]
    store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 5000.0, now)])
    rule = r.parse_rule({"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s"})
    ev.evaluate(conn, r.RuleSet(rules={"queue_age": rule}, destinations={}), ev.AlertSettings(), now=now)
    alert_id = conn.execute("SELECT id FROM skiplock.alerts").fetchone()[0]

    viewer = client_as("admin")
    for url in ("/alerts", "/alerts/active", "/alerts/rules", f"/alerts/{alert_id}", "/overview"):
        response = viewer.get(url)
        assert response.status_code == 200, url
        hrefs = [a.get("href") or "" for t, a in elements(response.get_data(as_text=True)) if t == "a"]
        assert hrefs and not any(h.strip().lower().startswith("javascript:") for h in hrefs), url
    assert "runbook" in viewer.get("/alerts/rules").get_data(as_text=True)  # the rule is there, the link is not


FORMULAS = ["=HYPERLINK(\"https://evil.example\",\"click\")", "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]


def test_csv_export_neutralises_formula_cells(client_as, conn):
    for text in FORMULAS:
        q.enqueue(conn, text, {"note": text}, queue="csv", priority=-5, max_attempts=1)
    for job in q.claim(conn, "w", queues=["csv"], limit=10, lease=60):
        q.fail(conn, job, text := job.kind)
        conn.execute("UPDATE skiplock.jobs SET last_error = %s WHERE id = %s", (text, job.id))
    response = client_as("viewer").get("/jobs/export.csv?queue=csv")
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True), newline="")))
    assert sorted(row["kind"] for row in rows) == sorted("'" + text for text in FORMULAS)
    assert sorted(row["last_error"] for row in rows) == sorted("'" + text for text in FORMULAS)
    assert {row["priority"] for row in rows} == {"-5"}  # numbers are not text: left as they are
    assert all(json.loads(row["payload"])["note"] in FORMULAS for row in rows)  # JSON starts with {: safe


def test_slack_messages_escape_text_that_would_become_links():
    """A queue named "<https://evil.example|Fix it here>" must not be a link in the on-call channel."""
    from console.alerts.transports import transport_for

    dest = r.parse_destination({"name": "chat", "kind": "slack", "url": "https://hooks.slack.example/services/T/B/x"})
    body, _ = transport_for(dest).render({
        "event": "firing", "console_url": "https://console.example/alerts/1",
        "alert": {"rule": "queue_age", "labels": {"queue": "<https://evil.example|Fix it here>"},
                  "summary": "Queue <!channel> & friends late", "severity": "critical",
                  "runbook": "https://wiki.example/a|<https://evil.example|x>"}})
    text = json.loads(body)["text"]
    assert "<https://evil.example" not in text and "<!channel>" not in text
    assert "queue=&lt;https://evil.example|Fix it here&gt;" in text
    assert "Queue &lt;!channel&gt; &amp; friends late" in text
    assert "<https://wiki.example/a%7C&lt;https://evil.example%7Cx&gt;|Runbook>" in text
    assert "<https://console.example/alerts/1|Console>" in text
