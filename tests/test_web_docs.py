"""The operator docs served by the console (/docs/): every page of docs/ renders for any
signed-in user, with GitHub's heading anchors; every link between the pages answers and lands on
an existing heading; raw HTML in the Markdown is shown as text, never run; nothing outside docs/
is served; and the pages keep to the CSP (no style="" from table alignment)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

from console.alerts.defaults import DEFAULT_RULES
from console.web import docpages
from tests.test_security_csp import EXPECTED as CSP

DOCS = Path(__file__).resolve().parent.parent / "docs"


class Anchors(HTMLParser):
    """Every element id and every a[href] / img[src] of a page (main content only for links)."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.images: list[str] = []
        self.styles: list[str] = []
        self._in_main = 0

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if "style" in values:
            self.styles.append(f"<{tag} style={values['style']!r}>")
        if tag == "main":
            self._in_main += 1
        if self._in_main and tag == "a" and values.get("href"):
            self.links.append(values["href"])
        if self._in_main and tag == "img":
            self.images.append(values.get("src") or "")

    def handle_endtag(self, tag):
        if tag == "main":
            self._in_main -= 1


def parse(html: str) -> Anchors:
    found = Anchors()
    found.feed(html)
    return found


def test_the_slug_is_githubs():
    assert docpages.slug("queue_age") == "queue_age"
    assert docpages.slug("Queue throughput (bench/throughput.py)") == "queue-throughput-benchthroughputpy"
    assert docpages.slug("One alert's page (/alerts/<id>)") == "one-alerts-page-alertsid"
    assert docpages.slug("Databases: several databases") == "databases-several-databases"


def test_every_runbook_section_has_its_anchor_on_the_served_page(client_as):
    response = client_as("viewer").get("/docs/alerts.md")
    assert response.status_code == 200 and response.headers["Content-Security-Policy"] == CSP
    page = parse(response.get_data(as_text=True))
    missing = [rule.name for rule in DEFAULT_RULES if rule.name not in page.ids]
    assert missing == []
    assert "<title>Alerts and webhooks · Skiplock</title>" in response.get_data(as_text=True)


def test_docs_need_a_signed_in_user_and_any_role_may_read_them(client_as):
    anonymous = client_as(None).get("/docs/alerts.md")
    assert anonymous.status_code == 302 and "/login" in anonymous.headers["Location"]
    for role in ("viewer", "operator", "admin"):
        assert client_as(role).get("/docs/alerts.md").status_code == 200, role
    index = client_as("viewer").get("/docs/").get_data(as_text=True)
    listed = re.findall(r'href="/docs/([a-z0-9-]+\.md)"', index)
    assert listed[0] == "operators-guide.md"
    assert set(listed) == {p.name for p in DOCS.glob("*.md")}


def test_every_link_between_the_pages_answers_and_lands_on_a_heading(client_as):
    """The link checker: every relative link (and image) of every page, followed through the
    console; a 404 or a fragment that names no id on the target page fails."""
    client = client_as("viewer")
    pages: dict[str, Anchors] = {}

    def load(path: str) -> Anchors | None:
        if path not in pages:
            response = client.get(path)
            assert response.status_code == 200, f"{path}: {response.status_code}"
            is_html = response.mimetype == "text/html"
            pages[path] = parse(response.get_data(as_text=True)) if is_html else None
        return pages[path]

    broken, followed = [], 0
    for md in sorted(DOCS.glob("*.md")):
        here = f"/docs/{md.name}"
        page = load(here)
        assert page.styles == [], (md.name, page.styles[:3])  # the CSP would drop them
        for href in page.links + page.images:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc:
                continue
            target = urlsplit(urljoin(f"http://console{here}", href)).path  # as a browser resolves it
            try:
                landed = load(target)
            except AssertionError as exc:
                broken.append(f"{md.name}: {href} -> {exc}")
                continue
            followed += 1
            if parts.fragment and (landed is None or parts.fragment not in landed.ids):
                broken.append(f"{md.name}: {href} -> no id {parts.fragment!r} on {target}")
    assert broken == []
    assert followed > 40  # the pages do link each other (and the runbooks' page)


def test_links_to_files_the_console_does_not_serve_are_text_not_dead_links(client_as):
    html = client_as("viewer").get("/docs/operators-guide.md").get_data(as_text=True)
    assert '../Procfile' not in html  # a file of the repository, not of the installation
    assert f'<span class="doc-file" title="{docpages.NOT_SERVED}"><code>Procfile</code></span>' in html
    assert '<img src="screenshots/demo-workers.png"' in html  # a served image keeps its relative src


def test_assets_are_served_and_nothing_outside_docs_is(client_as):
    client = client_as("viewer")
    png = client.get("/docs/screenshots/demo-workers.png")
    assert png.status_code == 200 and png.mimetype == "image/png"
    rules = client.get("/docs/prometheus/skiplock-rules.yml")
    assert rules.status_code == 200 and rules.mimetype == "text/plain"
    assert rules.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/docs/../pyproject.toml", "/docs/%2e%2e/pyproject.toml", "/docs/..%2fREADME.md",
                 "/docs/nothing.md", "/docs/screenshots/", "/docs/prometheus", "/docs/.hidden.md",
                 "/docs//etc/passwd", "/docs/alerts.md.bak"):
        response = client.get(path, follow_redirects=True)  # Werkzeug merges "//" with a redirect first
        assert response.status_code == 404, (path, response.status_code)
        assert "root:" not in response.get_data(as_text=True) and "[project]" not in response.get_data(as_text=True)
    missing = client.get("/docs/nothing.md").get_data(as_text=True)
    assert "no docs page &#39;nothing.md&#39;: the pages are listed at /docs/" in missing


HOSTILE = """# A page

<script>window.ran = 1</script>

<img src=x onerror="window.ran = 2">

Inline <b onclick="window.ran = 3">bold</b>, a [link](javascript:alert(1)), another
[link](vbscript:msgbox(1)), an ![image](https://tracker.example/pixel.png) and a [file](file:///etc/passwd).

| right | centre |
|------:|:------:|
| 1     | 2      |
"""


@pytest.fixture
def hostile_docs(tmp_path, monkeypatch):
    (tmp_path / "hostile.md").write_text(HOSTILE)
    monkeypatch.setattr("console.web.docs.docs_dir", lambda: tmp_path)
    return tmp_path


def test_raw_html_and_script_links_in_markdown_are_text(client_as, hostile_docs):
    response = client_as("viewer").get("/docs/hostile.md")
    assert response.status_code == 200 and response.headers["Content-Security-Policy"] == CSP
    html = response.get_data(as_text=True)
    article = html[html.index('<article'):html.index('</article>')]
    assert "<script" not in article and "<img" not in article and "<b " not in article
    assert "&lt;script&gt;window.ran = 1&lt;/script&gt;" in article
    assert "&lt;b onclick=" in article
    assert 'href="javascript:' not in article and 'href="vbscript:' not in article and 'href="file:' not in article
    assert "tracker.example" not in article  # another site's image: its alt text only
    page = parse(html)
    assert page.styles == []
    assert '<th class="align-right">right</th>' in article and '<td class="align-center">2</td>' in article
