"""The checks that apply to any table-as-queue, run against one [[external_queues]] source:
the claim skips locked rows (pg_stat_statements), a partial index serves the claim, no long
transaction holds the queue table, completed rows leave it, no foreign key points at it,
autovacuum keeps up with it; and its queues are within the alert rules in force (queue age,
stuck work, dead-letter growth), judged per queue with its `system` and `external` labels on
the collectors' newest samples, as Skiplock's own queues are (`ext-queue-signals`).

`run_external(conn, adapter, config)` -> `Report` (the same results as the checklist's, area
"External queue NAME (system)", each result carrying `system` and `external`); `conn` is a
connection to the source's database. `run_sources(conn, config)` runs them for every entry, as
the advisor page's stored run does: a source that cannot be reached or read as declared gets
each check "not available" with its error. Every check only reads (catalogs, statistics,
EXPLAIN without ANALYZE); docs/external-queues.md#advisor explains them. `skiplock check
--external NAME` and the advisor page are the faces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from console.advisor.base import (
    COUNT_CAP,
    FAIL,
    OK,
    UNKNOWN,
    WARN,
    Check,
    CheckResult,
    Outcome,
    Probe,
    Report,
    count,
    seconds,
)
from console.config import Config
from console.external import Adapter
from console.sqlfiles import query

DOCS = "docs/external-queues.md"


@dataclass(frozen=True)
class ExternalCheck(Check):
    @property
    def docs(self) -> str:
        return f"{DOCS}#{self.id}"


def _rows(probe: Probe, name: str, **params: Any) -> list[dict[str, Any]]:
    probe.cur.execute(query("external", name), params)
    return probe.cur.fetchall()


def _qualified(adapter: Adapter) -> str:
    schema, table = adapter.queue_table
    return f'"{schema}"."{table}"'


def claim_skip_locked(probe: Probe, adapter: Adapter) -> Outcome:
    _, table = adapter.queue_table
    if adapter.claim_function is not None:
        # Its claim is a function (Procrastinate's fetch, pgmq's read): read the function's own
        # body, which pg_stat_statements does not show.
        schema, pattern = adapter.claim_function
        bodies = [b for b in _rows(probe, "function_source", schema=schema, pattern=pattern)
                  if "for update" in b["source"].lower()]
        if not bodies:
            return Outcome(UNKNOWN, f"not available: no claim function {pattern} in the schema {schema}")
        lacking = [b["name"] for b in bodies if "skip locked" not in b["source"].lower()]
        evidence = [f"function {b['name']}: {'SKIP LOCKED' if b['name'] not in lacking else 'no SKIP LOCKED'}" for b in bodies]
        if lacking:
            return Outcome(FAIL, f"the claim function(s) {', '.join(lacking)} lock rows without SKIP LOCKED", evidence)
        return Outcome(OK, f"{adapter.system}'s claim function skips locked rows", evidence)
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    found = _rows(probe, "advisor_claim_statements", claim_pattern=adapter.claim_pattern, table=table)
    data = {"statements": [{k: r[k] for k in ("queryid", "query", "calls", "skips_locked")} for r in found]}
    evidence = [f"queryid {r['queryid']}: {count(r['calls'])} calls, {'skips locked rows' if r['skips_locked'] else 'NO SKIP LOCKED'}: "
                f"{r['query'][:160]}" for r in found]
    if not found:
        return Outcome(UNKNOWN, f"no claim of {table} in pg_stat_statements yet (pattern {adapter.claim_pattern or 'none'}; "
                       "any SELECT ... FOR UPDATE ... LIMIT naming the table)", [],
                       "Let the workers run, or set claim_query_like on the entry to the claim's text.", data)
    lacking = [r for r in found if not r["skips_locked"]]
    if lacking:
        return Outcome(FAIL, f"{len(lacking)} claim statement(s) on {table} lock rows FOR UPDATE without SKIP LOCKED: "
                       "workers queue behind each other's rows (a convoy)", evidence,
                       "Claim with SELECT ... FOR UPDATE SKIP LOCKED LIMIT n, so a worker passes over rows another "
                       "worker holds instead of waiting for them.", data)
    return Outcome(OK, f"{len(found)} claim statement(s) on {table} skip locked rows", evidence, "", data)


def _plan_indexes(node: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(node["Node Type"], node["Index Name"])] if node.get("Index Name") else []
    for child in node.get("Plans", []):
        out += _plan_indexes(child)
    return out


def partial_index(probe: Probe, adapter: Adapter) -> Outcome:
    indexes = _rows(probe, "advisor_indexes", qualified=_qualified(adapter))
    partial = {i["index"] for i in indexes if i["is_partial"]}
    statement = sql.SQL(query("external", "advisor_claim_plan")).format(table=adapter.table_ident(),
                                                                       pending=adapter.shape().pending)
    # With sequential and bitmap scans priced out, the plan shows whether an index can serve
    # the pending predicate at all.
    for setting in ("enable_seqscan", "enable_bitmapscan"):
        probe.cur.execute("SELECT set_config(%s, 'off', true)", (setting,))
    probe.cur.execute(statement, {"stuck_after": adapter.entry.stuck_after})
    row = probe.cur.fetchone()
    plan = (row["QUERY PLAN"] if isinstance(row, dict) else row[0])[0]["Plan"]
    used = _plan_indexes(plan)
    evidence = [f"index {i['index']}: {i['definition']}" for i in indexes] or ["the queue table has no index"]
    evidence.insert(0, "plan for the pending rows: " + (", ".join(f"{t} using {n}" for t, n in used) or "Seq Scan"))
    data = {"indexes": [i["index"] for i in indexes], "partial": sorted(partial), "plan_indexes": [n for _, n in used]}
    remedy = ("Index the pending rows only, in claim order: CREATE INDEX CONCURRENTLY ... ON <table> (<claim order>) "
              "WHERE <pending predicate>. The claim then walks a small index that finished rows never enter.")
    if any(name in partial for _, name in used):
        return Outcome(OK, f"a partial index ({', '.join(n for _, n in used if n in partial)}) serves the pending rows",
                       evidence, "", data)
    if used:
        return Outcome(WARN, "the pending rows are found through an index that also holds finished rows", evidence, remedy, data)
    return Outcome(FAIL, "no index serves the pending rows: every claim scans the table", evidence, remedy, data)


def long_transactions(probe: Probe, adapter: Adapter) -> Outcome:
    rows = _rows(probe, "advisor_table_transactions", qualified=_qualified(adapter))
    warn_s, fail_s = probe.setting("advisor.transaction_age_warn"), probe.setting("advisor.transaction_age_fail")
    idle_warn, idle_fail = probe.setting("advisor.idle_in_transaction_warn"), probe.setting("advisor.idle_in_transaction_fail")

    def level(r: dict[str, Any]) -> str:
        idle = (r["state"] or "").startswith("idle in transaction")
        if r["xact_age_s"] >= fail_s or (idle and r["state_age_s"] >= idle_fail):
            return FAIL
        if r["xact_age_s"] >= warn_s or (idle and r["state_age_s"] >= idle_warn):
            return WARN
        return OK

    levels = [level(r) for r in rows]
    evidence = [f"pid {r['pid']} ({r['application_name'] or r['usename']}, {r['state']}): transaction open "
                f"{seconds(r['xact_age_s'])}: {r['query'] or ''}" for r, lv in zip(rows, levels, strict=True) if lv != OK]
    data = {"sessions": [{k: r[k] for k in ("pid", "state", "xact_age_s")} for r in rows]}
    remedy = ("A transaction holding the queue table keeps the xmin horizon back, so vacuum cannot remove the rows "
              "finished jobs leave behind, and the claim walks ever more dead entries. End it; keep job work outside "
              "the claiming transaction.")
    worst = FAIL if FAIL in levels else WARN if WARN in levels else OK
    if worst == OK:
        return Outcome(OK, f"no long transaction holds the queue table ({len(rows)} open now, all short)", [], "", data)
    return Outcome(worst, f"{sum(lv != OK for lv in levels)} long transaction(s) hold the queue table", evidence, remedy, data)


def completed_rows(probe: Probe, adapter: Adapter) -> Outcome:
    """Finished rows the library (or the team's code) leaves in the queue table. Counted exactly
    when the planner puts the whole table under COUNT_CAP rows, else the planner's estimate of
    the `completed` predicate: never a scan of a large table."""
    predicate = adapter.completed
    if predicate is None:
        if adapter.system == "table":
            return Outcome(UNKNOWN, "not available: the entry has no `completed` predicate, so finished rows cannot be "
                           "told apart", [], "Add completed = \"<predicate of finished rows>\" to the entry (leave it "
                           "out only if finished rows are deleted).")
        return Outcome(OK, adapter.completed_note, [], "", {"completed": 0, "kept_by_library": False})
    from console.external import estimate_rows

    warn_at = probe.setting("advisor.completed_rows_warn")
    total = estimate_rows(probe.cur, adapter, sql.SQL("true"))
    if total <= COUNT_CAP:
        probe.cur.execute(sql.SQL(query("external", "count_capped")).format(table=adapter.table_ident(), predicate=predicate),
                          {"cap": COUNT_CAP, "stuck_after": adapter.entry.stuck_after})
        completed, how = probe.cur.fetchone()["n"], "counted"
    else:
        completed, how = estimate_rows(probe.cur, adapter, predicate), "the planner's estimate"
    schema, table = adapter.queue_table
    approx = "" if how == "counted" else "about "
    evidence = [f"{approx}{count(completed, COUNT_CAP)} finished row(s) in {schema}.{table} ({how}; "
                f"the table holds about {count(total)} rows); the advisor warns at {count(warn_at)}"]
    data = {"completed": round(completed), "table_rows_estimate": round(total), "exact": how == "counted",
            "warn_at": warn_at}
    how_to = adapter.completed_note or ("Delete or archive them in bounded batches from a scheduled job "
                                        "(a thousand rows per statement, by id).")
    remedy = f"Finished rows in the hot table make every claim scan, vacuum and index larger. {how_to}"
    if completed >= 10 * warn_at:
        return Outcome(FAIL, f"{approx}{count(completed, COUNT_CAP)} finished rows stay in the queue table", evidence, remedy, data)
    if completed >= warn_at:
        return Outcome(WARN, f"{approx}{count(completed, COUNT_CAP)} finished rows stay in the queue table", evidence, remedy, data)
    return Outcome(OK, f"{approx}{count(completed, COUNT_CAP)} finished rows in the queue table", evidence, "", data)


def foreign_keys(probe: Probe, adapter: Adapter) -> Outcome:
    rows = _rows(probe, "advisor_foreign_keys", qualified=_qualified(adapter))
    evidence = [f"{r['referencing']}.{r['name']}: {r['definition']}" for r in rows]
    if not rows:
        return Outcome(OK, "no foreign key points at the queue table", [], "", {"foreign_keys": []})
    return Outcome(WARN, f"{len(rows)} foreign key(s) point at the queue table", evidence,
                   "Every delete or key update of a job row checks (and locks) the referencing rows, and a "
                   "cascade turns one completed job into many writes. Reference jobs by id without a constraint, "
                   "or keep the referencing data in the job row.", {"foreign_keys": [r["name"] for r in rows]})


def autovacuum(probe: Probe, adapter: Adapter) -> Outcome:
    relid = _rows(probe, "advisor_relid", qualified=_qualified(adapter))[0]["relid"]
    probe.cur.execute(query("collectors_tables", "table_stats"), {"relids": [relid]})
    stats = probe.cur.fetchone()
    if stats is None:
        return Outcome(UNKNOWN, "not available: no statistics for the queue table yet")
    dead, threshold = stats["n_dead_tup"], stats["vacuum_threshold"]
    evidence = [f"{count(dead)} dead rows, {count(stats['n_live_tup'])} live; autovacuum starts at {count(threshold)}",
                f"last (auto)vacuum {seconds(stats['vacuum_age_s'])} ago" if stats["vacuum_age_s"] is not None
                else "never vacuumed since the statistics were reset"]
    data = {k: stats[k] for k in ("n_dead_tup", "n_live_tup", "vacuum_threshold", "autovacuum_enabled")}
    remedy = ("Give the queue table its own autovacuum settings: ALTER TABLE <table> SET (autovacuum_vacuum_scale_factor = 0, "
              "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0); then look for what holds the "
              "xmin horizon if dead rows still pile up.")
    if not stats["autovacuum_enabled"]:
        return Outcome(FAIL, "autovacuum is disabled on the queue table", evidence, remedy, data)
    if dead > 10 * max(threshold, 1000):
        return Outcome(FAIL, f"dead rows ({count(dead)}) are ten times past the autovacuum threshold", evidence, remedy, data)
    if dead > threshold:
        return Outcome(WARN, f"dead rows ({count(dead)}) are past the autovacuum threshold ({count(threshold)})",
                       evidence, remedy, data)
    return Outcome(OK, f"autovacuum keeps up ({count(dead)} dead rows, threshold {count(threshold)})", evidence, "", data)


CHECKS: tuple[tuple[str, str, Callable[[Probe, Adapter], Outcome]], ...] = (
    ("ext-claim-skip-locked", "The claim skips locked rows", claim_skip_locked),
    ("ext-partial-index", "A partial index serves the claim", partial_index),
    ("ext-long-transactions", "No long transaction holds the queue table", long_transactions),
    ("ext-completed-rows", "Completed rows leave the queue table", completed_rows),
    ("ext-foreign-keys", "No foreign keys point at the queue table", foreign_keys),
    ("ext-autovacuum", "Autovacuum keeps up with the queue table", autovacuum),
)
SIGNALS_CHECK = ("ext-queue-signals", "Its queues are within the alert rules (age, stuck work, dead letters)")


# The rules an on-call engineer is paged by for a queue, and the figure of each in the samples.
SIGNALS = (("queue_age_seconds", "oldest eligible job waited"), ("stuck_leases", "stuck running jobs"),
           ("dead_letter_growth", "dead letters per hour"))


def queue_signals(probe: Probe, adapter: Adapter) -> Outcome:
    """The source's queues judged by the alert rules in force on its newest samples (the
    collectors' figures, labelled system and external): FAIL where a critical rule's condition
    holds, WARN where a warning rule's does. `probe` reads the console's database."""
    from datetime import timedelta

    from console import samples
    from console.alerts.rules import load

    rules = [r for r in load(probe.cur.connection, probe.config).rules.values() if r.enabled]
    found = [s for s in samples.latest(probe.cur.connection, within=timedelta(minutes=15))
             if s.labels.get("external") == adapter.name and s.metric in dict(SIGNALS) and "queue" in s.labels]
    if not found:
        return Outcome(UNKNOWN, "not available: no samples of this source in the last 15 minutes (is the scheduler "
                       "collecting it?)")
    breaches: list[tuple[str, str]] = []
    evidence: list[str] = []
    for s in sorted(found, key=lambda s: (s.labels["queue"], s.metric)):
        for rule in rules:
            if rule.metric != s.metric or not rule.matches(s.labels) or s.value is None or not rule.condition(s.value):
                continue
            level = FAIL if rule.severity == "critical" else WARN
            breaches.append((level, rule.name))
            evidence.append(f"queue {s.labels['queue']}: {dict(SIGNALS)[s.metric]} {s.value:.4g} "
                            f"({rule.name}: {rule.describe()}, {rule.severity})")
    data = {"queues": sorted({s.labels["queue"] for s in found}),
            "breaches": [{"rule": r, "status": lv} for lv, r in breaches]}
    if not breaches:
        return Outcome(OK, f"{len(data['queues'])} queue(s) within the alert rules (queue age, stuck work, dead-letter "
                       "growth)", [f"queues: {', '.join(data['queues'])}"], "", data)
    status = FAIL if any(lv == FAIL for lv, _ in breaches) else WARN
    return Outcome(status, f"{len(breaches)} alert condition(s) hold on this source's queues", evidence,
                   f"Open /external/{adapter.name} (the queue's own page) for its dead letters and figures, and act "
                   "through its library (or the console, where the entry says actions = true).", data)


def run_external(conn: psycopg.Connection, adapter: Adapter, config: Config, *, timeout_ms: int | None = None,
                 console: psycopg.Connection | None = None) -> Report:
    """The checks of one source; `console` is the console's database (the samples), `conn` by default."""
    from console.advisor.checks import run_one

    area = f"External queue {adapter.name} ({adapter.system})"
    timeout_ms = timeout_ms or config.database.statement_timeout_ms
    results = [run_one(conn, ExternalCheck(cid, title, area, lambda probe, fn=fn: fn(probe, adapter), adapter.system,
                                           adapter.name), config, timeout_ms)
               for cid, title, fn in CHECKS]
    results.append(run_one(console or conn, ExternalCheck(SIGNALS_CHECK[0], SIGNALS_CHECK[1], area,
                                                          lambda probe: queue_signals(probe, adapter), adapter.system,
                                                          adapter.name), config, timeout_ms))
    return Report(results, database=conn.info.dbname, server_version=conn.info.server_version)


def _not_available(adapter: Adapter, error: str) -> list[CheckResult]:
    area = f"External queue {adapter.name} ({adapter.system})"
    return [CheckResult(cid, title, area, UNKNOWN, f"not available: {error}", [], "", f"{DOCS}#{cid}", {}, 0.0,
                        adapter.system, adapter.name) for cid, title, _ in (*CHECKS, (*SIGNALS_CHECK, None))]


def run_sources(conn: psycopg.Connection, config: Config, *, timeout_ms: int | None = None) -> list[CheckResult]:
    """The checks of every [[external_queues]] source, in the config file's order. `conn` is the
    console's database (autocommit); an entry with its own `dsn` gets a connection of its own for
    the run, opened with a connect timeout of the statement timeout."""
    from console.config import ConfigError, external_queues
    from console.db import DatabaseError, connect
    from console.external import adapter_for, validate

    timeout_ms = timeout_ms or config.database.statement_timeout_ms
    out: list[CheckResult] = []
    for entry in external_queues(config):
        adapter = adapter_for(entry)
        try:
            own = connect(entry.dsn, application_name="skiplock-advisor",
                          connect_timeout=max(1, round(timeout_ms / 1000))) if entry.dsn else None
        except DatabaseError as exc:
            out += _not_available(adapter, str(exc))
            continue
        try:
            source = own or conn
            validate(source, adapter, timeout_ms)
            out += run_external(source, adapter, config, timeout_ms=timeout_ms, console=conn).results
        except (ConfigError, psycopg.Error) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            out += _not_available(adapter, first.removeprefix(f"{entry.where}: "))
        finally:
            if own is not None:
                own.close()
    return out
