"""Scenarios that need a standby (tests/scenarios.py says what each one checks): replica lag
made for real by pausing a standby's replay while the primary writes, and the xmin horizon held
by a standby's query through hot_standby_feedback, with a slot and without one.

The cluster is this module's own (a primary and a hot standby with hot_standby_feedback, made
by console.pgcluster `start_standby`), stopped in a `finally` whatever the tests do; each test
gets a fresh database on the primary (the `dsn` fixture below replaces the session's)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from console.db import connect
from console.pgcluster import PrivateCluster
from tests.replication import SLOT, Replication, fresh_database, replicated
from tests.scenarios import SCALED, scenario_console

pytestmark = [pytest.mark.slow, pytest.mark.scenario]

@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[PrivateCluster, PrivateCluster, PrivateCluster]]:
    """(primary, replica-feedback, replica-slot): tests/replication.py."""
    with replicated("scenario_template") as found:
        yield found.primary, found.feedback_standby, found.slot_standby


@pytest.fixture
def dsn(cluster) -> Iterator[str]:
    with fresh_database(Replication(cluster[0], cluster[2], cluster[1], "scenario_template"), "scenario") as found:
        yield found


def test_replica_lag(cluster, dsn, conn, tmp_path):
    """A standby's replay is paused (a long query it must not cancel, or a stuck disk) while the
    primary writes: its replay lag grows past the threshold; the other one keeps up."""
    _, standby, _ = cluster
    with scenario_console(dsn, tmp_path, name="replica lag") as console:
        console.tick()
        control = connect(standby.dsn)
        control.execute("SELECT pg_wal_replay_pause()")
        t0 = time.monotonic()

        def write():
            conn.execute("INSERT INTO skiplock.queues (name) SELECT 'q' || g FROM generate_series(1, 50) AS g "
                         "ON CONFLICT (name) DO UPDATE SET updated_at = now()")

        try:
            fired = console.expect_firing("replica_lag", since=t0 + SCALED["replica_lag"]["threshold"],
                                          labels={"standby": "replica-feedback"}, mention="replica-feedback",
                                          offender="replica-feedback", every=write, scenario="replica lag",
                                          extra_budget=2.0)  # pg_stat_replication's lag trails replies by ~1 s
            wal = console.api("/api/v1/health")["wal"]
            mine = next(s for s in wal["standbys"] if s["name"] == "replica-feedback")
            other = next(s for s in wal["standbys"] if s["name"] == "replica-slot")
            assert mine["replay_lag_s"] > SCALED["replica_lag"]["threshold"] and mine["level"] != "good"
            assert (other["replay_lag_s"] or 0) < mine["replay_lag_s"]
            assert not console.alert("replica_lag", standby="replica-slot")
        finally:
            control.execute("SELECT pg_wal_replay_resume()")
            control.close()
        console.expect_resolved(fired, budget=20, every=write)


@pytest.mark.parametrize("kind", ["standby", "replication_slot"])
def test_a_standby_holds_the_horizon(cluster, dsn, conn, tmp_path, kind):
    """A report runs for a while on a standby with hot_standby_feedback: the primary keeps the
    rows it may still read (the walsender's xmin without a slot, the slot's xmin with one). The
    age comes from the horizon collector's XID history; the Database page names the same
    holder the alert is about."""
    _, feedback_standby, slot_standby = cluster
    standby = feedback_standby if kind == "standby" else slot_standby
    with connect(cluster[0].dsn) as admin:
        walsender = admin.execute("SELECT pid::text FROM pg_stat_replication WHERE application_name = %s",
                                  ("replica-feedback",)).fetchone()[0]
    holder_id = walsender if kind == "standby" else SLOT
    with scenario_console(dsn, tmp_path, name=f"standby holder {kind}") as console:
        console.tick()
        session = connect(standby.dsn, application_name="replica-report", autocommit=False)
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT count(*) FROM pg_class")
        t0 = time.monotonic()

        def burn():
            with psycopg.connect(dsn, autocommit=True) as c:
                for _ in range(5):
                    c.execute("SELECT pg_current_xact_id()")

        try:
            fired = console.expect_firing("vacuum_blocked", since=t0 + SCALED["vacuum_blocked"]["threshold"],
                                          labels={"holder": "any"}, mention="xmin horizon",
                                          offender=f'data-holder="{holder_id}"', every=burn,
                                          scenario=f"xmin holder: {kind}", extra_budget=2.0)
            holders = console.api("/api/v1/health")["holders"]["holders"]
            mine = [h for h in holders if h["id"] == holder_id]
            assert mine and mine[0]["level"] != "good" and mine[0]["age_s"] is not None, holders
        finally:
            session.rollback()
            session.close()
        console.expect_resolved(fired, budget=20, every=burn)
