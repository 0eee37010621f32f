"""The production checklist, evaluated live against the database.

Each check is a small function that reads what it needs through `Probe` (named queries from
`sql/advisor.sql`, all bounded: catalogs, statistics views, or a slice of the jobs table through
one of its partial indexes) and returns an `Outcome`: ok / warn / fail, one sentence saying
what it found, the evidence (who, what, how much), and what to do. `run_checks` runs every check
in its own short transaction under a statement timeout; a check whose queries time out or are
refused reports "unknown" (not available) and the others still run.

Checks read the server; they do not change it. The one write is the advisor's own memory
(`skiplock.advisor_snapshots`): readings of cumulative counters kept so the next run can turn
them into rates. docs/advisor.md explains every check (anchors are the check ids).

This module does not render anything (the CLI and the web page do) and does not decide the
long-term verdict (`console.advisor.verdict` does, from stored samples).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from decimal import Decimal
from functools import cache
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from console import histogram
from console.config import Config, load_config
from console.db import require_schema, time_limited
from console.resources import resource_dir
from console.sqlfiles import query

log = logging.getLogger(__name__)

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
STATUSES = (OK, WARN, FAIL, UNKNOWN)
SEVERITY = {OK: 0, UNKNOWN: 1, WARN: 2, FAIL: 3}
DOCS = "docs/advisor.md"
EXPLAIN_WORKER = "skiplock-advisor-explain"
COUNT_CAP = 100_000  # bounded counts stop here and say "100,000+"


# --- results --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a check function returns."""

    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    remedy: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckResult:
    id: str
    title: str
    area: str
    status: str
    summary: str
    evidence: list[str]
    remedy: str
    docs: str
    data: dict[str, Any]
    elapsed_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    results: list[CheckResult]
    database: str = ""
    server_version: int = 0

    @property
    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in STATUSES}
        for result in self.results:
            counts[result.status] += 1
        return counts

    @property
    def worst(self) -> str:
        return max((r.status for r in self.results), key=SEVERITY.__getitem__, default=OK)

    @property
    def failed(self) -> bool:
        return any(r.status == FAIL for r in self.results)

    def by_id(self, check_id: str) -> CheckResult:
        for result in self.results:
            if result.id == check_id:
                return result
        raise KeyError(check_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "server_version": self.server_version,
            "worst": self.worst,
            "counts": self.counts,
            "checks": [r.to_dict() for r in self.results],
        }


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    area: str
    func: Callable[[Probe], Outcome]

    @property
    def docs(self) -> str:
        return f"{DOCS}#{self.id}"


CHECKS: list[Check] = []
AREAS = ("Claim path", "Locks and transactions", "Leases", "Retries", "Hot table hygiene",
         "MultiXact risk", "Server")


def check(check_id: str, title: str, area: str):
    assert area in AREAS, area

    def register(func: Callable[[Probe], Outcome]) -> Callable[[Probe], Outcome]:
        CHECKS.append(Check(check_id, title, area, func))
        return func

    return register


class UnknownCheck(ValueError):
    pass


def check_ids() -> list[str]:
    return [c.id for c in CHECKS]


# --- what a check reads through -------------------------------------------------------------


class Probe:
    """A check's view of the database: one time-limited cursor, the config, and the advisor's
    memory of earlier readings."""

    def __init__(self, cur: psycopg.Cursor, config: Config):
        self.cur = cur
        self.config = config

    def rows(self, query_name: str, /, **params: Any) -> list[dict[str, Any]]:
        self.cur.execute(query("advisor", query_name), params)
        # extract(epoch ...) is numeric: figures become floats so checks can do arithmetic
        return [{k: float(v) if isinstance(v, Decimal) else v for k, v in row.items()} for row in self.cur.fetchall()]

    def row(self, query_name: str, /, **params: Any) -> dict[str, Any]:
        rows = self.rows(query_name, **params)
        return rows[0] if rows else {}

    def setting(self, dotted: str) -> Any:
        """A setting's value; durations come back as seconds (float)."""
        section, _, key = dotted.partition(".")
        value = self.config.get(section, key)
        return value.total_seconds() if isinstance(value, timedelta) else value

    def recall(self, name: str) -> dict[str, Any] | None:
        return self.row("snapshot_get", name=name) or None

    def remember(self, name: str, data: dict[str, Any]) -> None:
        self.cur.execute(query("advisor", "snapshot_put"), {"name": name, "data": Jsonb(data)})

    def exists(self, relation: str) -> bool:
        return bool(self.row("relation_exists", name=relation).get("exists"))

    @property
    def has_pg_stat_statements(self) -> bool:
        return bool(self.row("capabilities").get("pg_stat_statements"))

    @property
    def can_read_control_data(self) -> bool:
        return bool(self.row("capabilities").get("control_data"))

    @property
    def server_version(self) -> int:
        return self.cur.connection.info.server_version


# --- running --------------------------------------------------------------------------------


def run_checks(
    conn: psycopg.Connection,
    config: Config | None = None,
    *,
    only: Iterable[str] | None = None,
    timeout_ms: int | None = None,
) -> Report:
    """Run the checks (all, or those named in `only`) and return the report.

    `conn` should be autocommit: each check is its own short transaction, so statistics are
    fresh for each and nothing stays open between them.
    """
    config = config or load_config()
    wanted = list(only) if only else None
    if wanted:
        unknown = [name for name in wanted if name not in check_ids()]
        if unknown:
            raise UnknownCheck(f"unknown check {', '.join(unknown)}; known checks: {', '.join(check_ids())}")
    require_schema(conn)
    timeout_ms = timeout_ms or config.database.statement_timeout_ms
    results = []
    for chk in CHECKS:
        if wanted and chk.id not in wanted:
            continue
        results.append(run_one(conn, chk, config, timeout_ms))
    return Report(results, database=conn.info.dbname, server_version=conn.info.server_version)


def run_one(conn: psycopg.Connection, chk: Check, config: Config, timeout_ms: int) -> CheckResult:
    started = time.perf_counter()
    try:
        with time_limited(conn, timeout_ms) as cur:
            outcome = chk.func(Probe(cur, config))
    except psycopg.errors.QueryCanceled:
        outcome = Outcome(UNKNOWN, f"not available: the check's queries took longer than {timeout_ms} ms",
                          remedy="Run the check again when the database is less busy, or raise database.statement_timeout_ms.")
    except psycopg.errors.LockNotAvailable:
        outcome = Outcome(UNKNOWN, "not available: the check waited on a lock (a DDL statement holds the jobs table?)")
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        outcome = Outcome(UNKNOWN, f"not available: {first}")
    except Exception as exc:  # a bug in one check must not take the report down
        log.exception("advisor check %s failed", chk.id)
        outcome = Outcome(UNKNOWN, f"not available: the check itself failed ({exc.__class__.__name__}: {exc})")
    elapsed = (time.perf_counter() - started) * 1000.0
    return CheckResult(chk.id, chk.title, chk.area, outcome.status, outcome.summary, outcome.evidence,
                       outcome.remedy, chk.docs, _jsonable(outcome.data), round(elapsed, 1))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


# --- formatting helpers ---------------------------------------------------------------------


def seconds(value: float | None) -> str:
    """A duration for a human: 45 s, 12 min, 3.5 h, 9 days."""
    if value is None:
        return "unknown"
    value = float(value)
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.0f} days"


def count(value: float | None, cap: int | None = None) -> str:
    if value is None:
        return "unknown"
    if cap is not None and value >= cap:
        return f"{cap:,}+"
    return f"{int(round(value)):,}"


def size(value: float | None) -> str:
    if value is None:
        return "unknown"
    value = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def session(row: dict[str, Any]) -> str:
    """pid, application and query of a session, on one line."""
    app = row.get("application_name") or "(no application_name)"
    query_text = " ".join((row.get("query") or "").split())
    if len(query_text) > 160:
        query_text = query_text[:157] + "..."
    return f"pid {row['pid']} [{app}] {row.get('state') or ''}: {query_text}".strip()


def worst(*statuses: str) -> str:
    return max(statuses, key=SEVERITY.__getitem__, default=OK)


# ============================================================================================
# Claim path
# ============================================================================================


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


@check("claim-plan", "The claim walks the partial claim index in its own order", "Claim path")
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


@check("unused-indexes", "No unused index on the hot table", "Claim path")
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


@check("claim-buffers", "The claim stays cheap (buffers per claim against its baseline)", "Claim path")
def claim_buffers(probe: Probe) -> Outcome:
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    stats = probe.row("claim_statements")
    min_calls = probe.setting("advisor.claim_min_calls")
    calls, rows, buffers = stats["calls"], stats["rows"], stats["buffers"]
    previous = probe.recall("claim_buffers")
    memory = dict(previous["data"]) if previous else {}
    history: list[float] = list(memory.get("history", []))
    current = None
    basis = ""
    if memory and calls >= memory.get("calls", 0) and calls - memory["calls"] >= min_calls:
        d_calls = calls - memory["calls"]
        d_units = d_calls + (rows - memory.get("rows", 0))
        current = (buffers - memory["buffers"]) / max(d_units, 1)
        basis = f"over the last {count(d_calls)} claim calls"
    elif (not memory or calls < memory.get("calls", 0)) and calls >= min_calls:
        current = buffers / max(calls + rows, 1)  # first reading, or counters were reset
        basis = f"over all {count(calls)} claim calls since pg_stat_statements was reset"
    baseline = min(history) if history else None
    if current is not None:
        history = (history + [round(current, 3)])[-50:]
        probe.remember("claim_buffers", {"calls": calls, "rows": rows, "buffers": buffers, "history": history})
    elif not memory:
        probe.remember("claim_buffers", {"calls": calls, "rows": rows, "buffers": buffers, "history": []})
    data = {"calls": calls, "rows": rows, "buffers": buffers, "current": current, "baseline": baseline,
            "statements": stats["statements"]}
    if current is None:
        return Outcome(OK, f"not enough claim calls yet to measure ({count(calls)} seen; {min_calls} needed between runs)",
                       [], "", data)
    evidence = [f"{current:.1f} buffers per claim call or claimed row {basis}"]
    if baseline is None:
        return Outcome(OK, f"{current:.1f} buffers per claim (first measurement: this becomes the baseline)",
                       evidence, "", data)
    evidence.append(f"baseline (lowest of the last {len(history) - 1} measurements): {baseline:.1f}")
    remedy = ("A rising figure means the claim walks dead entries at the head of the claim index: vacuum is "
              "behind or blocked. Check autovacuum-progress and xmin-horizon below; end the transaction that "
              "holds the horizon; keep the jobs table's per-table autovacuum settings (scale factor 0, a fixed "
              "threshold, no cost delay).")
    ratio = current / max(baseline, 0.5)
    data["ratio"] = ratio
    if ratio >= 20 and current - baseline >= 100:
        return Outcome(FAIL, f"each claim reads {ratio:.0f}x the buffers of its baseline ({current:.0f} vs {baseline:.1f})",
                       evidence, remedy, data)
    if ratio >= 4 and current - baseline >= 20:
        return Outcome(WARN, f"each claim reads {ratio:.1f}x the buffers of its baseline ({current:.0f} vs {baseline:.1f})",
                       evidence, remedy, data)
    return Outcome(OK, f"{current:.1f} buffers per claim, {ratio:.1f}x its baseline", evidence, "", data)


# ============================================================================================
# Locks and transactions
# ============================================================================================

_LOCKING_CLAUSE = re.compile(r"\bfor\s+(?:no\s+key\s+update|update|key\s+share|share)\b", re.IGNORECASE)
_SKIPS = re.compile(r"\bskip\s+locked\b|\bnowait\b", re.IGNORECASE)


def waits_for_rows(query_text: str) -> bool:
    """A SELECT ... FOR UPDATE/SHARE without SKIP LOCKED or NOWAIT: it queues behind row locks."""
    return bool(_LOCKING_CLAUSE.search(query_text)) and not _SKIPS.search(query_text)


@check("row-lock-waits", "Claims skip locked rows: nobody waits on jobs-table row locks", "Locks and transactions")
def row_lock_waits(probe: Probe) -> Outcome:
    waiters = probe.rows("lock_waiters")
    if not waiters:
        return Outcome(OK, "no session is waiting on a lock of the jobs tables")
    blocker_pids = sorted({pid for w in waiters for pid in (w["blocked_by"] or [])})
    blockers = {b["pid"]: b for b in probe.rows("sessions", pids=blocker_pids)} if blocker_pids else {}
    evidence = []
    convoy = []
    for w in waiters:
        evidence.append(f"waiting {seconds(w['waiting_s'])} on {w['wait_event']}: {session(w)}")
        for pid in w["blocked_by"] or []:
            b = blockers.get(pid)
            evidence.append(f"  blocked by pid {pid}" + (
                f" [{b['application_name'] or '(no application_name)'}] {b['state']}, transaction open "
                f"{seconds(b['xact_s'])}: {' '.join((b['query'] or '').split())[:160]}" if b else " (a prepared transaction or gone)"))
        if waits_for_rows(w["query"] or ""):
            convoy.append(w)
    longest = max((w["waiting_s"] or 0) for w in waiters)
    data = {"waiters": len(waiters), "longest_wait_s": longest,
            "applications": sorted({w["application_name"] or "" for w in waiters}),
            "plain_for_update": [w["pid"] for w in convoy]}
    remedy = ("Claim with FOR UPDATE SKIP LOCKED (Skiplock's claim does): a plain FOR UPDATE waits behind the "
              "row another worker holds, and the workers form a convoy. Find the application by its "
              "application_name and fix its claim; if a blocker sits idle in a transaction, end it "
              "(SELECT pg_terminate_backend(pid)) and fix the code that holds it open.")
    if convoy:
        apps = ", ".join(sorted({w["application_name"] or "(no application_name)" for w in convoy}))
        return Outcome(FAIL, f"{len(convoy)} session(s) claim jobs with a plain FOR UPDATE and wait in a convoy ({apps})",
                       evidence, remedy, data)
    limit = probe.setting("advisor.lock_wait_fail")
    status = FAIL if longest >= limit or len(waiters) >= 3 else WARN
    return Outcome(status, f"{len(waiters)} session(s) waiting on locks of the jobs tables, longest {seconds(longest)}",
                   evidence, remedy, data)


@check("long-transactions", "Short claim transactions: nothing holds the jobs table open across work", "Locks and transactions")
def long_transactions(probe: Probe) -> Outcome:
    idle_warn = probe.setting("advisor.idle_in_transaction_warn")
    idle_fail = probe.setting("advisor.idle_in_transaction_fail")
    age_warn = probe.setting("advisor.transaction_age_warn")
    age_fail = probe.setting("advisor.transaction_age_fail")
    rows = probe.rows("long_transactions", idle_s=idle_warn, xact_s=age_warn)
    touching = [r for r in rows if r["touches_jobs"]]
    data = {"sessions": [{k: r[k] for k in ("pid", "application_name", "state", "xact_s", "state_s", "touches_jobs")} for r in rows]}
    if not touching:
        note = [f"{len(rows)} long transaction(s) elsewhere in this database (see xmin-horizon)"] if rows else []
        return Outcome(OK, "no transaction holds the jobs tables open", note, "", data)
    status = WARN
    evidence = []
    for r in touching:
        idle = (r["state"] or "").startswith("idle in transaction")
        if (idle and r["state_s"] >= idle_fail) or r["xact_s"] >= age_fail:
            status = FAIL
        what = f"idle in transaction for {seconds(r['state_s'])}" if idle else f"running, transaction open {seconds(r['xact_s'])}"
        who = f"{r['usename']}@{r['client'] or 'local'}"
        evidence.append(f"pid {r['pid']} [{r['application_name'] or '(no application_name)'}] {who}, {what}, "
                        f"transaction open {seconds(r['xact_s'])}; last statement: "
                        f"{' '.join((r['query'] or '').split())[:160]}")
    remedy = ("Claim in one statement and commit at once; do the job's work outside any transaction and "
              "complete it in a second short transaction. A transaction held open across work keeps its row "
              "locks and pins the xmin horizon, so vacuum cannot clean the claim index. End the session "
              "(SELECT pg_terminate_backend(pid)) and set idle_in_transaction_session_timeout for that role.")
    idle_count = sum(1 for r in touching if (r["state"] or "").startswith("idle in transaction"))
    summary = (f"{len(touching)} session(s) hold a transaction open on the jobs tables"
               + (f", {idle_count} of them idle in transaction" if idle_count else ""))
    return Outcome(status, summary, evidence, remedy, data)


# ============================================================================================
# Leases
# ============================================================================================


@check("lease-vs-runtime", "The lease is longer than the jobs take (p99 runtime)", "Leases")
def lease_vs_runtime(probe: Probe) -> Outcome:
    lease = float(probe.setting("worker.lease"))
    workers = probe.rows("worker_runtimes", window_s=86400)
    total = [0] * len(histogram.BOUNDS_MS)
    for w in workers:
        for i, n in enumerate(w["runtime_histogram"] or []):
            if i < len(total):
                total[i] += n
    observed = sum(total)
    p99 = histogram.quantile(total, 0.99)
    p50 = histogram.quantile(total, 0.50)
    data = {"lease_s": lease, "p99_s": p99, "p50_s": p50, "observations": observed, "workers": len(workers)}
    if p99 is None:
        return Outcome(OK, "no job runtimes recorded by workers in the last day", [f"configured lease: {lease:g} s"], "", data)
    evidence = [f"configured lease (worker.lease): {lease:g} s",
                f"job runtime over {observed:,} jobs from {len(workers)} worker(s) in the last day: p50 {p50:.2f} s, p99 {p99:.2f} s"]
    remedy = ("Make the lease longer than ordinary job duration (worker.lease, or --lease), keep heartbeats on "
              "for long jobs, or split long jobs into smaller resumable ones. A job that outlives its lease "
              "without a heartbeat is rescued by the reaper and runs twice.")
    if p99 >= lease:
        return Outcome(FAIL, f"p99 job runtime ({p99:.1f} s) is longer than the lease ({lease:g} s)", evidence, remedy, data)
    if p99 >= lease / 2:
        return Outcome(WARN, f"p99 job runtime ({p99:.1f} s) is more than half the lease ({lease:g} s)", evidence, remedy, data)
    return Outcome(OK, f"p99 job runtime {p99:.2f} s against a {lease:g} s lease", evidence, "", data)


def _scheduler_line(probe: Probe, job: str) -> list[str]:
    """What the scheduler says about one of its jobs, when the scheduler's tables exist."""
    if not probe.exists("skiplock.scheduler_jobs"):
        return []
    row = probe.row("scheduler_job", job=job)
    leader = f"scheduler leader {row['live_leader']} is alive" if row.get("live_leader") else "no live scheduler leader"
    if row.get("last_run_age_s") is None:
        return [f"{leader}; the scheduler has not run its {job} job on this database"]
    line = (f"{leader}; scheduler {job} job every {seconds(row['interval_seconds'])}, last run "
            f"{seconds(row['last_run_age_s'])} ago")
    if row.get("last_error"):
        line += f", failed: {row['last_error'][:160]}"
    return [line]


def _maintenance_runs(probe: Probe, task: str) -> dict[str, Any] | None:
    """The last run of a maintenance task, when the maintenance module records runs."""
    if not probe.exists("skiplock.maintenance_runs"):
        return None
    return probe.row("maintenance_last_run", task=task) or None


@check("stuck-leases", "No job runs past its lease; the reaper is rescuing expired ones", "Leases")
def stuck_leases(probe: Probe) -> Outcome:
    grace = probe.setting("advisor.stuck_lease_grace")
    counts = probe.row("running_counts", cap=COUNT_CAP)
    data = {"running": counts["running"], "expired": counts["expired"]}
    last_reap = _maintenance_runs(probe, "reap")
    reap_line = []
    if last_reap:
        data["last_reap"] = last_reap
        reap_line = [f"last reaper run: {seconds(last_reap['age_s'])} ago by {last_reap['actor']}, {last_reap['outcome']}"
                     + (f" ({last_reap['error']})" if last_reap.get("error") else f", {count(last_reap['rows'])} rescued")]
    if counts["expired"]:
        # the scheduler's reaper records its runs in scheduler_jobs; maintenance_runs holds the
        # operator's `skiplock reap` / "reap now"
        reap_line += _scheduler_line(probe, "reap")
    if not counts["expired"]:
        return Outcome(OK, f"no stuck leases ({count(counts['running'], COUNT_CAP)} job(s) running)", reap_line, "", data)
    top = probe.rows("stuck_leases", limit=5)
    oldest = top[0]["overdue_s"] if top else 0
    data["oldest_overdue_s"] = oldest
    evidence = [f"job {r['id']} ({r['kind']} on {r['queue']}), attempt {r['attempts']}, held by {r['locked_by']}: "
                f"lease expired {seconds(r['overdue_s'])} ago, running {seconds(r['running_s'])}" for r in top] + reap_line
    remedy = ("Expired leases mean workers died or stopped heartbeating. The reaper (scheduler, every 30 s, or "
              "`skiplock reap`) returns them to pending or to the dead letters. If leases stay expired, the "
              "scheduler is not running or not the leader: start it, or run `skiplock reap` now.")
    if oldest >= grace:
        return Outcome(FAIL, f"{count(counts['expired'], COUNT_CAP)} job(s) past their lease, the oldest by "
                       f"{seconds(oldest)}: the reaper is not rescuing them", evidence, remedy, data)
    return Outcome(WARN, f"{count(counts['expired'], COUNT_CAP)} job(s) past their lease (the reaper should "
                   f"rescue them within {seconds(grace)})", evidence, remedy, data)


# ============================================================================================
# Retries
# ============================================================================================

HEAD_SCAN = 5000  # rows of the head of the claim index that retry checks look at


@check("retry-caps", "Every job has a real attempt cap", "Retries")
def retry_caps(probe: Probe) -> Outcome:
    warn_at = probe.setting("advisor.max_attempts_warn")
    fail_at = probe.setting("advisor.max_attempts_fail")
    default = probe.setting("queue.max_attempts")
    rows = probe.rows("attempt_caps", scan=HEAD_SCAN, threshold=warn_at)
    data = {"default_max_attempts": default, "kinds": rows}
    evidence = [f"{r['jobs']} job(s) of kind {r['kind']} on queue {r['queue']} allow up to {r['max_attempts']:,} "
                f"attempts (e.g. job {r['example_id']})" for r in rows]
    remedy = ("Cap attempts at a number that matches the backoff (with the default 2 s base and 1 h cap, 25 "
              "attempts span about a day). Without a cap a poisoned job retries forever and never reaches the "
              "dead letters where someone would look at it. Set max_attempts on enqueue, or queue.max_attempts.")
    if default > warn_at:
        evidence.insert(0, f"queue.max_attempts (the default for enqueue) is {default:,}")
    top = max([r["max_attempts"] for r in rows] + [default if default > warn_at else 0])
    if not rows and default <= warn_at:
        return Outcome(OK, f"the next {HEAD_SCAN:,} jobs to run and the running ones all allow {warn_at} attempts or fewer",
                       [f"default max_attempts: {default}"], "", data)
    status = FAIL if top > fail_at else WARN
    return Outcome(status, f"jobs allow up to {top:,} attempts: effectively no retry cap", evidence, remedy, data)


@check("retry-hot-loops", "Retries back off instead of hot-looping", "Retries")
def retry_hot_loops(probe: Probe) -> Outcome:
    gap = probe.setting("advisor.hot_loop_gap")
    rows = probe.rows("hot_loops", scan=500, gap_s=gap, min_quick=2)
    base = probe.setting("queue.backoff_base")
    data = {"jobs": [{k: r[k] for k in ("id", "kind", "queue", "status", "attempts", "quick", "min_gap_s")} for r in rows],
            "backoff_base": base}
    evidence = [f"job {r['id']} ({r['kind']} on {r['queue']}, {r['status']}): {r['quick']} retries less than "
                f"{gap:g} s after the previous attempt (shortest {r['min_gap_s']:.3f} s)" for r in rows]
    if base < 0.5:
        evidence.append(f"queue.backoff_base is {base:g} s")
    remedy = ("Retries must wait: run_at pushed out by exponential backoff with jitter (queue.backoff_base, "
              "queue.backoff_cap). A job retried within milliseconds burns a worker and the database on the same "
              "error, and hides the failure rate. Check the handler or the worker that sets a zero delay.")
    if not rows:
        return Outcome(OK if base >= 0.5 else WARN,
                       "no job among the newest dead letters and next retries retried in a hot loop"
                       if base >= 0.5 else f"backoff base is only {base:g} s", evidence, remedy if base < 0.5 else "", data)
    status = FAIL if len(rows) >= 5 or max(r["quick"] for r in rows) >= 5 else WARN
    return Outcome(status, f"{len(rows)} job(s) retried in a hot loop (attempts less than {gap:g} s apart)",
                   evidence, remedy, data)


@check("dead-letters", "Dead letters are looked at: bounded growth and age", "Retries")
def dead_letters(probe: Probe) -> Outcome:
    age_warn = probe.setting("advisor.dead_letter_age_warn")
    row = probe.row("dead_letters", cap=COUNT_CAP)
    data = dict(row)
    if not row["total"]:
        return Outcome(OK, "no dead letters", [], "", data)
    evidence = [f"{count(row['total'], COUNT_CAP)} dead letter(s); {count(row['last_day'], COUNT_CAP)} in the last day, "
                f"{count(row['last_hour'], COUNT_CAP)} in the last hour",
                f"oldest dead letter failed {seconds(row['oldest_s'])} ago"]
    remedy = ("Group the dead letters by error (the console's dead-letter page), fix the cause, then replay the "
              "group or purge it (audited). A dead-letter set nobody inspects is a quiet data graveyard, and its "
              "rows stay in the hot table.")
    oldest = row["oldest_s"] or 0
    if oldest >= 4 * age_warn or row["total"] >= COUNT_CAP:
        return Outcome(FAIL, f"{count(row['total'], COUNT_CAP)} dead letters, the oldest {seconds(oldest)} old: nobody is looking",
                       evidence, remedy, data)
    if oldest >= age_warn:
        return Outcome(WARN, f"the oldest dead letter is {seconds(oldest)} old ({count(row['total'], COUNT_CAP)} in all)",
                       evidence, remedy, data)
    if row["last_hour"] >= 100:
        return Outcome(WARN, f"dead letters are growing: {count(row['last_hour'], COUNT_CAP)} in the last hour",
                       evidence, remedy, data)
    return Outcome(OK, f"{count(row['total'], COUNT_CAP)} dead letter(s), the oldest {seconds(oldest)} old", evidence, "", data)


# ============================================================================================
# Hot table hygiene
# ============================================================================================


def _archive_age(probe: Probe) -> tuple[float, str]:
    """Age past which a completed job is late: the archival age plus a slack for the archiver's
    schedule (completed rows are fine until archival has had its chance)."""
    slack = probe.setting("advisor.archive_slack")
    value = probe.setting("maintenance.archive_after")
    return value + slack, f"maintenance.archive_after {seconds(value)} + advisor.archive_slack {seconds(slack)}"


def _has_completed_index(probe: Probe) -> bool:
    return any("status = 'completed'" in (i["definition"] or "") and "finished_at" in (i["definition"] or "")
               for i in probe.rows("jobs_indexes"))


@check("completed-rows", "Completed jobs leave the hot table (archival keeps up)", "Hot table hygiene")
def completed_rows(probe: Probe) -> Outcome:
    age, source = _archive_age(probe)
    warn_at = probe.setting("advisor.completed_rows_warn")
    stats = probe.row("jobs_table_stats")
    if _has_completed_index(probe):
        # exact up to the cap, through the archiver's own index
        counted = probe.row("completed_counts", age_s=age, cap=COUNT_CAP)
        old, completed, oldest = counted["old_completed"], counted["completed"], counted["oldest_completed_s"]
        live, exact, percent = stats["n_live_tup"] or 0, True, None
        how = "counted through jobs_completed_idx"
    else:
        # no index on completed rows: estimate from a page sample, never a full scan
        pages = max(int(stats["pages"] or 0), 1)
        percent = min(100.0, 100.0 * probe.setting("advisor.sample_pages") / pages)
        sample = probe.row("completed_sample", age_s=age, percent=percent)
        exact = percent >= 100
        live = sample["sampled"] if exact else max(stats["n_live_tup"] or 0, sample["sampled"])
        scale = live / sample["sampled"] if sample["sampled"] else 0
        old, completed, oldest = sample["old_completed"] * scale, sample["completed"] * scale, sample["oldest_completed_s"]
        how = "counted" if exact else f"estimated from a {percent:.1f}% page sample"
    data = {"late_after_s": age, "age_source": source, "old_completed": round(old), "completed": round(completed),
            "live_rows": live, "exact": exact, "sampled_percent": percent}
    approx = "" if exact else "about "
    evidence = [f"{approx}{count(old, COUNT_CAP)} completed row(s) finished more than {seconds(age)} ago "
                f"({source}), of {approx}{count(completed, COUNT_CAP)} completed rows in skiplock.jobs ({how})"]
    if oldest is not None:
        evidence.append(f"oldest completed row{' in the sample' if not exact else ''} finished {seconds(oldest)} ago")
    last = _maintenance_runs(probe, "archive")
    late = old >= warn_at
    if last:
        data["last_archive"] = last
        evidence.append(f"last archival run: {seconds(last['age_s'])} ago by {last['actor']}, {last['outcome']}"
                        + (f" ({last['error']})" if last.get("error") else f", {count(last['rows'])} rows"))
    elif probe.exists("skiplock.maintenance_runs"):
        evidence.append("archival has never run on this database")
    if late:
        evidence += _scheduler_line(probe, "archive")
    remedy = ("Completed rows that stay in the hot table make every scan, vacuum and index larger. Let the "
              "archiver move them out in bounded batches (the scheduler runs it every few minutes; "
              "`skiplock archive` runs it now); check that the scheduler runs, that the last archival run "
              "ended ok, and that maintenance.archive_after is what you want.")
    if old >= 10 * warn_at or (late and last and last["outcome"] == "error"):
        return Outcome(FAIL, f"{approx}{count(old, COUNT_CAP)} completed rows older than {seconds(age)} are still in the "
                       "hot table: archival is not keeping up", evidence, remedy, data)
    if late:
        return Outcome(WARN, f"{approx}{count(old, COUNT_CAP)} completed rows older than {seconds(age)} are still in the hot table",
                       evidence, remedy, data)
    return Outcome(OK, f"{approx}{count(old, COUNT_CAP)} completed rows past the archival age ({seconds(age)})", evidence, "", data)


@check("autovacuum-settings", "The jobs table's autovacuum settings match its churn", "Hot table hygiene")
def autovacuum_settings(probe: Probe) -> Outcome:
    s = probe.row("jobs_table_stats")
    churn = ((s["n_tup_upd"] or 0) + (s["n_tup_del"] or 0)) / max(s["stats_age_s"] or 1, 1)
    trigger = s["vacuum_trigger"]
    interval = trigger / churn if churn > 0 else None
    data = {k: s[k] for k in ("autovacuum_enabled", "vacuum_threshold", "vacuum_scale_factor", "cost_delay_ms",
                              "vacuum_trigger", "reloptions", "reltuples")}
    data.update(churn_per_s=churn, vacuum_every_s=interval)
    evidence = [
        f"reloptions: {', '.join(s['reloptions']) if s['reloptions'] else 'none (server defaults apply)'}",
        f"vacuum starts at {count(trigger)} dead rows (threshold {s['vacuum_threshold']:g} + scale factor "
        f"{s['vacuum_scale_factor']:g} x {count(s['reltuples'])} rows); cost delay {s['cost_delay_ms']:g} ms",
        f"churn (updates + deletes) since statistics reset: {churn:.1f} rows/s"
        + (f", so a vacuum about every {seconds(interval)}" if interval else ""),
    ]
    remedy = ("Give the jobs table its own settings, as migration 001 does: ALTER TABLE skiplock.jobs SET "
              "(autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000, "
              "autovacuum_vacuum_cost_delay = 0). A scale factor lets the dead rows at the head of the claim "
              "index grow with the backlog; cost-based sleeping lets them pile up during the vacuum.")
    if not s["autovacuum_enabled"]:
        return Outcome(FAIL, "autovacuum is disabled for skiplock.jobs", evidence,
                       "Re-enable it: ALTER TABLE skiplock.jobs RESET (autovacuum_enabled). " + remedy, data)
    problems = []
    if s["vacuum_scale_factor"] > 0.05 and (s["reltuples"] or 0) >= 50_000:
        problems.append(f"the scale factor {s['vacuum_scale_factor']:g} makes vacuum wait for {count(trigger)} dead rows")
    elif trigger > 50_000:
        # what bounds the damage is the number of dead rows a claim may walk, not the time
        problems.append(f"vacuum waits for {count(trigger)} dead rows, which every claim may have to walk past")
    if s["cost_delay_ms"] > 2 and churn >= 100:
        problems.append(f"vacuum sleeps {s['cost_delay_ms']:g} ms per cost unit on a table changing {churn:.0f} rows/s")
    if problems:
        return Outcome(WARN, "; ".join(problems), evidence, remedy, data)
    return Outcome(OK, f"vacuum starts at {count(trigger)} dead rows"
                   + (f", about every {seconds(interval)} at the current churn" if interval else ""), evidence, "", data)


@check("autovacuum-progress", "Autovacuum keeps up with the jobs table", "Hot table hygiene")
def autovacuum_progress(probe: Probe) -> Outcome:
    s = probe.row("jobs_table_stats")
    dead, trigger = s["n_dead_tup"] or 0, s["vacuum_trigger"]
    data = {"dead": dead, "live": s["n_live_tup"], "trigger": trigger, "vacuum_running": s["vacuum_running"],
            "last_vacuum_age_s": s["last_vacuum_age_s"], "autovacuum_count": s["autovacuum_count"]}
    evidence = [f"{count(dead)} dead rows, {count(s['n_live_tup'])} live; autovacuum starts at {count(trigger)}",
                f"last vacuum: {seconds(s['last_vacuum_age_s']) + ' ago' if s['last_vacuum_age_s'] is not None else 'never'}; "
                f"autovacuum runs: {s['autovacuum_count']}; "
                + ("a vacuum is running now" if s["vacuum_running"] else "no vacuum running")]
    remedy = ("If dead rows stay above the threshold while vacuums run, something holds the xmin horizon (see "
              "xmin-horizon). If no vacuum runs, autovacuum workers are busy elsewhere (raise "
              "autovacuum_max_workers) or disabled; run VACUUM (VERBOSE) skiplock.jobs to see what it can remove.")
    if dead <= trigger:
        return Outcome(OK, f"{count(dead)} dead rows, below the autovacuum trigger ({count(trigger)})", evidence, "", data)
    if dead >= 10 * trigger and dead >= 10_000:
        return Outcome(FAIL, f"{count(dead)} dead rows, {dead / max(trigger, 1):.0f}x the autovacuum trigger",
                       evidence, remedy, data)
    if s["vacuum_running"]:
        return Outcome(OK, f"{count(dead)} dead rows above the trigger and a vacuum is running", evidence, "", data)
    return Outcome(WARN, f"{count(dead)} dead rows above the autovacuum trigger ({count(trigger)}) and no vacuum running",
                   evidence, remedy, data)


@check("xmin-horizon", "Vacuum is not blocked by the xmin horizon", "Hot table hygiene")
def xmin_horizon(probe: Probe) -> Outcome:
    warn_at = probe.setting("advisor.xmin_horizon_warn")
    fail_at = probe.setting("advisor.xmin_horizon_fail")
    holders = probe.rows("xmin_holders")
    stats = probe.row("jobs_table_stats")
    data = {"holders": holders[:5], "dead": stats["n_dead_tup"]}
    if not holders:
        return Outcome(OK, "nothing holds back the xmin horizon", [], "", data)
    oldest = max((h["age_s"] or 0) for h in holders)
    evidence = [f"{h['kind']} {h['id']} {h['who']}: held {seconds(h['age_s']) if h['age_s'] is not None else '(age unknown)'}, "
                f"{h['xid_age']:,} transactions behind; {' '.join((h['detail'] or '').split())[:160]}" for h in holders[:5]]
    evidence.append(f"skiplock.jobs has {count(stats['n_dead_tup'])} dead rows vacuum cannot remove while the horizon stands")
    remedy = ("Vacuum can only remove row versions older than the oldest snapshot still open. End the session "
              "(pg_terminate_backend), drop or advance the slot, COMMIT/ROLLBACK PREPARED the prepared "
              "transaction, or set idle_in_transaction_session_timeout. Until then every claim walks more dead "
              "index entries.")
    data["oldest_s"] = oldest
    # slots and standby feedback carry no time; judge them by XID age (a million transactions
    # is a lot of churn)
    stuck = [h for h in holders if h["age_s"] is None and h["xid_age"] >= 1_000_000]
    if oldest >= fail_at:
        return Outcome(FAIL, f"the xmin horizon has been held for {seconds(oldest)}", evidence, remedy, data)
    if oldest >= warn_at or stuck:
        return Outcome(WARN, f"the xmin horizon has been held for {seconds(oldest)}" if oldest >= warn_at
                       else f"a {stuck[0]['kind']} holds the xmin horizon back", evidence, remedy, data)
    # all of them (up to five), not only the first: the oldest by XID is often a standby's
    # feedback a few transactions behind, and the session that matters comes second
    return Outcome(OK, f"the oldest snapshot is {seconds(oldest)} old", evidence[:-1], "", data)


# ============================================================================================
# MultiXact risk
# ============================================================================================


@check("fk-into-jobs", "No foreign key points into the jobs table", "MultiXact risk")
def fk_into_jobs(probe: Probe) -> Outcome:
    fks = probe.rows("fk_into_jobs")
    data = {"foreign_keys": fks}
    if not fks:
        return Outcome(OK, "no foreign key references the jobs tables", [], "", data)
    lockers = [r for r in probe.rows("row_lockers") if (r["xact_s"] or 0) >= 1]
    data["share_lockers"] = [r["pid"] for r in lockers]
    evidence = [f"{f['constraint_name']} on {f['child_table']}: {f['definition']} ({count(f['child_writes'])} writes to the child table)"
                for f in fks]
    evidence += [f"holding row locks on skiplock.jobs for {seconds(r['xact_s'])}: {session(r)}" for r in lockers]
    remedy = ("Every insert or key update in the child table takes FOR KEY SHARE on the referenced job row; "
              "when a second transaction locks the same row (a claim, a completion, another child insert) "
              "PostgreSQL creates a MultiXact, and the claim scan must resolve it through the MultiXact SLRU. "
              "Reference jobs by id without a constraint (or reference a stable business table instead), "
              "and check integrity in the application or with a periodic query.")
    names = ", ".join(f["constraint_name"] for f in fks)
    if lockers:
        return Outcome(FAIL, f"foreign key(s) into the jobs table ({names}) and {len(lockers)} session(s) holding row "
                       "locks on job rows: MultiXacts are being created on the hot table", evidence, remedy, data)
    return Outcome(WARN, f"{len(fks)} foreign key(s) point into the jobs table: {names}", evidence, remedy, data)


@check("savepoints", "No savepoints around claims (subtransactions)", "MultiXact risk")
def savepoints(probe: Probe) -> Outcome:
    state = probe.row("multixact_state")
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    sp = probe.row("savepoint_statements")
    claims = probe.row("claim_statements")
    data = {**sp, "claim_calls": claims["calls"], "subtrans_waiters": state["subtrans_waiters"]}
    evidence = [f"SAVEPOINT statements: {count(sp['savepoints'])}, RELEASE: {count(sp['releases'])}, "
                f"ROLLBACK TO: {count(sp['rollbacks_to'])}; claim calls: {count(claims['calls'])}"]
    if sp["track_utility"] == "off":
        evidence.append("pg_stat_statements.track_utility is off: savepoints are not counted")
    if state["subtrans_waiters"]:
        evidence.append(f"{state['subtrans_waiters']} session(s) waiting on the subtransaction SLRU now")
    remedy = ("A claim (SELECT ... FOR UPDATE) followed by an UPDATE inside a savepoint turns each row lock into "
              "a MultiXact. ORMs add savepoints for nested transaction blocks (Django atomic(), SQLAlchemy "
              "begin_nested(), JDBC autosave), and so do PL/pgSQL EXCEPTION blocks. Claim in a single "
              "statement on an autocommit connection, as Skiplock's worker does.")
    if state["subtrans_waiters"]:
        return Outcome(FAIL, "sessions are waiting on the subtransaction SLRU (subtransaction overflow)", evidence, remedy, data)
    if sp["savepoints"] and claims["calls"] and sp["savepoints"] >= 0.1 * claims["calls"]:
        return Outcome(WARN, f"{count(sp['savepoints'])} savepoints beside {count(claims['calls'])} claims in this database",
                       evidence, remedy, data)
    return Outcome(OK, "no savepoints at the scale of the claims" if sp["savepoints"] else "no savepoints in this database",
                   evidence, "", data)


@check("multixact", "MultiXact consumption, member space and SLRU waits", "MultiXact risk")
def multixact(probe: Probe) -> Outcome:
    state = probe.row("multixact_state")
    table = probe.row("jobs_table_stats")
    slru = {r["name"].lower(): r for r in probe.rows("slru_stats")}
    members = slru.get("multixactmember") or slru.get("multixact_member") or {}
    previous = probe.recall("multixact")
    reading = {"next_mxid": state["next_mxid"], "member_pages_zeroed": members.get("blks_zeroed")}
    probe.remember("multixact", reading)
    rate = None
    consumed = None
    if previous and previous["age_s"] and previous["data"].get("next_mxid") is not None:
        consumed = state["next_mxid"] - previous["data"]["next_mxid"]
        if consumed >= 0:
            rate = consumed / max(previous["age_s"], 0.001)
    offsets = probe.row("multixact_offsets") if probe.can_read_control_data else None
    member_share = None
    if offsets and offsets.get("next_multi_offset") is not None:
        member_share = offsets["next_multi_offset"] / 2**32  # an upper bound: truncation is not exposed
    freeze = state["mxid_freeze_max_age"]
    data = {"next_mxid": state["next_mxid"], "consumed_since_last_check": consumed, "per_second": rate,
            "jobs_mxid_age": table["mxid_age"], "oldest_db_mxid_age": state["oldest_db_mxid_age"],
            "freeze_max_age": freeze, "member_space_upper_bound": member_share,
            "waiters": state["multixact_waiters"], "slru_io_waiters": state["slru_io_waiters"]}
    evidence = [
        f"MultiXacts created so far on this server: {count(state['next_mxid'])}"
        + (f"; {count(consumed)} since the last check ({rate:.2f}/s)" if rate is not None else "; rate known from the next check on"),
        f"MultiXact age: skiplock.jobs {count(table['mxid_age'])}, oldest database {count(state['oldest_db_mxid_age'])} "
        f"(autovacuum_multixact_freeze_max_age {count(freeze)})",
    ]
    if member_share is not None:
        evidence.append(f"member space used: at most {member_share:.1%} (next member offset at the last checkpoint)")
    if members:
        evidence.append(f"MultiXact member SLRU: {count(members.get('blks_read'))} blocks read, {count(members.get('blks_hit'))} hits")
    if state["multixact_waiters"] or state["slru_io_waiters"]:
        evidence.append(f"sessions waiting now: {state['multixact_waiters']} on MultiXact locks, {state['slru_io_waiters']} on SLRU I/O")
    remedy = ("MultiXacts come from several transactions locking one row: foreign keys into jobs, savepoints "
              "around claims, FOR SHARE readers. Remove the cause (see fk-into-jobs and savepoints). Member "
              "space is a separate 4-billion limit that can run out while the MultiXact age looks healthy; "
              "vacuum (freezing) reclaims both.")
    oldest = state["oldest_db_mxid_age"] or 0
    if oldest >= 1_000_000_000 or (member_share is not None and member_share >= 0.5):
        return Outcome(FAIL, "MultiXact wraparound or member-space exhaustion is approaching", evidence, remedy, data)
    if state["multixact_waiters"] >= 3:
        return Outcome(FAIL, f"{state['multixact_waiters']} sessions waiting on MultiXact SLRU locks", evidence, remedy, data)
    if state["multixact_waiters"] or oldest >= 1.5 * freeze or (member_share is not None and member_share >= 0.25):
        return Outcome(WARN, "MultiXact pressure: waits on the SLRU or freezing behind", evidence, remedy, data)
    if rate is not None and rate >= 100:
        return Outcome(WARN, f"{rate:.0f} MultiXacts/s are being created", evidence, remedy, data)
    return Outcome(OK, "no MultiXact pressure"
                   + (f" ({count(consumed)} created since the last check)" if consumed else ""), evidence, "", data)


# ============================================================================================
# Server
# ============================================================================================


@check("notify-queue", "The NOTIFY queue is not filling up", "Server")
def notify_queue(probe: Probe) -> Outcome:
    usage = probe.row("notify_usage")["usage"] or 0.0
    data = {"usage": usage}
    evidence = [f"NOTIFY queue {usage:.2%} full"]
    remedy = ("The queue fills when a listening session stops reading (a stuck LISTEN connection, or one inside a "
              "long transaction). When it is full, every NOTIFY (every enqueue) fails. Find the listener that "
              "does not consume (pg_stat_activity, query LISTEN) and restart it.")
    if usage >= 0.5:
        return Outcome(FAIL, f"the NOTIFY queue is {usage:.0%} full", evidence, remedy, data)
    if usage >= 0.1:
        return Outcome(WARN, f"the NOTIFY queue is {usage:.0%} full", evidence, remedy, data)
    return Outcome(OK, f"NOTIFY queue {usage:.1%} used", evidence, "", data)


@check("connections", "Connections stay below max_connections", "Server")
def connections(probe: Probe) -> Outcome:
    row = probe.row("connections")
    limit = max(row["max_connections"] - row["reserved"], 1)
    share = row["clients"] / limit
    data = {"clients": row["clients"], "limit": limit, "share": share, "top_applications": row["top_applications"]}
    evidence = [f"{row['clients']} client connections of {limit} available (max_connections {row['max_connections']}, "
                f"{row['reserved']} reserved)",
                "largest: " + ", ".join(f"{a['application']} {a['sessions']}" for a in row["top_applications"])]
    remedy = ("Each worker process holds a few connections (claims, heartbeats, LISTEN). Put a pooler in front "
              "of the application, lower worker concurrency, or raise max_connections with the memory to match.")
    if share >= 0.95:
        return Outcome(FAIL, f"{share:.0%} of the connection slots are in use", evidence, remedy, data)
    if share >= 0.8:
        return Outcome(WARN, f"{share:.0%} of the connection slots are in use", evidence, remedy, data)
    return Outcome(OK, f"{row['clients']} of {limit} connection slots in use", evidence, "", data)


@check("wal-replicas", "WAL rate and replica lag", "Server")
def wal_replicas(probe: Probe) -> Outcome:
    position = probe.row("wal_position")
    previous = probe.recall("wal")
    probe.remember("wal", {"wal_bytes": position["wal_bytes"]})
    rate = None
    if previous and previous["age_s"] and previous["data"].get("wal_bytes") is not None:
        delta = position["wal_bytes"] - previous["data"]["wal_bytes"]
        if delta >= 0:
            rate = delta / max(previous["age_s"], 0.001)
    replicas = probe.rows("replication")
    data = {"wal_bytes_per_second": rate, "in_recovery": position["in_recovery"], "replication": replicas}
    evidence = [f"WAL written: {size(rate)}/s since the last check" if rate is not None
                else "WAL rate known from the next check on"]
    if position["in_recovery"]:
        evidence.append(f"this server is a standby; last replayed transaction {seconds(position['replay_delay_s'])} ago")
    status = OK
    problems = []
    for r in replicas:
        if r["kind"] == "standby":
            evidence.append(f"standby {r['name']} ({r['detail']}): replay lag {seconds(r['lag_s']) if r['lag_s'] is not None else '0 s'}, "
                            f"{size(r['lag_bytes'])} behind")
            lag = r["lag_s"] or 0
            if lag >= 300:
                status, _ = worst(status, FAIL), problems.append(f"standby {r['name']} is {seconds(lag)} behind")
            elif lag >= 30:
                status, _ = worst(status, WARN), problems.append(f"standby {r['name']} is {seconds(lag)} behind")
        else:
            evidence.append(f"slot {r['name']} ({r['detail']}): retains {size(r['lag_bytes'])} of WAL")
            retained = r["lag_bytes"] or 0
            if r["detail"] == "active=false" and retained >= 1024**3:
                status = worst(status, WARN)
                problems.append(f"inactive slot {r['name']} retains {size(retained)}")
    remedy = ("Queue churn is WAL: every claim, completion and archival writes it, and standbys must replay "
              "it. Lag that grows with the queue's rate is a migration signal; drop slots nobody uses.")
    if problems:
        return Outcome(status, "; ".join(problems), evidence, remedy, data)
    return Outcome(OK, "no lagging standby" + (f"; WAL {size(rate)}/s" if rate is not None else ""), evidence, "", data)
