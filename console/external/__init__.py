"""Queue sources Skiplock did not create: PGQueuer, Procrastinate, graphile-worker, pg-boss,
BullMQ on PostgreSQL, a hand-rolled table.

A source is one `[[external_queues]]` entry (console.config.ExternalQueue) and its `Adapter`,
which answers the small questions the collectors and the advisor ask:
- `queue_table` (schema, table) and `tables()`: what the table collectors watch;
- `shape()`: the SQL pieces (queue expression, pending/due/running/stuck/failed predicates)
  that fill the one bounded snapshot statement in sql/external.sql;
- `claim_pattern`: a LIKE pattern that finds its claim statement in pg_stat_statements (the
  collector's per-source claim latency, the advisor's claim check);
- `completions()`: where the library records finished jobs (an append-only log keyed by a
  bigint id: PGQueuer's pgqueuer_log, Procrastinate's procrastinate_events), for throughput;
  None with `no_completions` saying why (graphile-worker deletes finished jobs, a declared
  table has no log, pg-boss's completed rows have no index to find the newest by);
- `completed`: the predicate of finished rows that stay in the queue table (None when the
  library deletes them), for the advisor's completed-rows check;
- `check_schema(cur)`: refuses a table or column that is missing, an unknown schema version,
  a predicate that does not parse, with a message naming the entry;
- `offered`: what the library lets an operator do to its jobs, each through the library's own
  functions or statements (replay, purge, cancel, pause, resume: console.external.actions runs
  them), and `withheld`: what it does not offer and why; `actions` is what the console may do
  on this source: the offered ones when its entry says `actions = true`, else none (and
  `read_only_reason` says why to the pages).

`snapshot(cur, adapter, caps)` runs the statement in a READ ONLY transaction the caller opened.
This package does not schedule, store or render anything; only console.external.actions
writes to a source, and only to one whose entry has `actions = true`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from console.config import ConfigError, ExternalQueue
from console.sqlfiles import query

log = logging.getLogger("skiplock.external")

READ_ONLY_REASON = ("read-only: Skiplock watches this queue but does not change it; retry and cancel "
                    "belong to its own library's tools")
ACTIONS_OFF_REASON = ("read-only: actions are off for this source (its [[external_queues]] entry has no `actions = true`), "
                      "so Skiplock only reads its tables")
ACTION_NAMES = ("replay", "purge", "cancel", "pause", "resume")
NO_TIME = sql.SQL("NULL")
_BIGINT_KEY = re.compile(r"^[1-9][0-9]{0,17}$")  # Shape.failed_at of a library that records no time of failure


class SourceError(Exception):
    """The source cannot be read as declared (missing table or column, unknown schema)."""


@dataclass(frozen=True)
class Shape:
    """The SQL pieces of one source's snapshot (each a psycopg.sql Composable)."""

    queue: sql.Composable
    pending: sql.Composable
    due: sql.Composable = field(default_factory=lambda: sql.SQL("true"))
    since: sql.Composable = field(default_factory=lambda: sql.SQL("NULL"))
    running: sql.Composable = field(default_factory=lambda: sql.SQL("false"))
    stuck: sql.Composable = field(default_factory=lambda: sql.SQL("false"))
    stuck_since: sql.Composable = field(default_factory=lambda: sql.SQL("NULL"))
    failed: sql.Composable = field(default_factory=lambda: sql.SQL("false"))
    # When a failed row failed (timestamptz; NULL: not known), for dead-letter growth and the
    # dead letters' order; its last error and attempts, for the dead-letter list.
    failed_at: sql.Composable = field(default_factory=lambda: NO_TIME)
    error: sql.Composable = field(default_factory=lambda: sql.SQL("NULL"))
    attempts: sql.Composable = field(default_factory=lambda: sql.SQL("NULL"))
    # A job's key as text (what the pages, the CLI and an operation's items name it by), and the
    # predicate that finds rows by a list of keys through the table's primary key.
    key: sql.Composable = field(default_factory=lambda: sql.SQL("j.id::text"))
    key_match: sql.Composable = field(default_factory=lambda: sql.SQL("j.id = ANY(%(keys)s::text[]::bigint[])"))


@dataclass(frozen=True)
class Completions:
    """A library's log of finished jobs: `table` (in the source's schema) with a bigint primary
    key `id` that only grows; the other pieces are SQL over its row `e`."""

    table: str
    queue: sql.Composable
    outcomes: tuple[tuple[str, sql.Composable], ...]  # (throughput outcome, predicate)


class Adapter:
    system = ""
    default_table = ""
    no_completions = "the library keeps no record of finished jobs"
    completed_note = ""
    schema_version = ""
    # action -> how the library does it (the pages and docs/external-queues.md say so), and
    # action -> why it is not offered. The statements are sql/external_actions.sql's
    # `<statement_prefix>_<action>` queries.
    offered: dict[str, str] = {}
    withheld: dict[str, str] = {}
    no_actions = "Skiplock does not know this system's state machine, so it offers no action"
    statement_prefix = ""
    # (schema, LIKE pattern) of the function whose body holds the claim (the advisor reads it
    # there: pg_stat_statements sees only the call), or None.
    claim_function: tuple[str, str] | None = None
    # Functions of the library that resolve its tables through search_path (Procrastinate's):
    # the action's transaction sets search_path to the source's schema first.
    needs_search_path = False

    def __init__(self, entry: ExternalQueue):
        self.entry = entry

    @property
    def actions(self) -> tuple[str, ...]:
        """What the console may do to this source's jobs: the library's offered actions when the
        entry opted in (`actions = true`), else nothing."""
        if not self.entry.actions:
            return ()
        return tuple(a for a in ACTION_NAMES if a in self.offered)

    @property
    def read_only_reason(self) -> str | None:
        """Why the console does not act on this source (None when it does)."""
        if not self.offered:
            return f"read-only: {self.no_actions}"
        if not self.entry.actions:
            return ACTIONS_OFF_REASON
        return None

    key_example = "a job id (a whole number)"

    def check_key(self, key: str) -> str:
        """`key` if it can name one of this library's jobs, else ValueError saying what one looks like."""
        if not _BIGINT_KEY.fullmatch(key):
            raise ValueError(f"{key[:80]!r} is not a {self.system} job key: {self.key_example}")
        return key

    def key_params(self, keys: list[str]) -> dict[str, Any]:
        """Bound parameters of `shape().key_match` for these keys."""
        return {"keys": list(keys)}

    def statement_identifiers(self) -> dict[str, sql.Composable]:
        """The identifiers the action statements of sql/external_actions.sql are formatted with."""
        schema, table = self.queue_table
        return {"table": sql.Identifier(schema, table), "schema": sql.Identifier(schema)}

    def paused_queues(self, cur: psycopg.Cursor) -> set[str] | None:
        """The queues the library has paused (None: the library has no pause)."""
        return None

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def queue_table(self) -> tuple[str, str]:
        return self.entry.qualified(self.default_table)

    @property
    def table_label(self) -> str:
        schema, table = self.queue_table
        return f"{self.name}:{schema}.{table}"

    def table_ident(self, table: str | None = None) -> sql.Identifier:
        schema, name = self.queue_table
        return sql.Identifier(schema, table or name)

    def tables(self) -> list[tuple[str, str]]:
        """(label, qualified name) of the tables the table collectors watch for this source."""
        schema, table = self.queue_table
        return [(self.table_label, f"{schema}.{table}")]

    @property
    def claim_pattern(self) -> str | None:
        return self.entry.claim_query_like or None

    def shape(self) -> Shape:
        raise NotImplementedError

    def completions(self) -> Completions | None:
        return None

    @property
    def completed(self) -> sql.Composable | None:
        return None

    def check_schema(self, cur: psycopg.Cursor) -> None:
        raise NotImplementedError

    # helpers for check_schema
    def _columns(self, cur: psycopg.Cursor, table: str | None = None) -> list[str]:
        schema, name = self.queue_table
        qualified = f'"{schema}"."{table or name}"'
        row = cur.execute(query("external", "table_exists"), {"qualified": qualified}).fetchone()
        if not row["found"]:
            raise SourceError(f"table {schema}.{table or name} does not exist")
        return row["columns"]

    def _require_columns(self, cur: psycopg.Cursor, needed: list[str], table: str | None = None) -> list[str]:
        columns = self._columns(cur, table)
        schema, name = self.queue_table
        missing = [c for c in needed if c not in columns]
        if missing:
            raise SourceError(f"table {schema}.{table or name} has no column {', '.join(missing)}")
        return columns


def _registry() -> dict[str, type[Adapter]]:
    from console.external.bullmq import BullMQAdapter
    from console.external.graphile_worker import GraphileWorkerAdapter
    from console.external.pgboss import PgBossAdapter
    from console.external.pgmq import PgmqAdapter
    from console.external.pgqueuer import PgQueuerAdapter
    from console.external.procrastinate import ProcrastinateAdapter
    from console.external.table import TableAdapter

    return {a.system: a for a in (TableAdapter, PgQueuerAdapter, ProcrastinateAdapter, GraphileWorkerAdapter, PgBossAdapter,
                                      BullMQAdapter, PgmqAdapter)}


def adapter_for(entry: ExternalQueue) -> Adapter:
    return _registry()[entry.system](entry)


def adapters(config: Any, database: str | None = None) -> list[Adapter]:
    """Adapters of every entry, or of the entries `database` watches (see ExternalQueue.database)."""
    from console.config import database_names, external_queues

    if config is None:
        return []
    entries = external_queues(config)
    if database is not None:
        first = database_names(config)[0]
        entries = [e for e in entries if e.belongs_to(database, first)]
    return [adapter_for(e) for e in entries]


def read_only(cur: psycopg.Cursor, timeout_ms: int) -> None:
    """Make the caller's open transaction READ ONLY with a statement timeout (first statement)."""
    cur.execute("SET TRANSACTION READ ONLY")
    cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))


def validate(conn: psycopg.Connection, adapter: Adapter, timeout_ms: int = 2000) -> None:
    """Check one source against its database; raise ConfigError naming the entry."""
    try:
        with conn.transaction(), conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            read_only(cur, timeout_ms)
            adapter.check_schema(cur)
            shape = adapter.shape()
            for part in ("pending", "due", "running", "stuck", "failed"):
                cur.execute(_estimate_sql(adapter, getattr(shape, part)), _params(adapter, {}))
            if adapter.completed is not None:
                cur.execute(_estimate_sql(adapter, adapter.completed), _params(adapter, {}))
    except SourceError as exc:
        raise ConfigError(f"{adapter.entry.where}: {exc}") from None
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{adapter.entry.where}: {first}") from None


def validate_all(config: Any, default_dsn: str, *, timeout_ms: int = 2000, database: str | None = None) -> list[Adapter]:
    """Start-up check of every entry `database` watches (all when None), an entry without its
    own dsn read in `default_dsn` (scheduler, `skiplock check --external`, `skiplock collect`)."""
    from console.db import DatabaseError, connect

    out = adapters(config, database)
    for adapter in out:
        try:
            conn = connect(adapter.entry.dsn or default_dsn, application_name="skiplock-console-external")
        except DatabaseError as exc:
            # An unreachable source must not keep Skiplock's own monitoring from starting: its
            # panel shows the error every cycle until it is back (and is checked then).
            log.warning("%s: not checked at start-up: %s", adapter.entry.where, exc)
            continue
        with conn:
            validate(conn, adapter, timeout_ms)
    return out


def _params(adapter: Adapter, extra: dict[str, Any]) -> dict[str, Any]:
    return {"stuck_after": adapter.entry.stuck_after, **extra}


def _estimate_sql(adapter: Adapter, predicate: sql.Composable) -> sql.Composed:
    return sql.SQL(query("external", "estimate_rows")).format(table=adapter.table_ident(), predicate=predicate)


def estimate_rows(cur: psycopg.Cursor, adapter: Adapter, predicate: sql.Composable) -> float:
    cur.execute(_estimate_sql(adapter, predicate), _params(adapter, {}))
    row = cur.fetchone()
    plan = row["QUERY PLAN"] if isinstance(row, dict) else row[0]
    return float(plan[0]["Plan"]["Plan Rows"])


@dataclass
class QueueFigures:
    queue: str
    eligible: float = 0.0
    scheduled: float = 0.0
    running: float = 0.0
    stuck: float = 0.0
    failed: float = 0.0
    age_s: float = 0.0
    oldest_stuck_s: float = 0.0
    # Dead letters per hour: failed within the rate window and still failed (None when the
    # library records no time of failure), console.collectors.queue's definition.
    dead_per_hour: float | None = None


@dataclass
class Snapshot:
    queues: list[QueueFigures] = field(default_factory=list)
    estimated: bool = False


@dataclass
class Finished:
    """Jobs finished since the previous cycle's cursor, by queue and outcome."""

    head_id: int | None
    counts: dict[str, dict[str, float]]  # queue -> outcome -> jobs
    estimated: bool = False


def finished_since(cur: psycopg.Cursor, adapter: Adapter, after: int | None, *, cap: int) -> Finished | None:
    """What the library's completion log recorded after id `after` (None: only read the head).
    Reads at most `cap` log rows in id order (the primary key), so a busy log costs the same as
    a quiet one; beyond the cap the counts are scaled by the share of ids read. None when the
    source has no completion log, or its log table is missing."""
    comp = adapter.completions()
    if comp is None:
        return None
    schema, _ = adapter.queue_table
    if cur.execute(query("external", "table_exists"), {"qualified": f'"{schema}"."{comp.table}"'}).fetchone()["found"] is False:
        return None
    outcomes = sql.SQL(", ").join(
        sql.SQL("coalesce(({}), false) AS {}").format(pred, sql.Identifier(f"is_{name}")) for name, pred in comp.outcomes)
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE d.{}) AS {}").format(sql.Identifier(f"is_{name}"), sql.Identifier(name))
        for name, _ in comp.outcomes)
    any_outcome = sql.SQL(" OR ").join(sql.SQL("({})").format(pred) for _, pred in comp.outcomes)
    statement = sql.SQL(query("external", "completions")).format(
        log=sql.Identifier(schema, comp.table), queue=comp.queue, outcomes=outcomes, counts=counts, any_outcome=any_outcome)
    row = cur.execute(statement, {"after": after, "cap": cap}).fetchone()
    head, last = row["head_id"], row["last_id"]
    scale, estimated = 1.0, False
    if after is not None and last is not None and head is not None and head > last > after:
        scale, estimated = (head - after) / (last - after), True
    by = {q["queue"]: {name: float(q[name]) * scale for name, _ in comp.outcomes} for q in row["queues"]}
    return Finished(head, by, estimated)


def snapshot(cur: psycopg.Cursor, adapter: Adapter, *, cap: int, failed_cap: int,
             window: timedelta = timedelta(minutes=15), drained: Iterable[str] = ()) -> Snapshot:
    """Per-queue figures of one source, bounded by the caps (estimates beyond them); dead-letter
    growth over `window` ([scheduler] rate_window), per hour. A queue in `drained` (busy at the
    previous reading) is in the snapshot with zeros when it holds nothing now, so the newest
    readings say it emptied instead of keeping its last backlog."""
    shape = adapter.shape()
    statement = sql.SQL(query("external", "snapshot")).format(
        table=adapter.table_ident(), queue=shape.queue, pending=shape.pending, due=shape.due, since=shape.since,
        running=shape.running, stuck=shape.stuck, stuck_since=shape.stuck_since, failed=shape.failed,
        failed_at=shape.failed_at)
    cur.execute(statement, _params(adapter, {"cap": cap, "failed_cap": failed_cap, "window": window}))
    snap = cur.fetchone()
    pending, running, failed = snap["pending"], snap["running"], snap["failed"]
    estimated = False
    scale = 1.0
    seen = sum(r["eligible"] + r["scheduled"] for r in pending)
    if seen >= cap:
        estimated = True
        estimate = estimate_rows(cur, adapter, shape.pending)
        scale = estimate / seen if estimate > seen else 1.0
    failed_scale = 1.0
    failed_seen = sum(r["failed"] for r in failed)
    if failed_seen >= failed_cap:
        estimated = True
        estimate = estimate_rows(cur, adapter, shape.failed)
        failed_scale = estimate / failed_seen if estimate > failed_seen else 1.0
    by: dict[str, QueueFigures] = {}
    for r in pending:
        f = by.setdefault(r["queue"], QueueFigures(r["queue"]))
        f.eligible = float(round(r["eligible"] * scale))
        f.scheduled = float(round(r["scheduled"] * scale))
        f.age_s = max(r["oldest_eligible_s"] or 0.0, 0.0)
    for r in running:
        f = by.setdefault(r["queue"], QueueFigures(r["queue"]))
        f.running, f.stuck = float(r["running"]), float(r["stuck"])
        f.oldest_stuck_s = max(r["oldest_stuck_s"] or 0.0, 0.0)
    hours = max(window.total_seconds(), 1.0) / 3600.0
    for r in failed:
        f = by.setdefault(r["queue"], QueueFigures(r["queue"]))
        f.failed = float(round(r["failed"] * failed_scale))
        if r["failed_at_known"]:
            f.dead_per_hour = r["arrived"] * failed_scale / hours
    for name in drained:
        by.setdefault(name, QueueFigures(name))
    if shape.failed_at is not NO_TIME:  # then a queue with no dead letter grows by none
        for f in by.values():
            if f.dead_per_hour is None:
                f.dead_per_hour = 0.0
    return Snapshot(sorted(by.values(), key=lambda f: f.queue), estimated)


__all__ = ["READ_ONLY_REASON", "Adapter", "Completions", "Finished", "QueueFigures", "finished_since", "Shape", "Snapshot", "SourceError", "adapter_for",
           "adapters", "estimate_rows", "read_only", "snapshot", "validate", "validate_all"]

