"""The on-call path end to end in real Chromium: a failing queue on the overview, followed to
its dead letters, a group previewed and replayed with a reason, progress watched to the end,
a selection purged; the end state checked in the database and the audit log. A viewer sees no
action buttons and a forged POST is refused. Also takes the screenshots of the main pages, each
checked for what it must show (into docs/screenshots/ when SKIPLOCK_SCREENSHOTS=1, as
docs/console.md says; into a temporary folder otherwise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from console import maintenance as m
from console import queue as q
from tests.oncall_data import make_dead_letters, store_history, wait_audited
from tests.web_fixtures import PASSWORD


@pytest.fixture
def web_settings(web_settings):
    """A panel that says "not available" fails the screenshots; on a machine loaded by other
    suites the 2 s statement limit was what made one say it. These pictures are of the pages, not
    of that limit: give the page's queries room."""
    return {**web_settings, "database.statement_timeout_ms": 15000}


pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def sign_in(page: Page, base: str, name: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


def statuses(conn, ids) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM skiplock.jobs WHERE id = ANY(%s)", (list(ids),)).fetchall())


@pytest.fixture
def incident(conn, personas):
    """A failing billing queue (an hour of samples) and dead letters in two groups."""
    store_history(conn, failing="billing")
    dead = make_dead_letters(conn, smtp=6, card=3, queue_smtp="mail", queue_card="billing")
    for i in range(4):
        q.enqueue(conn, "charge_card", {"customer": 2000 + i, "amount_cents": 500}, queue="billing")
    return dead


def test_on_call_path_replay_then_purge(page: Page, live_server, conn, incident):
    dead = incident
    page.set_default_timeout(15_000)
    sign_in(page, live_server, "operator")

    # 1. the overview says the queue is failing and why
    page.goto(f"{live_server}/overview")
    verdict = page.locator(".verdict")
    expect(verdict).to_have_attribute("data-verdict", "failing")
    expect(verdict).to_contain_text("queue billing")
    expect(page).to_have_title("FAILING · Overview · Skiplock")

    # 2. follow the failing queue to its dead letters
    page.locator('tr[data-queue="billing"] >> text=triage →').click()
    page.wait_for_url("**/deadletters?queue=billing")
    group = page.locator("#groups tbody tr")
    expect(group).to_have_count(1)
    expect(group).to_contain_text("card declined")

    # 3. preview the group: exact count and sample, then replay with a reason
    group.locator("button[value=replay]").click()
    expect(page.locator("h2[data-total]")).to_have_attribute("data-total", "3")
    expect(page.locator("#confirm tbody tr")).to_have_count(3)
    page.fill("textarea[name=reason]", "payment provider outage over (INC-1042)")
    page.locator("#confirm button[data-confirm-action]").click()

    # 4. watch the progress finish (the bar polls until the operation is over)
    page.wait_for_url("**/deadletters/operations/*")
    expect(page.locator("section[data-state]")).to_have_attribute("data-state", "done", timeout=20_000)
    expect(page.locator("section[data-state]")).to_contain_text("they are pending again")

    assert statuses(conn, dead["card"]) == {i: "pending" for i in dead["card"]}
    assert statuses(conn, dead["smtp"]) == {i: "failed" for i in dead["smtp"]}
    replays = wait_audited(conn, "replay")
    assert {(r["outcome"], r["rows"], r["reason"], r["actor"]) for r in replays} == {
        ("started", 3, "payment provider outage over (INC-1042)", "operator"),
        ("ok", 3, "payment provider outage over (INC-1042)", "operator")}

    # 5. purge a selection: two ticked jobs of the SMTP group
    page.goto(f"{live_server}/deadletters")
    page.locator('#groups tr:has-text("SMTP") >> text=jobs').click()
    chosen = dead["smtp"][:2]
    for job_id in chosen:
        page.check(f"input[name=ids][value='{job_id}']")
    page.locator("#selection button[value=purge]").click()
    expect(page.locator("h2[data-total]")).to_have_attribute("data-total", "2")
    page.fill("textarea[name=reason]", "test messages sent to a fake address")
    page.locator("#confirm button[data-confirm-action]").click()
    expect(page.locator("section[data-state]")).to_have_attribute("data-state", "done", timeout=20_000)

    left = {r[0] for r in conn.execute("SELECT id FROM skiplock.jobs WHERE id = ANY(%s)", (dead["smtp"],)).fetchall()}
    assert left == set(dead["smtp"]) - set(chosen)
    assert statuses(conn, left) == {i: "failed" for i in left}
    purge_done = [r for r in wait_audited(conn, "purge") if r["outcome"] == "ok"]
    assert len(purge_done) == 1 and purge_done[0]["rows"] == 2
    assert purge_done[0]["selection"] == {"ids": sorted(chosen)}


def test_viewer_sees_no_actions_and_a_forged_post_is_refused(page: Page, live_server, conn, incident):
    dead = incident
    page.set_default_timeout(15_000)
    sign_in(page, live_server, "viewer")
    page.goto(f"{live_server}/deadletters")
    expect(page.locator("#groups tbody tr")).to_have_count(2)
    expect(page.locator("button[value=replay], button[value=purge]")).to_have_count(0)
    page.locator('#groups tr:has-text("SMTP") >> text=jobs').click()
    expect(page.locator("input[name=ids]")).to_have_count(0)
    expect(page.locator("button:has-text('Replay'), button:has-text('Purge')")).to_have_count(0)
    page.goto(f"{live_server}/maintenance")
    expect(page.locator("button:has-text('now')")).to_have_count(0)

    # a forged POST (no CSRF token) from the signed-in browser, and one with the token: both refused
    forged = page.request.post(f"{live_server}/deadletters/jobs/{dead['smtp'][0]}/purge", form={"next": "/deadletters"},
                               max_redirects=0)
    assert forged.status == 403
    token = page.locator("body").get_attribute("hx-headers")
    import json

    csrf = json.loads(token)["X-CSRF-Token"]
    as_viewer = page.request.post(f"{live_server}/deadletters/jobs/{dead['smtp'][0]}/purge",
                                  form={"csrf_token": csrf}, max_redirects=0)
    assert as_viewer.status == 403
    assert statuses(conn, dead["smtp"]) == {i: "failed" for i in dead["smtp"]}


def _realistic_extras(conn, dsn, dead) -> dict[str, int]:
    """Workers, maintenance runs, a bulk operation and audit rows, so every page has content."""
    conn.execute(
        """INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, started_at, last_seen, in_flight, claimed, completed, failed, retried)
           VALUES ('web-1:4312', 'web-1', 4312, '{default,mail}', 8, now() - interval '6 hours', now(), 1, 182340, 180110, 12, 211),
                  ('web-2:4388', 'web-2', 4388, '{default,mail}', 8, now() - interval '6 hours', now() - interval '2 seconds', 0, 179900, 178020, 9, 179),
                  ('billing-1:977', 'billing-1', 977, '{billing}', 4, now() - interval '2 hours', now() - interval '3 seconds', 2, 51200, 42010, 880, 39),
                  ('billing-2:1021', 'billing-2', 1021, '{billing}', 4, now() - interval '2 hours', now() - interval '4 minutes', 1, 49880, 41330, 845, 10)""")
    for worker, queue, n in (("web-1:4312", "default", 1), ("billing-1:977", "billing", 2), ("billing-2:1021", "billing", 1)):
        if queue == "default":
            q.enqueue(conn, "resize_image", {"image": "uploads/7781.png", "width": 640}, queue="default")
        q.claim(conn, worker, queues=[queue], limit=n, lease=300)
    m.reap(conn, actor="scheduler")
    m.reap(conn, actor="alice", reason="worker host web-3 was replaced")
    m.replay(dsn, {"ids": dead["smtp"][:2]}, actor="alice", reason="SMTP credentials rotated; retrying two receipts")
    m.archive_completed(conn, older_than=__import__("datetime").timedelta(hours=1), actor="scheduler")
    m.pause_queue(conn, "reports", actor="operator", reason="nightly export disabled during the incident")
    job = q.enqueue(conn, "render_report", {"report": "daily-sales", "format": "pdf", "recipients": ["cfo@example.com"]}, queue="reports")
    return {"job": job}


def test_screenshots_of_the_main_pages(page: Page, live_server, conn, dsn, incident, tmp_path):
    out = SHOTS if os.environ.get("SKIPLOCK_SCREENSHOTS", "") not in ("", "0") else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    extras = _realistic_extras(conn, dsn, incident)
    failed_job = incident["card"][0]
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.set_default_timeout(15_000)
    sign_in(page, live_server, "operator")
    # page -> (path, its heading, texts the page must show): a screenshot of an error page, an
    # empty table or a panel that says "not available" is a failure, not a picture.
    shots = {
        "overview": ("/overview", "Overview", ["queue billing", "failing"]),
        "queue": ("/queues/billing", "Queue billing", ["Oldest waiting", "Running", "Pause"]),
        "jobs": ("/jobs?state=failed", "Jobs", ["card declined", "SMTP server smtp.example.com timed out"]),
        "job-detail": (f"/jobs/{failed_job}", f"Job {failed_job}", ["card declined for customer", "charge_card"]),
        "deadletters": ("/deadletters", "Dead letters", ["card declined", "SMTP server"]),
        "workers": ("/workers", "Workers", ["web-1:4312", "billing-2:1021"]),
        "database-health": ("/health", "Database health", ["deploy-migration", "worker billing-1"]),
        "maintenance": ("/maintenance", "Maintenance", ["archive", "reap"]),
        "audit": ("/audit", "Audit log", ["SMTP credentials rotated; retrying two receipts",
                                          "nightly export disabled during the incident"]),
    }
    for name, (path, heading, texts) in shots.items():
        if name == "database-health":
            stop_blocking = _a_blocked_worker(dsn)
        try:
            response = page.goto(f"{live_server}{path}")
            assert response.status == 200, (name, response.status)
            page.wait_for_load_state("networkidle")
            if name == "queue":
                page.wait_for_selector("#queue-charts svg")
            expect(page.locator("h1")).to_contain_text(heading)
            for text in texts:
                expect(page.locator("main")).to_contain_text(text)
            expect(page.get_by_text("not available", exact=False)).to_have_count(0)
            page.screenshot(path=str(out / f"{name}.png"), full_page=True)
        finally:
            if name == "database-health":
                stop_blocking()
        assert (out / f"{name}.png").stat().st_size > 10_000
    assert extras["job"]


def _a_blocked_worker(dsn: str):
    """A migration holding a lock on skiplock.queues and a worker waiting for it (> 5 s: amber),
    so the database page shows a blocking tree. Returns the function that ends both."""
    import threading
    import time

    import psycopg

    blocker = psycopg.connect(dsn, application_name="deploy-migration")
    blocker.execute("LOCK TABLE skiplock.queues IN ACCESS EXCLUSIVE MODE")
    blocker.execute("SELECT 'ALTER TABLE skiplock.queues ADD COLUMN note text' AS pretend_migration")

    def wait():
        with psycopg.connect(dsn, application_name="worker billing-1", autocommit=True) as w:
            w.execute("SET lock_timeout = '30s'")
            try:
                w.execute("SELECT paused FROM skiplock.queues WHERE name = 'billing'")
            except psycopg.errors.LockNotAvailable:
                pass

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(5.5)

    def stop():
        blocker.rollback()
        blocker.close()
        thread.join(10)

    return stop
