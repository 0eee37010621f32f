"""What every collector shares: its options, the cycle's context, and the dedicated connection.

A collector is a function `collect(ctx) -> Iterable[Sample]` registered in
`console.collectors.COLLECTORS`. It reads through `ctx.rows(concern, name, params)`, keeps the
counters it needs for the next cycle's deltas with `ctx.remember(state)` (stored in
`skiplock.collector_state`, so a restarted scheduler or a new leader continues from the last
stored snapshot), and puts what is not a number (holders, trees, progress) in `ctx.detail()`.

The connection is autocommit (statistics views are frozen inside a transaction: every
statement here is its own transaction, so each reads fresh counters), carries statement and
lock timeouts, and is named `skiplock-collector` so the database collectors leave it (and the
rest of the console) out of what they report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import signals
from console.config import database_names, external_queues
from console.db import connect
from console.redaction import DEFAULT_KEYS, key_set
from console.samples import Sample
from console.sqlfiles import query

COLLECTOR_APP = "skiplock-collector"
# The console's own sessions, left out of horizon holders, lock waits and connection counts.
# Workers ("skiplock-worker*") are the queue's, not the console's, and are reported.
CONSOLE_APPS: tuple[str, ...] = ("skiplock-collector%", "skiplock-scheduler%", "skiplock-web%", "skiplock-console%")
WATCHED_TABLES: tuple[tuple[str, str], ...] = (("jobs", "skiplock.jobs"), ("jobs_archive", "skiplock.jobs_archive"))


@dataclass(frozen=True)
class Options:
    """How hard collectors may look. Defaults suit a 15 s cycle on a busy queue."""

    statement_timeout_ms: int = 2000
    lock_timeout_ms: int = 200
    # Pending/running entries counted exactly before scaling to the planner's estimate.
    depth_exact_limit: int = 10_000
    # Dead letters read (with a heap fetch each, for the queue name) for the per-queue split.
    failed_queue_limit: int = 5_000
    # Dead letters counted exactly (an index-only walk of jobs_failed_idx) for the total;
    # beyond it, the planner's estimate.
    failed_total_limit: int = 50_000
    # Queues probed one by one with a rolled-back claim (besides one probe over all queues).
    probe_queues: int = 1
    # Groups of each fair queue with their own group_* series, and over every fair queue
    # together (console/collectors/groups.py); the rest are folded into group="_other".
    group_series: int = 10
    group_series_total: int = 200
    # Seconds between re-reads of pg_stat_statements query text to find the claim statement.
    pgss_discovery_interval: float = 300.0
    live_worker_within: float = 15.0
    # Seconds the windowed signals are computed over (dead letters per hour, retry rate,
    # per-queue throughput): `[scheduler] rate_window`.
    rate_window: float = 900.0
    # Error groups (console.collectors.errorgroups): a group back after `error_group_quiet`
    # seconds without a dead letter is regressed; a new or regressed one is reported for
    # `error_group_new_for` seconds. `secret_keys`: the values its label hides (web.redact_keys
    # and the defaults), as every alert link and webhook does.
    error_group_quiet: float = 86400.0
    error_group_new_for: float = 3600.0
    secret_keys: frozenset[str] = DEFAULT_KEYS
    exclude_apps: tuple[str, ...] = CONSOLE_APPS
    tables: tuple[tuple[str, str], ...] = WATCHED_TABLES
    # [[external_queues]] entries (console.config.ExternalQueue) the external collector reads.
    external: tuple[Any, ...] = ()
    # [broker] nats_url: where the broker collector reads the queues NATS JetStream serves
    # (console.collectors.broker; read only when some queue's backend is 'nats').
    broker_url: str = ""

    @classmethod
    def from_config(cls, config: Any | None, database: str | None = None) -> Options:
        """The collectors' options for the cycle of `database` (None: the first database), whose
        [[external_queues]] are the entries that belong to it."""
        if config is None:
            return cls()
        s = config.scheduler
        return cls(
            statement_timeout_ms=config.database.statement_timeout_ms,
            lock_timeout_ms=s.lock_timeout_ms,
            depth_exact_limit=s.depth_exact_limit,
            failed_queue_limit=s.failed_queue_limit,
            failed_total_limit=s.failed_total_limit,
            probe_queues=s.probe_queues,
            group_series=s.group_series,
            group_series_total=s.group_series_total,
            live_worker_within=signals.live_worker_within(config),
            rate_window=s.rate_window.total_seconds(),
            error_group_quiet=s.error_group_quiet.total_seconds(),
            error_group_new_for=s.error_group_new_for.total_seconds(),
            secret_keys=DEFAULT_KEYS | key_set(config.web.redact_keys),
            external=tuple(sources_of(config, database)),
            broker_url=config.broker.nats_url or "",
        )


def sources_of(config: Any, database: str | None = None) -> list[Any]:
    """The [[external_queues]] entries watched by `database`'s console (None: the first)."""
    first = database_names(config)[0]
    return [e for e in external_queues(config) if e.belongs_to(database or first, first)]


def collector_connection(dsn: str, options: Options | None = None) -> psycopg.Connection:
    """An autocommit connection with the collectors' time limits and name."""
    options = options or Options()
    pg_options = (
        f"-c statement_timeout={int(options.statement_timeout_ms)}"
        f" -c lock_timeout={int(options.lock_timeout_ms)}"
        " -c idle_in_transaction_session_timeout=30000"
        # Small catalog and index reads: compiling them costs more than running them.
        " -c jit=off"
        # The capped counts on skiplock.jobs must walk their partial index and stop at the cap;
        # when the cap is a large share of the backlog the planner otherwise prefers a bitmap
        # scan of every pending entry plus a sort, whose cost grows with the backlog. No
        # collector query wants a sequential scan of anything large either.
        " -c enable_bitmapscan=off -c enable_seqscan=off"
    )
    return connect(dsn, application_name=COLLECTOR_APP, autocommit=True, options=pg_options)


@dataclass
class Context:
    """One collector's view of one cycle."""

    conn: psycopg.Connection
    options: Options
    now: datetime  # the database's clock at the start of the cycle
    name: str = ""
    previous_at: datetime | None = None
    previous: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def server_version(self) -> int:
        return self.conn.info.server_version

    @property
    def interval(self) -> float | None:
        """Seconds since this collector's previous stored snapshot (None on the first cycle)."""
        if self.previous_at is None:
            return None
        seconds = (self.now - self.previous_at).total_seconds()
        return seconds if seconds > 0 else None

    def rows(self, concern: str, name: str, params: dict[str, Any] | None = None, *, text: Any = None) -> list[dict[str, Any]]:
        """Run a named query (or an already composed `text`) and return dict rows."""
        statement = text if text is not None else query(concern, name)
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(statement, params or {})
            return cur.fetchall() if cur.description else []

    def remember(self, state: dict[str, Any]) -> None:
        """Keep `state` (JSON-able) as this collector's snapshot for the next cycle."""
        self.state = state

    def detail(self, key: str, value: Any) -> None:
        self.details[key] = value


CollectFn = Callable[[Context], Iterable[Sample]]


@dataclass(frozen=True)
class Collector:
    name: str
    collect: CollectFn
    help: str


def rate(new: float | None, old: float | None, seconds: float | None) -> float | None:
    """Per-second rate of a cumulative counter; None without a previous value or after a reset."""
    if new is None or old is None or not seconds:
        return None
    diff = new - old
    if diff < 0:
        return None
    return diff / seconds
