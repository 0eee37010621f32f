"""From a page to the offending jobs in two clicks, in real Chromium. For each kind of alert
(queue age, dead letters, stuck leases, xmin horizon holder, lock waits, an advisor-backed
alert, a late periodic job): the database holds the offending work, the default rule fires
through the evaluator, its webhook is delivered to a real local receiver, and the test follows
the payload's own links: the alert page (`console_url`), then at most one more click on "look
here" — and the page that opens lists the offending job ids (or names the holder's pid and
application, the blocking session and the one it blocks, the failing check with its evidence,
the late entry), and not the innocent ones."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from playwright.sync_api import Page, expect

from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from console.queue import periodic
from tests.alert_links_data import deliver, fire_default
from tests.alert_receiver import Receiver
from tests.oncall_data import make_dead_letters

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
def signed_in(page_as) -> Page:
    page = page_as("viewer")  # the login form has its own tests; these are about the links
    page.set_default_timeout(15_000)
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


def wait_until_waiting(conn, pid: int, timeout: float = 10.0) -> None:
    """Until session `pid` waits on a heavyweight lock (it has sent its statement)."""
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != ("Lock",):
        assert time.monotonic() < deadline, f"session {pid} never started waiting on a lock"
        time.sleep(0.05)


def test_lock_wait_alert_leads_to_the_blocking_tree(signed_in: Page, live_server, conn, dsn):
    job, other = (q.enqueue(conn, "charge", {}, queue="billing") for _ in range(2))
    blocker = psycopg.connect(dsn, application_name="month-end-report")
    bystander = psycopg.connect(dsn, application_name="bystander")  # holds a row lock nobody wants
    waiter = psycopg.connect(dsn, application_name="worker-3", autocommit=True)
    waiter.execute("SET lock_timeout = '30s'")  # the waiting thread ends even if the test does not
    update = threading.Thread(target=lambda: waiter.execute(
        "UPDATE skiplock.jobs SET priority = priority + 1 WHERE id = %s", (job,)), daemon=True)
    try:
        blocker.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (job,))
        bystander.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (other,))
        update.start()
        wait_until_waiting(conn, waiter.info.backend_pid)
        document = page_payload(conn, live_server, "jobs_lock_waits", {"relation": "jobs"}, 1)
        follow(signed_in, document)
        assert "/health" in signed_in.url and signed_in.url.endswith("#panel-locks")
        root = signed_in.locator(f"#panel-locks #blocking-tree > li[data-pid='{blocker.info.backend_pid}']")
        expect(root).to_contain_text("month-end-report")
        blocked = root.locator(f"li[data-pid='{waiter.info.backend_pid}']")
        expect(blocked).to_contain_text("worker-3")
        expect(blocked).to_contain_text("UPDATE skiplock.jobs")
        expect(signed_in.locator(f"#panel-locks [data-pid='{bystander.info.backend_pid}']")).to_have_count(0)
    finally:
        blocker.close()  # its transaction ends: the waiting update goes through
        update.join(10)
        waiter.close()
        bystander.close()


def test_advisor_backed_alert_opens_the_check_with_its_evidence(signed_in: Page, live_server, conn):
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")  # every claim now reads and sorts the pending rows
    document = page_payload(conn, live_server, "claim_latency_p95", {"queue": "all"}, 0.9)
    follow(signed_in, document)
    assert "/advisor?check=claim-plan" in signed_in.url and signed_in.url.endswith("#check-claim-plan")
    check = signed_in.locator("#check-claim-plan")
    expect(check).to_have_attribute("data-status", "fail")
    evidence = check.locator(".check-evidence")
    expect(evidence).to_be_visible()
    expect(evidence).to_contain_text("no index on skiplock.jobs has a status = 'pending' predicate")
    expect(signed_in.locator("tr[data-check]")).to_have_count(1)  # that check, not the whole checklist


def test_periodic_job_alert_opens_the_entry(signed_in: Page, live_server, conn):
    declared = periodic.parse_entries([
        ("[[periodic]] #1", {"name": "nightly-report", "kind": "reports.build", "cron": "0 3 * * *"}, "config"),
        ("[[periodic]] #2", {"name": "cleanup", "kind": "cleanup", "every": "10m"}, "config")])
    periodic.sync(conn, declared)
    conn.execute("UPDATE skiplock.periodic SET created_at = now() - interval '3 days' WHERE name = 'nightly-report'")
    document = page_payload(conn, live_server, "periodic_late", {"name": "nightly-report"}, 3.0)
    follow(signed_in, document)
    assert signed_in.url.endswith("/periodic#entry-nightly-report")
    entry = signed_in.locator("#entry-nightly-report")
    expect(entry).to_contain_text("nightly-report")
    expect(entry.locator(".badge")).to_have_text("late")
    expect(signed_in.locator("#entry-cleanup .badge")).to_have_text("active")  # the innocent one is not late
