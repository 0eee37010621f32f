"""Jinja filters and globals shared by every template, and JSON with ISO-8601 times.

Filters: `utc` ("2026-11-30 03:40:12 UTC"), `ago` ("3 min ago", "in 2 h"), `number`
("12,345"), `duration` (seconds -> "2 min 5 s"), `pretty_json`, `json_text` and `query_args`.
Test: `safe_link` (`{% if rule.runbook is safe_link %}<a href=...>`). Filter `runbook_href`: where a
rule's runbook opens (the console's /docs/ page, or `[alerts] runbook_base_url`'s). Globals: `csrf_token()`,
`csrf_field()`, `nav_entries()`, `user`, `can(role)` (false for actions in a read-only console),
`read_only`, `endpoints` (the registered view names), `poll_fast_ms`.

Output encoding: autoescape is on for every template, so `{{ value }}` is safe in element text
and in a double- or single-quoted attribute. Do not put Flask's `tojson` inside an attribute: it
returns Markup (autoescape skips it) and does not escape `"`, so a payload like `{"a": "x"
hx-get=..."}` becomes new attributes. Use `json_text` there: plain JSON text that autoescape then
encodes. Never mark user or payload text `|safe` or `Markup`. Links whose target comes from
configuration or users (runbooks) go through the `safe_link` test: http(s) URLs and site paths only.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from flask import Flask, g
from flask.json.provider import DefaultJSONProvider
from markupsafe import Markup, escape

from console.jsonbounds import PAGE, bounded
from console.timefmt import duration
from console.web import nav


class SkiplockJSON(DefaultJSONProvider):
    sort_keys = False

    @staticmethod
    def default(o: Any) -> Any:
        if isinstance(o, datetime):
            return o.astimezone(UTC).isoformat() if o.tzinfo else o.isoformat()
        if isinstance(o, date):
            return o.isoformat()
        if isinstance(o, timedelta):
            return o.total_seconds()
        if isinstance(o, Decimal):
            return float(o)
        if isinstance(o, (set, frozenset, tuple)):
            return list(o)
        return DefaultJSONProvider.default(o)


def now() -> datetime:
    return datetime.now(UTC)


def utc(value: datetime | None, seconds: bool = True) -> str:
    if value is None:
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC")


def ago(value: datetime | None, reference: datetime | None = None) -> str:
    if value is None:
        return "never"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = ((reference or now()) - value).total_seconds()
    if abs(delta) < 5:
        return "just now"
    text = duration(abs(delta)).split(" ")
    text = " ".join(text[:2])  # "3 min", not "3 min 5 s"
    return f"{text} ago" if delta > 0 else f"in {text}"


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def pretty_json(value: Any) -> str:
    """Indented JSON for a page, within console.jsonbounds.PAGE (the indenting encoder recurses
    per level: a value is bounded, without recursion, before it is encoded)."""
    return json.dumps(bounded(value, PAGE), indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_text(value: Any) -> str:
    """JSON as a plain str (not Markup), so autoescape encodes it for an attribute or text;
    within console.jsonbounds.PAGE, like pretty_json."""
    return json.dumps(bounded(value, PAGE), ensure_ascii=False, sort_keys=True, default=str)


def query_args(args: dict[str, Any]) -> dict[str, str]:
    """Filter values for url_for: structured ones (a payload filter) as JSON text, not a repr."""
    return {k: v if isinstance(v, str) else json_text(v) for k, v in args.items() if v is not None}


def safe_link(value: Any) -> bool:
    """Whether a configured link target may be an href: http(s) with a host, or a site path."""
    from console.alerts.rules import link_problem

    return isinstance(value, str) and bool(value) and link_problem(value) is None


def runbook_href(runbook: Any) -> str | None:
    """The href of a rule's runbook on a page: "docs/alerts.md#queue_age" is the console's own
    /docs/alerts.md#queue_age (under the request's script root), or joined to
    `[alerts] runbook_base_url` when that is set (console.alerts.links). None when it may not
    be a link at all (see `safe_link`)."""
    from flask import request

    from console.alerts.links import runbook_path, runbook_url
    from console.web import state

    if not safe_link(runbook):
        return None
    base = state().config.alerts.runbook_base_url
    path = runbook_path(runbook, base)
    href = request.script_root + path if path else runbook_url(runbook, runbook_base_url=base)
    return href if safe_link(href) else None


def _switcher() -> list[dict[str, Any]]:
    """[{name, url, current}] for the database switcher: this page under each database
    (`/db/<name>/<path>`); empty with one database. Unprefixed pages are the first database."""
    from flask import request

    from console.web import state
    from console.web.database import current_database

    names = state().databases.names
    if len(names) < 2:
        return []
    here = current_database()
    root = request.root_path
    base = root[: root.rfind("/db/")] if "/db/" in root else root
    return [{"name": n, "url": f"{base}/db/{n}{request.path}", "current": n == here} for n in names]


def install(app: Flask) -> None:
    from console.web.auth import csrf_token

    app.json = SkiplockJSON(app)
    env = app.jinja_env
    env.filters.update(utc=utc, ago=ago, number=number, duration=duration, pretty_json=pretty_json,
                       json_text=json_text, query_args=query_args, runbook_href=runbook_href)
    env.tests["safe_link"] = safe_link
    env.globals.update(csrf_token=csrf_token, now=now)

    def csrf_field() -> Markup:
        return Markup('<input type="hidden" name="csrf_token" value="%s">') % escape(csrf_token())

    env.globals["csrf_field"] = csrf_field

    @app.context_processor
    def inject() -> dict[str, Any]:
        from console.web import state
        from console.web.auth import may_act

        web = state().config.web
        user = g.get("user")
        return {
            "database_switcher": _switcher,
            "user": user,
            # False for actions (any role above viewer) when the console is read-only.
            "can": may_act,
            "read_only": bool(web.read_only),
            # Where the page's queries went (primary or replica, and its lag): console/web/database.py.
            "read_from": g.get("_skiplock_read_from"),
            "endpoints": app.view_functions,  # `'search.index' in endpoints`: link only what exists
            "nav_entries": lambda: nav.entries_for(app, user),
            "poll_fast_ms": int(web.poll_fast * 1000),
        }
