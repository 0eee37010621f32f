"""External queue sources ([[external_queues]]): the same queue figures as Skiplock's own
(queue_depth by state, queue_age_seconds, stuck_leases, stuck_lease_age_seconds, dead_letters, and
dead_letter_growth where the library records when a job failed: the dead letters that failed
within `[scheduler] rate_window` and are still failed, per hour, as for Skiplock's own queues),
throughput{outcome, queue} where the library records finished jobs (from its completion log
after the previous cycle's id: console.external.finished_since; PGQueuer and Procrastinate),
claim_latency_seconds{queue="all", source="pg_stat_statements", quantile="mean"} from the
deltas of the statements LIKE the source's claim pattern (their ids found again only when the
database's pg_stat_statements entries change or every `pgss_discovery_interval`, as the
statements collector does, because reading query text is the expensive part), plus the queue
table's health through the table collector's `measure`, each series labelled
`system` (pgqueuer, procrastinate, table) and `external` (the entry's name).

Each source is read in its own READ ONLY transaction under the collectors' statement_timeout,
on the collector connection or, for an entry with its own `dsn`, on a collector connection to
that database opened for the cycle. A source that fails (missing table, timeout, unreachable)
gets `external_source_errors{external, system} = 1`, its previous series as "not available"
and its error in the cycle's details (`external_sources`), which its panel shows; the other
sources and collectors still run. Counts stop at the caps like Skiplock's own (estimates beyond).

Neither series exists before a second cycle (a rate needs two readings); a counter that went
down (a reset, a truncated log) skips one interval.

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
from console.sqlfiles import query


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
        if f.dead_per_hour is not None:  # the same definition as Skiplock's own queues'
            out.append(Sample("dead_letter_growth", q, f.dead_per_hour))
    out.append(Sample("queue_depth_estimated", base, 1.0 if snap.estimated else 0.0))
    return out


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    out: list[Sample] = []
    details: dict[str, Any] = {}
    state: dict[str, Any] = {"sources": {}, "tables": {}, "cursors": {}, "pgss": {}, "busy": {}}
    previous_sources = ctx.previous.get("sources", {})
    for entry in opts.external:
        adapter = external.adapter_for(entry)
        info: dict[str, Any] = {"system": adapter.system, "schema_version": adapter.schema_version,
                                "table": ".".join(adapter.queue_table), "read_only": adapter.read_only_reason,
                                "actions": list(adapter.actions), "error": None, "queues": []}
        labels = {"system": adapter.system, "external": adapter.name}
        try:
            produced = _one(ctx, adapter, state, info)
            state["sources"][adapter.name] = [[s.metric, s.labels] for s in produced]
            out += produced
            out.append(Sample("external_source_errors", labels, 0.0))
        except Exception as exc:  # noqa: BLE001 - one source's failure is its panel's, not the cycle's
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            info["error"] = f"{type(exc).__name__}: {first}"[:500]
            out += [Sample(m, lbl, None) for m, lbl in previous_sources.get(adapter.name, [])]
            state["sources"][adapter.name] = previous_sources.get(adapter.name, [])
            out.append(Sample("external_source_errors", labels, 1.0))
            for key in ("cursors", "pgss", "busy"):  # the next good cycle starts from the last good one
                if adapter.name in ctx.previous.get(key, {}):
                    state[key][adapter.name] = ctx.previous[key][adapter.name]
            if not ctx.conn.closed and ctx.conn.info.transaction_status != 0:
                ctx.conn.rollback()
        details[adapter.name] = info
    ctx.detail("external_sources", details)
    ctx.remember(state)
    return out


def _throughput(ctx: Context, cur: psycopg.Cursor, adapter: external.Adapter, snap: external.Snapshot,
                info: dict[str, Any], state: dict[str, Any]) -> list[Sample]:
    before = ctx.previous.get("cursors", {}).get(adapter.name)
    after = before["id"] if before else None
    done = external.finished_since(cur, adapter, after, cap=ctx.options.depth_exact_limit)
    if done is None:
        info["throughput"] = f"not available: {adapter.no_completions}" if adapter.completions() is None else \
            "not available: the library's completion log table is missing"
        return []
    now = ctx.now.timestamp()
    state["cursors"][adapter.name] = {"id": done.head_id if done.head_id is not None else 0, "at": now}
    interval = now - before["at"] if before else 0.0
    if not before or interval <= 0 or (done.head_id or 0) < (after or 0):
        info["throughput"] = "from the next cycle on (a rate needs two readings)"
        return []
    info["throughput"] = "estimated (more log rows than the cap)" if done.estimated else "from the completion log"
    outcomes = [name for name, _ in adapter.completions().outcomes]
    out = []
    for queue in sorted({f.queue for f in snap.queues} | set(done.counts)):
        counts = done.counts.get(queue, {})
        for outcome in outcomes:
            out.append(Sample("throughput", {"outcome": outcome, "queue": queue, "system": adapter.system,
                                             "external": adapter.name}, counts.get(outcome, 0.0) / interval))
    return out


def _claim_latency(ctx: Context, cur: psycopg.Cursor, adapter: external.Adapter, info: dict[str, Any],
                   state: dict[str, Any]) -> list[Sample]:
    pattern = adapter.claim_pattern
    avail = cur.execute(query("collectors_statements", "pgss_available")).fetchone()
    if not pattern or not (avail["installed"] and avail["preloaded"]):
        info["claim_latency"] = ("not available: no claim_query_like on the entry" if not pattern else
                                 "not available: pg_stat_statements is not installed in the source's database")
        return []
    old = ctx.previous.get("pgss", {}).get(adapter.name) or {}
    entries = cur.execute(query("collectors_statements", "pgss_entries")).fetchone()["entries"]
    now = ctx.now.timestamp()
    ids, discovered_at = old.get("ids"), old.get("discovered_at")
    if (ids is None or discovered_at is None or entries != old.get("entries")
            or now - discovered_at >= ctx.options.pgss_discovery_interval):
        ids = [r["queryid"] for r in cur.execute(query("external", "claim_statements"), {"pattern": pattern}).fetchall()]
        discovered_at = now
    counters = {str(r["queryid"]): {"calls": r["calls"], "total_exec_ms": r["total_exec_ms"]} for r in cur.execute(
        query("collectors_statements", "claim_statement_counters"), {"ids": [int(i) for i in ids]}).fetchall()}
    state["pgss"][adapter.name] = {"ids": ids, "entries": entries, "discovered_at": discovered_at, "counters": counters}
    before = old.get("counters")
    if before is None:
        info["claim_latency"] = "from the next cycle on (a latency needs two readings)"
        return []
    calls = total = 0.0
    for qid, now_c in counters.items():
        was = before.get(qid)
        if was is None or now_c["calls"] < was["calls"]:
            continue  # a new statement or a reset: no honest delta this interval
        calls += now_c["calls"] - was["calls"]
        total += now_c["total_exec_ms"] - was["total_exec_ms"]
    info["claim_latency"] = (f"{len(ids)} statement(s) LIKE {pattern}" if ids else
                             f"no statement LIKE {pattern} in pg_stat_statements yet")
    labels = {"queue": "all", "source": "pg_stat_statements", "quantile": "mean", "system": adapter.system,
              "external": adapter.name}
    return [Sample("claim_latency_seconds", labels, total / calls / 1000.0 if calls else None)]


def _one(ctx: Context, adapter: external.Adapter, state: dict[str, Any], info: dict[str, Any]) -> list[Sample]:
    opts = ctx.options
    own = adapter.entry.dsn or None
    conn = collector_connection(adapter.entry.dsn, opts) if own else ctx.conn
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            external.read_only(cur, opts.statement_timeout_ms)
            adapter.check_schema(cur)
            snap = external.snapshot(cur, adapter, cap=opts.depth_exact_limit, failed_cap=opts.failed_total_limit,
                                     window=timedelta(seconds=opts.rate_window),
                                     drained=ctx.previous.get("busy", {}).get(adapter.name, []))
            state["busy"][adapter.name] = [f.queue for f in snap.queues
                                           if f.eligible or f.scheduled or f.running or f.failed or f.dead_per_hour]
            produced = _source_samples(adapter, snap)
            produced += _throughput(ctx, cur, adapter, snap, info, state)
            produced += _claim_latency(ctx, cur, adapter, info, state)
        info["queues"] = [f.queue for f in snap.queues]
        info["estimated"] = snap.estimated
        sub = Context(conn=conn, options=opts, now=ctx.now, name=ctx.name, previous_at=ctx.previous_at,
                      previous=ctx.previous, details={})
        table_samples, snapshot, _ = tables.measure(sub, adapter.tables(), ctx.previous.get("tables", {}),
                                                    {"system": adapter.system})
        state["tables"].update(snapshot)
        return produced + table_samples
    finally:
        if own:
            conn.close()


def latest_sources(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """What the pages show: each external source of the newest collection cycle, with its
    system, schema version, table, error (None when it was read), claim latency and per-queue
    figures (throughput_completed/_failed/_retried where recorded) from the newest samples. Reads stored samples and the cycle's details only, never the source."""
    from console.collectors import latest_details

    run = latest_details(conn)
    details = ((run or {}).get("details") or {}).get("external_sources") or {}
    if not details:  # none configured (the usual case): the list is empty, read no samples
        return []
    queues: dict[tuple[str, str], dict[str, Any]] = {}
    claims: dict[str, float | None] = {}
    for s in samples.latest(conn, within=timedelta(minutes=15)):
        name = s.labels.get("external")
        if name is None or "queue" not in s.labels:
            continue
        if s.metric == "claim_latency_seconds":  # one per source (queue "all")
            claims[name] = s.value
            continue
        row = queues.setdefault((name, s.labels["queue"]), {"queue": s.labels["queue"], "at": s.at})
        key = {"queue_depth": s.labels.get("state"), "throughput": f"throughput_{s.labels.get('outcome')}"}.get(s.metric, s.metric)
        row[key] = s.value
    out = []
    for name in sorted(details):
        info = details[name]
        rows = [r for (n, _), r in sorted(queues.items()) if n == name]
        out.append({"name": name, **info, "queues": rows, "claim_latency_s": claims.get(name),
                    "collected_at": (run or {}).get("started_at")})
    return out
