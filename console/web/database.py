"""The request's database connection, panels under a time limit, and "database unreachable".

`get_conn()` borrows one autocommit connection from the app's pool for the whole request and
returns it at teardown: from the home database's pool (the first of `[[databases]]`, or the
only one), or from the pool of the database `use_database(name)` chose for this app context (the
fleet page runs each database in its own app context, in its own thread). `run_panel(fn, *args)` runs `fn(conn, *args)` under
`console.db.time_limited`: a statement timeout or a failed query gives a `Panel` that says
"not available" and why, and the page renders the rest. Losing the connection itself is not a
panel's problem: it raises `DatabaseUnreachable`, and every page then says so (errors.py).

Primary or replica
------------------
A database with `replica_dsn` has a read-only replica pool (console.databases.Registry). Which
connection `get_conn()` gives is decided here, once per request, by the route's kind:

- a GET of an endpoint in `REPLICA_READS` (pages, fragments and API reads of replicated
  tables: jobs, queues, samples, alerts, audit) reads the replica, if it answers within
  `REPLICA_WAIT_S`, is a standby, and has replayed this session's last change (the primary's WAL
  position after it, kept in the session cookie: an operator sees their own action at once);
- everything else reads and writes the primary: every POST/PUT/DELETE (actions, audit rows,
  bulk previews and the operations they start, alert rule edits), sign-in, sessions, users and
  API tokens (`home_conn()`, always the primary), and the GETs of `PRIMARY_READS`, which read
  what only the primary has (its pg_stat_activity, locks, horizon holders, replication, the
  scheduler's advisory locks) or bind a later action.

`primary_conn()` is the primary whatever the route. A replica that does not answer (or is not a
standby) makes the page read the primary with a note in the layout, never a 500, and is rested
for a while (console.databases.REPLICA_REST_S) so the next pages do not wait for it. The choice
and the replica's lag are `read_from()` (the layout's banner and the `X-Skiplock-Read-From`
header); `replica_probe(name)` measures a replica for the fleet page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from flask import Flask, abort, g, has_request_context, request, session
from psycopg_pool import PoolTimeout

from console import replica
from console.db import time_limited

log = logging.getLogger(__name__)

# The GET endpoints that may read the replica: what they show lives in replicated tables (jobs,
# queues, samples, alerts, audit log, schedules), so a replica shows it as of its lag.
REPLICA_READS: frozenset[str] = frozenset({
    "overview.index", "overview.api_index", "overview.figures_fragment", "overview.queues_fragment",
    "overview.verdict_fragment", "overview.queue_charts", "overview.api_queue_charts",
    "queues.index", "queues.table", "queues.detail", "queues.external_fragment", "queues.api_index",
    "queues.api_detail",
    "jobs.index", "jobs.count_fragment", "jobs.detail", "jobs.export", "jobs.api_index", "jobs.api_detail",
    "jobs.api_export",
    "deadletters.index", "deadletters.jobs", "deadletters.api_index", "deadletters.api_jobs",
    "alerts.index", "alerts.active_fragment", "alerts.alert_page", "alerts.deliveries_page", "alerts.api_index",
    "alerts.api_alert", "alerts.api_events", "alerts.api_deliveries", "alerts.api_silences",
    "auditlog.index", "auditlog.api_index",
    "search.index", "search.api_index",
    "periodic.index", "periodic.table", "periodic.api_index",
})

# The GET endpoints that read the primary even when a replica is configured, and why. Every GET
# route is in exactly one of the two (tests/test_replica_reads.py): a new page must choose.
PRIMARY_READS: dict[str, str] = {
    "core.home": "a redirect, no query",
    "core.healthz": "the load balancer asks whether the primary answers",
    "core.favicon": "no query (a static file)",
    "auth.login": "sign-in and sessions",
    "api.openapi": "no query",
    "static": "no query",
    "docs.index": "no query (files of the installation)",
    "docs.page": "no query (files of the installation)",
    "admin.users": "users and API tokens",
    "brokerdead.index": "a broker queue's dead letters come from NATS; its backend from the primary, as the action reads it",
    "brokerdead.api_index": "a broker queue's dead letters come from NATS; its backend from the primary, as the action reads it",
    "admin.api_users": "users and API tokens",
    "health.index": "the primary's pg_stat_activity, locks, horizon holders, replication and WAL",
    "health.panels_fragment": "the primary's pg_stat_activity, locks, horizon holders, replication and WAL",
    "health.api_index": "the primary's pg_stat_activity, locks, horizon holders, replication and WAL",
    "advisor.index": "live checks of the primary (pg_stat_statements, locks, index use, vacuum)",
    "advisor.checks_fragment": "live checks of the primary (pg_stat_statements, locks, index use, vacuum)",
    "advisor.api_index": "live checks of the primary (pg_stat_statements, locks, index use, vacuum)",
    "workers.index": "workers' live state: heartbeats and leases as they are now",
    "workers.table": "workers' live state: heartbeats and leases as they are now",
    "workers.api_index": "workers' live state: heartbeats and leases as they are now",
    "maintenance.index": "the scheduler's leader and run locks are the primary's advisory locks",
    "maintenance.api_index": "the scheduler's leader and run locks are the primary's advisory locks",
    "metrics.metrics": "a scrape has no page to show a lag on: it must not be silently behind",
    "fleet.index": "each database's primary (reachable means the primary); the replica's lag is a column",
    "fleet.api_index": "each database's primary (reachable means the primary); the replica's lag is a field",
    "deadletters.operation": "a bulk operation in progress, and the cancel/resume it binds",
    "deadletters.progress_fragment": "a bulk operation in progress, and the cancel/resume it binds",
    "deadletters.api_operation": "a bulk operation in progress, and the cancel/resume it binds",
    "deadletters.api_operations": "bulk operations in progress, and the cancel/resume they bind",
    "deadletters.operations": "bulk operations in progress, and the cancel/resume they bind",
    "alerts.rules_page": "the alert configuration edited there",
    "alerts.api_rules": "the alert configuration edited there",
    "alerts.destinations_page": "the alert configuration edited there",
    "alerts.api_destinations": "the alert configuration edited there",
    "external.index": "reads the watched queue's own tables live (READ ONLY), and binds its previews and actions",
    "external.deadletters_fragment": "reads the watched queue's own tables live (READ ONLY)",
    "external.api_sources": "no query (the config's [[external_queues]])",
    "external.api_source": "reads the watched queue's own tables live (READ ONLY), and binds its previews and actions",
    "external.operation": "external-queue operations in progress, and the cancel/resume they bind",
    "external.progress_fragment": "external-queue operations in progress, and the cancel/resume they bind",
    "external.api_operation": "external-queue operations in progress, and the cancel/resume they bind",
    "why.job_fragment": "why a job waits turns on workers' heartbeats and leases as they are now",
    "why.queue_fragment": "why a queue waits turns on workers' heartbeats and leases as they are now",
    "timeline.index": "whether a worker or a scheduler is lost turns on its last heartbeat as it is now",
    "timeline.postmortem": "whether a worker or a scheduler is lost turns on its last heartbeat as it is now",
    "timeline.api_index": "whether a worker or a scheduler is lost turns on its last heartbeat as it is now",
    "why.api_job": "why a job waits turns on workers' heartbeats and leases as they are now",
    "why.api_queue": "why a queue waits turns on workers' heartbeats and leases as they are now",
    "editreplay.form": "the edit form binds a later preview and apply to the job's state as it is now",
    "exitplan.page": "the relay's leader lock is in the primary's pg_locks, and the page binds the move to the "
                     "backend as it is now",
    "exitplan.api_plan": "the relay's leader lock is in the primary's pg_locks, and the plan names the backend a "
                         "move starts from",
}

# How long a page waits for a replica connection before it reads the primary instead.
REPLICA_WAIT_S = 1.0
# Session key: {database: the primary's WAL position after this session's last change there}.
WRITTEN_KEY = "skiplock_written_lsn"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class ReadFrom:
    """Where this request's page queries went: the replica (with its lag), or the primary (with
    a note when a configured replica was passed over)."""

    database: str
    replica: bool = False
    lag_seconds: float | None = None
    note: str | None = None


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
    if g.get("_skiplock_conn") is not None or g.get("_skiplock_read_from") is not None:
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
        return primary_conn()
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
    """The page's connection: the replica's when this route may read it (module docstring),
    else the primary's."""
    if read_from().replica:
        return g._skiplock_replica_conn
    return primary_conn()


def read_from() -> ReadFrom:
    """Where this request reads, decided (and the replica borrowed) on first call."""
    chosen = g.get("_skiplock_read_from")
    if chosen is None:
        chosen = g._skiplock_read_from = _choose()
    return chosen


def _reads_replica_route() -> bool:
    return has_request_context() and request.method in ("GET", "HEAD") and request.endpoint in REPLICA_READS


def _choose() -> ReadFrom:
    name = current_database()
    if not _reads_replica_route():
        return ReadFrom(name)
    written = session.get(WRITTEN_KEY, {}).get(name) if has_request_context() else None
    try:
        conn, pool, status = _borrow_replica(name, written)
    except _NoReplica as missing:
        return ReadFrom(name, note=missing.note)
    if conn is None:
        return ReadFrom(name)  # no replica_dsn
    if not status.replayed:
        _give_back(conn, pool)
        return ReadFrom(name, lag_seconds=status.lag_seconds,
                        note=f"Read from the primary: the replica of {name} has not yet replayed your last change")
    g._skiplock_replica_conn, g._skiplock_replica_pool = conn, pool
    return ReadFrom(name, replica=True, lag_seconds=status.lag_seconds)


class _NoReplica(Exception):
    def __init__(self, note: str):
        super().__init__(note)
        self.note = note


def _borrow_replica(name: str, written: str | None = None):
    """(connection, pool, status) of database `name`'s replica; (None, None, None) without
    replica_dsn; `_NoReplica` (with the page's note) when it is down, slow or not a standby."""
    registry = _state().databases
    pool = registry.replica_pool(name)
    if pool is None:
        return None, None, None
    if registry.replica_resting(name):
        raise _NoReplica(f"Read from the primary: the replica of {name} did not answer lately")
    wait = min(REPLICA_WAIT_S, _state().config.web.db_wait)
    try:
        conn = pool.getconn(timeout=wait)
    except PoolTimeout:
        registry.replica_failed(name)
        log.warning("replica of %s: no connection within %g s; reading the primary", name, wait)
        raise _NoReplica(f"Read from the primary: the replica of {name} is unreachable") from None
    try:
        status = replica.status(conn, written)
    except psycopg.Error as exc:  # a broken connection (the replica went away), a timeout
        _give_back(conn, pool)
        registry.replica_failed(name)
        log.warning("replica of %s failed (%s); reading the primary", name, exc.__class__.__name__)
        raise _NoReplica(f"Read from the primary: the replica of {name} is unreachable") from None
    if not status.in_recovery:
        _give_back(conn, pool)
        registry.replica_failed(name)
        log.warning("replica_dsn of %s is not a standby (pg_is_in_recovery() is false); reading the primary", name)
        raise _NoReplica(f"Read from the primary: the replica_dsn of {name} is not a standby")
    return conn, pool, status


def replica_probe(name: str) -> dict[str, Any]:
    """The fleet's replica field of database `name`: {configured, reachable, lag_seconds}."""
    try:
        conn, pool, status = _borrow_replica(name)
    except _NoReplica:
        return {"configured": True, "reachable": False, "lag_seconds": None}
    if conn is None:
        return {"configured": False, "reachable": None, "lag_seconds": None}
    _give_back(conn, pool)
    return {"configured": True, "reachable": True, "lag_seconds": status.lag_seconds}


def replica_lost() -> str | None:
    """The request's replica failed mid-page: rest it and return its database's name (None when
    the request did not read a replica)."""
    chosen = g.get("_skiplock_read_from")
    if chosen is None or not chosen.replica:
        return None
    _state().databases.replica_failed(chosen.database)
    return chosen.database


def _primary_pool():
    name = _scoped()
    return _state().pool if name is None else _state().databases.pool(name)


def read_pool():
    """The pool this request reads from, for a route that borrows a connection per batch (the
    jobs export): the replica's when `read_from()` chose it, else the database's primary."""
    if read_from().replica:
        return g._skiplock_replica_pool
    return _primary_pool()


def primary_conn() -> psycopg.Connection:
    """The request's connection to the primary of its database, whatever the route."""
    conn = g.get("_skiplock_conn")
    if conn is None:
        st = _state()
        pool = _primary_pool()
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


def release() -> None:
    """Give back every connection this request borrowed, before something slow that needs none
    (the sign-in's password check); the next `home_conn()`/`get_conn()` borrows again."""
    _release()


def _release(exc: BaseException | None = None) -> None:
    home = g.pop("_skiplock_home_conn", None)
    if home is not None:
        _give_back(home, _state().pool)
    g.pop("_skiplock_read_from", None)  # decided again by the next request that asks
    replica_conn = g.pop("_skiplock_replica_conn", None)
    if replica_conn is not None:
        _give_back(replica_conn, g.pop("_skiplock_replica_pool"))
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


def _after(response):
    """Say where the page read; after a change, remember the primary's WAL position so this
    session's next pages read the replica only once it has replayed the change."""
    chosen = g.get("_skiplock_read_from")
    if chosen is not None:
        response.headers["X-Skiplock-Read-From"] = "replica" if chosen.replica else "primary"
    conn = g.get("_skiplock_conn")
    if (request.method not in SAFE_METHODS and response.status_code < 400 and conn is not None
            and _state().databases.get(current_database()).replica_dsn):
        try:
            lsn = replica.primary_position(conn)
        except psycopg.Error as exc:
            log.warning("primary's WAL position not read (%s): the next pages may read the replica",
                        exc.__class__.__name__)
        else:
            session[WRITTEN_KEY] = {**session.get(WRITTEN_KEY, {}), current_database(): lsn}
    return response


def install(app: Flask) -> None:
    app.teardown_appcontext(_release)
    app.before_request(_check_prefix)
    app.after_request(_after)
