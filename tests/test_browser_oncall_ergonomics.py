"""On-call ergonomics (issue 17) in real Chromium: the search box, the keyboard shortcuts,
hidden tabs that stop polling and catch up when shown, a read-only console without buttons,
and an idle queue that stays listed."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from console import queue as q
from console import samples
from console.samples import Sample
from tests.oncall_data import make_dead_letters, store_history
from tests.web_fixtures import PASSWORD

pytestmark = [pytest.mark.browser]


def sign_in(page: Page, base: str, name: str) -> None:
    page.set_default_timeout(15_000)
    page.goto(f"{base}/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


@pytest.fixture
def read_only() -> bool:
    return False  # a test parametrizes it to True


@pytest.fixture
def web_settings(web_settings, read_only):
    return {**web_settings, "web.poll_fast": 0.3, "web.read_only": read_only}


def test_search_box_finds_a_job_a_queue_and_an_error_group(page: Page, live_server, conn, personas):
    dead = make_dead_letters(conn, smtp=2, card=1, queue_smtp="mail", queue_card="billing")
    sign_in(page, live_server, "viewer")
    page.goto(f"{live_server}/overview")
    box = page.locator("header input[data-search]")

    box.fill(str(dead["smtp"][0]))
    box.press("Enter")
    page.wait_for_url(f"**/jobs/{dead['smtp'][0]}")

    page.locator("header input[data-search]").fill("billing")
    page.locator("header input[data-search]").press("Enter")
    page.wait_for_url("**/queues/billing")

    page.locator("header input[data-search]").fill("smtp server")
    page.locator("header input[data-search]").press("Enter")
    page.wait_for_url(re.compile(r".*/deadletters/jobs\?fingerprint=.*"))
    expect(page.locator("main")).to_contain_text("SMTP server")

    page.locator("header input[data-search]").fill("i")  # several kinds of match: the results page
    page.locator("header input[data-search]").press("Enter")
    page.wait_for_url("**/search?q=i")
    expect(page.locator("#search-results li[data-match=queue]")).to_have_count(2)
    expect(page.locator("#search-results li[data-match=error_group]")).to_have_count(2)


def test_keyboard_shortcuts(page: Page, live_server, conn, personas):
    sign_in(page, live_server, "viewer")
    page.goto(f"{live_server}/overview")
    page.locator("h1").click()  # focus on the page, not a field

    page.keyboard.press("/")
    expect(page.locator("header input[data-search]")).to_be_focused()
    page.keyboard.type("gq")  # typing in the box: no shortcut fires
    page.wait_for_timeout(400)
    assert page.url.endswith("/overview")
    expect(page.locator("header input[data-search]")).to_have_value("gq")
    page.locator("header input[data-search]").blur()

    page.keyboard.press("?")
    expect(page.locator("#shortcuts")).to_be_visible()
    expect(page.locator("#shortcuts")).to_contain_text("g q")
    page.keyboard.press("Escape")
    expect(page.locator("#shortcuts")).to_be_hidden()

    page.keyboard.press("g")
    page.keyboard.press("q")
    page.wait_for_url("**/queues")
    page.keyboard.press("g")
    page.keyboard.press("d")
    page.wait_for_url("**/deadletters")
    page.keyboard.press("g")
    page.keyboard.press("o")
    page.wait_for_url("**/overview")


HIDE = """(hidden) => {
  Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
  Object.defineProperty(document, "visibilityState", {configurable: true, get: () => hidden ? "hidden" : "visible"});
  document.dispatchEvent(new Event("visibilitychange"));
}"""


def test_a_hidden_tab_stops_polling_and_catches_up_when_shown(page: Page, live_server, conn, personas):
    store_history(conn, failing="billing", minutes=5)
    sign_in(page, live_server, "viewer")
    polls: list[float] = []
    page.on("request", lambda r: polls.append(time.monotonic()) if "/overview/_" in r.url else None)
    page.goto(f"{live_server}/overview")
    page.wait_for_function("document.title.startsWith('FAILING')")

    deadline = time.monotonic() + 10
    while len(polls) < 3 and time.monotonic() < deadline:  # polls every 0.3 s while visible
        page.wait_for_timeout(100)
    assert len(polls) >= 3

    page.evaluate(HIDE, True)
    page.wait_for_timeout(500)  # a request already on its way may land
    hidden_from = time.monotonic()
    page.wait_for_timeout(2500)  # over eight poll intervals
    assert [t for t in polls if t > hidden_from] == []

    page.evaluate("document.title = 'Skiplock'")  # the state must come back with the refresh
    shown_at = time.monotonic()
    page.evaluate(HIDE, False)
    page.wait_for_function("document.title.startsWith('FAILING · Overview')", timeout=5_000)
    assert any(t >= shown_at for t in polls)
    assert min(t for t in polls if t >= shown_at) - shown_at < 1.0  # at once, not after an interval


@pytest.mark.parametrize("read_only", [True])
def test_read_only_console_in_the_browser(page: Page, live_server, conn, personas, read_only):
    dead = make_dead_letters(conn, smtp=1, card=2, queue_card="billing")
    q.enqueue(conn, "charge_card", {}, queue="billing")
    sign_in(page, live_server, "admin")
    for path in ("/queues", "/deadletters", f"/jobs/{dead['card'][0]}", "/alerts"):
        page.goto(live_server + path)
        expect(page.locator("[data-read-only]")).to_contain_text("Read-only console")
        actions = page.locator("main form[method=post i], main [hx-post]")  # not drawn at all
        expect(actions).to_have_count(0)
    page.goto(live_server + "/deadletters")
    expect(page.locator("main button", has_text="Filter")).to_be_visible()  # reading still works
    # a forged POST from the page is refused (the guard, not the template)
    status = page.evaluate("""async () => {
        const r = await fetch("/queues/billing/pause", {method: "POST", headers: {
            "X-CSRF-Token": JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRF-Token"]}});
        return [r.status, await r.text()];
    }""")
    assert status[0] == 403 and "read-only" in status[1]
    assert conn.execute("SELECT count(*) FROM skiplock.queues WHERE paused").fetchone()[0] == 0


def test_an_idle_queue_stays_listed_with_idle_since(page: Page, live_server, conn, personas):
    now = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "reports", "state": "eligible"}, 4)],
                  at=now - timedelta(hours=3))
    samples.store(conn, [Sample("queue_depth", {"queue": "reports", "state": "eligible"}, 0)],
                  at=now - timedelta(minutes=1))
    sign_in(page, live_server, "viewer")
    page.goto(f"{live_server}/queues")
    row = page.locator("#queues-table tr", has_text="reports")
    expect(row).to_contain_text("idle since 3 h ago")
    page.wait_for_timeout(700)  # after a poll or two, still there
    expect(page.locator("#queues-table tr", has_text="reports")).to_contain_text("idle since")


def test_a_queue_whose_dead_letters_grow_past_the_rule_is_amber_on_the_queues_page(page: Page, live_server, conn, personas):
    """The Queues page colours what the alert rules would fire on, as the overview does. The
    dead-letter count is a link: its cell's class alone left it link-blue, so a queue whose
    dead_letter_growth alert was pending looked like every other (seen in the demo)."""
    q.enqueue(conn, "noop", queue="billing")
    samples.store(conn, [Sample("dead_letter_growth", {"queue": "billing", "system": "skiplock"}, 64.0),
                         Sample("dead_letter_growth", {"queue": "mail", "system": "skiplock"}, 0.0)])
    q.enqueue(conn, "noop", queue="mail")
    sign_in(page, live_server, "viewer")
    page.goto(f"{live_server}/queues")
    billing = page.locator("#queues-table tr[data-queue-level]", has_text="billing")
    expect(billing).to_have_attribute("data-queue-level", "warn")
    warn = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--warn').trim()")
    link = billing.locator("td.warn a")
    expect(link).to_have_css("color", hex_to_rgb(warn))
    expect(billing.locator("td").first).to_have_css("background-color", hex_to_rgb(
        page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--warn-bg').trim()")))
    mail = page.locator("#queues-table tr[data-queue-level]", has_text="mail")
    expect(mail).to_have_attribute("data-queue-level", "good")
    expect(mail.locator("td").nth(6).locator("a")).not_to_have_css("color", hex_to_rgb(warn))


def hex_to_rgb(value: str) -> str:
    value = value.lstrip("#")
    r, g, b = (int(value[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgb({r}, {g}, {b})"
