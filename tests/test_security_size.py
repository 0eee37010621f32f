"""Issue 26, class 9: size as an attack. A producer decides how many queues, kinds, error
groups and tenants there are; no page, poll, API answer or /metrics may grow with that.

One database per module, seeded once as a careless producer leaves it (tests/fleet_data.py:
5,000 queues, 2,000 kinds, 1,001 error groups, a stuck lease on every tenth queue), with the
samples one collection cycle stores and the alerts the default rules raise from them; each
test reads a copy. Before: the overview was 11 MB, the alerts page 17 MB, the queues page
5.8 MB and /metrics 4.9 MB (docs/benchmarks.md). The tests assert bounds (bytes, rows, the
"N more" counts and that nothing is lost from the totals), never times.
"""

from __future__ import annotations

import os
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.db import connect
from tests.conftest import dsn_for
from tests.fleet_data import SHARED_GROUP, seed_fleet

QUEUES, KINDS, GROUPS = 5000, 2000, 1000
WORST = "fleet-05000"  # stuck, and its job has waited longest


@pytest.fixture(scope="module")
def fleet_template(admin_dsn, template_db):
    """A database with the fleet, its samples and its alerts, for the tests to copy."""
    from console.alerts import evaluate, rules
    from console.collectors import collect_once
    from console.config import load_config

    name = f"fleet_{os.getpid()}"
    with connect(admin_dsn) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    dsn = dsn_for(admin_dsn, name)
    with connect(dsn) as conn:
        assert seed_fleet(conn, queues=QUEUES, kinds=KINDS, groups=GROUPS) == \
            {"queues": QUEUES, "kinds": KINDS, "groups": GROUPS + 1}
    collect_once(dsn)
    with connect(dsn) as conn:
        config = load_config(env={})
        evaluate.evaluate(conn, rules.load(conn, config), evaluate.AlertSettings.from_config(config))
    yield name
    with connect(admin_dsn) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(make_database, fleet_template):
    return make_database(template=fleet_template)


def rows_of(html: str, attribute: str) -> list[str]:
    return re.findall(rf'{attribute}="([^"]*)"', html)


def more_of(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-more="(\d+)"', html)]


def active_alerts(conn) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.alerts WHERE state IN ('pending', 'firing')").fetchone()[0]


# --- the queues ----------------------------------------------------------------------------------

def test_the_queues_page_shows_the_worst_hundred_and_counts_the_rest(client_as):
    viewer = client_as("viewer")
    for url in ("/queues", "/queues/_table"):
        page = viewer.get(url)
        html = page.get_data(as_text=True)
        assert page.status_code == 200 and len(page.data) < 300_000, (url, len(page.data))
        shown = re.findall(r'<td><a href="/queues/(fleet-\d+)">', html)
        assert len(shown) == 100 and shown[0] == WORST, (url, shown[:3])
        assert all(int(q[6:]) % 10 == 0 for q in shown[:50])  # the stuck ones first, the oldest of them first
        assert "4,900 more queues not shown" in html and 'href="/queues?page=2"' in html
    last = viewer.get("/queues?page=50").get_data(as_text=True)
    assert len(re.findall(r'<td><a href="/queues/(fleet-\d+)">', last)) == 100 and "‹ page 49" in last
    assert "page 51" not in last


def test_a_search_finds_any_queue_beyond_the_first_page(client_as):
    viewer = client_as("viewer")
    html = viewer.get("/queues?q=FLEET-0001").get_data(as_text=True)
    shown = re.findall(r'<td><a href="/queues/(fleet-\d+)">', html)
    assert sorted(shown) == [f"fleet-{n:05d}" for n in range(10, 20)]
    assert "10 of 5,000 queues match" in html
    assert "No queue's name contains" in viewer.get("/queues?q=nothing-like-this").get_data(as_text=True)
    assert viewer.get("/queues/fleet-00001").status_code == 200  # the best queue still has its page


def test_the_queues_api_pages_and_refuses_an_unbounded_limit(client_as):
    viewer = client_as("viewer")
    body = viewer.get("/api/v1/queues").get_json()
    assert len(body["queues"]) == 100 and body["queues"][0]["queue"] == WORST
    assert (body["total"], body["more"], body["next_page"], body["pages"]) == (QUEUES, 4900, 2, 50)
    everything = viewer.get("/api/v1/queues?limit=1000&page=5").get_json()
    assert len(everything["queues"]) == 1000 and everything["next_page"] is None
    for bad in ("limit=1001", "limit=0", "page=0", "page=x", "q=" + "a" * 201):
        answer = viewer.get(f"/api/v1/queues?{bad}")
        assert answer.status_code == 400 and bad.split("=")[0] in answer.get_json()["error"], bad


# --- the overview -----------------------------------------------------------------------------

def test_the_overview_and_its_polls_stay_small_and_say_what_they_leave_out(client_as, conn):
    viewer = client_as("viewer")
    alerts = active_alerts(conn)
    assert alerts > 5000  # one per late queue and more: the default rules judged every queue
    page = viewer.get("/overview")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and len(page.data) < 150_000, len(page.data)
    queues = rows_of(html, "data-queue")
    assert len(queues) == 20 and queues[0] == WORST
    assert "4,980 more queues not shown" in html and f"all {QUEUES:,} queues" in html
    assert len(rows_of(html, "data-alert-state")) == 20 and f"{alerts - 20:,} more alerts not shown" in html
    reasons = rows_of(html, "data-reason-panel")
    assert len(reasons) == 10 and "more reasons" in html
    for poll, bound in (("/overview/_verdict", 60_000), ("/overview/_queues", 30_000), ("/overview/_figures", 60_000)):
        answer = viewer.get(poll)
        assert answer.status_code == 200 and len(answer.data) < bound, (poll, len(answer.data))
    assert max(more_of(viewer.get("/overview/_queues").get_data(as_text=True))) == QUEUES - 20


def test_the_overview_api_is_bounded_and_counts_everything(client_as, conn):
    body = client_as("viewer").get("/api/v1/overview").get_json()
    assert len(body["queues"]) == 20 and body["queues_total"] == QUEUES
    assert len(body["alerts"]) == 20 and body["alerts_total"] == active_alerts(conn)
    verdict = body["verdict"]
    assert len(verdict["why"]) == 10 and verdict["why_more"] > 5000 and verdict["state"] == "failing"
    assert len(verdict["reasons"]) == 10


# --- dead letters, alerts ---------------------------------------------------------------------

def test_the_dead_letters_page_pages_the_groups_and_names_few_queues_and_kinds_per_group(client_as):
    viewer = client_as("viewer")
    html = viewer.get("/deadletters").get_data(as_text=True)
    groups = rows_of(html, "data-fingerprint")
    assert len(groups) == 100 and groups[0] == SHARED_GROUP
    assert f"{GROUPS + 1 - 100:,} more error groups not shown" in html
    shared = html.split(f'data-fingerprint="{SHARED_GROUP}"')[1].split("</tr>")[0]
    assert shared.count("fleet-") == 10 and "and 4,990 more" in shared  # queues
    assert shared.count("kind-") == 10 and f"and {KINDS - 10:,} more" in shared
    last = viewer.get("/deadletters?page=11").get_data(as_text=True)
    assert len(rows_of(last, "data-fingerprint")) == 1
    api = viewer.get("/api/v1/deadletters").get_json()
    assert (len(api["groups"]), api["total"], api["next_page"]) == (100, GROUPS + 1, 2)
    first = api["groups"][0]
    assert (len(first["queues"]), first["queue_count"], len(first["kinds"]), first["kind_count"]) == (10, QUEUES, 10, KINDS)


def test_the_alerts_page_and_api_page_through_thousands_of_alerts(client_as, conn):
    viewer = client_as("viewer")
    alerts = active_alerts(conn)
    page = viewer.get("/alerts")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and len(page.data) < 400_000, len(page.data)
    assert len(rows_of(html, "data-alert-id")) == 100 and f"{alerts - 100:,} more alerts not shown" in html
    api = viewer.get("/api/v1/alerts").get_json()
    assert len(api["alerts"]) == 100 and api["total"] == alerts == api["firing"] + api["pending"]
    found = viewer.get(f"/api/v1/alerts?q=queue={WORST}").get_json()
    assert found["total"] >= 2 and all(a["labels"]["queue"] == WORST for a in found["alerts"])
    second = viewer.get("/api/v1/alerts?page=2").get_json()["alerts"]
    assert not {a["id"] for a in second} & {a["id"] for a in api["alerts"]}


# --- /metrics ----------------------------------------------------------------------------------

def scrape(client) -> tuple[int, dict]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    return len(answer.data), {f.name: f for f in text_string_to_metric_families(answer.data.decode())}


def test_metrics_keep_the_worst_queues_fold_the_rest_and_lose_nothing(web_app, conn):
    size, families = scrape(web_app.test_client())
    assert size < 1_000_000, size
    depth = families["skiplock_queue_depth"].samples
    queues = {s.labels["queue"] for s in depth}
    assert len(queues - {"_other"}) == 200 and "_other" in queues and WORST in queues
    eligible = sum(s.value for s in depth if s.labels["state"] == "eligible")
    assert eligible == QUEUES  # the folded queues' jobs are counted under _other, not dropped
    dead = sum(s.value for s in families["skiplock_dead_letters"].samples)
    assert dead == conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0]
    ages = {s.labels["queue"]: s.value for s in families["skiplock_queue_age_seconds"].samples}
    # fleet-04999 (not stuck, so folded) has waited almost as long as the worst: _other is the
    # worst of the folded queues, not a sum and not lost
    assert 4990 < ages["_other"] <= ages[WORST]
    dropped = {s.labels["metric"]: s.value for s in families["skiplock_metrics_series_dropped"].samples}
    per_queue = sum(1 for s in depth if s.labels["queue"] == WORST)
    assert dropped["queue_depth"] == per_queue * (QUEUES - 200) and dropped["queue_age_seconds"] == QUEUES - 200
    assert families["skiplock_metrics_queue_series_limit"].samples[0].value == 200
    assert families["skiplock_metrics_queues_folded"].samples[0].value == QUEUES - 200


def test_the_metrics_policy_follows_its_setting(web_settings, dsn):
    from console.web import create_app

    app = create_app({**web_settings, "web.metrics_queue_series": 10})
    try:
        size, families = scrape(app.test_client())
    finally:
        app.extensions["skiplock"].close()
    assert size < 150_000
    assert len({s.labels["queue"] for s in families["skiplock_queue_age_seconds"].samples} - {"_other"}) == 10
    assert families["skiplock_metrics_queues_folded"].samples[0].value == QUEUES - 10
