"""The alert's page as Chromium draws it, in the light and the dark theme, on a laptop (1280 px)
and a phone (390 px): its chart has a visible background (the plot is not a solid black box, as
it was when the page did not load the charts' stylesheet) and shows the line and the threshold,
and nothing makes the page scroll sideways (wide tables scroll inside their panel). Screenshots
go to a temporary folder (SKIPLOCK_SCREENSHOTS_DIR to keep them)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from console import samples
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from console.samples import Sample
from tests import pixels
from tests.alert_links_data import deliver, fire_default
from tests.alert_receiver import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = (1280, 390)
SCHEMES = ("light", "dark")


@pytest.fixture
def alert_id(conn) -> int:
    """A queue-age alert that fired after 20 minutes of samples, whose webhook failed (a wide
    delivery log with the receiver's error), with an audit row just before it fired."""
    now = conn.execute("SELECT now()").fetchone()[0]
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "search-reindex-nightly"}, 15.0 * i,
                                now - timedelta(minutes=20 - i)) for i in range(20)])
    conn.execute("INSERT INTO skiplock.audit_log (at, actor, action, target, reason) VALUES "
                 "(now() - interval '5 minutes', 'alice', 'pause', 'queue:search-reindex-nightly', "
                 "'reindex in progress; resume after the nightly export has finished writing')")
    settings = ev.AlertSettings(console_url="https://console.example", allow_private_destinations=True,
                                retry_base=0.01)
    with Receiver([500, 500]) as rx:
        destinations = {"oncall-webhook-primary": parse_destination(
            {"name": "oncall-webhook-primary", "url": rx.url + "/a-rather-long-path/that-goes-on", "kind": "json"})}
        fired = fire_default(conn, "queue_age", {"queue": "search-reindex-nightly"}, 420,
                             destinations=destinations, settings=settings)
        deliver(conn, destinations, settings)
    return fired


def shots_dir() -> Path:
    kept = os.environ.get("SKIPLOCK_SCREENSHOTS_DIR")
    path = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="skiplock-alert-page-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_chart_has_a_visible_background_and_the_page_fits(page_as, live_server, alert_id, scheme):
    page = page_as("viewer")
    page.set_default_timeout(15_000)
    page.emulate_media(color_scheme=scheme)
    out = shots_dir()
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server}/alerts/{alert_id}")
        chart = page.locator("#alert-chart svg.chart")
        expect(chart).to_be_visible()
        expect(chart.locator("line.threshold")).to_have_count(1)
        page.screenshot(path=str(out / f"alert-{scheme}-{width}.png"), full_page=True)

        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{scheme} at {width} px: the page scrolls sideways by {overflow} px"
        box = chart.bounding_box()
        assert box and box["width"] > 200 and box["x"] + box["width"] <= width, box

        # What is drawn, pixel by pixel: mostly the panel's own background, hardly any black.
        panel = pixels.rgb(page.locator("#alert-chart").evaluate("e => getComputedStyle(e).backgroundColor"))
        _, _, drawn = pixels.decode(chart.screenshot())
        colour, part = pixels.most_common(drawn)
        assert colour == panel and part > 0.6, f"{scheme} at {width} px: background {colour} ({part:.0%}), panel {panel}"
        black = pixels.share(drawn, lambda p: max(p) < 24)
        assert black < 0.05, f"{scheme} at {width} px: {black:.0%} of the chart is black"
        line = pixels.share(drawn, lambda p, bg=panel: sum(abs(a - b) for a, b in zip(p, bg, strict=True)) > 60)
        assert line > 0.003, f"{scheme} at {width} px: nothing drawn on the chart"
