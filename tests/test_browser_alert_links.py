"""From a page to the offending jobs in two clicks, in real Chromium. For each kind of alert
(queue age, dead letters, stuck leases, xmin horizon holder): the database holds the offending
work, the default rule fires through the evaluator, its webhook is delivered to a real local
receiver, and the test follows the payload's own links: the alert page (`console_url`), then
at most one more click on "look here" — and the page that opens lists the offending job ids
(or names the holder's pid and application), and not the innocent ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from playwright.sync_api import Page, expect

from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from tests.alert_links_data import deliver, fire_default
from tests.alert_receiver import Receiver
from tests.oncall_data import make_dead_letters
from tests.test_browser_oncall import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def page_payload(conn, live_server, rule: str, labels: dict, value: float) -> dict:
    """Fire `rule` and deliver its webhook to a local receiver; return the delivered document."""
    settings = ev.AlertSettings(console_url=live_server, allow_private_destinations=True)  # receiver on loopback
    with Receiver() as rx:
        destinations = {"oncall": parse_destination({"name": "oncall", "url": rx.url, "kind": "json"})}
        fire_default(conn, rule, labels, value, destinations=destinations, settings=settings)
        assert deliver(conn, destinations, settings).delivered == 1
        (document,) = rx.json_bodies()
    assert document["event"] == "firing" and document["alert"]["look_here"][0]["url"].startswith(live_server)
    return document


def follow(page: Page, document: dict) -> None:
    """Open the payload's alert link, then click the first "look here" link (one click)."""
    page.goto(document["console_url"])
    links = page.locator("#look-here a[data-look-here]")
    expect(links.filter(has_text=document["alert"]["look_here"][0]["label"])).to_have_count(1)  # same as the payload's
    links.first.click()
    page.wait_for_load_state()


def shown_job_ids(page: Page, selector: str) -> set[int]:
    return {int(t) for t in page.locator(selector).all_inner_texts() if t.strip().isdigit()}


@pytest.fixture
def signed_in(page: Page, live_server, personas):
    page.set_default_timeout(15_000)
    sign_in(page, live_server, "viewer")
    return page


def test_queue_age_alert_leads_to_the_queues_eligible_jobs(signed_in: Page, live_server, conn):
    now = datetime.now(UTC)
    waiting = [q.enqueue(conn, "reindex", {"n": i}, queue="search", run_at=now - timedelta(seconds=62 - i))
               for i in range(3)]
    later = q.enqueue(conn, "reindex", {"n": 9}, queue="search", run_at=now + timedelta(hours=1))
    elsewhere = q.enqueue(conn, "send", {}, queue="mail")
    document = page_payload(conn, live_server, "queue_age", {"queue": "search"}, 420)
    follow(signed_in, document)
    assert "/jobs?" in signed_in.url and "eligible=1" in signed_in.url
    expect(signed_in.locator("#jobs-table")).to_be_visible()
    shown = shown_job_ids(signed_in, "#jobs-table tbody td.num a")
    assert shown == set(waiting), (shown, waiting)
    assert later not in shown and elsewhere not in shown


def test_dead_letter_alert_leads_to_the_failed_jobs(signed_in: Page, live_server, conn):
    dead = make_dead_letters(conn, smtp=2, card=3, queue_smtp="mail", queue_card="billing")
    document = page_payload(conn, live_server, "dead_letter_growth", {"queue": "billing"}, 540)
    follow(signed_in, document)  # the new error group of billing (first seen just now)
    assert "/deadletters/jobs?" in signed_in.url
    rows = signed_in.locator("tr[data-job]")
    expect(rows).to_have_count(3)
    shown = {int(v) for v in (rows.nth(i).get_attribute("data-job") for i in range(3))}
    assert shown == set(dead["card"]) and not shown & set(dead["smtp"])


def test_dead_letter_payload_link_lists_the_groups_then_one_click_to_the_jobs(signed_in: Page, live_server, conn):
    dead = make_dead_letters(conn, smtp=2, card=3, queue_smtp="mail", queue_card="billing")
    document = page_payload(conn, live_server, "dead_letter_growth", {"queue": "billing"}, 540)
    groups_link = next(link for link in document["alert"]["look_here"] if link["path"].startswith("/deadletters?"))
    signed_in.goto(groups_link["url"])  # the error groups of billing, straight from the payload
    signed_in.locator("#groups tbody tr").first.locator("a", has_text="jobs").first.click()
    rows = signed_in.locator("tr[data-job]")
    expect(rows).to_have_count(3)
    assert {int(rows.nth(i).get_attribute("data-job")) for i in range(3)} == set(dead["card"])


def test_stuck_lease_alert_leads_to_the_running_jobs_with_expired_leases(signed_in: Page, live_server, conn):
    for _ in range(3):
        q.enqueue(conn, "crunch", {}, queue="work")
    claimed = q.claim(conn, "worker-7", queues=["work"], limit=3, lease=600)
    stuck, healthy = [j.id for j in claimed[:2]], claimed[2].id
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '5 minutes' WHERE id = ANY(%s)", (stuck,))
    document = page_payload(conn, live_server, "stuck_leases", {"queue": "work"}, 2)
    follow(signed_in, document)
    assert "lease=expired" in signed_in.url
    expect(signed_in.locator("#jobs-table")).to_be_visible()
    shown = shown_job_ids(signed_in, "#jobs-table tbody td.num a")
    assert shown == set(stuck) and healthy not in shown


def test_xmin_horizon_alert_leads_to_the_holder(signed_in: Page, live_server, conn, dsn):
    holder = psycopg.connect(dsn, application_name="nightly-report")
    try:
        holder.execute("SELECT txid_current()")  # an open transaction with an xid: it holds the horizon
        pid = holder.info.backend_pid
        document = page_payload(conn, live_server, "vacuum_blocked", {"holder": "any"}, 900)
        follow(signed_in, document)
        assert "/health" in signed_in.url and signed_in.url.endswith("#panel-holders")
        panel = signed_in.locator("#panel-holders")
        expect(panel).to_contain_text(str(pid))
        expect(panel).to_contain_text("nightly-report")
    finally:
        holder.close()
