"""Per-attempt logs (issue 33 item 3) on the on-call path in real Chromium: a real worker runs a
handler that logs, then fails for good; the operator opens the dead letters, the error group's
jobs, reads why the newest failed in its handler's own words (a secret it logged redacted),
opens the job and reads each attempt's records, the older attempt folded until clicked. The
records shown are checked against the database.

Set SKIPLOCK_SCREENSHOTS=1 to (re)write docs/screenshots/attempt_logs.png (the job page's panel).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from console import queue as q
from tests.workers import WorkerProcs, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def test_an_operator_reads_why_a_dead_letter_failed_in_its_handlers_words(page_as, live_server, conn, subprocess_env):
    job_id = q.enqueue(conn, "log_then_fail", {"order": 4711}, queue="billing", max_attempts=2)
    secret_id = q.enqueue(conn, "log_secret", {"user": "ada"}, queue="auth", max_attempts=1)
    procs = WorkerProcs(subprocess_env)
    try:
        procs.start(tasks="tests.logging_tasks")
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0] == 2,
                 timeout=60, what="both jobs to fail for good")
    finally:
        procs.stop_all()
    stored = conn.execute("SELECT attempt_logs FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]
    assert [e["attempt"] for e in stored] == [1, 2]

    page = page_as("operator")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/deadletters")
    group = page.locator("tr", has_text="ValueError: payment failed for order 4711")
    group.get_by_role("link", name="jobs").click()

    # The group's page says why its newest dead letter failed, in its handler's words.
    sample = page.locator("#sample-logs")
    expect(sample).to_contain_text(f"job {job_id}")
    expect(sample).to_contain_text("card declined on attempt 2")
    expect(sample.locator("tr.log-warning")).to_contain_text("shop.billing")

    # Its job page: the last attempt open, the first one folded until clicked.
    sample.get_by_role("link", name=f"job {job_id}").first.click()
    expect(page).to_have_url(f"{live_server}/jobs/{job_id}")
    logs = page.locator("#attempt-logs")
    newest, oldest = logs.locator("details[data-attempt='2']"), logs.locator("details[data-attempt='1']")
    expect(newest).to_have_attribute("open", "")
    expect(newest.locator("td code.log-message")).to_have_text([r["message"] for r in stored[1]["records"]])
    expect(oldest.locator("td code.log-message").first).not_to_be_visible()
    oldest.locator("summary").click()
    expect(oldest.locator("td code.log-message")).to_have_text([r["message"] for r in stored[0]["records"]])
    if os.environ.get("SKIPLOCK_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        logs.screenshot(path=str(SHOTS / "attempt_logs.png"))

    # A logged secret is redacted on the page, as in the database.
    page.goto(f"{live_server}/jobs/{secret_id}")
    expect(page.locator("#attempt-logs")).to_contain_text("logging in with password=[redacted] for ada")
    assert "hunter2" not in page.content()
