"""The operator docs (docs/*.md) as HTML pages of the console: the runbooks the alerts link to.

    page = render(docs_dir, "alerts.md")
    page.title  -> "Alerts and webhooks"
    page.html   -> Markup: headings with ids ("## queue_age" -> id="queue_age"), links, tables
    page.anchors -> {"queue_age", "how-an-alert-moves", ...}

Markdown is parsed by markdown-it-py (CommonMark, plus GitHub's tables and strikethrough), with
raw HTML switched off: a `<script>` or `<b onclick=...>` in a page is shown as text, never
passed through. Its link check refuses `javascript:`, `vbscript:` and `file:` targets.

Anchors follow GitHub's rule (lower case; letters, digits, `_`, `-` and spaces kept, spaces
become `-`; a repeated heading gets `-1`, `-2`), so a link written for the repository
(`alerts.md#queue_age`, `benchmarks.md#queue-throughput-benchthroughputpy`) lands on the same
heading here.

Links between pages stay relative: the console serves `docs/<name>.md` at `/docs/<name>.md`,
so `configuration.md#databases` resolves as it does in the repository. A link to a file this
console does not serve (`../Procfile`, a folder) becomes plain text with a note, so a page
never holds a link that answers 404; an image that is not a served file shows its alt text
(the console's CSP would block another site's image anyway).

The console's CSP has no inline styles: table alignment, which markdown-it writes as
`style="text-align:..."`, becomes a class (`align-right`, styled in static/docs.css).

This module reads files and renders; it does not know about Flask routes or sign-in
(console/web/docs.py does).
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markupsafe import Markup

# Files under docs/ the console serves as they are (besides the .md pages it renders): the
# screenshots the pages show and the files they link (the example config, Prometheus rules).
ASSET_TYPES: dict[str, str] = {
    ".png": "image/png",
    ".toml": "text/plain; charset=utf-8",
    ".yml": "text/plain; charset=utf-8",
    ".json": "application/json",
}
NOT_SERVED = "a file of the source repository, not served by the console"


@dataclass(frozen=True)
class Page:
    name: str  # "alerts.md"
    title: str
    html: Markup
    anchors: frozenset[str] = field(default_factory=frozenset)


def slug(text: str) -> str:
    """GitHub's heading anchor: "One alert's page (`/alerts/<id>`)" -> "one-alerts-page-alertsid"."""
    kept = "".join(c for c in text.strip().lower()
                   if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def is_page(name: str) -> bool:
    return name.endswith(".md")


def served(docs_dir: Path, name: str) -> bool:
    """Whether `name` (a path relative to docs/, already normalised) is a page or an asset the
    console serves: it exists under docs/ and has a served suffix."""
    if not name or name.startswith(("/", "../")) or name == "..":
        return False
    suffix = posixpath.splitext(name)[1].lower()
    if suffix != ".md" and suffix not in ASSET_TYPES:
        return False
    path = (docs_dir / name).resolve()
    return path.is_file() and docs_dir.resolve() in path.parents


def _heading_text(inline: Token) -> str:
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def _anchors(state: StateCore) -> None:
    """Give every heading its GitHub id."""
    seen: dict[str, int] = {}
    tokens = state.tokens
    for i, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        base = slug(_heading_text(tokens[i + 1]))
        count = seen.get(base, 0)
        seen[base] = count + 1
        token.attrSet("id", base if count == 0 else f"{base}-{count}")


def _no_inline_styles(state: StateCore) -> None:
    """Table alignment as a class: the CSP blocks style="" attributes."""
    for token in state.tokens:
        style = token.attrGet("style")
        if style is None:
            continue
        del token.attrs["style"]
        match = re.fullmatch(r"text-align:(left|center|right)", str(style))
        if match:
            token.attrJoin("class", f"align-{match.group(1)}")


def _target(env: dict, href: str) -> str:
    """The docs-relative file a relative link points to ("../Procfile" when it leaves docs/)."""
    here = posixpath.dirname(env["page"])
    return posixpath.normpath(posixpath.join(here, href)) if href else env["page"]


def _links(state: StateCore) -> None:
    """Relative links to files the console does not serve become text; so do such images."""
    docs_dir: Path = state.env["docs_dir"]
    for block in state.tokens:
        children = block.children or []
        opened: list[Token] = []
        for i, token in enumerate(children):
            if token.type == "link_open":
                href = str(token.attrGet("href") or "")
                parts = urlsplit(href)
                if parts.scheme or parts.netloc:
                    token.attrSet("rel", "noopener noreferrer")
                    opened.append(token)
                    continue
                if not parts.path:  # "#anchor" on this page
                    opened.append(token)
                    continue
                if served(docs_dir, _target(state.env, parts.path)):
                    opened.append(token)
                    continue
                token.tag, token.attrs = "span", {"class": "doc-file", "title": NOT_SERVED}
                opened.append(token)
            elif token.type == "link_close":
                if opened and opened.pop().tag == "span":
                    token.tag = "span"
            elif token.type == "image":
                src = str(token.attrGet("src") or "")
                parts = urlsplit(src)
                local = not (parts.scheme or parts.netloc) and served(docs_dir, _target(state.env, parts.path))
                if not local:  # its alt text, as a text token
                    children[i] = Token("text", "", 0, content=token.content)


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    md.core.ruler.push("skiplock_anchors", _anchors)
    md.core.ruler.push("skiplock_no_inline_styles", _no_inline_styles)
    md.core.ruler.push("skiplock_links", _links)
    return md


_MD = _parser()


def _title(tokens: list[Token], fallback: str) -> str:
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            return _heading_text(tokens[i + 1]) or fallback
    return fallback


@lru_cache(maxsize=64)
def _render(path: Path, mtime_ns: int, name: str, docs_dir: Path) -> Page:
    del mtime_ns  # part of the cache key only: an edited file is rendered again
    text = path.read_text(encoding="utf-8")
    env = {"docs_dir": docs_dir, "page": name}
    tokens = _MD.parse(text, env)
    anchors = frozenset(str(t.attrGet("id")) for t in tokens if t.type == "heading_open")
    html = _MD.renderer.render(tokens, _MD.options, env)
    return Page(name=name, title=_title(tokens, name), html=Markup(html), anchors=anchors)


def render(docs_dir: Path, name: str) -> Page:
    """The page docs/`name` (a served .md file: check with `served` first)."""
    path = docs_dir / name
    return _render(path, path.stat().st_mtime_ns, name, docs_dir)


FIRST = "operators-guide.md"  # the index starts where a new operator starts


def pages(docs_dir: Path) -> list[Page]:
    """Every page in docs/ (top level): the operator's guide, then the others by title."""
    found = [render(docs_dir, p.name) for p in sorted(docs_dir.glob("*.md"))]
    return sorted(found, key=lambda p: (p.name != FIRST, p.title.lower()))


__all__ = ["ASSET_TYPES", "NOT_SERVED", "Page", "pages", "render", "served", "slug"]
