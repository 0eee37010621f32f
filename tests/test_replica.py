"""Replicas and horizon holders against a real streaming replica.

A private primary (max_prepared_transactions > 0, so two-phase commit works) with two hot
standbys made by `pg_basebackup -R` (console.pgcluster `start_standby`), both with
hot_standby_feedback on and a 1 s status interval:

- `replica-slot` streams through the physical slot `skiplock_test_slot`, so its feedback
  becomes the slot's xmin (pg_stat_replication.backend_xmin stays empty for it);
- `replica-feedback` has no slot, so its feedback is the walsender's backend_xmin.

Lag is made for real: replay paused on a standby while the primary writes. Every holder kind
is made for real and then checked in the collectors' details, the health page (and its JSON)
and the advisor's xmin-horizon check. The cluster is this module's own (a standby would slow
every other test); it is stopped in a `finally`, whatever the tests do.

The tests run in the module's order on one cluster; each gets a fresh database on the primary
(the `dsn` fixture below replaces the session cluster's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import psycopg
import pytest

from console.advisor import run_checks
from console.advisor.verdict import evaluate_verdict
from console.collectors.database import standby_labels
from console.config import load_config
from console.db import connect
from console.pgcluster import PrivateCluster
from tests.collector_helpers import cycle, eventually, value
from tests.oncall_data import horizon_rule
from tests.replication import SLOT, Replication, fresh_database, replicated


@pytest.fixture(scope="module")
def replication() -> Iterator[Replication]:
    with replicated("replica_template") as found:
        yield found


@pytest.fixture
def dsn(replication) -> Iterator[str]:
    """A fresh migrated database on this module's primary (replaces conftest's `dsn`)."""
    with fresh_database(replication, "replica") as found:
        yield found


def advisor_check(conn, check_id: str):
    config = load_config(env={}, overrides={})
    res = run_checks(conn, config, only=[check_id]).by_id(check_id)
    return res, "\n".join([res.summary, *res.evidence])


def burn_xids(conn, n: int = 5) -> None:
    """Commit n transactions that each take an XID: the primary's horizon wants to move on."""
    for _ in range(n):
        conn.execute("SELECT pg_current_xact_id()")


def holder(report, kind: str, holder_id: str) -> dict | None:
    return next((h for h in report.details["xmin_holders"] if h["kind"] == kind and h["id"] == holder_id), None)


def standby_snapshot(standby: PrivateCluster) -> psycopg.Connection:
    """A session on the standby holding a REPEATABLE READ snapshot (a long report on a replica)."""
    session = connect(standby.dsn, application_name="replica-report", autocommit=False)
    session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    session.execute("SELECT count(*) FROM pg_class")
    return session


def metric_line(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


# --- replica lag ---------------------------------------------------------------------------

def test_a_paused_standby_lags_in_the_collectors_metrics_health_and_advisor_then_catches_up(
        replication, dsn, conn, client_as):
    standby = replication.feedback_standby
    for _ in range(3):  # a steady, lag-free start for the verdict's trend
        cycle(dsn, only=("wal",))
        time.sleep(0.2)

    def in_step():  # both standbys have replayed everything (the cycles write samples: WAL)
        report = cycle(dsn, only=("wal",))
        return all(value(report, "replica_lag_bytes", standby=name, client="127.0.0.1") == 0
                   for name in ("replica-feedback", "replica-slot"))
    eventually(in_step, timeout=15, interval=0.3)

    control = connect(standby.dsn)
    control.execute("SELECT pg_wal_replay_pause()")
    try:
        def lagging():
            conn.execute("INSERT INTO skiplock.jobs (kind) SELECT 'noop' FROM generate_series(1, 200)")
            report = cycle(dsn, only=("wal",))
            lag_s = value(report, "replica_lag_seconds", standby="replica-feedback", client="127.0.0.1")
            return report if lag_s >= 6.0 else None
        report = eventually(lagging, timeout=20, interval=0.3)
        lag_bytes = value(report, "replica_lag_bytes", standby="replica-feedback", client="127.0.0.1")
        assert lag_bytes > 0
        # the other standby kept replaying
        assert value(report, "replica_lag_bytes", standby="replica-slot", client="127.0.0.1") < lag_bytes

        metrics = client_as(None).get("/metrics").get_data(as_text=True)
        assert metric_line(metrics, "skiplock_replica_lag_seconds", standby="replica-feedback", client="127.0.0.1") >= 6.0
        assert metric_line(metrics, "skiplock_replica_lag_bytes", standby="replica-feedback", client="127.0.0.1") > 0
        assert "# HELP skiplock_replica_lag_seconds" in metrics

        data = client_as("viewer").get("/api/v1/health").get_json()["wal"]
        [row] = [s for s in data["standbys"] if s["name"] == "replica-feedback"]
        assert row["replay_lag_s"] >= 6.0 and row["lag_bytes"] > 0 and row["client"] == "127.0.0.1"
        assert {s["name"] for s in data["standbys"]} == {"replica-feedback", "replica-slot"}
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert "replica-feedback" in html and "replica-slot" in html
        assert "No standbys or replication slots" not in html

        res, text = advisor_check(conn, "wal-replicas")
        assert re.search(r"standby replica-feedback \(streaming\): replay lag \d+(\.\d+)? s, \d", text), text
        assert "standby replica-slot (streaming)" in text

        signal = next(s for s in evaluate_verdict(conn).signals if s.id == "replica-lag")
        assert signal.level == "watch", signal.text  # from 0 s to 6+ s within the window: growing
        assert "replica-feedback" in signal.text
    finally:
        control.execute("SELECT pg_wal_replay_resume()")
        control.close()

    def caught_up():
        report = cycle(dsn, only=("wal",))
        return report if value(report, "replica_lag_bytes", standby="replica-feedback", client="127.0.0.1") == 0 else None
    report = eventually(caught_up, timeout=20, interval=0.3)
    assert value(report, "replica_lag_seconds", standby="replica-feedback", client="127.0.0.1") < 1.0


# --- the horizon holders, one kind each ----------------------------------------------------

def test_an_idle_in_transaction_snapshot_is_named_with_its_kind_and_age(dsn, conn, client_as, monkeypatch):
    session = connect(dsn, application_name="forgotten-report", autocommit=False)
    try:
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT count(*) FROM skiplock.jobs")  # a snapshot, no XID
        pid = str(session.info.backend_pid)
        burn_xids(conn)
        time.sleep(1.1)
        # under the amber threshold the page says so, with the session's age
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert re.search(r"No sessions are holding back vacuum \(the oldest open transaction is [1-9](\.\d)? s old: [^)]*idle in transaction[^)]*\)", html), \
            re.findall(r"No sessions are holding back vacuum[^<]*", html)

        horizon_rule(conn, 0)
        held = holder(cycle(dsn, only=("horizon",)), "idle_in_transaction", pid)
        assert held and held["application_name"] == "forgotten-report" and held["state"] == "idle in transaction"
        assert held["xid_age"] >= 5 and held["age_s"] >= 0.3

        api = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
        [row] = [h for h in api if h["id"] == pid]
        assert row["kind"] == "idle_in_transaction" and row["age_s"] >= 0.3
        assert f"pg_terminate_backend({pid})" in row["advice"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert re.search(rf"idle in transaction<br><code>{pid}</code>", html)

        res, text = advisor_check(conn, "xmin-horizon")
        assert re.search(rf"session {pid} forgotten-report \(postgres\): held \d+(\.\d+)? (ms|s)", text), text
        assert "idle in transaction: SELECT count(*) FROM skiplock.jobs" in text
    finally:
        session.rollback()
        session.close()


def test_a_replication_slot_fed_by_a_standby_is_named_with_its_kind_and_age(
        replication, dsn, conn, client_as, monkeypatch):
    horizon_rule(conn, 0)
    cycle(dsn, only=("horizon",))  # the XID history the slot's age is estimated from
    session = standby_snapshot(replication.slot_standby)
    try:
        burn_xids(conn)

        def held():
            report = cycle(dsn, only=("horizon",))
            h = holder(report, "replication_slot", SLOT)
            return h if h and h["xid_age"] >= 5 and (h["age_s"] or 0) > 0 else None
        found = eventually(held, timeout=15, interval=0.3)
        assert found["state"] == "active" and found["detail"] == "physical" and found["age_estimated"]
        # with a slot the feedback goes to the slot, not to the walsender
        report = cycle(dsn, only=("horizon",))
        assert not [h for h in report.details["xmin_holders"]
                    if h["kind"] == "standby" and h["application_name"] == "replica-slot"]
        assert value(report, "xmin_horizon_age_xids", holder="replication_slot") >= 5

        api = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
        [row] = [h for h in api if h["id"] == SLOT]
        assert row["kind"] == "replication_slot" and row["xid_age"] >= 5
        assert f"pg_drop_replication_slot('{SLOT}')" in row["advice"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f"replication slot<br><code>{SLOT}</code>" in html

        res, text = advisor_check(conn, "xmin-horizon")
        assert re.search(rf"replication slot {SLOT} physical: held \(age unknown\), \d+ transactions behind", text), text
    finally:
        session.rollback()
        session.close()


def test_a_prepared_transaction_is_named_with_its_kind_and_age(dsn, conn, client_as, monkeypatch):
    horizon_rule(conn, 0)
    gid = "skiplock-test-2pc"
    with connect(dsn, application_name="coordinator") as coordinator:
        coordinator.execute("BEGIN")
        coordinator.execute("INSERT INTO skiplock.queues (name) VALUES ('two-phase')")
        coordinator.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        burn_xids(conn)
        time.sleep(0.3)
        held = holder(cycle(dsn, only=("horizon",)), "prepared_transaction", gid)
        assert held and held["state"] == "prepared" and held["detail"] == "postgres"
        assert held["xid_age"] >= 5 and held["age_s"] >= 0.3

        api = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
        [row] = [h for h in api if h["id"] == gid]
        assert row["kind"] == "prepared_transaction" and row["age_s"] >= 0.3
        assert f"ROLLBACK PREPARED '{gid}'" in row["advice"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f"prepared transaction<br><code>{gid}</code>" in html

        res, text = advisor_check(conn, "xmin-horizon")
        assert re.search(rf"prepared transaction {gid} postgres: held \d+(\.\d+)? (ms|s)", text), text
    finally:
        conn.execute(f"ROLLBACK PREPARED '{gid}'")


def test_standby_feedback_is_named_with_its_kind_and_age_and_lets_go_when_the_query_ends(
        replication, dsn, conn, client_as, monkeypatch):
    with connect(replication.primary.dsn) as admin:
        [(walsender, connected_s)] = admin.execute(
            "SELECT pid::text, extract(epoch FROM now() - backend_start)::float8 FROM pg_stat_replication"
            " WHERE application_name = 'replica-feedback'").fetchall()
    cycle(dsn, only=("horizon",))
    session = standby_snapshot(replication.feedback_standby)
    try:
        burn_xids(conn)
        # Under the amber threshold: the standby's feedback has no age of its own, so the page
        # claims none (it used to print the first holder's, here "0 ms").
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert "No sessions are holding back vacuum.</p>" in html, re.findall(r"No sessions are holding back vacuum[^<]*", html)
        horizon_rule(conn, 0)

        def held():
            h = holder(cycle(dsn, only=("horizon",)), "standby", walsender)
            return h if h and h["xid_age"] >= 5 and (h["age_s"] or 0) > 0 else None
        found = eventually(held, timeout=15, interval=0.3)
        assert found["application_name"] == "replica-feedback" and found["detail"] == "127.0.0.1"
        assert found["state"] == "streaming" and found["age_estimated"]

        api = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
        [row] = [h for h in api if h["kind"] == "standby" and h["id"] == walsender]
        assert row["application"] == "replica-feedback" and row["xid_age"] >= 5
        assert "hot_standby_feedback" in row["advice"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f"standby<br><code>{walsender}</code>" in html

        res, text = advisor_check(conn, "xmin-horizon")
        assert re.search(rf"standby feedback {walsender} replica-feedback: held \(age unknown\), \d+ transactions behind",
                         text), text
    finally:
        session.rollback()
        session.close()

    # The query ended: the standby still sends feedback, but it holds nothing old any more. Its
    # age is the horizon's, not the replication connection's.
    def released():
        h = holder(cycle(dsn, only=("horizon",)), "standby", walsender)
        return h if h and h["xid_age"] < 5 else None
    after = eventually(released, timeout=15, interval=0.3)
    assert connected_s > 1.0 and after["age_s"] < connected_s - 1.0


def test_two_standbys_with_one_name_and_address_stay_two_series():
    rows = [{"pid": 11, "standby": "walreceiver", "client": "10.0.0.5"},
            {"pid": 12, "standby": "walreceiver", "client": "10.0.0.5"},
            {"pid": 13, "standby": "walreceiver", "client": "10.0.0.6"}]
    assert [labels for labels, _ in standby_labels(rows)] == [
        {"standby": "walreceiver", "client": "10.0.0.5"},
        {"standby": "walreceiver (pid 12)", "client": "10.0.0.5"},
        {"standby": "walreceiver", "client": "10.0.0.6"},
    ]
