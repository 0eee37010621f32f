"""Issue 26, class 6: a GET never writes.

Every GET route of the app's URL map (every blueprint, present and future) is requested with
real path values and sensible query strings, by a viewer, an admin and a read-only API token,
over a database with something in every table; then every table of the skiplock schema must
hold exactly the rows it held, with the same content and the same xmin (an UPDATE to the same
value still changes xmin), and every sequence must be where it was (an INSERT rolled back
still moves one).

Left out on purpose, and only these two columns: a credential's last use, which its use stamps
(at most once a minute). `web_sessions.last_seen_at` is the session's idle clock: it is what
ends a forgotten session after `web.session_idle` (polls do not move it).
`api_tokens.last_used_at` tells an admin which tokens nobody uses any more. Every other column
of those two tables is compared like every other table's.

A new GET route needs nothing here; a GET route that needs a path value this file cannot
fill fails `test_every_get_route_is_walked` until PATH_VALUES names one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql

from console import audit
from console import queue as q
from console import users as users_mod
from console.alerts import evaluate as ev
from console.alerts.rules import parse_destination
from console.maintenance import start
from console.queue import periodic
from tests.alert_links_data import fire_default
from tests.oncall_data import make_dead_letters, store_history

# Sensible extra query strings per endpoint (the bare path is always requested too).
QUERIES: dict[str, list[str]] = {
    "jobs.index": ["state=failed", "state=pending&eligible=1", "state=running&lease=expired", 'payload={{"customer":1000}}'],
    "jobs.api_index": ["state=failed&count=true", "queue=billing"],
    "jobs.count_fragment": ["state=failed"],
    "jobs.export": ["state=failed"],
    "jobs.api_export": ["state=failed"],
    "deadletters.index": ["queue=billing"],
    "deadletters.jobs": ["queue=billing", "fingerprint=x"],
    "deadletters.api_jobs": ["queue=mail"],
    "advisor.index": ["check=claim-plan"],
    "advisor.checks_fragment": ["check=claim-plan"],
    "advisor.api_index": ["check=claim-plan", "fresh=1", "fresh=1&check=retry-caps"],
    "search.index": ["q=billing", "q=declined", "q={job}"],
    "search.api_index": ["q=mail", "q={job}"],
    "auditlog.index": ["action=replay"],
    "auditlog.api_index": ["since=1h"],
    "alerts.deliveries_page": ["destination=hook"],
    "alerts.api_deliveries": ["destination=hook"],
    "alerts.api_events": ["limit=5"],
    "overview.index": ["window=1h"],
    "overview.api_index": ["window=6h"],
    "health.index": ["fresh=1"],
    "maintenance.index": ["run=1"],
    "metrics.metrics": [""],
}

# Values for path arguments, by argument name ({...} is filled from the seeded data).
PATH_VALUES = {
    "job_id": "{job}", "alert_id": "{alert}", "op_id": "{op}", "name": "{queue}", "fmt": "csv",
    "filename": "skiplock.css",
}
PER_ENDPOINT = {  # where `name` is not a queue
    "periodic": {"name": "nightly"},
}

# The credentials' last-use stamps (see the module docstring): every other column is compared.
LAST_USE = {"web_sessions": "last_seen_at", "api_tokens": "last_used_at"}


def seed(conn, personas) -> dict[str, object]:
    """Something in every table a GET could touch."""
    store_history(conn, minutes=30)
    dead = make_dead_letters(conn, smtp=2, card=2)
    q.enqueue(conn, "email", {"to": "a@example.com"}, queue="mail")
    [running] = q.claim(conn, "w-1", queues=["mail"], limit=1, lease=60)
    q.enqueue(conn, "later", {}, queue="default", run_at=datetime.now(UTC) + timedelta(hours=1))
    op = start(conn, "replay", {"ids": dead["smtp"][:1]}, actor="operator", reason="seeded replay")
    destinations = {"hook": parse_destination({"name": "hook", "url": "https://hooks.example/x", "kind": "json"})}
    alert = fire_default(conn, "dead_letter_growth", {"queue": "billing"}, 540, destinations=destinations)
    ev.silence(conn, rule="queue_age", labels={"queue": "mail"}, duration=timedelta(hours=1), reason="seeded silence",
               actor="operator")
    declared = periodic.parse_entries([("#1", {"name": "nightly", "kind": "report", "every": "1h"}, "config")])
    periodic.sync(conn, declared)
    periodic.enqueue_due(conn, declared)
    audit.record(conn, actor="operator", action="pause", target="queue:mail", reason="seeded pause", rows=1)
    users_mod.create_token(conn, "operator", "seeded")
    return {"job": dead["card"][0], "alert": alert, "op": op, "queue": "billing", "running": running.id}


def tables(conn) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'skiplock' AND c.relkind IN ('r', 'p') ORDER BY c.relname").fetchall()]


def snapshot(conn) -> dict[str, object]:
    """Per table: row count and a digest of every row with its xmin; per sequence: its value."""
    state: dict[str, object] = {}
    for name in tables(conn):
        table = sql.Identifier("skiplock", name)
        if name in LAST_USE:
            row_text = sql.SQL("(to_jsonb(t) - {})::text").format(sql.Literal(LAST_USE[name]))
        else:
            row_text = sql.SQL("t.xmin::text || ':' || t::text")
        row = conn.execute(sql.SQL("SELECT count(*), md5(coalesce(string_agg({row}, ',' ORDER BY {row}), '')) "
                                   "FROM {table} AS t").format(row=row_text, table=table)).fetchone()
        state[name] = tuple(row)
    for (seq,) in conn.execute("SELECT sequencename FROM pg_sequences WHERE schemaname = 'skiplock'").fetchall():
        state[f"sequence {seq}"] = conn.execute(sql.SQL("SELECT last_value, is_called FROM {}").format(
            sql.Identifier("skiplock", seq))).fetchone()
    return state


def get_routes(app, ctx) -> list[tuple[str, str]]:
    """(endpoint, url) for every GET rule, with path values filled and each sensible query."""
    out = []
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or ()):
            continue
        values = {**PATH_VALUES, **PER_ENDPOINT.get(rule.endpoint.split(".")[0], {})}

        def fill(match: re.Match, values=values) -> str:
            return values[match.group(2)].format(**ctx)

        path = re.sub(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>", fill, rule.rule)
        for query in ["", *QUERIES.get(rule.endpoint, [])]:
            out.append((rule.endpoint, path + ("?" + query.format(**ctx) if query else "")))
    return sorted(out)


@pytest.fixture
def world(conn, personas):
    return seed(conn, personas)


def test_every_get_route_is_walked(web_app, world):
    routes = get_routes(web_app, world)
    endpoints = {e for e, _ in routes}
    assert len(endpoints) >= 60, len(endpoints)
    assert {"advisor.api_index", "advisor.index", "jobs.export", "overview.index", "metrics.metrics"} <= endpoints
    assert not [u for _, u in routes if "<" in u]


@pytest.mark.parametrize("persona", ["viewer", "admin", "token-readonly"])
def test_no_get_route_changes_any_table(web_app, client_as, conn, world, persona):
    routes = get_routes(web_app, world)
    if persona.startswith("token"):
        token = users_mod.create_token(conn, "admin", "walk read-only", read_only=True)
        client, headers = client_as(None), {"Authorization": f"Bearer {token}"}
        routes = [(e, u) for e, u in routes if u.startswith("/api/")]
    else:
        client, headers = client_as(persona), {}
    # One request first, so the session's first `last_seen_at` touch is behind us.
    client.get("/overview", headers=headers)
    before = snapshot(conn)
    errors, statuses = [], {}
    for endpoint, url in routes:
        response = client.get(url, headers=headers)
        body = response.get_data(as_text=True)  # a streamed export runs to its end
        response.close()
        statuses[url] = response.status_code
        if response.status_code >= 500:
            errors.append(f"{url}: {response.status_code} {body[:200]}")
        after = snapshot(conn)
        changed = sorted(k for k in after if after[k] != before.get(k))
        if changed:
            errors.append(f"GET {url} ({endpoint}) as {persona} changed {', '.join(changed)}")
            before = after
    assert errors == [], "\n".join(errors)
    assert sum(1 for s in statuses.values() if s == 200) >= len(routes) // 2, statuses
