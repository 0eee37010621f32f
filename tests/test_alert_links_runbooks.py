"""No dead end on the incident path: alert -> look here -> runbook. For every default rule, its
runbook link (on the rules page, on the alert's page, in the overview's firing-alert row and in
its webhook payload) opens a page of the console that has the rule's section, and every link on
the alert's page answers (no 404) and lands on an element with the link's #fragment. The
overview row's "details" opens that alert. With `[alerts] runbook_base_url` set, the runbook
links point there instead, on the pages and in the messages alike."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest

from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.rules import parse_destination
from console.queue import periodic
from tests.alert_links_data import deliver, fire_default
from tests.alert_receiver import Receiver
from tests.oncall_data import make_dead_letters

# The labels each default rule fires with here (a new default rule fires with none).
LABELS: dict[str, dict[str, str]] = {
    "queue_age": {"queue": "search"},
    "stuck_leases": {"queue": "work"},
    "dead_letter_growth": {"queue": "billing"},
    "claim_latency_p95": {"queue": "all"},
    "periodic_late": {"name": "nightly-report"},
    "autovacuum_behind": {"table": "jobs"},
    "vacuum_blocked": {"holder": "any"},
    "jobs_lock_waits": {"relation": "jobs"},
    "wraparound_age": {"table": "jobs", "part": "heap"},
    "replica_lag": {"standby": "replica-1"},
}


def firing_value(rule) -> float:
    """A value that meets the rule's condition: well over (or under) its threshold."""
    if rule.op in ("<", "<="):
        return rule.threshold - 1
    return rule.threshold * 3 + 1


class Page(HTMLParser):
    """The ids of a page and the hrefs of its links (with the link's data- attributes)."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        values = {k: v or "" for k, v in attrs}
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("href"):
            self.links.append(values)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


class Walker:
    """Follows links through the test client, once per page: each must answer 200 (after
    redirects), and a #fragment must name an element of the page it opens."""

    def __init__(self, client):
        self.client = client
        self.pages: dict[str, Page | None] = {}

    def open(self, path_and_query: str) -> Page | None:
        if path_and_query not in self.pages:
            response = self.client.get(path_and_query, follow_redirects=True)
            assert response.status_code == 200, f"{path_and_query} answers {response.status_code}"
            self.pages[path_and_query] = parse(response.get_data(as_text=True)) if response.mimetype == "text/html" else None
            response.close()
        return self.pages[path_and_query]

    def problem(self, base: str, href: str) -> str | None:
        """Why following `href` from the page at `base` is a dead end, or None."""
        parts = urlsplit(urljoin(f"http://console{base}", href))
        if parts.netloc != "console":
            return None  # another site: not ours to check
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            landed = self.open(target)
        except AssertionError as exc:
            return f"{href}: {exc}"
        if parts.fragment and (landed is None or parts.fragment not in landed.ids):
            return f"{href}: no element with id {parts.fragment!r} on {target}"
        return None


def seed(conn) -> None:
    """What the look-here pages show for these labels: the queues, the dead letters, the entry."""
    q.enqueue(conn, "reindex", {}, queue="search")
    q.enqueue(conn, "crunch", {}, queue="work")
    make_dead_letters(conn, smtp=1, card=2, queue_smtp="mail", queue_card="billing")
    declared = periodic.parse_entries([("[[periodic]] #1", {"name": "nightly-report", "kind": "reports.build",
                                                             "cron": "0 3 * * *"}, "config")])
    periodic.sync(conn, declared)


def fire(conn, rule, **kwargs) -> int:
    if rule.name == "collectors_stale":  # computed from the clock: the newest cycle ended 10 minutes ago
        conn.execute("INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms, collectors) "
                     "VALUES (now() - interval '10 minutes', now() - interval '10 minutes', 1, '{}')")
    return fire_default(conn, rule.name, LABELS.get(rule.name, {}), firing_value(rule), **kwargs)


def test_every_default_rules_runbook_link_opens_its_section(client_as, conn):
    walker = Walker(client_as("viewer"))
    rules = walker.open("/alerts/rules")
    runbooks = {urlsplit(link["href"]).fragment: link["href"] for link in rules.links if "data-runbook" in link}
    assert set(runbooks) == {rule.name for rule in DEFAULT_RULES}
    for rule in DEFAULT_RULES:
        assert runbooks[rule.name] == f"/docs/alerts.md#{rule.name}"
        assert walker.problem("/alerts/rules", runbooks[rule.name]) is None


@pytest.mark.slow
def test_every_link_on_every_default_alerts_page_answers_and_lands(client_as, conn):
    seed(conn)
    walker = Walker(client_as("viewer"))
    dead_ends, runbooks = [], 0
    # collectors_stale last: the stale cycle it inserts holds every sample-based rule after it.
    for rule in sorted(DEFAULT_RULES, key=lambda r: r.name == "collectors_stale"):
        alert_id = fire(conn, rule)
        here = f"/alerts/{alert_id}"
        page = walker.open(here)
        assert "look-here" in page.ids, f"{rule.name}: no look-here links"
        for link in page.links:
            runbooks += "data-runbook" in link
            if (problem := walker.problem(here, link["href"])) is not None:
                dead_ends.append(f"{rule.name} ({here}): {problem}")
    assert dead_ends == []
    assert runbooks == len(DEFAULT_RULES)  # each alert's page links its runbook


def test_the_overview_row_opens_the_alert_its_look_here_and_its_runbook(client_as, conn):
    seed(conn)
    alert_id = fire(conn, next(r for r in DEFAULT_RULES if r.name == "queue_age"))
    walker = Walker(client_as("viewer"))
    overview = walker.open("/overview")
    row = {link.get("data-look-here") is not None and "look" or "data-runbook" in link and "runbook"
           or "data-alert-details" in link and "details": link["href"] for link in overview.links}
    assert row["details"] == f"/alerts/{alert_id}"  # the alert, not the list of alerts
    assert row["runbook"] == "/docs/alerts.md#queue_age"
    assert row["look"] == "/jobs?state=pending&queue=search&eligible=1"
    for href in (row["details"], row["runbook"], row["look"]):
        assert walker.problem("/overview", href) is None


def test_the_webhooks_runbook_is_the_consoles_docs_page_under_console_url(client_as, conn):
    settings = ev.AlertSettings(console_url="https://console.example/skiplock/", allow_private_destinations=True)
    with Receiver() as rx:
        destinations = {"hook": parse_destination({"name": "hook", "url": rx.url, "kind": "json"}),
                        "chat": parse_destination({"name": "chat", "url": rx.url + "/slack", "kind": "slack"})}
        fire(conn, next(r for r in DEFAULT_RULES if r.name == "stuck_leases"), destinations=destinations,
             settings=settings)
        assert deliver(conn, destinations, settings).delivered == 2
        bodies = {r["path"]: json.loads(r["body"]) for r in rx.requests}
    url = "https://console.example/skiplock/docs/alerts.md#stuck_leases"
    assert bodies["/hook"]["alert"]["runbook"] == url
    assert f"<{url}|Runbook>" in bodies["/hook/slack"]["text"]
    path = url.removeprefix("https://console.example/skiplock")  # the console behind its /skiplock prefix
    assert Walker(client_as("viewer")).problem("/", path) is None


@pytest.fixture
def runbook_base(web_settings):
    web_settings["alerts.runbook_base_url"] = "https://runbooks.example/skiplock/"
    return web_settings


def test_with_a_runbook_base_url_the_links_go_there_on_the_pages_and_in_the_messages(runbook_base, client_as, conn):
    rule = next(r for r in DEFAULT_RULES if r.name == "queue_age")
    settings = ev.AlertSettings(console_url="https://console.example", runbook_base_url=runbook_base[
        "alerts.runbook_base_url"], allow_private_destinations=True)
    with Receiver() as rx:
        destinations = {"hook": parse_destination({"name": "hook", "url": rx.url, "kind": "json"})}
        alert_id = fire(conn, rule, destinations=destinations, settings=settings)
        deliver(conn, destinations, settings)
        (document,) = rx.json_bodies()
    url = "https://runbooks.example/skiplock/docs/alerts.md#queue_age"
    assert document["alert"]["runbook"] == url
    client = client_as("viewer")
    for path in (f"/alerts/{alert_id}", "/alerts", "/alerts/rules", "/overview"):
        page = parse(client.get(path).get_data(as_text=True))
        hrefs = {link["href"] for link in page.links if "data-runbook" in link}
        assert url in hrefs and not any(h.startswith("/docs/") for h in hrefs), (path, hrefs)
