from datetime import UTC, datetime, timedelta

import pytest

from console import samples
from console.catalog import UnknownMetric
from console.samples import Sample


def test_store_and_read_latest_and_series(conn):
    now = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 5, now - timedelta(minutes=2))])
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 7),
                         Sample("queue_depth", {"queue": "b", "state": "eligible"}, None)], at=now)
    latest = {s.labels["queue"]: s.value for s in samples.latest(conn, "queue_depth")}
    assert latest == {"a": 7, "b": None}
    points = samples.series(conn, "queue_depth", since=timedelta(hours=1), labels={"queue": "a"})
    assert [p["value"] for p in points] == [5, 7]


def test_unknown_metric_is_refused(conn):
    with pytest.raises(UnknownMetric, match="queue_dept"):
        samples.store(conn, [Sample("queue_dept", {}, 1)])


def depth(conn) -> dict[str, float | None]:
    return {s.labels["queue"]: s.value for s in samples.latest(conn, "queue_depth")}


def test_the_newest_of_each_series_whoever_writes_and_in_whatever_order(conn):
    """samples_latest (migration 027) is kept by triggers: a sample stored late does not replace
    a newer one; a plain INSERT (a script, an older release's scheduler) counts as the console's
    own store; a series outside the window is not read."""
    now = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 7, now)])
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 5, now - timedelta(minutes=1))])
    assert depth(conn) == {"a": 7}
    conn.execute("INSERT INTO skiplock.samples (collected_at, metric, labels, value) VALUES "
                 "(now(), 'queue_depth', '{\"queue\": \"b\", \"state\": \"eligible\"}', 3), "
                 "(now() - interval '20 minutes', 'queue_depth', '{\"queue\": \"c\", \"state\": \"eligible\"}', 9)")
    assert depth(conn) == {"a": 7, "b": 3}  # c's newest is 20 minutes old: outside the 10-minute default
    assert {s.labels["queue"] for s in samples.latest(conn, "queue_depth", within=timedelta(hours=1))} == {"a", "b", "c"}
    # the same series twice in one statement: the newer wins
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 11, now + timedelta(seconds=2)),
                         Sample("queue_depth", {"queue": "a", "state": "eligible"}, 10, now + timedelta(seconds=1))])
    assert depth(conn)["a"] == 11
    # ... and in one statement, in either order (an upsert row by row would update the series
    # twice, which PostgreSQL refuses: the trigger groups them then, migration 033)
    for newest_first in (True, False):
        later, earlier = (now + timedelta(seconds=20), 21), (now + timedelta(seconds=10), 20)
        rows = [later, earlier] if newest_first else [earlier, later]
        conn.execute("INSERT INTO skiplock.samples (collected_at, metric, labels, value) VALUES "
                     "(%s, 'queue_depth', '{\"queue\": \"a\", \"state\": \"eligible\"}', %s), "
                     "(%s, 'queue_depth', '{\"queue\": \"a\", \"state\": \"eligible\"}', %s)",
                     (rows[0][0], rows[0][1], rows[1][0], rows[1][1]))
        assert depth(conn)["a"] == 21
        conn.execute("DELETE FROM skiplock.samples WHERE collected_at >= %s", (now + timedelta(seconds=10),))


def test_retention_and_truncate_forget_what_they_removed(conn):
    now = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "old", "state": "eligible"}, 1, now - timedelta(minutes=5)),
                         Sample("queue_depth", {"queue": "kept", "state": "eligible"}, 2, now - timedelta(minutes=5))])
    samples.store(conn, [Sample("queue_depth", {"queue": "kept", "state": "eligible"}, 4, now)])
    # retention deletes the oldest rows: "old" loses its newest row and goes; "kept" keeps its newest
    conn.execute("DELETE FROM skiplock.samples WHERE collected_at < %s", (now - timedelta(minutes=1),))
    assert depth(conn) == {"kept": 4}
    conn.execute("TRUNCATE skiplock.samples")
    assert depth(conn) == {}


def test_samples_moved_in_time_are_read_again(conn):
    now = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "a", "state": "eligible"}, 1, now - timedelta(minutes=1)),
                         Sample("queue_depth", {"queue": "a", "state": "eligible"}, 2, now)])
    conn.execute("UPDATE skiplock.samples SET collected_at = collected_at - interval '20 minutes' WHERE value = 2")
    assert depth(conn) == {"a": 1}  # the moved row is older now: the other one is the newest


def test_queue_activity_reads_when_each_queue_was_last_seen_and_last_busy(conn):
    """samples.queue_activity (migration 029: samples_latest.busy_at, kept by the triggers): the
    newest sample of each queue, and the newest in which it had eligible, scheduled or running
    work or finished some. A sample at zero leaves the busy time; a late sample changes nothing;
    failed jobs (dead letters) are not work; a busy time older than the window is none; an
    UPDATE of samples reads the series again."""
    now = datetime.now(UTC)

    def depth_at(queue: str, state: str, value: float, ago: timedelta) -> Sample:
        return Sample("queue_depth", {"queue": queue, "state": state}, value, now - ago)

    samples.store(conn, [depth_at("reports", "eligible", 4, timedelta(hours=2)),
                         depth_at("billing", "running", 1, timedelta(minutes=3))])
    samples.store(conn, [depth_at("reports", "eligible", 0, timedelta(minutes=1)),
                         depth_at("reports", "failed", 9, timedelta(minutes=1)),  # dead letters are not work
                         depth_at("billing", "running", 0, timedelta(minutes=1)),
                         Sample("queue_throughput", {"queue": "mail"}, 2.5, now - timedelta(minutes=1)),
                         depth_at("old", "eligible", 3, timedelta(hours=30))])
    samples.store(conn, [depth_at("billing", "running", 5, timedelta(minutes=50))])  # late: ignored
    activity = samples.queue_activity(conn)
    assert set(activity) == {"reports", "billing", "mail"}  # "old" was last seen 30 h ago
    assert activity["reports"]["last_busy"] == now - timedelta(hours=2)
    assert activity["reports"]["last_seen"] == now - timedelta(minutes=1)
    assert activity["billing"]["last_busy"] == now - timedelta(minutes=3)
    assert activity["mail"]["last_busy"] == now - timedelta(minutes=1)
    assert samples.queue_activity(conn, within=timedelta(hours=1))["reports"]["last_busy"] is None
    conn.execute("UPDATE skiplock.samples SET value = 0 WHERE labels ->> 'queue' = 'billing'")
    assert samples.queue_activity(conn)["billing"]["last_busy"] is None


def latest_rows(conn) -> dict[str, tuple]:
    return {queue: (value, at, busy) for queue, value, at, busy in conn.execute(
        "SELECT labels ->> 'queue', value, collected_at, busy_at FROM skiplock.samples_latest WHERE metric = 'queue_depth'")}


def test_a_cycle_is_merged_into_the_newest_of_each_series(conn):
    """A statement holding each series once (a collection cycle) is merged into samples_latest
    (migration 037): a newer sample replaces the series' value and time, moves busy_at when above
    zero and leaves it at zero or not available; a late one changes nothing; a new series is
    added; the series the statement does not hold stay as they were."""
    now = datetime.now(UTC)

    def eligible(queue: str, value: float | None, at: datetime) -> Sample:
        return Sample("queue_depth", {"queue": queue, "state": "eligible"}, value, at)

    earlier = now - timedelta(minutes=1)
    samples.store(conn, [eligible("busy", 3, earlier), eligible("emptied", 2, earlier), eligible("gone", 1, earlier),
                         eligible("late", 4, now), eligible("unknown", 5, earlier)])
    samples.store(conn, [eligible("busy", 6, now), eligible("emptied", 0, now), eligible("unknown", None, now),
                         eligible("late", 9, earlier), eligible("new", 7, now), eligible("new-idle", 0, now)])
    assert latest_rows(conn) == {
        "busy": (6, now, now),
        "emptied": (0, now, earlier),
        "unknown": (None, now, earlier),
        "late": (4, now, now),
        "gone": (1, earlier, earlier),
        "new": (7, now, now),
        "new-idle": (0, now, None),
    }


def test_a_wide_cycle_is_joined_with_samples_latest_once(dsn):
    """The insert trigger joins a cycle's rows with samples_latest by hashing both (migration 037),
    not one probe of the (metric, labels) index per row (45,000 at 5,000 queues, most of the
    store's time), on the collectors' own connection, which turns sequential scans off; and it
    takes the MERGE, not the grouped form kept for a statement that holds a series twice."""
    from console.collectors import collector_connection

    cycle = [Sample("queue_depth", {"queue": f"q{i:05d}", "state": "eligible"}, float(i % 3)) for i in range(3000)]
    with collector_connection(dsn) as conn:
        samples.store(conn, cycle, at=datetime.now(UTC) - timedelta(seconds=15))
        plans: list[str] = []
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")  # each plan as a notice to this client
        for setting in ("log_nested_statements = on", "log_level = notice", "log_min_duration = 0"):
            conn.execute(f"SET auto_explain.{setting}")
        samples.store(conn, cycle)
        conn.execute("SET auto_explain.log_min_duration = -1")
    merge = [p for p in plans if "Merge on samples_latest" in p]
    assert len(merge) == 1, plans
    assert "Hash" in merge[0] and "samples_latest_pkey" not in merge[0], merge[0]
    assert not [p for p in plans if "Insert on samples_latest" in p], plans  # not the grouped form


def test_a_new_series_another_transaction_stored_meanwhile_is_updated(dsn, conn):
    """Two writers store the same new series at once (a script beside the scheduler): the second
    one's MERGE finds no row, then meets the first one's insert (unique_violation once it
    commits), and the trigger falls back to the grouped upsert (migration 037): the newer value
    is kept and the second store does not fail."""
    import threading

    from console.db import connect

    now = datetime.now(UTC)
    series = {"queue": "raced", "state": "eligible"}
    with connect(dsn, autocommit=False) as first:
        samples.store(first, [Sample("queue_depth", series, 1, now - timedelta(seconds=15))])
        failed: list[BaseException] = []

        def second() -> None:
            try:
                with connect(dsn) as other:
                    samples.store(other, [Sample("queue_depth", series, 2, now)])
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                failed.append(exc)

        writer = threading.Thread(target=second)
        writer.start()
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()").fetchone()[0]:
            assert datetime.now(UTC) < deadline, "the second store never waited for the first"
        first.commit()
        writer.join(10)
    assert not failed, failed
    assert latest_rows(conn)["raced"] == (2, now, now)
