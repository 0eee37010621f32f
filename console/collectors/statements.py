"""Claim latency and buffers per claim from pg_stat_statements, and a rolled-back probe claim.

pg_stat_statements: the claim statements are found by their shape (FOR UPDATE SKIP LOCKED on
skiplock.jobs with an attempts increment) only when this database's number of entries changed
or every `pgss_discovery_interval` seconds, because reading query text is the expensive part
of the view; otherwise only counters are read, with `pg_stat_statements(false)`. Per interval:
latency = delta total_exec_time / delta calls, buffers per call = delta (shared hit + read) /
delta calls, rows per call likewise. Buffers per call climbing while rows per call stays flat
is the claim walking dead index entries. A counter that went down (reset, eviction) skips one
interval rather than reporting garbage.

Convoys: the same discovery also finds claim-like statements that do not skip locked rows (a
SELECT with FOR UPDATE or FOR NO KEY UPDATE and a LIMIT, without SKIP LOCKED or NOWAIT, not on
Skiplock's own tables), up to `CONVOY_LIMIT` of them, and every cycle reports their cumulative
calls as `claim_without_skip_locked_calls{statement="<queryid>"}` (and `statement="all"`, 0 when
there are none). Workers running such a statement wait behind each other's row locks. The
advisor's `claim-skip-locked` check shows their text and mean time.

Probe: the claim statement itself, run in a transaction that is always rolled back, timed from
the client. It finds what a worker would find right now, even with no worker running. Because
it really locks and updates one row before the rollback, each probe leaves one dead tuple, and
it appears in pg_stat_statements as one call of the `claim` statement per probe (workers
mostly run `complete_and_claim`, reported under its own `statement` label).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from console.collectors.base import Context
from console.samples import Sample
from console.sqlfiles import query

PROBE_WORKER = "skiplock-probe"
CONVOY_LIMIT = 10  # statements reported by claim_without_skip_locked_calls


def _pgss(ctx: Context) -> list[Sample]:
    avail = ctx.rows("collectors_statements", "pgss_available")[0]
    blank = [
        Sample("claim_latency_seconds", {"queue": "all", "source": "pg_stat_statements", "quantile": "mean"}, None),
        Sample("claim_buffers_per_call", {"statement": "all"}, None),
        Sample("claim_rows_per_call", {"statement": "all"}, None),
        Sample("claim_without_skip_locked_calls", {"statement": "all"}, None),
    ]
    if not (avail["installed"] and avail["preloaded"]):
        ctx.detail("pg_stat_statements", "not installed in this database (CREATE EXTENSION pg_stat_statements) or not preloaded")
        ctx.remember({})
        return blank

    known = ctx.previous.get("ids")
    convoy: list[str] = ctx.previous.get("convoy_ids") or []
    discovered_at = ctx.previous.get("discovered_at")
    entries = ctx.rows("collectors_statements", "pgss_entries")[0]["entries"]
    now_s = ctx.now.timestamp()
    if (not known or discovered_at is None or entries != ctx.previous.get("entries")
            or now_s - discovered_at >= ctx.options.pgss_discovery_interval):
        known = {str(r["queryid"]): r["statement"] for r in ctx.rows("collectors_statements", "claim_statement_ids")}
        convoy = [str(r["queryid"]) for r in ctx.rows("collectors_statements", "claims_without_skip_locked",
                                                      {"limit": CONVOY_LIMIT})]
        discovered_at = now_s
    both = {
        str(r["queryid"]): r
        for r in ctx.rows("collectors_statements", "claim_statement_counters", {"ids": [int(i) for i in [*known, *convoy]]})
    }
    counters = {qid: r for qid, r in both.items() if qid in known}
    # cumulative calls since pg_stat_statements was reset: no delta needed, so from the first cycle
    waiting = [Sample("claim_without_skip_locked_calls", {"statement": qid}, both[qid]["calls"])
               for qid in convoy if qid in both and qid not in known]
    waiting.append(Sample("claim_without_skip_locked_calls", {"statement": "all"}, sum(s.value for s in waiting)))
    old = ctx.previous.get("counters", {})
    ctx.remember({
        "ids": known,
        "discovered_at": discovered_at,
        "entries": entries,
        "convoy_ids": convoy,
        "counters": {qid: {k: r[k] for k in ("calls", "rows", "total_exec_ms", "shared_blks")} for qid, r in counters.items()},
    })
    if ctx.interval is None or not old:
        return blank[:-1] + waiting

    sums: dict[str, dict[str, float]] = {}
    for qid, r in counters.items():
        before = old.get(qid)
        if before is None or r["calls"] < before["calls"]:
            continue  # new id or a reset: no honest delta this interval
        for statement in (known.get(qid, "claim"), "all"):
            acc = sums.setdefault(statement, dict.fromkeys(("calls", "rows", "total_exec_ms", "shared_blks"), 0.0))
            for k in acc:
                acc[k] += r[k] - before[k]
    out: list[Sample] = []
    total = sums.get("all")
    latency = total["total_exec_ms"] / total["calls"] / 1000.0 if total and total["calls"] else None
    out.append(Sample("claim_latency_seconds", {"queue": "all", "source": "pg_stat_statements", "quantile": "mean"}, latency))
    for statement in sorted({"all", *sums}):
        acc = sums.get(statement)
        calls = acc["calls"] if acc else 0
        out.append(Sample("claim_buffers_per_call", {"statement": statement}, acc["shared_blks"] / calls if calls else None))
        out.append(Sample("claim_rows_per_call", {"statement": statement}, acc["rows"] / calls if calls else None))
    return out + waiting


def _probe(ctx: Context, queues: list[str] | None) -> float:
    params = {"worker": PROBE_WORKER, "queues": queues, "limit": 1, "lease": 1.0}
    conn = ctx.conn
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        cur.execute(query("collectors_statements", "probe_planner_defaults"), {})
        started = time.perf_counter()
        cur.execute(query("queue", "claim"), params)
        cur.fetchall()
        elapsed = time.perf_counter() - started
    return elapsed


def collect(ctx: Context) -> Iterable[Sample]:
    # Probes first: on a fresh database the probe puts the claim statement into
    # pg_stat_statements, so discovery finds it in this same cycle.
    out = [Sample("claim_latency_seconds", {"queue": "all", "source": "probe", "quantile": "last"}, _probe(ctx, None))]
    if ctx.options.probe_queues > 0:
        for row in ctx.rows("collectors_statements", "probe_queues", {"limit": ctx.options.probe_queues}):
            out.append(Sample("claim_latency_seconds", {"queue": row["queue"], "source": "probe", "quantile": "last"}, _probe(ctx, [row["queue"]])))
    return _pgss(ctx) + out
