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
from flask import Flask, g
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


def current_database() -> str:
    return g.get("_skiplock_database") or _state().databases.home.name


def get_conn() -> psycopg.Connection:
    conn = g.get("_skiplock_conn")
    if conn is None:
        st = _state()
        name = g.get("_skiplock_database")
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
    conn = g.pop("_skiplock_conn", None)
    pool = g.pop("_skiplock_pool", None)
    if conn is None:
        return
    try:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
    except psycopg.Error:
        pass
    (pool or _state().pool).putconn(conn)


def install(app: Flask) -> None:
    app.teardown_appcontext(_release)
