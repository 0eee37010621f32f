"""The advisor judges with enough evidence, live: claim-buffers fails only against a baseline of
several measurements of claims that found work, and when claims get dearer because of a known
cause present now (a horizon holder, a paused queue's backlog, an operator's change) it names
that cause and its fix, in the same words as the check that owns the cause."""

from __future__ import annotations

import ast
import time
from pathlib import Path

from console import audit
from console import queue as q
from console.advisor import run_checks
from console.advisor.causes import LOAD_CHANGES, NO_LOAD_CHANGES
from console.advisor.checks import FAIL, OK, WARN
from console.config import load_config
from console.db import connect
from console.maintenance import actions

ROOT = Path(__file__).resolve().parent.parent


def cfg(**advisor):
    return load_config(env={}, overrides={f"advisor.{k}": v for k, v in {"claim_min_calls": 20, **advisor}.items()})


def result(conn, check_id, config):
    return run_checks(conn, config, only=[check_id]).by_id(check_id)


def evidence(res) -> str:
    return "\n".join([res.summary, *res.evidence])


def claims(conn, n, queue=None):
    for _ in range(n):
        for job in q.claim(conn, "w1", limit=1, queues=[queue] if queue else None):
            q.complete(conn, job)


def measure(conn, config, times, queue=None):
    """`times` claim-buffers measurements of 20 claims each; the last result."""
    res = None
    for _ in range(times):
        claims(conn, 20, queue)
        res = result(conn, "claim-buffers", config)
    return res


def dead_entries_at_the_head(conn, n=10_000):
    """n jobs enter the claim index ahead of everything and leave it unclaimed: dead entries
    every claim walks past until vacuum removes them."""
    conn.execute("INSERT INTO skiplock.jobs (kind, priority) SELECT 'bulk', 5 FROM generate_series(1, %s)", (n,))
    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() WHERE kind = 'bulk'")


def snapshot_holder(dsn, app):
    """A session idle in a REPEATABLE READ transaction: its snapshot holds the xmin horizon."""
    holder = connect(dsn, application_name=app, autocommit=False)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM skiplock.queues")
    return holder


def test_a_baseline_taken_while_the_queue_was_empty_does_not_count(conn, dsn):
    """The demo's case: the first measurements came from claims of an empty table (two or three
    index pages each). Against them any working queue looks 20x dearer; they must not count."""
    config = cfg()
    empty = measure(conn, config, 5)  # 100 claims, none of which found a job
    assert empty.status == OK and empty.data["baseline"] is None, empty.data
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    holder = snapshot_holder(dsn, "long-report")  # seconds old: not named as a cause
    try:
        dead_entries_at_the_head(conn)
        loaded = measure(conn, config, 1)
    finally:
        holder.rollback()
        holder.close()
    assert loaded.status == OK, (loaded.summary, loaded.data)
    assert loaded.data["current"] > 50  # dear indeed: 20x what the empty queue's claims read
    assert "no baseline yet (0 of 5 measurements that claimed rows)" in loaded.summary
    assert "an empty queue's claims do not count" in evidence(loaded)


def test_a_baseline_of_too_few_measurements_cannot_fail(conn, dsn):
    config = cfg()
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    measure(conn, config, 1)  # one measurement in the baseline when the next is judged
    holder = snapshot_holder(dsn, "long-report")
    try:
        dead_entries_at_the_head(conn)
        slow = measure(conn, config, 1)
    finally:
        holder.rollback()
        holder.close()
    assert slow.data["ratio"] >= 20 and slow.data["current"] - slow.data["baseline"] >= 100, slow.data  # a failure's figures
    assert slow.status == WARN, (slow.summary, slow.data)
    assert "the baseline rests on 1 of the 5 measurements needed to call it a failure: not enough evidence yet" in slow.summary


def test_claims_climbing_behind_an_idle_holder_name_it_in_every_check_that_sees_it(conn, dsn):
    """Claim-buffers, xmin-horizon and autovacuum-progress name the same holder and the same fix:
    the page does not say "vacuum is blocked" in one row and "nothing holds the horizon" in another."""
    config = cfg(xmin_horizon_warn=0.3)
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    measure(conn, config, 5)
    holder = snapshot_holder(dsn, "report-export")
    pid = holder.info.backend_pid
    try:
        dead_entries_at_the_head(conn)
        time.sleep(0.5)  # past advisor.xmin_horizon_warn
        slow = measure(conn, config, 1)
        horizon = result(conn, "xmin-horizon", config)
        deadline = time.monotonic() + 10
        while (vacuum := result(conn, "autovacuum-progress", config)).status == OK and time.monotonic() < deadline:
            time.sleep(0.2)  # the dead rows reach pg_stat_user_tables within a second
    finally:
        holder.rollback()
        holder.close()
    held = f"an idle-in-transaction session (pid {pid}, app report-export) holds the xmin horizon for"
    fix = f"end it (pg_terminate_backend({pid}))"
    assert slow.status == WARN, (slow.summary, slow.data)
    assert slow.summary.startswith("each claim reads") and held in slow.summary and fix in slow.summary
    assert slow.summary.endswith("claims recover once vacuum runs")
    assert slow.data["cause"]["kind"] == "xmin-holder" and slow.data["cause"]["subject"] == f"pid {pid}"
    assert horizon.status == WARN and horizon.summary.startswith(held) and fix in horizon.summary
    assert vacuum.status in (WARN, FAIL) and held in vacuum.summary and fix in vacuum.summary, vacuum.summary
    assert horizon.data["cause"]["subject"] == vacuum.data["cause"]["subject"] == f"pid {pid}"


def test_claims_walking_past_a_paused_queues_backlog_name_the_pause(conn):
    config = cfg()
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    measure(conn, config, 5, queue="default")
    # 3,000 jobs of a paused queue ahead of everything in the claim index: every claim walks past them
    q.enqueue_many(conn, [q.NewJob("reindex", queue="search", priority=10) for _ in range(3000)])
    actions.pause_queue(conn, "search", actor="alice", reason="search cluster upgrade")
    slow = measure(conn, config, 1, queue="default")
    assert slow.data["ratio"] >= 4, slow.data
    assert slow.status == WARN, (slow.summary, slow.data)
    assert "queue search is paused (paused by alice" in slow.summary
    assert "3,000 jobs at the head of the claim index" in slow.summary
    assert "resume it once its incident allows (skiplock resume search" in slow.summary
    assert slow.data["cause"]["kind"] == "held-back-work"


def test_an_operators_change_shortly_before_is_named(conn, dsn):
    config = cfg()
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    measure(conn, config, 5)
    audit.record(conn, actor="alice", action="login", target="user:alice")  # changes no load: never named
    audit.record(conn, actor="alice", action="replay", target="operation:7", rows=10_000, reason="provider is back")
    holder = snapshot_holder(dsn, "long-report")  # seconds old: not a cause of its own
    try:
        dead_entries_at_the_head(conn)
        slow = measure(conn, config, 1)
    finally:
        holder.rollback()
        holder.close()
    assert slow.status == WARN, (slow.summary, slow.data)
    assert "an operator's change shortly before: alice ran 'replay' on operation:7" in slow.summary
    assert "10,000 rows, reason: provider is back" in slow.summary
    assert "see whether the figure settles once it has finished and vacuum has run" in slow.summary


def test_every_audited_action_is_placed_as_changing_the_load_or_not():
    """A new audited action must be placed in causes.LOAD_CHANGES or NO_LOAD_CHANGES: the list
    of actions is read from the code (every literal action= of an audit.record call)."""
    found = set()
    for path in (ROOT / "console").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "record":
                for kw in node.keywords:
                    if kw.arg == "action":
                        values = [kw.value.body, kw.value.orelse] if isinstance(kw.value, ast.IfExp) else [kw.value]
                        found |= {v.value for v in values if isinstance(v, ast.Constant)}
    found |= {"replay", "purge", "archive", "reap", "retention", "user_enable"}  # passed as variables
    assert not set(LOAD_CHANGES) & set(NO_LOAD_CHANGES)
    unplaced = found - set(LOAD_CHANGES) - set(NO_LOAD_CHANGES)
    assert not unplaced, f"place these audited actions in console.advisor.causes: {sorted(unplaced)}"
