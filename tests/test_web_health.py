"""The database health page against real sessions: an idle-in-transaction horizon holder, a
lock-wait tree, good news when all is well, a timed-out panel alone saying "not available"."""

from __future__ import annotations

import threading
import time

import psycopg
import psycopg.sql
import pytest

from console.web import health
from tests.oncall_data import horizon_rule, store_history


def test_personas(client_as):
    assert client_as(None).get("/health").status_code == 302
    assert client_as(None).get("/api/v1/health").status_code == 401
    for role in ("viewer", "operator", "admin"):
        assert client_as(role).get("/health").status_code == 200
        assert client_as(role).get("/health/_panels").status_code == 200


def test_good_news_is_stated_plainly(conn, client_as):
    store_history(conn, minutes=2)
    html = client_as("viewer").get("/health").get_data(as_text=True)
    for text in ("No sessions are holding back vacuum", "No session is waiting for a lock",
                 "Far from wraparound", "No sessions are waiting on MultiXact or SLRU locks",
                 "No standbys or replication slots", "Autovacuum is keeping up"):
        assert text in html, text
    data = client_as("viewer").get("/api/v1/health").get_json()
    assert {k: data[k]["level"] for k in health.PANELS} == {k: "good" for k in health.PANELS}
    jobs = next(t for t in data["tables"]["tables"] if t["table"] == "jobs")
    assert jobs["threshold"] == 50_050  # from the stored sample


def test_a_holder_younger_than_the_rule_in_force_holds_back_nothing(dsn, conn, client_as):
    """The panel judges holders by the vacuum_blocked rule in force, as the alert does: a
    transaction open for a second is not "holding back vacuum" under the shipped 10 minutes."""
    with psycopg.connect(dsn, application_name="quick-report") as other:
        other.execute("SELECT txid_current()")
        time.sleep(1.1)
        data = client_as("viewer").get("/api/v1/health").get_json()["holders"]
        assert data["threshold_s"] == 600 and data["level"] == "good"
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert "No sessions are holding back vacuum" in html and "more than 10 min" in html
        horizon_rule(conn, 1)  # an admin lowers it: the same holder now holds back vacuum
        data = client_as("viewer").get("/api/v1/health").get_json()["holders"]
        assert data["threshold_s"] == 1 and [h["application"] for h in data["holders"] if h["level"] == "warn"] == [
            "quick-report"]
        other.rollback()


def test_idle_in_transaction_holder_is_named_with_what_to_do(dsn, conn, client_as):
    horizon_rule(conn, 0.2)
    with psycopg.connect(dsn, application_name="forgotten-report") as other:
        other.execute("SELECT txid_current()")  # a transaction with an xid, left open
        pid = other.info.backend_pid
        time.sleep(0.4)
        data = client_as("viewer").get("/api/v1/health").get_json()["holders"]
        holder = next(h for h in data["holders"] if h["pid"] == pid)
        assert holder["kind"] == "idle_in_transaction" and holder["level"] == "warn"
        assert holder["application"] == "forgotten-report"
        assert f"pg_terminate_backend({pid})" in holder["advice"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert "forgotten-report" in html and "No sessions are holding back vacuum" not in html
        other.rollback()


GID = "nightly'); DROP TABLE skiplock.jobs; -- o'brien \\ batch"


def test_prepared_transaction_advice_is_valid_safe_sql(dsn, conn, client_as):
    """A gid with quotes and a backslash: the advised ROLLBACK PREPARED runs as is, rolls back
    exactly that transaction and nothing else (the test cluster allows prepared transactions)."""
    horizon_rule(conn, 0.2)
    with psycopg.connect(dsn) as other:
        other.execute("SELECT txid_current()")
        other.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(GID)))
    try:
        time.sleep(0.4)
        data = client_as("viewer").get("/api/v1/health").get_json()["holders"]
        holder = next(h for h in data["holders"] if h["kind"] == "prepared_transaction")
        assert holder["id"] == GID
        command = holder["advice"].split("or: ", 1)[1]
        assert command.startswith("ROLLBACK PREPARED ") and command.endswith(";")
        conn.execute(command)  # valid SQL, one statement
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0
        assert conn.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL").fetchone()[0]
    finally:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall():
            conn.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))


def test_lock_waits_are_drawn_as_a_tree(dsn, client_as):
    blocker = psycopg.connect(dsn, application_name="migration-script")
    waiter_ready = threading.Event()
    errors: list[BaseException] = []

    def wait_for_lock():
        try:
            with psycopg.connect(dsn, application_name="blocked-worker", autocommit=True) as w:
                waiter_ready.set()
                w.execute("SET lock_timeout = '10s'")
                w.execute("SELECT count(*) FROM skiplock.queues")
        except psycopg.errors.LockNotAvailable:
            pass
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    try:
        blocker.execute("LOCK TABLE skiplock.queues IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=wait_for_lock)
        thread.start()
        waiter_ready.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            locks = client_as("viewer").get("/api/v1/health").get_json()["locks"]
            if locks["waiting"]:
                break
            time.sleep(0.1)
        assert locks["waiting"] == 1
        [root] = locks["tree"]
        assert root["pid"] == blocker.info.backend_pid and root["application_name"] == "migration-script"
        assert [c["application_name"] for c in root["blocks"]] == ["blocked-worker"]
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f"pg_cancel_backend({blocker.info.backend_pid})" in html
    finally:
        blocker.rollback()
        blocker.close()
        thread.join(10)
    assert not errors


def test_lock_tree_handles_chains_and_cycles():
    waiters = [{"pid": 2, "blocked_by": [1]}, {"pid": 3, "blocked_by": [2]}, {"pid": 4, "blocked_by": [1]}]
    [root] = health.lock_tree(waiters, {})
    assert root["pid"] == 1 and [c["pid"] for c in root["blocks"]] == [2, 4]
    assert root["blocks"][0]["blocks"][0]["pid"] == 3
    cycle = health.lock_tree([{"pid": 5, "blocked_by": [6]}, {"pid": 6, "blocked_by": [5]}], {})
    assert cycle[0]["pid"] == 5 and cycle[0]["blocks"][0]["pid"] == 6 and cycle[0]["blocks"][0]["blocks"] == []


@pytest.mark.parametrize("slow_panel", ["holders_panel"])
def test_a_slow_panel_says_not_available_alone(client_as, monkeypatch, slow_panel):
    def slow(conn, *args):
        conn.execute("SELECT pg_sleep(5)")

    monkeypatch.setattr(health, slow_panel, slow)
    monkeypatch.setattr(health, "PANEL_MS", 200)
    resp = client_as("viewer").get("/health")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200
    assert html.count("Not available: the query took longer than 200 ms") == 1
    assert "No session is waiting for a lock" in html
    assert client_as("viewer").get("/api/v1/health").get_json()["holders"]["available"] is False
