"""Workers page (issue 17): recent throughput per worker from the collector's counter marks (not
a lifetime average), and stale registry rows cleared by the retention job after the grace."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from psycopg.types.json import Jsonb

from console.collectors import retention
from console.config import ConfigError, load_config
from tests.collector_helpers import cycle


def add_worker(conn, worker_id: str, *, completed: int = 0, failed: int = 0, started: str = "1 minute",
               last_seen: str = "0 seconds", stopped: str | None = None) -> None:
    conn.execute(
        "INSERT INTO skiplock.workers (id, host, pid, concurrency, completed, failed, started_at, last_seen, stopped_at) "
        "VALUES (%s, 'h', 1, 4, %s, %s, now() - %s::interval, now() - %s::interval, now() - %s::interval)",
        (worker_id, completed, failed, started, last_seen, stopped))


def set_counters(conn, worker_id: str, completed: int, failed: int) -> None:
    conn.execute("UPDATE skiplock.workers SET completed = %s, failed = %s, last_seen = now() WHERE id = %s",
                 (completed, failed, worker_id))


def age_marks(conn, seconds: float) -> None:
    """Make the collector's marks `seconds` older (as if it had run that long ago)."""
    state = conn.execute("SELECT state FROM skiplock.collector_state WHERE name = 'workers'").fetchone()[0]
    state["history"] = {w: [[m[0] - seconds, m[1], m[2]] for m in marks] for w, marks in state["history"].items()}
    conn.execute("UPDATE skiplock.collector_state SET state = %s WHERE name = 'workers'", (Jsonb(state),))


def by_id(client) -> dict:
    return {w["id"]: w for w in client.get("/api/v1/workers").get_json()["workers"]}


def test_recent_throughput_is_the_last_minute_not_the_lifetime(dsn, conn, client_as):
    add_worker(conn, "busy", completed=100, started="10 minutes")
    add_worker(conn, "idle-now", completed=36_000, started="1 hour")  # 10 jobs/s over its life, nothing lately
    client = client_as("viewer")
    before = by_id(client)
    assert before["busy"]["recent_per_minute"] is None  # no collector mark yet: unknown, not zero
    assert 'data-recent=""' in client.get("/workers").get_data(as_text=True)
    cycle(dsn, only=("workers",))
    age_marks(conn, 60)
    set_counters(conn, "busy", 110, 0)
    cycle(dsn, only=("workers",))
    age_marks(conn, 70)  # marks now ~130 s and ~70 s old
    cycle(dsn, only=("workers",))  # and a fresh one: the page uses the newest at least a minute old
    history = conn.execute("SELECT state -> 'history' FROM skiplock.collector_state WHERE name = 'workers'").fetchone()[0]
    assert [m[1] for m in history["busy"]] == [100, 110, 110] and len(history["idle-now"]) == 3
    set_counters(conn, "busy", 145, 5)  # 40 jobs finished since the mark ~70 s ago
    workers = by_id(client)
    busy, idle = workers["busy"], workers["idle-now"]
    assert 70 <= busy["recent_window_s"] < 90
    assert busy["recent_per_minute"] == pytest.approx(40 * 60 / busy["recent_window_s"], abs=0.05)
    assert idle["recent_per_minute"] == 0 and idle["throughput"] == pytest.approx(10, rel=0.05)
    html = client.get("/workers/_table").get_data(as_text=True)
    shown = dict(re.findall(r'<code>([\w-]+)</code>.*?data-recent="([^"]*)"', html, re.S))
    assert float(shown["busy"]) == pytest.approx(busy["recent_per_minute"], abs=0.5) and float(shown["idle-now"]) == 0


def test_a_worker_restarted_under_the_same_id_counts_from_zero(dsn, conn, client_as):
    add_worker(conn, "w", completed=500)
    cycle(dsn, only=("workers",))
    age_marks(conn, 60)
    set_counters(conn, "w", 12, 0)
    assert by_id(client_as("viewer"))["w"]["recent_per_minute"] == pytest.approx(12, rel=0.1)


def test_retention_clears_registry_rows_of_gone_workers_after_the_grace_in_batches(conn):
    add_worker(conn, "killed", started="3 hours", last_seen="2 hours")  # never said it stopped
    add_worker(conn, "stopped-long-ago", started="3 hours", last_seen="2 hours", stopped="2 hours")
    add_worker(conn, "stopped-lately", started="3 hours", last_seen="10 minutes", stopped="10 minutes")
    add_worker(conn, "quiet", started="3 hours", last_seen="50 minutes")  # within the grace
    add_worker(conn, "live")
    settings = retention.RetentionSettings(worker_grace=timedelta(hours=1), batch_size=1, max_batches=1)
    assert retention.run(conn, settings).deleted["workers"] == 1  # one bounded batch
    result = retention.run(conn, retention.RetentionSettings(worker_grace=timedelta(hours=1), batch_size=1))
    assert result.deleted["workers"] == 1
    left = {r[0] for r in conn.execute("SELECT id FROM skiplock.workers").fetchall()}
    assert left == {"stopped-lately", "quiet", "live"}
    shorter = retention.RetentionSettings(worker_grace=timedelta(minutes=30))
    assert retention.run(conn, shorter).deleted["workers"] == 1
    assert {r[0] for r in conn.execute("SELECT id FROM skiplock.workers").fetchall()} == {"stopped-lately", "live"}


def test_the_grace_is_a_setting(tmp_path):
    config = load_config(env={}, overrides={"worker.registry_grace": "30m"})
    assert retention.RetentionSettings.from_config(config).worker_grace == timedelta(minutes=30)
    assert retention.RetentionSettings.from_config(load_config(env={})).worker_grace == timedelta(hours=1)
    with pytest.raises(ConfigError, match="registry_grace"):
        load_config(env={"SKIPLOCK_WORKER_REGISTRY_GRACE": "soon"})
