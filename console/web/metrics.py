"""`/metrics`: the newest collection cycle in the Prometheus text format, for scrapers.

No sign-in session (Prometheus has none). When `web.metrics_token` is set, only with
`Authorization: Bearer <that token>` (401 otherwise). Without a token, production mode (the
default) answers 401 unless `web.metrics_public = true` says the figures may be read by anyone
who can reach the port; the development server (`skiplock serve`) serves them openly. The body comes from
`console.metrics.render_databases`: every database's newest samples, read in parallel, each under
the console's statement timeout, every series labelled `database` (`database="default"` for a
single database). A database that cannot be read has only `skiplock_collection_age_seconds` = NaN;
when none can be read the answer is 503, never a stale page.
"""

from __future__ import annotations

import functools
import hmac
from concurrent.futures import ThreadPoolExecutor

import psycopg
from flask import Blueprint, Response, copy_current_request_context, current_app, request
from psycopg_pool import PoolTimeout

from console.db import time_limited
from console.metrics import CONTENT_TYPE, render_databases
from console.samples import latest_cycle
from console.web import cycle
from console.web.auth import public
from console.web.database import DatabaseUnreachable, get_conn, use_database

bp = Blueprint("metrics", __name__)


def _token_ok(expected: str) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


def _unauthorized(message: str) -> Response:
    return Response(message + "\n", status=401, mimetype="text/plain",
                    headers={"WWW-Authenticate": 'Bearer realm="skiplock metrics"'})


@bp.get("/metrics")
@public
def metrics():
    config = current_app.extensions["skiplock"].config
    expected = config.web.metrics_token
    if expected and not _token_ok(expected):
        return _unauthorized("a bearer token is required for /metrics")
    if not expected and config.web.production and not config.web.metrics_public:
        return _unauthorized("/metrics is closed: set web.metrics_token (SKIPLOCK_WEB_METRICS_TOKEN) and scrape "
                             "with that bearer token, or set web.metrics_public = true")
    names = current_app.extensions["skiplock"].databases.names
    timeout = config.database.statement_timeout_ms

    def read(name: str) -> tuple[list | None, str | None, tuple | None]:
        # The newest cycle's samples, read once per generation of the database for every
        # scraper (console/web/cycle.py).
        use_database(name)
        try:
            conn = get_conn()
            with time_limited(conn, timeout):
                found, shown = cycle.cache().get(("metrics",), cycle.generation(), lambda: latest_cycle(conn))
                return found, None, shown
        except (DatabaseUnreachable, PoolTimeout, psycopg.Error) as exc:
            return None, f"{name}: " + (str(exc).strip().splitlines() or [type(exc).__name__])[0], None

    # Each database in a copy of this request's context (its own app context, `g` and connection).
    calls = [copy_current_request_context(functools.partial(read, name)) for name in names]
    # Always in a thread, even for one database: in this thread the copy would share the
    # request's app context (and any connection it already borrowed).
    with ThreadPoolExecutor(max_workers=min(len(calls), 16), thread_name_prefix="skiplock-metrics") as pool:
        results = list(pool.map(lambda call: call(), calls))
    if all(samples is None for samples, _, _ in results):
        reason = "; ".join(error for _, error, _ in results if error)
        return Response(f"metrics not available: {reason}\n", status=503, mimetype="text/plain")
    # The body of every database's generation, rendered once for every scraper.
    body, _ = cycle.cache().get(
        ("metrics body", config.web.metrics_queue_series, config.web.metrics_group_series),
        cycle.Generation("", False, tuple(shown for _, _, shown in results)),
        lambda: render_databases({name: samples for name, (samples, _, _) in zip(names, results, strict=True)},
                                 queue_limit=config.web.metrics_queue_series,
                                 group_limit=config.web.metrics_group_series))
    return Response(body, status=200, content_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})
