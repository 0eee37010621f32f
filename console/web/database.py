"""The request's database connection, panels under a time limit, and "database unreachable".

`get_conn()` borrows one autocommit connection from the app's pool for the whole request and
returns it at teardown: from the home database's pool (the first of `[[databases]]`, or the
only one), or from the pool of the database `use_database(name)` chose for this app context (the
fleet page runs each database in its own app context, in its own thread). `run_panel(fn, *args)` runs `fn(conn, *args)` under
`console.db.time_limited`: a statement timeout or a failed query gives a `Panel` that says
"not available" and why, and the page renders the rest. Losing the connection itself is not a
panel's problem: it raises `DatabaseUnreachable`, and every page then says so (errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from flask import Flask, abort, g, has_request_context, request
from psycopg_pool import PoolTimeout

from console.db import time_limited

log = logging.getLogger(__name__)


class DatabaseUnreachable(RuntimeError):
    """No connection within `web.db_wait` seconds, or the connection broke mid-request."""


@dataclass
class Panel:
    ok: bool
    data: Any = None
    error: str | None = None


def _state():
    from console.web import state

    return state()


def use_database(name: str | None) -> None:
    """Later `get_conn()` calls of this app context borrow from database `name`'s pool
    (None: the home database). Call it before the first `get_conn()`."""
    if g.get("_skiplock_conn") is not None:
        raise RuntimeError("use_database() after get_conn(): the connection is already borrowed")
    g._skiplock_database = name


PREFIX_KEY = "skiplock.database"  # WSGI environ key DatabasePrefix sets for /db/<name>/...


class DatabasePrefix:
    """WSGI middleware: `/db/<name>/rest` is the page `/rest` scoped to database `name`.

    The prefix moves to SCRIPT_NAME, so every `url_for` link of the page stays inside
    `/db/<name>/`; the name is checked (404 naming the configured ones) before sign-in."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith("/db/"):
            name, _, rest = path[len("/db/"):].partition("/")
            environ[PREFIX_KEY] = name
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "").rstrip("/") + "/db/" + name
            environ["PATH_INFO"] = "/" + rest
        return self.app(environ, start_response)


def _scoped() -> str | None:
    """The database of this app context: `use_database`'s, else the request's /db/<name>/."""
    name = g.get("_skiplock_database")
    if name is None and has_request_context():
        name = request.environ.get(PREFIX_KEY)
    return name


def current_database() -> str:
    return _scoped() or _state().databases.home.name


def _check_prefix() -> None:
    name = request.environ.get(PREFIX_KEY)
    if name is not None and name not in _state().databases.names:
        abort(404, f"unknown database {name!r} (configured: {', '.join(_state().databases.names)})")


def home_conn() -> psycopg.Connection:
    """A connection to the home database (users, sessions, API tokens live there), whatever
    database the page is scoped to."""
    name = _scoped()
    if name is None or name == _state().databases.home.name:
        return get_conn()
    conn = g.get("_skiplock_home_conn")
    if conn is None:
        st = _state()
        try:
            conn = st.pool.getconn(timeout=st.config.web.db_wait)
        except PoolTimeout:
            raise DatabaseUnreachable(f"no database connection within {st.config.web.db_wait:g} s") from None
        g._skiplock_home_conn = conn
    return conn


def get_conn() -> psycopg.Connection:
    conn = g.get("_skiplock_conn")
    if conn is None:
        st = _state()
        name = _scoped()
        pool = st.pool if name is None else st.databases.pool(name)
        try:
            conn = pool.getconn(timeout=st.config.web.db_wait)
        except PoolTimeout:
            raise DatabaseUnreachable(
                f"no database connection within {st.config.web.db_wait:g} s"
            ) from None
        g._skiplock_conn = conn
        g._skiplock_pool = pool
    return conn


def timeout_ms() -> int:
    return int(_state().config.database.statement_timeout_ms)


def run_panel(fn: Callable[..., Any], *args: Any, timeout: int | None = None, **kwargs: Any) -> Panel:
    """Run `fn(conn, *args, **kwargs)` under a statement timeout; never raises for a slow or
    failed query (only for a lost connection)."""
    conn = get_conn()
    limit = timeout or timeout_ms()
    try:
        with time_limited(conn, limit):
            return Panel(True, fn(conn, *args, **kwargs))
    except psycopg.errors.QueryCanceled:
        return Panel(False, error=f"the query took longer than {limit} ms")
    except psycopg.errors.LockNotAvailable:
        return Panel(False, error="waited too long for a lock")
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        log.warning("panel %s failed: %s (%s)", getattr(fn, "__name__", fn), exc.__class__.__name__, exc.sqlstate)
        return Panel(False, error=f"the query failed ({exc.__class__.__name__})")


def run_limited(fn: Callable[..., Any], *args: Any, timeout: int | None = None, **kwargs: Any) -> Any:
    """Like run_panel for a page's main query, whose failure is the page's failure: a timeout
    raises `QueryTooSlow` (shown as a 503 message asking to narrow the filter)."""
    conn = get_conn()
    limit = timeout or timeout_ms()
    try:
        with time_limited(conn, limit):
            return fn(conn, *args, **kwargs)
    except psycopg.errors.QueryCanceled:
        raise QueryTooSlow(limit) from None


class QueryTooSlow(RuntimeError):
    def __init__(self, limit_ms: int):
        super().__init__(f"the query took longer than {limit_ms} ms; narrow the filter (a queue, a state, a time range)")


def _release(exc: BaseException | None = None) -> None:
    home = g.pop("_skiplock_home_conn", None)
    if home is not None:
        _give_back(home, _state().pool)
    conn = g.pop("_skiplock_conn", None)
    pool = g.pop("_skiplock_pool", None)
    if conn is None:
        return
    _give_back(conn, pool or _state().pool)


def _give_back(conn, pool) -> None:
    try:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
    except psycopg.Error:
        pass
    pool.putconn(conn)


def install(app: Flask) -> None:
    app.teardown_appcontext(_release)
    app.before_request(_check_prefix)
