"""Convoy detection from history: claim-like statements without SKIP LOCKED found in
pg_stat_statements (preloaded in the test cluster), by the advisor check and the metric."""

from __future__ import annotations

import psycopg
import pytest

from console.advisor import run_checks
from console.advisor.base import OK, WARN
from tests.collector_helpers import cycle, values

PLAIN = "SELECT id FROM app_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE"
SKIPPING = "SELECT id FROM app_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"


@pytest.fixture
def app_queue(conn):
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    conn.execute("CREATE TABLE app_jobs (id bigint PRIMARY KEY, status text NOT NULL)")
    conn.execute("INSERT INTO app_jobs SELECT g, 'pending' FROM generate_series(1, 50) AS g")
    return conn


def claim_many(dsn, statement, n=40):
    with psycopg.connect(dsn) as other:  # a worker of another application: claims in transactions
        for _ in range(n):
            with other.transaction():
                other.execute(statement).fetchall()


def test_a_plain_for_update_claim_in_the_history_is_flagged_and_counted(app_queue, dsn):
    claim_many(dsn, SKIPPING)
    before = run_checks(app_queue, only=["claim-skip-locked"]).by_id("claim-skip-locked")
    assert before.status == OK, before.summary  # a SKIP LOCKED claim is not a convoy

    claim_many(dsn, PLAIN)
    res = run_checks(app_queue, only=["claim-skip-locked"]).by_id("claim-skip-locked")
    assert res.status == WARN, res.summary
    [flagged] = res.data["statements"]
    assert "FOR UPDATE" in flagged["query"] and "SKIP LOCKED" not in flagged["query"]
    assert flagged["calls"] >= 40 and flagged["mean_ms"] is not None
    assert any("40 calls" in line or "calls, mean" in line for line in res.evidence)

    report = cycle(dsn)
    labelled = {s.labels["statement"]: s.value for s in report.samples if s.metric == "claim_without_skip_locked_calls"}
    assert labelled.pop("all") >= 40
    assert list(labelled) == [str(flagged["queryid"])] and labelled[str(flagged["queryid"])] >= 40
    assert values(report, "claim_without_skip_locked_calls", statement="all") == [sum(labelled.values())]
