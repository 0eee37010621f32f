"""The Content-Security-Policy: sent on every response (every GET route of the URL map, error
pages, static files), and the on-call path walked in Chromium with zero violations, htmx polling
still refreshing fragments, the select-all checkbox still ticking, and an injected inline
handler refused by the browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from console import queue as q
from console.web import CONTENT_SECURITY_POLICY
from tests.oncall_data import make_dead_letters, store_history
from tests.web_fixtures import PASSWORD

EXPECTED = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
            "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")

# A value for each URL converter, so that every GET route can be called (a 404 is fine: the
# header must be on it too).
SAMPLE_ARGS = {"int": 1, "default": "x"}
SPECIAL = {"fmt": "csv", "name": "default", "filename": "skiplock.js"}


def every_get_url(app) -> list[str]:
    urls = []
    with app.test_request_context():
        from flask import url_for

        for rule in app.url_map.iter_rules():
            if "GET" not in rule.methods:
                continue
            args = {}
            for arg in rule.arguments:
                converter = type(rule._converters[arg]).__name__.lower()
                args[arg] = SPECIAL.get(arg, SAMPLE_ARGS["int"] if "integer" in converter else SAMPLE_ARGS["default"])
            urls.append(url_for(rule.endpoint, **args))
    return sorted(set(urls))


def test_the_policy_is_the_strict_one():
    assert CONTENT_SECURITY_POLICY == EXPECTED
    assert "unsafe" not in CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("role", [None, "viewer", "admin"])
def test_every_get_route_sends_the_policy(web_app, client_as, conn, role):
    make_dead_letters(conn, smtp=1, card=1)
    client = client_as(role)
    urls = every_get_url(web_app) + ["/no/such/page", "/jobs?since=yesterday-ish", "/static/skiplock.css"]
    assert len(urls) > 40
    missing = []
    for url in urls:
        response = client.get(url)
        if response.headers.get("Content-Security-Policy") != EXPECTED:
            missing.append((url, response.status_code))
        response.close()
    assert missing == []


def test_the_database_down_page_sends_the_policy(web_settings):
    """The 503 page (with its meta refresh) is an error handler's answer: the header is there too."""
    from console.web import create_app

    web_settings.update({"database.dsn": "postgresql://postgres@127.0.0.1:1/nothing", "web.db_wait": 0.2})
    app = create_app(web_settings)
    try:
        client = app.test_client()
        with client.session_transaction() as session:
            session["sid"] = "any-session-token"  # looked up in the database, which is down
        for url in ("/overview", "/healthz", "/jobs"):
            response = client.get(url)
            assert response.status_code == 503, url
            assert response.headers["Content-Security-Policy"] == EXPECTED, url
    finally:
        app.extensions["skiplock"].close()


def test_templates_carry_no_inline_script_style_or_handlers():
    """What the policy would block, caught before a browser sees it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "templates"
    offenders = []
    for path in sorted(root.rglob("*.html")):
        text = re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.S)  # not in Jinja comments
        # ... and no tojson inside an attribute (it leaves " alone and skips autoescape): json_text
        for pattern in (r"<script(?![^>]*\bsrc=)", r"<style", r"\sstyle=", r"\son[a-z]+=", r"javascript:", r"hx-on",
                        r"=\"[^\"]*\|\s*tojson", r"='[^']*\|\s*tojson"):
            for match in re.finditer(pattern, text, flags=re.I):
                offenders.append(f"{path.relative_to(root)}: {match.group(0).strip()}")
    assert offenders == []


# --- in Chromium ------------------------------------------------------------------------------

COLLECT = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") +
                              " at " + e.sourceFile + ":" + e.lineNumber + " " + (e.sample || ""));
});
"""


# Chromium asks for a favicon the console does not have; the walk opens a missing page on purpose.
EXPECTED_404S = ("/favicon.ico", "/no/such/page")


@pytest.fixture
def fast_poll_settings(web_settings):
    web_settings["web.poll_fast"] = 0.5
    return web_settings


@pytest.fixture
def watched(page: Page):
    """The page, with CSP violations (per page visited) and console errors recorded."""
    page.set_default_timeout(15_000)
    page.add_init_script(COLLECT)
    errors: list[str] = []

    def on_console(msg):
        source = (msg.location or {}).get("url", "")
        if msg.type == "error" and not source.endswith(EXPECTED_404S):
            errors.append(f"{page.url}: {msg.text} ({source})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.errors = errors
    return page


def violations(page: Page) -> list[str]:
    return page.evaluate("window.__cspViolations || []")


def sign_in(page: Page, base: str, name: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


def wait_for_swap(page: Page, seconds: float = 10) -> None:
    """An htmx fragment refresh (a poll) lands on the page within `seconds`."""
    page.evaluate("""(ms) => new Promise((resolve, reject) => {
        document.addEventListener("htmx:afterSettle", () => resolve(true), {once: true});
        setTimeout(() => reject(new Error("no htmx swap within " + ms + " ms")), ms);
    })""", int(seconds * 1000))


@pytest.mark.browser
def test_on_call_path_has_no_csp_violations(fast_poll_settings, watched: Page, live_server, conn, personas):
    page, base = watched, live_server
    store_history(conn, failing="billing")
    dead = make_dead_letters(conn, smtp=4, card=3, queue_smtp="mail", queue_card="billing")
    q.enqueue(conn, "charge_card", {"customer": 1}, queue="billing")
    job_id = dead["card"][0]
    seen: dict[str, list[str]] = {}

    def visit(path: str, label: str | None = None) -> None:
        response = page.goto(base + path)
        assert response is not None and response.status == 200, path
        assert response.headers.get("content-security-policy") == EXPECTED, path
        seen[label or path] = violations(page)

    page.goto(base + "/login")
    seen["/login"] = violations(page)
    sign_in(page, base, "admin")

    visit("/overview")
    assert page.evaluate("htmx.config.allowEval") is False
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False
    assert page.evaluate("document.querySelectorAll('style').length") == 0  # htmx injected none
    wait_for_swap(page)  # the overview's fragments poll
    seen["/overview (after a poll)"] = violations(page)

    visit("/queues")
    wait_for_swap(page)
    seen["/queues (after a poll)"] = violations(page)
    for path in ("/queues/billing", "/jobs", "/jobs?state=failed", f"/jobs/{job_id}", "/deadletters"):
        visit(path)

    # an error group's jobs: the select-all checkbox ticks and unticks every row
    page.locator('#groups tr:has-text("card declined") >> text=jobs').click()
    page.wait_for_url("**/deadletters/jobs?*")
    boxes = page.locator("input[name=ids]")
    expect(boxes).to_have_count(3)
    page.check("input[aria-label=\"select all on this page\"]")
    assert page.evaluate("[...document.querySelectorAll('input[name=ids]')].every(c => c.checked)")
    page.uncheck("input[aria-label=\"select all on this page\"]")
    assert page.evaluate("[...document.querySelectorAll('input[name=ids]')].every(c => !c.checked)")
    seen["error group's jobs"] = violations(page)

    # preview a replay of the group, confirm, watch the progress bar (polls every second)
    page.goto(base + "/deadletters?queue=billing")
    page.locator("#groups tbody tr button[value=replay]").click()
    expect(page.locator("h2[data-total]")).to_have_attribute("data-total", "3")
    seen["replay preview"] = violations(page)
    page.fill("textarea[name=reason]", "CSP walk")
    page.locator("#confirm button[data-confirm-action]").click()
    page.wait_for_url("**/deadletters/operations/*")
    expect(page.locator("section[data-state]")).to_have_attribute("data-state", "done", timeout=20_000)
    expect(page.locator("svg.progress rect.fill")).to_have_attribute("width", re.compile(r"^100(\.0)?$"))
    seen["replay progress"] = violations(page)

    for path in ("/audit", "/alerts", "/alerts/rules", "/alerts/destinations", "/alerts/deliveries", "/maintenance",
                 "/health", "/advisor", "/workers", "/admin/users", "/search?q=i",
                 "/docs/alerts.md", "/docs/benchmarks.md", "/docs/operators-guide.md"):  # aligned tables, an image
        visit(path)
    page.keyboard.press("?")  # the shortcuts' list, then "g q" to the queues page
    expect(page.locator("#shortcuts")).to_be_visible()
    page.keyboard.press("Escape")
    page.keyboard.press("g")
    page.keyboard.press("q")
    page.wait_for_url("**/queues")
    seen["shortcuts and search"] = violations(page)
    page.goto(base + "/no/such/page")
    seen["404 page"] = violations(page)

    assert {k: v for k, v in seen.items() if v} == {}
    assert page.errors == []


@pytest.mark.browser
def test_an_injected_inline_handler_is_refused(watched: Page, live_server, personas):
    """What the policy is for: markup that slipped past escaping still cannot run script."""
    page = watched
    sign_in(page, live_server, "viewer")
    page.goto(live_server + "/jobs")
    page.evaluate("""() => {
        window.__ran = [];
        document.querySelector("main").insertAdjacentHTML("beforeend",
          '<img src="data:," onerror="window.__ran.push(1)"><div hx-get="/healthz" hx-trigger="load" ' +
          'hx-on::before-request="window.__ran.push(2)"></div>');
        htmx.process(document.querySelector("main"));
    }""")
    page.wait_for_function("window.__cspViolations.length > 0", timeout=5_000)
    page.wait_for_timeout(300)  # give a handler that would run the time to run
    assert page.evaluate("window.__ran") == []
    assert any("script-src" in v for v in violations(page))
