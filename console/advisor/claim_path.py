"""Claim path: does the claim walk its partial index in order, does any index slow every state change,
and does each claim stay as cheap as it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from typing import Any

from console.advisor.base import (
    FAIL,
    OK,
    UNKNOWN,
    WARN,
    Family,
    Outcome,
    Probe,
    count,
    seconds,
    size,
)
from console.advisor.causes import (
    BACKLOG_MIN,
    CHANGES_BEFORE,
    HOLDER,
    Cause,
    change_cause,
    held_back_causes,
    held_back_work,
    holder_cause,
    operator_changes,
    the_holder,
)
from console.resources import resource_dir
from console.sqlfiles import query

EXPLAIN_WORKER = "skiplock-advisor-explain"

FAMILY = Family("Claim path")


def _plan_nodes(node: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        if child.get("Parent Relationship") == "SubPlan":
            continue  # the paused-queues lookup is not part of the claim's walk
        yield from _plan_nodes(child)


def _claim_scan(plan: dict[str, Any]) -> dict[str, Any]:
    """How the candidates CTE of the claim reaches its rows: index used, sort, seq scan."""
    root = plan["Plan"]
    cte = next((n for n in _all_nodes(root) if n.get("Subplan Name") == "CTE candidates"), None)
    scope = list(_plan_nodes(cte)) if cte else list(_plan_nodes(root))
    jobs_scans = [n for n in scope if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]]
    index = None
    for node in scope:
        if node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") and node.get("Index Name"):
            if node["Node Type"] == "Bitmap Index Scan" or node.get("Relation Name") == "jobs":
                index = node["Index Name"]
                break
    chain = " -> ".join(
        n["Node Type"] + (f" using {n['Index Name']}" if n.get("Index Name") else "")
        + (f" on {n['Relation Name']}" if n.get("Relation Name") else "")
        for n in scope
    )
    return {
        "index": index,
        "sort": any(n["Node Type"] in ("Sort", "Incremental Sort") for n in scope),
        "seq_scan": any(n["Node Type"] == "Seq Scan" for n in jobs_scans),
        "chain": chain,
        "cost": root.get("Total Cost"),
    }


def _all_nodes(node: dict[str, Any]) -> Iterable[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _all_nodes(child)


def _explain_claim(probe: Probe) -> dict[str, Any]:
    params = {
        "queues": None,
        "limit": probe.setting("worker.batch_size"),
        "worker": EXPLAIN_WORKER,
        "lease": float(probe.setting("worker.lease")),
    }
    # EXPLAIN without ANALYZE plans the real statement and runs nothing.
    probe.cur.execute("EXPLAIN (FORMAT JSON) " + query("queue", "claim"), params)
    return _claim_scan(probe.cur.fetchone()["QUERY PLAN"][0])


@FAMILY.check("claim-plan", "The claim walks the partial claim index in its own order")
def claim_plan(probe: Probe) -> Outcome:
    indexes = probe.rows("jobs_indexes")
    stats = probe.row("jobs_table_stats")
    natural = _explain_claim(probe)
    # Could the planner use an index that matches the predicate and ORDER BY at all? With seq
    # scans, sorts and bitmap scans priced out, only a matching index avoids a Sort node.
    for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
        probe.cur.execute("SELECT set_config(%s, 'off', true)", (setting,))
    forced = _explain_claim(probe)
    for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
        probe.cur.execute("SELECT set_config(%s, 'on', true)", (setting,))
    by_name = {i["index"]: i for i in indexes}
    evidence = [f"planner's choice: {natural['chain']}"]
    if forced["chain"] != natural["chain"]:
        evidence.append(f"best plan with a matching index: {forced['chain']}")
    claim_like = [i for i in indexes if "pending" in (i["definition"] or "")]
    evidence += [f"index {i['index']}: {i['definition']}" for i in claim_like] or ["no index on skiplock.jobs has a status = 'pending' predicate"]
    data = {"natural": natural, "forced": forced, "live_rows": stats.get("n_live_tup")}
    remedy_missing = (
        "Create the claim index exactly as migration 001 does: CREATE INDEX CONCURRENTLY jobs_claim_idx "
        "ON skiplock.jobs (priority DESC, run_at, id) INCLUDE (queue) WHERE status = 'pending'. "
        "Its predicate must be the claim's (status = 'pending') and its columns the claim's ORDER BY."
    )
    if forced["index"] is None or forced["sort"] or forced["seq_scan"]:
        return Outcome(FAIL, "no index matches the claim's predicate and ordering: every claim reads and sorts "
                       "the pending rows", evidence, remedy_missing, data)
    used = by_name.get(forced["index"], {})
    if not used.get("is_partial"):
        return Outcome(WARN, f"the claim can only use {forced['index']}, which also holds finished rows",
                       evidence, remedy_missing, data)
    if natural["index"] == forced["index"] and not natural["sort"]:
        return Outcome(OK, f"the claim walks {forced['index']} in its own order and stops after the batch",
                       evidence, "", data)
    live = stats.get("n_live_tup") or 0
    if live < 10_000:
        return Outcome(OK, f"{forced['index']} matches the claim; at {live:,} rows the planner prefers "
                       "another plan, which is cheap at this size", evidence, "", data)
    return Outcome(WARN, f"{forced['index']} matches the claim, but the planner does not choose it at "
                   f"{live:,} rows", evidence,
                   "Run ANALYZE skiplock.jobs; if the plan stays, check the table's statistics target and "
                   "autovacuum_analyze settings (docs/advisor.md#claim-plan).", data)


@cache
def skiplock_indexes() -> frozenset[str]:
    """Index names Skiplock's own migrations create on skiplock.jobs (the pkey included)."""
    names = {"jobs_pkey"}
    pattern = re.compile(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+skiplock\.jobs\b",
                         re.IGNORECASE)
    for path in sorted((resource_dir("sql") / "migrations").glob("*.sql")):
        names.update(pattern.findall(path.read_text(encoding="utf-8")))
    return frozenset(names)


@FAMILY.check("unused-indexes", "No unused index on the hot table")
def unused_indexes(probe: Probe) -> Outcome:
    indexes = probe.rows("jobs_indexes")
    own = skiplock_indexes()
    extra = [i for i in indexes if i["index"] not in own and not i["is_unique"] and not i["is_primary"]]
    unused = [i for i in extra if not i["idx_scan"]]
    evidence = [f"{i['index']}: {i['idx_scan'] or 0:,} scans, {size(i['bytes'])}; {i['definition']}" for i in extra]
    data = {"indexes": [{k: i[k] for k in ("index", "idx_scan", "bytes", "is_partial")} for i in indexes],
            "unused": [i["index"] for i in unused]}
    remedy = ("Every claim, completion and retry changes the status of a row, which updates every index of the "
              "table (no HOT update is possible). Drop an index nothing reads: DROP INDEX CONCURRENTLY "
              "skiplock.<name>; keep lookups on finished jobs in the archive instead.")
    if unused:
        names = ", ".join(i["index"] for i in unused)
        return Outcome(WARN, f"{len(unused)} index(es) on skiplock.jobs never scanned since the statistics were reset: {names}",
                       evidence, remedy, data)
    if extra:
        return Outcome(OK, f"{len(extra)} index(es) besides Skiplock's own, all in use", evidence,
                       "Each extra index costs every state change; keep only those a worker or the console reads.", data)
    return Outcome(OK, "only Skiplock's own indexes are on the hot table", [], "", data)


# A measurement counts toward the baseline only when its claims claimed rows: one claimed row per
# ten calls at least. Claims of an empty queue read the empty index's two or three pages, a
# figure no working queue matches, so such a baseline would call any later load a failure.
BASELINE_ROWS_PER_CALL = 0.1
MEMORY = 50  # measurements kept


def _baseline(counted: list[float]) -> float:
    """The lower quartile of the counted measurements: robust to one low outlier, and to a
    degradation that covers less than three quarters of the memory."""
    ordered = sorted(counted)
    return ordered[(len(ordered) - 1) // 4]


def claims_cause(probe: Probe, now: datetime) -> tuple[Cause | None, list[str]]:
    """What, present now, explains claims getting dearer, and the facts behind the answer (the
    same readings the xmin-horizon and autovacuum-progress checks judge, so the page agrees with
    itself): a horizon holder the xmin-horizon check warns about, held-back work at the head of
    the claim index, a load-changing operator action in the last half hour."""
    warn_at = probe.setting("advisor.xmin_horizon_warn")
    holders = probe.rows("xmin_holders")
    stats = probe.row("jobs_table_stats")
    facts = [f"skiplock.jobs: {count(stats['n_dead_tup'])} dead rows; autovacuum starts at {count(stats['vacuum_trigger'])}"]
    holder = the_holder(holders, warn_at)
    if holder is not None:
        cause = holder_cause(holder)
        return cause, facts + [f"xmin horizon: {cause.text}"]
    if holders:
        young = holder_cause(max(holders, key=lambda h: h["age_s"] or 0.0))
        facts.append(f"xmin horizon: nothing held past advisor.xmin_horizon_warn ({seconds(warn_at)}); "
                     f"the oldest: {young.text}")
    else:
        facts.append("xmin horizon: nothing holds it")
    held = held_back_causes(held_back_work(probe.cur), now)
    if held:
        return held[0], facts + [c.text for c in held]
    facts.append(f"no paused or limited queue and no limited kind has {BACKLOG_MIN}+ jobs at the head of the claim index")
    changes = operator_changes(probe.cur, now - CHANGES_BEFORE, now)
    if changes:
        cause = change_cause(changes[0])
        return cause, facts + [change_cause(r).text for r in changes[:5]]
    facts.append(f"no operator changed the queue's load in the last {seconds(CHANGES_BEFORE.total_seconds())} (audit log)")
    return None, facts


@FAMILY.check("claim-buffers", "The claim stays cheap (buffers per claim against its baseline)")
def claim_buffers(probe: Probe) -> Outcome:
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    stats = probe.row("claim_statements")
    min_calls = probe.setting("advisor.claim_min_calls")
    needed = probe.setting("advisor.claim_baseline_min")
    calls, rows, buffers = stats["calls"], stats["rows"], stats["buffers"]
    previous = probe.recall("claim_buffers")
    memory = dict(previous["data"]) if previous else {}
    # Measurements are {"buffers", "rows_per_call"}; a bare number is from before rows were
    # kept and cannot say whether its claims found work, so it does not count.
    history: list[dict[str, float]] = [m for m in memory.get("history", []) if isinstance(m, dict)]
    current = rows_per_call = None
    basis = ""
    if memory and calls >= memory.get("calls", 0) and calls - memory["calls"] >= min_calls:
        d_calls = calls - memory["calls"]
        d_rows = rows - memory.get("rows", 0)
        current = (buffers - memory["buffers"]) / max(d_calls + d_rows, 1)
        rows_per_call = max(d_rows, 0) / d_calls
        basis = f"over the last {count(d_calls)} claim calls"
    elif (not memory or calls < memory.get("calls", 0)) and calls >= min_calls:
        current = buffers / max(calls + rows, 1)  # first reading, or counters were reset
        rows_per_call = rows / calls
        basis = f"over all {count(calls)} claim calls since pg_stat_statements was reset"
    counted = [m["buffers"] for m in history if m["rows_per_call"] >= BASELINE_ROWS_PER_CALL]
    baseline = _baseline(counted) if counted else None
    if current is not None:
        history = (history + [{"buffers": round(current, 3), "rows_per_call": round(rows_per_call, 3)}])[-MEMORY:]
        probe.remember("claim_buffers", {"calls": calls, "rows": rows, "buffers": buffers, "history": history})
    elif not memory:
        probe.remember("claim_buffers", {"calls": calls, "rows": rows, "buffers": buffers, "history": []})
    data = {"calls": calls, "rows": rows, "buffers": buffers, "current": current, "baseline": baseline,
            "baseline_measurements": len(counted), "baseline_needed": needed, "statements": stats["statements"]}
    if current is None:
        return Outcome(OK, f"not enough claim calls yet to measure ({count(calls)} seen; {min_calls} needed between runs)",
                       [], "", data)
    evidence = [f"{current:.1f} buffers per claim call or claimed row {basis} ({rows_per_call:.2f} rows claimed per call)"]
    rule = (f"a baseline needs {needed} measurements (advisor.claim_baseline_min) whose claims claimed at least "
            f"one row per {1 / BASELINE_ROWS_PER_CALL:.0f} calls; an empty queue's claims do not count")
    if baseline is None:
        return Outcome(OK, f"{current:.1f} buffers per claim; no baseline yet (0 of {needed} measurements that claimed rows)",
                       evidence + [rule], "", data)
    enough = len(counted) >= needed
    evidence.append(f"baseline (lower quartile of {len(counted)} measurements that claimed rows, of the last "
                    f"{len(history) - 1}): {baseline:.1f}" + ("" if enough else f"; {rule}, so it cannot fail yet"))
    ratio = current / max(baseline, 0.5)
    data["ratio"] = ratio
    figure = f"each claim reads {ratio:.1f}x the buffers of its baseline ({current:.0f} vs {baseline:.1f})"
    if ratio >= 20 and current - baseline >= 100:
        status = FAIL
    elif ratio >= 4 and current - baseline >= 20:
        status = WARN
    else:
        return Outcome(OK, f"{current:.1f} buffers per claim, {ratio:.1f}x its baseline", evidence, "", data)
    cause, facts = claims_cause(probe, datetime.now(UTC))
    evidence += facts
    if cause is not None:
        # Named, with its fix, instead of a verdict on the claim: the cause's own check
        # (xmin-horizon, the queue's page, the audit log) carries how bad it is.
        data["cause"] = cause.to_dict()
        return Outcome(WARN, f"{figure}: {cause.sentence('claims recover once vacuum runs' if cause.kind == HOLDER else '')}",
                       evidence, f"{cause.fix[0].upper()}{cause.fix[1:]}. " + _CLAIM_REMEDY, data)
    if status == FAIL and not enough:
        return Outcome(WARN, f"{figure}, but the baseline rests on {len(counted)} of the {needed} measurements needed "
                       "to call it a failure: not enough evidence yet", evidence, _CLAIM_REMEDY, data)
    return Outcome(status, f"{figure}, with no known cause (no horizon holder, no held-back work, no recent change)",
                   evidence, _CLAIM_REMEDY, data)


_CLAIM_REMEDY = ("A rising figure means the claim walks more entries at the head of the claim index: dead ones "
                 "that vacuum has not removed yet (look at autovacuum-progress and xmin-horizon), or live ones it "
                 "must leave alone (a paused or limited queue's backlog). Keep the jobs table's per-table autovacuum "
                 "settings (scale factor 0, a fixed threshold, no cost delay); if the figure stays high with none of "
                 "these, the claim itself has become dearer at this load.")


@FAMILY.check("claim-skip-locked", "Claim-like statements skip locked rows (no FOR UPDATE convoy in the history)")
def claim_skip_locked(probe: Probe) -> Outcome:
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    # the collector's own definition of "claim-like without SKIP LOCKED" (one query, two readers)
    probe.cur.execute(query("collectors_statements", "claims_without_skip_locked"), {"limit": 10})
    found = probe.cur.fetchall()
    data = {"statements": [{"queryid": r["queryid"], "query": r["query"][:160], "calls": r["calls"],
                            "mean_ms": r["mean_ms"]} for r in found]}
    if not found:
        return Outcome(OK, "no statement in pg_stat_statements locks rows FOR UPDATE with a LIMIT without SKIP LOCKED",
                       [], "", data)
    evidence = [f"queryid {r['queryid']}: {count(r['calls'])} calls, mean {r['mean_ms'] or 0:.1f} ms: "
                f"{r['query'][:160]}{'...' if len(r['query']) > 160 else ''}" for r in found]
    remedy = ("Add SKIP LOCKED to the claim (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n): without it every "
              "worker waits behind the row another worker holds, and the workers take turns instead of "
              "working in parallel (a convoy). The metric claim_without_skip_locked_calls{statement=queryid} "
              "tracks the same statements.")
    slow = [r for r in found if (r["mean_ms"] or 0) >= 100]
    if slow:
        return Outcome(FAIL, f"{len(found)} claim-like statement(s) without SKIP LOCKED; {len(slow)} average "
                       f"{max(r['mean_ms'] for r in slow):.0f} ms or more, so workers are waiting on each other",
                       evidence, remedy, data)
    return Outcome(WARN, f"{len(found)} claim-like statement(s) lock rows FOR UPDATE without SKIP LOCKED",
                   evidence, remedy, data)
