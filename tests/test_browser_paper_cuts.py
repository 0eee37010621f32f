"""Paper cuts of a first incident (issue 33 item 6) that only a browser shows: the go-to
shortcuts to every on-call page and j/k row navigation (static/skiplock.js, under the strict
CSP), and form placeholders that fit their inputs."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from console import queue as q

pytestmark = pytest.mark.browser

GO_TO = {"j": "/jobs", "w": "/workers", "a": "/alerts", "v": "/advisor", "m": "/maintenance", "q": "/queues",
         "d": "/deadletters", "o": "/overview"}


def focus_page(page: Page) -> None:
    page.locator("h1").first.click()  # focus on the page, not a field


def test_go_to_every_on_call_page_from_the_keyboard(page_as, live_server, conn):
    page = page_as("viewer")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/queues")
    focus_page(page)
    page.keyboard.press("?")
    for key in GO_TO:
        expect(page.locator(f'#shortcuts a[data-shortcut="g {key}"]')).to_have_count(1)
    page.keyboard.press("Escape")
    for key, path in GO_TO.items():
        focus_page(page)
        page.keyboard.press("g")
        page.keyboard.press(key)
        page.wait_for_url(f"{live_server}{path}")


def test_j_and_k_walk_the_rows_and_enter_opens_one(page_as, live_server, conn):
    ids = [q.enqueue(conn, "send", {"n": n}, queue="mail") for n in range(4)]
    page = page_as("viewer")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/jobs?state=pending")  # next to run first: ids in order
    focus_page(page)
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(4)
    page.keyboard.press("j")
    expect(rows.nth(0)).to_have_class("row-selected")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    expect(rows.nth(1)).to_have_class("row-selected")
    expect(page.locator("tr.row-selected")).to_have_count(1)
    page.keyboard.press("k")
    page.keyboard.press("k")  # stays on the first row
    expect(rows.nth(0)).to_have_class("row-selected")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server}/jobs/{ids[1]}")
    # Typing in a field moves nothing.
    page.goto(f"{live_server}/jobs?state=pending")
    page.locator("#job-filters input[name=kind]").click()
    page.keyboard.type("jk")
    expect(page.locator("tr.row-selected")).to_have_count(0)


# How wide a placeholder's text is in its input's own font, against the room the input has.
FITS = """(input) => {
  const style = getComputedStyle(input);
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return {name: input.name, text: ctx.measureText(input.placeholder).width, room: room};
}"""


def test_the_queue_pages_placeholders_fit_their_inputs(page_as, live_server, conn):
    q.enqueue(conn, "send", queue="mail")
    page = page_as("operator")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/queues/mail")
    inputs = page.locator("#limits-form input[placeholder], #enqueue input[placeholder]")
    assert inputs.count() >= 8
    clipped = [m for m in (inputs.nth(i).evaluate(FITS) for i in range(inputs.count())) if m["text"] > m["room"]]
    assert clipped == [], clipped
    # The limits form refuses to send without a reason (the browser asks for it) ...
    page.locator("#limits-form input[name=concurrency]").fill("3")
    page.locator("#limits-form button[type=submit]").click()
    assert page.locator("#limits-form input[name=reason]").evaluate("el => el.validity.valueMissing")
    assert page.url == f"{live_server}/queues/mail"
