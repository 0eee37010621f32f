"""The on-call path of "why isn't this job running?" (issue 33 item 1) in real Chromium: the
queue-age alert fires on a queue that waits; its page shows the computed answer (loaded by
htmx) and its look-here link opens the queue page at the answer; the operator reads who paused
the queue and why, resumes it there with a reason, and the answer moves on to the next cause (no
live worker listens on the queue: a real worker process serves another one). The end state is
checked in the database.

Set SKIPLOCK_SCREENSHOTS=1 to (re)write docs/screenshots/why.png (the answer's panel) from
this run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from console import maintenance as m
from console import queue as q
from tests.alert_links_data import fire_default
from tests.workers import EXECUTIONS_TABLE, WorkerProcs, wait_for

pytestmark = pytest.mark.browser

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def shot_panel(page: Page, selector: str, name: str) -> None:
    """A screenshot of one panel, for docs/console.md (only with SKIPLOCK_SCREENSHOTS=1)."""
    if os.environ.get("SKIPLOCK_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(selector).screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture
def mail_worker(subprocess_env, conn):
    """A real worker process that listens on queue mail only."""
    procs = WorkerProcs(subprocess_env)
    procs.start("--queues", "mail", "--concurrency", "2")
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers WHERE stopped_at IS NULL AND 'mail' = ANY(queues)"
                                  " AND kinds IS NOT NULL").fetchone()[0],
             timeout=30, what="the mail worker in the registry")
    yield procs
    procs.stop_all()


def test_from_the_queue_age_alert_to_why_the_queue_waits(page_as, live_server, conn, mail_worker):
    for order in range(4):
        q.enqueue(conn, "reindex", {"order": order}, queue="search", priority=order % 2)
    conn.execute("UPDATE skiplock.jobs SET run_at = now() - interval '7 minutes' WHERE queue = 'search'")
    m.pause_queue(conn, "search", actor="alice", reason="INC-2041: the search cluster is being resized")
    alert_id = fire_default(conn, "queue_age", {"queue": "search"}, 420)
    page = page_as("operator")
    page.set_default_timeout(15_000)

    # The alert page answers at once (the panel loads by itself), and links to the answer.
    page.goto(f"{live_server}/alerts/{alert_id}")
    verdict = page.locator("#why .why-verdict")
    expect(verdict).to_contain_text("Queue search is paused (by alice")
    expect(verdict).to_contain_text("INC-2041: the search cluster is being resized")
    expect(page.locator("#why [data-why-reason=no_worker]")).to_contain_text("listen on mail")
    why_link = page.locator("#look-here a[data-look-here]", has_text="Why queue search is not moving")
    expect(why_link).to_have_count(1)
    why_link.click()

    # The queue page opens at the answer, with its evidence a click away.
    page.wait_for_url(f"{live_server}/queues/search#why")
    panel = page.locator("#why")
    expect(panel.locator(".why-verdict")).to_have_attribute("data-why-code", "paused")
    expect(panel).to_contain_text("first eligible job")
    panel.locator("[data-why-reason=paused] summary").click()
    expect(panel.locator("[data-why-reason=paused] dl")).to_contain_text("alice")
    panel.locator("[data-why-reason=no_worker] summary").click()
    shot_panel(page, "#why", "why")

    # Resume it there, with a reason: the answer moves on to the next cause.
    page.locator("form.actions input[name=reason]").first.fill("INC-2041: resize done")
    page.locator("form.actions button", has_text="Resume").click()
    page.wait_for_url(f"{live_server}/queues/search")
    expect(page.locator("#why .why-verdict")).to_have_attribute("data-why-code", "no_worker")
    expect(page.locator("#why .why-verdict")).to_contain_text("No live worker listens on queue search")

    assert conn.execute("SELECT paused FROM skiplock.queues WHERE name = 'search'").fetchone()[0] is False
    assert conn.execute("SELECT actor, reason FROM skiplock.audit_log WHERE action = 'resume'").fetchone() == (
        "operator", "INC-2041: resize done")
    api = page.request.get(f"{live_server}/api/v1/queues/search/why").json()
    assert (api["code"], api["figures"]["eligible"]) == ("no_worker", 4)


def test_the_job_page_answers_for_a_running_job(page_as, live_server, conn, mail_worker):
    conn.execute(EXECUTIONS_TABLE)  # the slow task records its runs there
    job = q.enqueue(conn, "slow", {"sleep": 30}, queue="mail")
    wait_for(lambda: conn.execute("SELECT status = 'running' FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0],
             timeout=30, what="the job to be claimed")
    page = page_as("viewer")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/jobs/{job}")
    expect(page.locator("#why .why-verdict")).to_have_attribute("data-why-code", "running")
    expect(page.locator("#why .why-verdict")).to_contain_text("It is running: worker")
