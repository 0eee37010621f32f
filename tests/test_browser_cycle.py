"""The overview's polls in real Chromium (console/web/cycle.py, static/skiplock.js): while the
collection cycle is unchanged each poll is answered 304 with no body and the page keeps what it
shows; when newer samples arrive the next poll brings the new verdict."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from console.web import cycle
from tests.oncall_data import store_history

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def web_settings(web_settings):
    return {**web_settings, "web.poll_fast": 0.3}


def test_unchanged_polls_are_304_and_keep_the_page_and_a_new_cycle_is_shown(page_as, live_server, conn,
                                                                            monkeypatch):
    monkeypatch.setattr(cycle, "BUCKET_SECONDS", 10**9)  # only the samples the test stores change it
    store_history(conn, failing=None, minutes=5)
    page = page_as("viewer")
    page.set_default_timeout(15_000)
    statuses: list[int] = []
    page.on("response", lambda r: statuses.append(r.status) if "/overview/_verdict" in r.url else None)
    page.goto(f"{live_server}/overview")
    verdict = page.locator("#verdict [data-verdict]")
    expect(verdict).to_have_attribute("data-verdict", "healthy")
    deadline = time.monotonic() + 20
    while statuses.count(304) < 3:
        assert time.monotonic() < deadline, f"no 304 polls within 20 s: {statuses}"
        page.wait_for_timeout(200)
    # three unchanged polls later the verdict is still on the page, not swapped for an empty body
    expect(verdict).to_have_attribute("data-verdict", "healthy")
    expect(page.locator("#firing-alerts")).to_be_visible()

    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    expect(verdict).to_have_attribute("data-verdict", "failing")
    assert 200 in statuses[statuses.index(304):]
