"""The operator docs, served by the console: every runbook link of an alert opens here.

GET /docs/                 the list of pages
GET /docs/<name>.md        docs/<name>.md rendered as a page of the console (console/web/docpages.py)
GET /docs/<file>           a screenshot or a file a page links (docs/prometheus/*.yml, the example config)

A rule's runbook (`docs/alerts.md#queue_age`) becomes `/docs/alerts.md#queue_age` in the console
and `<alerts.console_url>/docs/alerts.md#...` in webhook messages (console.alerts.links.runbook_*),
unless `[alerts] runbook_base_url` is set: then it points there, in both. The pages are the copy
of docs/ installed with the console (a wheel carries it as console/_data/docs), so they describe
the version that is running.

Any signed-in user may read them (a viewer is on call too); there is no JSON twin (the Markdown
is in the repository). Nothing here reads the database.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from flask import Blueprint, abort, render_template, send_from_directory

from console.resources import resource_dir
from console.web import docpages
from console.web.auth import requires

bp = Blueprint("docs", __name__)


def docs_dir() -> Path:
    return resource_dir("docs")


@bp.get("/docs/")
@requires("viewer")
def index():
    return render_template("docs/index.html", pages=docpages.pages(docs_dir()))


@bp.get("/docs/<path:name>")
@requires("viewer")
def page(name: str):
    folder = docs_dir()
    name = posixpath.normpath(name)
    if not docpages.served(folder, name):
        abort(404, f"no docs page {name!r}: the pages are listed at /docs/")
    if docpages.is_page(name):
        return render_template("docs/page.html", page=docpages.render(folder, name))
    suffix = posixpath.splitext(name)[1].lower()
    return send_from_directory(folder, name, mimetype=docpages.ASSET_TYPES[suffix])
