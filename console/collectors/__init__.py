"""Collectors: measure the queue and PostgreSQL's health and store it as samples.

`collect(conn)` runs every collector once on a collector connection (see
`console.collectors.base`), each timed and isolated: one that fails or times out records its
error, stores "not available" (None) for the series it produced last time and
`collector_errors{collector} = 1`, and the others still run. The samples, each collector's
counters for the next cycle's deltas, and one `skiplock.collection_runs` row (per-collector
time and error, plus the details that are not numbers) are written in one short transaction.

This package measures; it does not decide what is healthy (alerts and the advisor do), and it
does not schedule itself (`console.scheduler` does).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import samples as samples_store
from console.collectors import (
    broker,
    database,
    errorgroups,
    external,
    groups,
    periodic,
    queue,
    restarts,
    statements,
    tables,
    workers,
)
from console.collectors.base import Collector, Context, Options, collector_connection
from console.samples import Sample
from console.sqlfiles import query

log = logging.getLogger("skiplock.collectors")

COLLECTORS: tuple[Collector, ...] = (
    Collector("queue", queue.collect, "Depth by state, oldest eligible job, stuck leases, dead letters."),
    Collector("groups", groups.collect, "Fair queues' groups (tenants): backlog, running jobs, oldest wait, dead letters, starvation; the top [scheduler] group_series per queue, the rest folded."),
    Collector("errorgroups", errorgroups.collect, "Error groups that are new or came back after a quiet period (skiplock.error_groups)."),
    Collector("workers", workers.collect, "Live workers, throughput, retries, claim and pickup latency from worker counters."),
    Collector("statements", statements.collect, "Claim latency and buffers per call (pg_stat_statements), probe claim."),
    Collector("tables", tables.collect, "Jobs tables: tuples, sizes, autovacuum threshold, vacuum progress, wraparound."),
    Collector("horizon", database.collect_horizon, "Who holds the xmin horizon; XID and MultiXact consumption."),
    Collector("locks", database.collect_locks, "Lock waits by relation and the blocking tree."),
    Collector("waits", database.collect_waits, "LWLock/SLRU waits and pg_stat_slru deltas."),
    Collector("wal", database.collect_wal, "WAL bytes per second and replica lag."),
    Collector("connections", database.collect_connections, "Connections by state, max_connections, NOTIFY queue."),
    Collector("external", external.collect, "[[external_queues]]: depth, age, stuck, dead letters and table health of queues Skiplock did not create."),
    Collector("broker", broker.collect, "Queues served by NATS JetStream: depth, ack pending, redeliveries, head age and dead letters from the JetStream API (backend=\"nats\")."),
    Collector("periodic", periodic.collect, "Periodic jobs: age of the last success against the interval, missed slots."),
    Collector("restarts", restarts.collect, "Scheduler processes that replaced one that died, in the last 15 minutes."),
)

__all__ = ["COLLECTORS", "CollectionReport", "Options", "collect", "collector_connection", "latest_details"]


@dataclass
class CollectionReport:
    started_at: datetime
    duration_s: float
    samples: list[Sample]
    collectors: dict[str, dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)
    run_id: int | None = None

    @property
    def errors(self) -> dict[str, str]:
        return {name: c["error"] for name, c in self.collectors.items() if c["error"]}


def _load_state(conn: psycopg.Connection) -> dict[str, tuple[datetime, dict[str, Any]]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return {r["name"]: (r["taken_at"], r["state"]) for r in cur.execute(query("collectors_runs", "load_state"), {})}


def _series_of(conn: psycopg.Connection, name: str) -> list[list[Any]]:
    """The [metric, labels] pairs `name` stored last cycle (its state's `_series`, which
    _load_state leaves out); [] when they cannot be read (the connection is gone)."""
    if conn.closed or conn.broken:
        return []
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(query("collectors_runs", "series_of"), {"name": name}).fetchone()
    except psycopg.Error:
        return []
    return row["series"] if row else []


def _describe(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:500]


def collect(
    conn: psycopg.Connection,
    options: Options | None = None,
    *,
    leader: str | None = None,
    store: bool = True,
    only: tuple[str, ...] | None = None,
) -> CollectionReport:
    """Run one full collection cycle on `conn` (a collector connection) and store it."""
    options = options or Options()
    cycle_started = time.perf_counter()
    with conn.cursor(row_factory=dict_row) as cur:
        clock = cur.execute(query("collectors_runs", "db_now"), {}).fetchone()
    now = clock["clock"]
    state = _load_state(conn)
    all_samples: list[Sample] = []
    report: dict[str, dict[str, Any]] = {}
    details: dict[str, Any] = {}
    new_state: dict[str, dict[str, Any]] = {}
    listed: dict[str, list[list[Any]]] = {}
    where = conn.info.dsn

    for collector in COLLECTORS:
        if only and collector.name not in only:
            continue
        previous_at, previous = state.get(collector.name, (None, {}))
        ctx = Context(conn=conn, options=options, now=now, name=collector.name,
                      previous_at=previous_at, previous=previous, details=details)
        started = time.perf_counter()
        error = None
        produced: list[Sample] = []
        try:
            produced = list(collector.collect(ctx))
        except Exception as exc:  # noqa: BLE001 - whatever one collector hits, the others still run
            error = _describe(exc)
            log.warning("collector %s failed: %s", collector.name, error)
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
                try:
                    conn.rollback()
                except psycopg.Error:
                    pass
            # Everything this collector reported last time is "not available" now.
            produced = [Sample(m, labels, None) for m, labels in _series_of(conn, collector.name)]
        elapsed = time.perf_counter() - started
        if error is None:
            series = [[s.metric, s.labels] for s in produced]
            listed[collector.name] = series
            saved = _SERIES_SAVED.get((where, collector.name))
            same = saved is not None and saved[0] == previous_at and saved[1] == series
            new_state[collector.name] = {**(ctx.state or {}), "_series": KEEP if same else series}
        all_samples += produced
        all_samples.append(Sample("collector_duration_seconds", {"collector": collector.name}, elapsed))
        all_samples.append(Sample("collector_errors", {"collector": collector.name}, 1.0 if error else 0.0))
        report[collector.name] = {"ms": round(elapsed * 1000.0, 3), "error": error, "samples": len(produced)}
        if conn.closed or conn.broken:
            break  # nothing more can be read or stored on this connection

    duration = time.perf_counter() - cycle_started
    all_samples.append(Sample("collection_duration_seconds", {}, duration))
    result = CollectionReport(started_at=now, duration_s=duration, samples=all_samples, collectors=report, details=details)
    if store and not (conn.closed or conn.broken):
        result.run_id = _store(conn, result, new_state, leader)
        for name, series in listed.items():
            _SERIES_SAVED[(where, name)] = (now, series)
    return result


# What each collector's row holds in `series` (migration 034), as this process stored it:
# {(the database's dsn, collector): (taken_at, [[metric, labels], ...])}. When the row still
# has that taken_at (no other scheduler stored since) and the collector reported the same
# series, the store keeps the stored list (KEEP) instead of sending it again: at 5,000 queues
# 45,000 pairs of JSON a cycle that change only when a queue comes or goes. One entry per
# database and collector.
_SERIES_SAVED: dict[tuple[str, str], tuple[datetime, list[list[Any]]]] = {}
KEEP = object()


# The store's own time limit, never below this: one statement writes a whole cycle (45,000
# samples at 5,000 queues, and the triggers keeping samples_latest), about 0.6 s on a quiet
# machine and past the pages' 2 s `statement_timeout` at load 7, which cancelled the cycle and
# lost its samples. Still bounded: one statement per cycle, in its own short transaction.
STORE_TIMEOUT_MS = 15_000


def _store(conn: psycopg.Connection, report: CollectionReport, new_state: dict[str, dict[str, Any]], leader: str | None) -> int:
    finished = datetime.now(UTC)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT set_config('statement_timeout', "
                    "greatest(extract(epoch FROM current_setting('statement_timeout')::interval) * 1000, %s)::bigint || 'ms', true)",
                    (STORE_TIMEOUT_MS,))
        samples_store.store(conn, report.samples, at=report.started_at)
        if new_state:
            cur.execute(query("collectors_runs", "save_states"), {
                "taken_at": report.started_at,
                "names": list(new_state),
                "states": [Jsonb({k: v for k, v in state.items() if k != "_series"}) for state in new_state.values()],
                # JSON null: keep the stored list (KEEP); no `_series` at all: none.
                "series": [Jsonb(None if state.get("_series", []) is KEEP else state.get("_series", []))
                           for state in new_state.values()],
            })
        row = cur.execute(query("collectors_runs", "insert_run"), {
            "started_at": report.started_at,
            "finished_at": finished,
            "duration_ms": report.duration_s * 1000.0,
            "collectors": Jsonb(report.collectors),
            "leader": leader,
            "details": Jsonb(report.details),
        }).fetchone()
    return row[0]


def latest_details(conn: psycopg.Connection) -> dict[str, Any] | None:
    """The newest cycle's details (xmin_holders, blocking_tree, lock_waiters, vacuum_progress,
    wait_events) with its time and per-collector errors; None before the first cycle."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("collectors_runs", "latest_details"), {}).fetchone()


def collect_once(dsn: str, options: Options | None = None, *, leader: str | None = None) -> CollectionReport:
    """Open a collector connection, run one cycle, store it, close."""
    with collector_connection(dsn, options) as conn:
        return collect(conn, options, leader=leader)
