"""Chromium through Playwright against a live server: sign in, the jobs browser, a job's page,
a replay with a reason, and what a viewer can and cannot do. End states checked in the DB.

Set SKIPLOCK_SCREENSHOTS=1 to (re)write docs/screenshots/*.png from this run.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from console import queue as q
from tests.web_fixtures import PASSWORD

pytestmark = pytest.mark.browser

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def shot(page, name: str) -> None:
    if os.environ.get("SKIPLOCK_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def traffic(conn):
    """A small realistic mix: backlog in mail, dead letters in billing, a worker."""
    for i in range(6):
        q.enqueue(conn, "send_receipt", {"order": 1000 + i, "to": f"customer{i}@example.com", "api_key": "sk_live_123"}, queue="mail")
    q.enqueue(conn, "send_digest", {"week": 48}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=2))
    for i in range(5):
        q.enqueue(conn, "charge_card", {"customer": 40 + i, "amount": 1999}, queue="billing", max_attempts=1)
    failed = []
    for job in q.claim(conn, "worker-a", queues=["billing"], limit=5, lease=60)[:4]:
        try:
            raise ConnectionError(f"payment gateway timed out after 30 s (customer {job.payload['customer']})")
        except ConnectionError as exc:
            q.fail(conn, job, exc)
        failed.append(job.id)
    conn.execute("""INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, last_seen, in_flight, claimed, completed, failed,
                        claim_calls, claim_seconds_sum, claim_histogram)
                    VALUES ('worker-a', 'app-1', 4242, '{billing,mail}', 8, now(), 1, 120, 110, 4, 60, 0.12, '{0,0,10,30,15,5}'),
                           ('worker-b', 'app-2', 977, NULL, 8, now() - interval '3 minutes', 0, 40, 40, 0, 20, 0.05, '{0,5,10,5}')""")
    conn.execute("UPDATE skiplock.jobs SET created_at = now() - interval '7 minutes', run_at = now() - interval '7 minutes' WHERE queue = 'mail' AND kind = 'send_receipt'")
    return failed


def sign_in(page, base: str, name: str, target: str = "/jobs") -> None:
    page.goto(base + target)
    assert "/login" in page.url
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base + target.split("?")[0])))


def test_operator_finds_dead_letters_and_replays_one(page, live_server, personas, traffic, conn):
    page.goto(live_server + "/login")
    shot(page, "login")
    sign_in(page, live_server, "operator")
    assert page.title() == "Jobs · Skiplock"
    page.select_option("select[name=state]", "failed")
    page.fill("input[name=queue]", "billing")
    page.click("#job-filters button[type=submit]")
    page.wait_for_url(re.compile(r"state=failed"))
    assert "queue=billing" in page.url  # bookmarkable
    page.locator("#job-count", has_text="match").wait_for()  # the count loads as its own fragment
    assert page.inner_text("#job-count").startswith("4 jobs match")
    assert page.locator("#jobs-table tbody tr").count() == 4
    shot(page, "jobs")

    target = traffic[0]
    page.click(f"#jobs-table a[href='/jobs/{target}']")
    page.wait_for_url(re.compile(rf"/jobs/{target}$"))
    assert "payment gateway timed out" in page.inner_text("body")
    assert '"amount": 1999' in page.inner_text("#payload")
    shot(page, "job-detail")
    form = page.locator(f"form[action='/jobs/{target}/replay']")
    form.locator("input[name=reason]").fill("gateway back up")
    form.locator("button").click()
    page.wait_for_load_state()
    assert page.locator("h1").inner_text().endswith("pending")
    status = conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (target,)).fetchone()[0]
    assert status == "pending"
    audit = conn.execute("SELECT actor, action, reason FROM skiplock.audit_log WHERE action = 'replay' AND outcome = 'started'").fetchall()
    assert audit == [("operator", "replay", "gateway back up")]
    others = conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0]
    assert others == 3  # exactly that one job left the dead letters

    page.goto(live_server + "/queues")
    assert page.title().endswith("Queues · Skiplock")
    shot(page, "queues")
    row = page.locator("#queues-table tr", has_text="mail")
    row.locator("button", has_text="Pause").click()  # the reason is required: the browser refuses to submit
    assert row.locator("input[name=reason]").evaluate("e => e.validity.valueMissing") is True
    row.locator("input[name=reason]").fill("SMTP relay down")
    row.locator("button", has_text="Pause").click()
    page.locator("#queues-table tr", has_text="mail").locator("button", has_text="Resume").wait_for()
    assert conn.execute("SELECT paused FROM skiplock.queues WHERE name = 'mail'").fetchone()[0] is True
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE action = 'pause'").fetchone()[0] == "SMTP relay down"
    page.goto(live_server + "/workers")
    assert page.title() == "1 stale · Workers · Skiplock"
    shot(page, "workers")
    page.goto(live_server + "/audit")
    assert "gateway back up" in page.inner_text("#audit-table")
    shot(page, "audit")
    page.emulate_media(color_scheme="dark")
    page.goto(live_server + "/jobs?queue=billing")
    page.locator("#job-count", has_text="match").wait_for()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(247, 248, 250)"
    shot(page, "jobs-dark")


def test_viewer_sees_no_action_buttons_and_a_forged_post_is_refused(page, live_server, personas, traffic, conn):
    sign_in(page, live_server, "viewer", f"/jobs/{traffic[1]}")
    assert page.locator("form[action*='/replay']").count() == 0
    assert page.locator("form[action*='/purge']").count() == 0
    assert "[redacted]" not in page.inner_text("#payload")  # this payload has no sensitive keys
    page.goto(live_server + "/jobs?queue=mail&state=pending")
    assert "sk_live_123" not in page.content()
    page.goto(live_server + "/queues")
    assert page.locator("#queues-table button").count() == 0
    # A forged POST from the viewer's own browser session, with and without a token.
    forged = page.request.post(f"{live_server}/jobs/{traffic[1]}/purge", form={"reason": "x"})
    assert forged.status == 403
    with_token = page.evaluate(
        """async (url) => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token'];
            const r = await fetch(url, {method: 'POST', headers: {'X-CSRF-Token': token}});
            return r.status;
        }""",
        f"{live_server}/jobs/{traffic[1]}/purge",
    )
    assert with_token == 403  # right token, wrong role
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (traffic[1],)).fetchone()[0] == "failed"
