"""The metric -> "look here" mapping (console/alerts/links.py): pure, one case per kind of
trouble, and a guard that every default rule's metric (and every catalogued metric) leads
somewhere."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from console.alerts import links
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.rules import DERIVED_METRICS
from console.catalog import METRICS

BASE = "https://console.example/skiplock"
ROOT = Path(__file__).resolve().parents[1]


def first(metric: str, labels: dict | None = None, console_url: str = "") -> links.Link:
    found = links.look_here(metric, labels or {}, console_url)
    assert found, f"{metric} maps to nothing"
    return found[0]


def query(path: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(path).query)


@pytest.mark.parametrize("rule", DEFAULT_RULES, ids=lambda r: r.name)
def test_every_default_rule_leads_somewhere(rule):
    found = links.look_here(rule.metric, rule.labels, BASE)
    assert found, f"default rule {rule.name!r} (metric {rule.metric}) has no look-here link: add one in console/alerts/links.py"
    for link in found:
        assert link.path.startswith("/") and link.label
        assert link.url == BASE + link.path


@pytest.mark.parametrize("metric", sorted([*METRICS, *DERIVED_METRICS]))
def test_every_catalogued_metric_leads_somewhere(metric):
    assert links.look_here(metric, {}), f"{metric} has no look-here link"


def test_database_page_links_land_on_a_panel_that_is_always_rendered():
    # #blocking-tree and #horizon-holders exist only while someone waits or holds: a link that
    # names them lands at the top of the page once the trouble has passed; a panel is always there.
    panels = set(re.findall(r'id="(panel-[a-z]+)"', (ROOT / "templates/health/_panels.html").read_text()))
    targets = {urlsplit(link.path).fragment for metric in [*METRICS, *DERIVED_METRICS]
               for link in links.look_here(metric, {}) if link.path.startswith("/health")}
    assert targets and targets <= panels, sorted(targets - panels)


def test_queue_age_leads_to_that_queues_eligible_jobs_oldest_first_then_why_it_is_not_moving():
    found = links.look_here("queue_age_seconds", {"queue": "search"}, BASE)
    jobs, why = found[0], found[1]
    assert urlsplit(jobs.path).path == "/jobs"
    assert query(jobs.path) == {"state": ["pending"], "queue": ["search"], "eligible": ["1"]}
    assert "oldest first" in jobs.label and "search" in jobs.label
    assert why.path == "/queues/search#why" and why.label.startswith("Why queue search is not moving")
    assert jobs.url == f"{BASE}{jobs.path}"
    assert links.look_here("queue_age_seconds", {})[1].path == "/queues"  # no one queue: the list


def test_the_alerts_whose_page_shows_why_their_queue_waits():
    assert links.why_queue("queue_age_seconds", {"queue": "search"}) == "search"
    assert links.why_queue("stuck_leases", {"queue": "mail"}) == "mail"
    assert links.why_queue("queue_depth", {"queue": "mail", "state": "failed"}) is None  # dead letters
    assert links.why_queue("queue_age_seconds", {"queue": "all"}) is None
    assert links.why_queue("queue_age_seconds", {"queue": "q", "external": "pgq"}) is None
    assert links.why_queue("dead_letters", {"queue": "mail"}) is None


def test_queue_names_are_encoded():
    found = links.look_here("queue_age_seconds", {"queue": "a b/&c"})
    assert query(found[0].path)["queue"] == ["a b/&c"]
    assert found[1].path == "/queues/a%20b%2F%26c#why"


def test_queue_depth_follows_the_state_label():
    assert query(first("queue_depth", {"queue": "q", "state": "running"}).path)["state"] == ["running"]
    assert first("queue_depth", {"queue": "q", "state": "failed"}).path.startswith("/deadletters?queue=q")
    assert query(first("queue_depth", {"queue": "q", "state": "eligible"}).path)["eligible"] == ["1"]


def test_stuck_leases_lead_to_running_jobs_with_expired_leases():
    link = first("stuck_leases", {"queue": "mail"})
    assert urlsplit(link.path).path == "/jobs"
    assert query(link.path) == {"state": ["running"], "queue": ["mail"], "lease": ["expired"]}
    assert query(first("stuck_lease_age_seconds", {"queue": "mail"}).path)["lease"] == ["expired"]


def test_dead_letter_alerts_lead_to_the_queues_error_groups_then_its_dead_letters():
    groups, jobs = links.look_here("dead_letter_growth", {"queue": "billing"})[:2]
    assert groups.path == "/deadletters?queue=billing#groups"
    assert jobs.path == "/deadletters/jobs?queue=billing"
    assert first("dead_letters", {"queue": "billing"}).path == groups.path


def test_horizon_and_lock_alerts_lead_to_the_database_page_anchors():
    assert first("xmin_horizon_age_seconds", {"holder": "any"}).path == "/health#panel-holders"
    assert first("vacuum_removed_nothing", {"table": "jobs"}).path == "/health#panel-holders"
    assert first("lock_waits", {"relation": "jobs"}).path == "/health#panel-locks"
    assert first("lock_wait_max_seconds").path == "/health#panel-locks"


def test_advisor_backed_alerts_open_the_check_with_its_evidence():
    link = first("multixact_consumption_per_second")
    assert link.path == "/health#panel-slru"
    advisor = links.look_here("multixact_consumption_per_second", {})[1]
    assert advisor.path == "/advisor?check=multixact#check-multixact"
    assert first("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": "p95"}).path \
        == "/advisor?check=claim-plan#check-claim-plan"


def test_periodic_hook_maps_the_prefix():
    assert first("periodic_late_seconds", {"entry": "nightly"}).path == "/periodic#entry-nightly"


def test_unknown_metric_and_no_console_url():
    assert links.look_here("no_such_metric", {}) == []
    assert links.look_here(None, None) == []
    assert first("stuck_leases", {"queue": "q"}).url is None
    assert links.absolute("https://c.example/", "/jobs") == "https://c.example/jobs"


def test_an_external_queues_alerts_open_its_own_page_filtered_to_the_queue():
    """Queue age, stuck work and dead-letter growth of a queue Skiplock did not create: its page
    (/external/<name>) filtered to that queue, at the dead letters for a dead-letter alert, then
    the source's other queues; never Skiplock's own /jobs or /deadletters, which do not show it."""
    labels = {"queue": "emails", "system": "pg-boss", "external": "boss"}
    for metric, fragment in (("queue_age_seconds", "external-source"), ("stuck_leases", "external-source"),
                             ("dead_letter_growth", "external-dead-letters"), ("dead_letters", "external-dead-letters")):
        found = links.look_here(metric, labels, BASE)
        page, every = found[0], found[1]
        assert urlsplit(page.path).path == "/external/boss" and query(page.path) == {"queue": ["emails"]}, metric
        assert urlsplit(page.path).fragment == fragment, metric
        assert "emails" in page.label and "boss (pg-boss)" in page.label
        assert every.path == "/external/boss" and page.url == BASE + page.path
    assert [link.path for link in links.look_here("queue_depth", {"state": "failed", "queue": "a b", "external": "x"})][0] == \
        "/external/x?queue=a+b#external-dead-letters"
    assert links.look_here("external_source_errors", {"system": "bullmq", "external": "bq"})[0].path == \
        "/external/bq#external-source"
