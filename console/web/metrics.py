"""`/metrics`: the newest collection cycle in the Prometheus text format, for scrapers.

No sign-in session (Prometheus has none). When `web.metrics_token` is set, only with
`Authorization: Bearer <that token>` (401 otherwise). Without a token, production mode (the
default) answers 401 unless `web.metrics_public = true` says the figures may be read by anyone
who can reach the port; the development server (`skiplock serve`) serves them openly. The body comes from
`console.metrics.render_metrics` under the console's statement timeout; a timeout or an
unreachable database answers 503, never a stale page.
"""

from __future__ import annotations

import hmac

import psycopg
from flask import Blueprint, Response, current_app, request
from psycopg_pool import PoolTimeout

from console.db import time_limited
from console.metrics import render_metrics
from console.web.auth import public
from console.web.database import DatabaseUnreachable, get_conn

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
    try:
        conn = get_conn()
        with time_limited(conn, config.database.statement_timeout_ms):
            body, content_type = render_metrics(conn)
    except (DatabaseUnreachable, PoolTimeout, psycopg.Error) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Response(f"metrics not available: {reason}\n", status=503, mimetype="text/plain")
    return Response(body, status=200, content_type=content_type, headers={"Cache-Control": "no-store"})
