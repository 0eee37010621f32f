"""Errors as messages: 400/401/403/404/405/409/422/429 with a message page, JSON for the API, text
for htmx; an unreachable database as a 503 page that says so. Bad input never becomes a 500."""

from __future__ import annotations

import logging

import psycopg
from flask import Flask, jsonify, render_template, request
from psycopg_pool import PoolTimeout
from werkzeug.exceptions import HTTPException

from console.actions import ReasonRequired
from console.caps import CapReached
from console.db import DatabaseError, _redact
from console.web.database import DatabaseUnreachable, QueryTooSlow, replica_lost

log = logging.getLogger(__name__)


def failure_reason(exc: BaseException) -> str:
    """A database failure for a log line: one line, the password removed (console.db._redact)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return _redact(text) if text else exc.__class__.__name__


def wants_json() -> bool:
    if request.path.startswith("/api/"):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and not request.accept_mimetypes["text/html"]


def respond(status: int, title: str, message: str, *, template: str = "error.html", **extra):
    if wants_json():
        body = {"error": message, "status": status}
        body.update(extra)
        return jsonify(body), status
    if request.headers.get("HX-Request"):
        return message, status, {"Content-Type": "text/plain; charset=utf-8"}
    return render_template(template, status=status, title=title, message=message, **extra), status


def install(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code is None or exc.code < 400:
            return exc
        response = respond(exc.code, exc.name, exc.description or exc.name)
        if exc.code == 405 and exc.valid_methods:
            body, status = response[0], response[1]
            return body, status, {"Allow": ", ".join(exc.valid_methods)}
        return response

    @app.errorhandler(ValueError)
    def bad_value(exc: ValueError):
        return respond(400, "Bad Request", str(exc) or "bad input")

    @app.errorhandler(CapReached)
    def cap_reached(exc: CapReached):
        # 429: well-formed, allowed for this role, but one more than the cap (console.caps).
        return respond(429, "Too many", str(exc))

    @app.errorhandler(ReasonRequired)
    def reason_required(exc: ReasonRequired):
        # 422: the request is well-formed, but this action needs a why (console.actions.ACTIONS).
        return respond(422, "Reason required", str(exc))

    @app.errorhandler(QueryTooSlow)
    def too_slow(exc: QueryTooSlow):
        return respond(503, "Query too slow", str(exc))

    @app.errorhandler(psycopg.errors.QueryCanceled)
    def cancelled(exc):
        return respond(503, "Query too slow", "the query took longer than its time limit; narrow the filter")

    def unreachable(exc: Exception):
        # The reason (host, port, user, the server's words) is for the operator's log, never for
        # the page: anyone, signed in or not, may see this page.
        log.warning("database unreachable (%s %s): %s", request.method, request.path, failure_reason(exc))
        lost = replica_lost()
        if lost:  # the replica went away after the page chose it: the next pages read the primary
            return respond(503, "Replica unreachable", f"The replica of {lost} stopped answering while this page "
                           "read it. Reload: the next pages read the primary.", template="db_down.html",
                           database="replica unreachable")
        return respond(503, "Database unreachable", "The database is unreachable. "
                       "The console will work again as soon as it answers.", template="db_down.html",
                       database="unreachable")

    for kind in (DatabaseUnreachable, PoolTimeout, psycopg.OperationalError, DatabaseError):
        app.register_error_handler(kind, unreachable)

    @app.errorhandler(psycopg.errors.SerializationFailure)
    def conflict(exc):
        # Outside an explicit transaction of ours this is a hot standby cancelling a query that
        # conflicts with the replay of the primary's changes (vacuum removed rows it reads).
        return respond(503, "Query cancelled", "the query was cancelled (on a replica: it conflicted with "
                       "replication); reload the page")

    @app.errorhandler(psycopg.errors.UndefinedTable)
    def schema_missing(exc):
        return respond(503, "Schema missing", "The skiplock schema is missing or out of date: run `skiplock migrate`.",
                       template="db_down.html", database="schema missing")
