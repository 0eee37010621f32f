"""External queue sources ([[external_queues]]): the same queue figures as Skiplock's own
(queue_depth by state, queue_age_seconds, stuck_leases, stuck_lease_age_seconds, dead_letters)
plus the queue table's health through the table collector's `measure`, each series labelled
`system` (pgqueuer, procrastinate, table) and `external` (the entry's name).

Each source is read in its own READ ONLY transaction under the collectors' statement_timeout,
on the collector connection or, for an entry with its own `dsn`, on a collector connection to
that database opened for the cycle. A source that fails (missing table, timeout, unreachable)
gets `external_source_errors{external, system} = 1`, its previous series as "not available"
and its error in the cycle's details (`external_sources`), which its panel shows; the other
sources and collectors still run. Counts stop at the caps like Skiplock's own (estimates beyond).

`latest_sources(conn)` is what the pages read back: the newest cycle's sources and their figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import external, samples
from console.collectors import tables
from console.collectors.base import Context, collector_connection
from console.samples import Sample


def _source_samples(adapter: external.Adapter, snap: external.Snapshot) -> list[Sample]:
    base = {"system": adapter.system, "external": adapter.name}
    out: list[Sample] = []
    for f in snap.queues:
        q = {**base, "queue": f.queue}
        out += [
            Sample("queue_depth", {**q, "state": "eligible"}, f.eligible),
            Sample("queue_depth", {**q, "state": "scheduled"}, f.scheduled),
            Sample("queue_depth", {**q, "state": "running"}, f.running),
            Sample("queue_depth", {**q, "state": "failed"}, f.failed),
            Sample("queue_age_seconds", q, f.age_s),
            Sample("stuck_leases", q, f.stuck),
            Sample("stuck_lease_age_seconds", q, f.oldest_stuck_s),
            Sample("dead_letters", q, f.failed),
        ]
    out.append(Sample("queue_depth_estimated", base, 1.0 if snap.estimated else 0.0))
    return out


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    out: list[Sample] = []
    details: dict[str, Any] = {}
    state: dict[str, Any] = {"sources": {}, "tables": {}}
    previous_sources = ctx.previous.get("sources", {})
    for entry in opts.external:
        adapter = external.adapter_for(entry)
        info: dict[str, Any] = {"system": adapter.system, "schema_version": adapter.schema_version,
                                "table": ".".join(adapter.queue_table), "read_only": adapter.read_only_reason,
                                "error": None, "queues": []}
        labels = {"system": adapter.system, "external": adapter.name}
        try:
            produced = _one(ctx, adapter, state["tables"], info)
            state["sources"][adapter.name] = [[s.metric, s.labels] for s in produced]
            out += produced
            out.append(Sample("external_source_errors", labels, 0.0))
        except Exception as exc:  # noqa: BLE001 - one source's failure is its panel's, not the cycle's
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            info["error"] = f"{type(exc).__name__}: {first}"[:500]
            out += [Sample(m, lbl, None) for m, lbl in previous_sources.get(adapter.name, [])]
            state["sources"][adapter.name] = previous_sources.get(adapter.name, [])
            out.append(Sample("external_source_errors", labels, 1.0))
            if not ctx.conn.closed and ctx.conn.info.transaction_status != 0:
                ctx.conn.rollback()
        details[adapter.name] = info
    ctx.detail("external_sources", details)
    ctx.remember(state)
    return out


def _one(ctx: Context, adapter: external.Adapter, table_state: dict[str, Any], info: dict[str, Any]) -> list[Sample]:
    opts = ctx.options
    own = adapter.entry.dsn or None
    conn = collector_connection(adapter.entry.dsn, opts) if own else ctx.conn
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            external.read_only(cur, opts.statement_timeout_ms)
            adapter.check_schema(cur)
            snap = external.snapshot(cur, adapter, cap=opts.depth_exact_limit, failed_cap=opts.failed_total_limit)
        info["queues"] = [f.queue for f in snap.queues]
        info["estimated"] = snap.estimated
        produced = _source_samples(adapter, snap)
        sub = Context(conn=conn, options=opts, now=ctx.now, name=ctx.name, previous_at=ctx.previous_at,
                      previous=ctx.previous, details={})
        table_samples, snapshot, _ = tables.measure(sub, adapter.tables(), ctx.previous.get("tables", {}),
                                                    {"system": adapter.system})
        table_state.update(snapshot)
        return produced + table_samples
    finally:
        if own:
            conn.close()


def latest_sources(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """What the pages show: each external source of the newest collection cycle, with its
    system, schema version, table, error (None when it was read) and per-queue figures from the
    newest samples. Reads stored samples and the cycle's details only, never the source."""
    from console.collectors import latest_details

    run = latest_details(conn)
    details = ((run or {}).get("details") or {}).get("external_sources") or {}
    queues: dict[tuple[str, str], dict[str, Any]] = {}
    for s in samples.latest(conn, within=timedelta(minutes=15)):
        name = s.labels.get("external")
        if name is None or "queue" not in s.labels:
            continue
        row = queues.setdefault((name, s.labels["queue"]), {"queue": s.labels["queue"], "at": s.at})
        key = s.labels.get("state") if s.metric == "queue_depth" else s.metric
        row[key] = s.value
    out = []
    for name in sorted(details):
        info = details[name]
        rows = [r for (n, _), r in sorted(queues.items()) if n == name]
        out.append({"name": name, **info, "queues": rows, "collected_at": (run or {}).get("started_at")})
    return out
