"""Reflected and stored XSS in real Chromium: a corpus of attribute-breaking, htmx-attribute,
javascript:-URL, <svg onload>, <img onerror> and template-syntax strings is seeded into every
field that echoes user or payload text (payloads, last_error and its error group, kind, queue
names, job detail, alert labels and rule summaries, destination URLs and headers, the delivery
log, workers, audit actors, actions, targets and reasons, and the Database page's lock tree: the
application_name and query text of other sessions) and placed in every filter of every
page. Nothing may run: no dialog, no request an injected htmx attribute would make (/healthz),
no element with an injected attribute, no CSP violation.

The Content-Security-Policy would stop most of these even if escaping failed, so the test looks
at the DOM itself (is there an on*="" / hx-on / hx-get="/healthz" attribute, a javascript: link,
an <img>/<script> that no template writes?) rather than only at dialogs.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from urllib.parse import quote, urlencode, urlsplit

import psycopg
import pytest
from playwright.sync_api import Page, expect
from psycopg import sql

from console import audit, samples
from console import queue as q
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.samples import Sample
from tests.web_fixtures import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CORPUS = [
    '"><img src=x onerror=alert("img")>',
    "'><svg onload=alert('svg')>",
    '" hx-get="/healthz" hx-trigger="load" data-x="',
    "' hx-get='/healthz' hx-trigger='load' data-x='",
    "x hx-trigger=load hx-get=/healthz hx-on::before-request=alert(3) y",
    "javascript:alert('js')",
    '<script>alert("script")</script>',
    "</title></textarea></code><svg/onload=alert(1)>",
    "{{7*7}}",
    '<a href="javascript:alert(7)">x</a>',
]
# The issue's link: a dead letter's payload that closes the filter's value="..." (tojson left " alone).
ISSUE_PAYLOAD = {"subject": "x hx-trigger=load hx-get=/healthz hx-on::before-request=alert(1) y"}
NO_SPACES = [bad for bad in CORPUS if " " not in bad]
CHART_QUEUES = [CORPUS[i] for i in (0, 1, 6, 7, 9)]

INJECTED = """() => {
  const found = [];
  for (const el of document.querySelectorAll("*")) {
    for (const a of el.attributes) {
      const n = a.name.toLowerCase(), v = a.value.trim().toLowerCase();
      const html = el.namespaceURI === "http://www.w3.org/1999/xhtml";  // an SVG <text> has a y=""
      if (n.startsWith("on") || n.startsWith("hx-on") || (html && n === "y") || n === "data-x") found.push(el.tagName + "[" + n + "]");
      if (n === "hx-get" && v === "/healthz") found.push(el.tagName + "[hx-get=/healthz]");
      if (["href", "src", "action", "formaction", "hx-get", "hx-post", "xlink:href"].includes(n) && v.startsWith("javascript:"))
        found.push(el.tagName + "[" + n + "=javascript:]");
    }
    if (el.tagName === "SCRIPT" && !el.src) found.push("inline <script>");
    if (["IMG", "IFRAME", "OBJECT", "EMBED"].includes(el.tagName)) found.push("<" + el.tagName.toLowerCase() + ">");
    if (el.tagName === "svg" && !/\\b(chart|progress)\\b/.test(el.getAttribute("class") || "")) found.push("<svg> no template draws");
  }
  return found;
}"""

COLLECT = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sample || ""));
});
"""


@pytest.fixture
def hostile(conn, web_app, personas):
    """Every echoing field carries the corpus. Returns ids to visit."""
    dead = []
    for bad in CORPUS:
        q.enqueue(conn, bad, {"subject": bad, "note": bad}, queue=bad, max_attempts=1)
        q.enqueue(conn, bad, {"subject": bad}, queue=bad, run_at=None)  # a pending one too
    q.enqueue(conn, "send_mail", ISSUE_PAYLOAD, queue="mail", max_attempts=1)
    for bad in CORPUS + ["mail"]:
        for job in q.claim(conn, "worker-" + bad[:20], queues=[bad], limit=1, lease=60):
            q.fail(conn, job, RuntimeError(f"{bad} (payload {json.dumps(job.payload)})"))
            dead.append(job.id)

    now = conn.execute("SELECT now()").fetchone()[0]
    rows = [Sample("queue_age_seconds", {"queue": bad}, 5000.0, now) for bad in CORPUS]
    # the overview draws one line per queue (with the name in the SVG's <title> and the legend)
    # for at most charts.MAX_LINES queues: two points each for five of the strings
    for bad in CHART_QUEUES:
        for at in (now - timedelta(minutes=2), now):
            rows += [Sample("queue_depth", {"queue": bad, "state": "eligible"}, 12.0, at),
                     Sample("queue_depth", {"queue": bad, "state": "failed"}, 1.0, at),
                     Sample("dead_letters", {"queue": bad}, 1.0, at)]
    samples.store(conn, rows)

    config = web_app.extensions["skiplock"].config
    r.save_destination(conn, {"name": "hook", "kind": "json", "url": "https://hooks.example/" + quote(NO_SPACES[0], safe="\"'<>=()/"),
                              "headers": {"X-Note": CORPUS[0]}}, actor="admin", config=config)
    r.save_rule(conn, {"name": "xss_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s",
                       "summary": "Queue {queue} waited: " + " | ".join(CORPUS)[:400],
                       "runbook": "https://wiki.example/runbook?q=" + quote(CORPUS[1], safe="'<>=()")}, actor="admin", config=config)
    ev.evaluate(conn, r.load(conn, config), ev.AlertSettings(), now=now)
    alert_id = conn.execute("SELECT id FROM skiplock.alerts ORDER BY id LIMIT 1").fetchone()[0]
    for bad in CORPUS:
        conn.execute("INSERT INTO skiplock.alert_deliveries (destination, outcome, http_status, error) VALUES ('hook', 'failed', 500, %s)",
                     (bad,))
        audit.record(conn, actor=bad, action=bad, target="queue:" + bad, reason=bad, selection={"payload": {"subject": bad}},
                     rows=1, detail={"note": bad})
        conn.execute("""INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, last_seen)
                        VALUES (%s, %s, 1, %s, 4, now())""", (bad, bad, [bad]))
    fingerprints = [row[0] for row in conn.execute(
        "SELECT DISTINCT error_fingerprint FROM skiplock.jobs WHERE status = 'failed'").fetchall()]
    return {"dead": dead, "alert_id": alert_id, "fingerprints": fingerprints}


@pytest.fixture
def lock_wait(dsn, hostile):
    """A session (application_name and query text from the corpus) waiting for a row lock that
    another one holds: the Database page draws both, names and queries, in its lock tree."""
    job_id = hostile["dead"][0]
    blocker = psycopg.connect(dsn, application_name=CORPUS[0][:63])
    blocker.execute(sql.SQL("SELECT {} AS note, id FROM skiplock.jobs WHERE id = {} FOR UPDATE").format(
        sql.Literal(CORPUS[7]), sql.Literal(job_id)))
    waiter = psycopg.connect(dsn, application_name=CORPUS[1][:63], autocommit=True)
    waiter.execute("SET statement_timeout = '120s'")
    statement = sql.SQL("UPDATE skiplock.jobs SET priority = priority WHERE id = {} AND {} IS NOT NULL").format(
        sql.Literal(job_id), sql.Literal(CORPUS[6]))
    thread = threading.Thread(target=lambda: waiter.execute(statement), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as probe:
        while not probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]:
            assert time.monotonic() < deadline, "the waiter never waited"
            time.sleep(0.05)
    yield
    blocker.rollback()
    thread.join(timeout=10)
    blocker.close()
    waiter.close()


@pytest.fixture
def watched(page: Page):
    page.set_default_timeout(15_000)
    page.add_init_script(COLLECT)
    page.dialogs = []
    page.healthz = []

    def on_dialog(dialog):
        page.dialogs.append(f"{page.url}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("request", lambda req: page.healthz.append(f"{page.url} -> {req.url}") if urlsplit(req.url).path == "/healthz" else None)
    return page


def paths_to_visit(data) -> list[str]:
    """The pages that show the seeded data, then every filter of every page with each string."""
    pages = ["/overview", "/queues", "/jobs", "/jobs?state=failed", "/deadletters", "/deadletters/jobs", "/audit",
             "/alerts", f"/alerts/{data['alert_id']}", "/alerts/rules", "/alerts/rules?edit=xss_age",
             "/alerts/destinations", "/alerts/destinations?edit=hook", "/alerts/deliveries", "/workers",
             "/maintenance", "/health", "/advisor", "/admin/users"]
    pages += [f"/jobs/{job_id}" for job_id in data["dead"]]
    pages += ["/deadletters/jobs?" + urlencode({"fingerprint": fp}) for fp in data["fingerprints"]]
    pages += ["/queues/" + quote(bad, safe="") for bad in CORPUS if "/" not in bad]
    for bad in CORPUS:
        payload = json.dumps({"subject": bad})
        pages += [
            "/jobs?" + urlencode({"queue": bad, "kind": bad, "fingerprint": bad, "payload": payload, "state": "failed"}),
            "/jobs?" + urlencode({"since": bad}),  # a 400 page that names the bad value
            "/jobs?" + urlencode({"payload": bad}),
            "/deadletters?" + urlencode({"queue": bad, "kind": bad}),
            "/deadletters/jobs?" + urlencode({"queue": bad, "kind": bad, "payload": payload}),
            "/deadletters/jobs?" + urlencode({"payload": bad}),
            "/audit?" + urlencode({"actor": bad, "action": bad}),
            "/audit?" + urlencode({"since": bad}),
            "/alerts/deliveries?" + urlencode({"destination": bad}),
            "/overview?" + urlencode({"window": bad}),
        ]
    return pages


def assert_clean(page: Page, where: str) -> None:
    page.wait_for_load_state("load")
    found = page.evaluate(INJECTED)
    violations = page.evaluate("window.__cspViolations || []")
    assert (found, violations, page.dialogs, page.healthz) == ([], [], [], []), where


def test_hostile_text_never_runs_in_any_page(watched: Page, live_server, hostile, lock_wait):
    page, base = watched, live_server

    # the sign-in page echoes ?next= and the name
    page.goto(base + "/login?" + urlencode({"next": CORPUS[2]}))
    assert_clean(page, "/login")
    page.fill("input[name=name]", CORPUS[0])
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert_clean(page, "/login after a failed sign-in")
    page.goto(base + "/login")
    page.fill("input[name=name]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)

    statuses = {}
    for path in paths_to_visit(hostile):
        response = page.goto(base + path)
        statuses[path] = response.status if response else None
        assert_clean(page, path)
    assert all(status in (200, 400) for status in statuses.values()), {p: s for p, s in statuses.items() if s not in (200, 400)}

    # the lock tree did show the sessions' names and queries (as text)
    page.goto(base + "/health")
    expect(page.locator("#panel-locks")).to_contain_text(CORPUS[0])
    expect(page.locator("#panel-locks")).to_contain_text("</title></textarea>")
    assert_clean(page, "/health with a lock wait")

    # template syntax in data is text, never evaluated
    page.goto(base + "/deadletters/jobs")
    expect(page.locator("main")).to_contain_text("{{7*7}}")

    # the issue's link: the payload filter stays one value, and "Replay all 1…" previews exactly that job
    page.goto(base + "/deadletters/jobs?" + urlencode({"payload": json.dumps(ISSUE_PAYLOAD)}))
    assert_clean(page, "the issue's link")
    page.locator("form.actions.bar button[value=replay]").click()
    expect(page.locator("h2[data-total]")).to_have_attribute("data-total", "1")
    assert_clean(page, "the replay preview of the issue's payload")
    assert page.healthz == [] and page.dialogs == []
