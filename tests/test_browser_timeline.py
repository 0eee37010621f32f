"""The on-call path of the incident timeline (issue 33 item 2) in real Chromium: a queue-age
alert fires; from its page the operator opens "Timeline of this incident", reads the alert, the
pause that came before it and the worker that was lost on one axis, follows an event's link,
and downloads the Markdown postmortem draft, whose sections and rows are checked in the file.
The page runs under the strict CSP: nothing it loads is refused.

Set SKIPLOCK_SCREENSHOTS=1 to (re)write docs/screenshots/timeline.png (the events panel).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from console import maintenance as m
from console import queue as q
from tests.alert_links_data import fire_default

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def shot_panel(page: Page, selector: str, name: str) -> None:
    if os.environ.get("SKIPLOCK_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(selector).screenshot(path=str(SHOTS / f"{name}.png"))


def test_from_a_firing_alert_to_its_timeline_and_the_postmortem_draft(page_as, live_server, conn, tmp_path):
    q.enqueue(conn, "reindex", {"order": 1}, queue="search")
    m.pause_queue(conn, "search", actor="alice", reason="INC-2041: the search cluster is being resized")
    # A worker that started and went silent without exiting (killed) during the incident.
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, started_at, last_seen) "
                 "VALUES ('search-1:4242:ab12', 'search-1', 4242, '{search}', 4, now() - interval '3 minutes', "
                 "now() - interval '2 minutes')")
    alert_id = fire_default(conn, "queue_age", {"queue": "search"}, 420)
    page = page_as("operator")
    page.set_default_timeout(15_000)
    refused: list[str] = []
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)

    page.goto(f"{live_server}/alerts/{alert_id}")
    page.locator("#alert-timeline a[data-timeline]").click()
    page.wait_for_url(f"{live_server}/timeline?alert={alert_id}")
    expect(page.locator("h1")).to_contain_text(f"Timeline of alert {alert_id}: queue_age")
    rows = page.locator("#timeline-events tbody tr")
    expect(rows.filter(has_text="alice: pause on queue:search")).to_have_count(1)
    expect(rows.filter(has_text="INC-2041: the search cluster is being resized")).to_have_count(1)
    expect(rows.filter(has_text="worker search-1:4242:ab12")).to_have_count(2)  # started, then lost
    expect(rows.filter(has_text="lost (")).to_have_count(1)
    fired = rows.filter(has_text=f"Alert {alert_id} queue_age")
    expect(fired).to_have_count(1)
    expect(page.locator("#timeline-summary [data-alert-span]")).to_contain_text("still firing")
    texts = rows.locator("td:nth-child(3)").all_inner_texts()
    assert texts.index(next(t for t in texts if "pause on queue:search" in t)) < \
        texts.index(next(t for t in texts if t.startswith(f"Alert {alert_id}")))
    shot_panel(page, "#timeline-events", "timeline")

    # The draft downloads as a file with the sections and the same rows.
    with page.expect_download() as download_info:
        page.locator("#timeline-window a[data-postmortem]").click()
    download = download_info.value
    assert download.suggested_filename == f"postmortem-alert-{alert_id}.md"
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    text = path.read_text(encoding="utf-8")
    for heading in ("## Summary", "## Timeline", "## Impact", "## Root cause", "## Follow-ups"):
        assert f"\n{heading}\n" in text
    assert "still firing at the window's end" in text
    table = [line for line in text.splitlines() if line.startswith("| 20")]
    assert len(table) == rows.count()
    assert any("alice: pause on queue:search" in line for line in table)
    assert f"[open]({live_server}/alerts/{alert_id})" in text

    # An event's link leads to its page.
    fired.locator("a[data-event-link]").click()
    page.wait_for_url(f"{live_server}/alerts/{alert_id}")
    assert refused == []
