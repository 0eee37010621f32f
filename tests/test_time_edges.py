"""Time windows at their edges: the last microsecond inside a window, its end instant, and the
first microsecond after, for uniqueness windows, leases, periodic slots, sample retention and
alert silences.

Time is the database's clock, held still rather than waited for: inside one transaction now()
does not move, so a test sets an end instant relative to now() and calls the product in the
same transaction (a function that wants an autocommit connection opens a savepoint there); a
function that takes `now=` is given the instant. Nothing sleeps. Each boundary was broken once
(`<` for `<=` and the like; the mutations named in docs/reliability.md, "Time windows at their
edges") and its test went red.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import maintenance, samples
from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.rules import RuleSet, parse_destination, parse_rule
from console.collectors import retention
from console.maintenance import bulk
from console.queue import periodic
from console.samples import Sample

WINDOW = timedelta(minutes=10)
TICK = "interval '1 microsecond'"


# --- uniqueness windows ---------------------------------------------------------------------

def window(conn, key: str = "order-7") -> tuple:
    return conn.execute("SELECT job_id, created_at, expires_at FROM skiplock.unique_keys WHERE idempotency_key = %s",
                        (key,)).fetchone()


def set_window_end(conn, end_sql: str, key: str = "order-7") -> None:
    conn.execute(f"UPDATE skiplock.unique_keys SET expires_at = {end_sql} WHERE idempotency_key = %s", (key,))  # noqa: S608


def archive(conn, job_id: int) -> None:
    [job] = q.claim(conn, "edge-worker", limit=1)
    assert job.id == job_id and q.complete(conn, job)
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s", (job_id,))
    assert maintenance.archive_completed(conn, older_than=timedelta(hours=1), actor="test").rows == 1


def test_with_half_a_second_left_a_duplicate_returns_the_first_and_leaves_the_window_as_it_was(conn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    set_window_end(conn, "now() + interval '500 milliseconds'")
    before = window(conn)

    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == first

    assert window(conn) == before  # not restarted: same job, same start, same end
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1


def test_a_window_ends_at_its_end_instant_and_not_a_microsecond_before(conn, tx_conn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    archive(conn, first)  # the hot table no longer answers for the key: only the window does

    # One microsecond before the end (now() stands still inside the transaction): still held.
    set_window_end(tx_conn, f"now() + {TICK}")
    held = window(tx_conn)
    assert q.enqueue(tx_conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == first
    assert window(tx_conn) == held
    tx_conn.rollback()

    # At the end instant itself the window is over: the next enqueue is a new job with a new window.
    set_window_end(tx_conn, "now()")
    second = q.enqueue(tx_conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    assert second != first
    job_id, created_at, expires_at = window(tx_conn)
    now = tx_conn.execute("SELECT now()").fetchone()[0]
    assert (job_id, created_at, expires_at) == (second, now, now + WINDOW)
    tx_conn.commit()


def test_across_the_archive_the_window_holds_to_its_last_moment(conn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    archive(conn, first)
    set_window_end(conn, "now() + interval '500 milliseconds'")
    before = window(conn)

    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == first
    assert window(conn) == before
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0  # nothing new in the hot table


def test_across_a_replay_the_window_keeps_pointing_at_the_replayed_job(conn, dsn):
    first = q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW)
    [job] = q.claim(conn, "edge-worker", limit=1)
    assert q.fail(conn, job, q.DoNotRetry("no")) == "failed"
    before = window(conn)
    assert bulk.replay(dsn, {"ids": [first]}, actor="operator", reason="test")["done"] == 1
    assert q.get_job(conn, first)["status"] == "pending"

    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == first
    assert window(conn) == before  # the replay neither ended nor restarted the window

    # The window ends while the replayed job is still in the hot table: the next enqueue takes a
    # new window, pointing at that job, and makes no second job.
    set_window_end(conn, "now() - interval '1 millisecond'")
    assert q.enqueue(conn, "ship", {}, idempotency_key="order-7", unique_for=WINDOW) == first
    job_id, _, expires_at = window(conn)
    assert job_id == first and expires_at > conn.execute("SELECT now() + interval '9 minutes'").fetchone()[0]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1


# --- leases ---------------------------------------------------------------------------------

def test_a_lease_is_reaped_a_microsecond_after_its_expiry_and_not_at_it(conn, tx_conn):
    job_id = q.enqueue(conn, "work", {})
    [job] = q.claim(conn, "edge-worker", limit=1, lease=60)
    assert job.id == job_id

    for end, reaped in ((f"now() + {TICK}", 0), ("now()", 0), (f"now() - {TICK}", 1)):
        tx_conn.execute(f"UPDATE skiplock.jobs SET lease_until = {end} WHERE id = %s", (job_id,))  # noqa: S608
        result = q.reap(tx_conn)
        assert result["pending"] == reaped, (end, result)
        status = tx_conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]
        assert status == ("pending" if reaped else "running"), end
        tx_conn.rollback()


# --- periodic slots ---------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
BERLIN = "Europe/Berlin"


def declare(conn, raw: dict, first_sight: datetime) -> list[periodic.Entry]:
    entries = periodic.parse_entries([("[[periodic]] #1", raw, "config")])
    periodic.sync(conn, entries)
    periodic.enqueue_due(conn, entries, now=first_sight)  # first sight: nothing for the past
    return entries


def slot_keys(conn) -> list[str]:
    return [k.split(":", 2)[2] for (k,) in conn.execute(
        "SELECT idempotency_key FROM skiplock.jobs WHERE idempotency_key LIKE 'periodic:%' ORDER BY id").fetchall()]


@pytest.mark.parametrize("schedule", [{"every": "1h"}, {"cron": "0 * * * *"}], ids=["every", "cron"])
def test_a_slot_is_due_at_its_instant_and_not_a_microsecond_before(conn, schedule):
    entries = declare(conn, {"name": "hourly", "kind": "k", **schedule}, T0)
    slot = T0 + timedelta(hours=1)

    assert periodic.enqueue_due(conn, entries, now=slot - timedelta(microseconds=1)).enqueued == {}
    assert slot_keys(conn) == []
    assert periodic.enqueue_due(conn, entries, now=slot).enqueued != {}
    assert slot_keys(conn) == ["2030-01-01T04:00:00+00:00"]


@pytest.mark.parametrize(("catch_up", "expected"), [
    (True, ["04:00", "05:00", "06:00", "07:00"]),
    (False, ["07:00"]),
], ids=["catch_up", "latest_only"])
def test_a_scheduler_down_across_four_slots_and_back_on_the_fourth(conn, catch_up, expected):
    entries = declare(conn, {"name": "hourly", "kind": "k", "cron": "0 * * * *", "catch_up": catch_up}, T0)

    report = periodic.enqueue_due(conn, entries, now=T0 + timedelta(hours=4))  # back exactly at 07:00

    assert slot_keys(conn) == [f"2030-01-01T{hm}:00+00:00" for hm in expected]
    assert report.missed.get("hourly", 0) == 4 - len(expected)
    row = conn.execute("SELECT last_slot, next_slot, missed FROM skiplock.periodic").fetchone()
    assert row == (T0 + timedelta(hours=4), T0 + timedelta(hours=5), 4 - len(expected))


def test_spring_forward_a_daily_slot_in_the_missing_hour_is_skipped_not_enqueued(conn):
    # 2030-03-31, Berlin: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    entries = declare(conn, {"name": "nightly", "kind": "k", "cron": "30 2 * * *", "timezone": BERLIN,
                             "catch_up": True}, datetime(2030, 3, 30, 12, 0, tzinfo=UTC))
    report = periodic.enqueue_due(conn, entries, now=datetime(2030, 4, 1, 12, 0, tzinfo=UTC))
    assert slot_keys(conn) == ["2030-04-01T00:30:00+00:00"]  # the 30th's 02:30 CET was before; the 31st has none
    assert report.missed == {}
    next_slot = conn.execute("SELECT next_slot FROM skiplock.periodic").fetchone()[0]
    assert next_slot == datetime(2030, 4, 2, 0, 30, tzinfo=UTC)


def test_fall_back_an_hourly_cron_runs_the_repeated_hour_once_at_its_first_occurrence(conn):
    # 2030-10-27, Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
    entries = declare(conn, {"name": "halfpast", "kind": "k", "cron": "30 * * * *", "timezone": BERLIN,
                             "catch_up": True}, datetime(2030, 10, 26, 23, 45, tzinfo=UTC))
    periodic.enqueue_due(conn, entries, now=datetime(2030, 10, 27, 3, 0, tzinfo=UTC))
    assert slot_keys(conn) == ["2030-10-27T00:30:00+00:00",  # 02:30 CEST
                               "2030-10-27T02:30:00+00:00"]  # 03:30 CET; 02:30 CET (01:30 UTC) is the repeat
    assert conn.execute("SELECT missed FROM skiplock.periodic").fetchone()[0] == 0


# --- sample retention -------------------------------------------------------------------------

def test_retention_keeps_a_sample_at_the_cutoff_and_deletes_one_a_microsecond_older(tx_conn):
    settings = retention.RetentionSettings(raw=timedelta(minutes=10), minute=timedelta(days=1), hour=timedelta(days=2))
    # One metric per table: the run also folds raw samples into minutes and minutes into hours.
    tx_conn.execute(f"""
        INSERT INTO skiplock.samples (collected_at, metric, labels, value) VALUES
            (now() - interval '10 minutes', 'edge.raw', '{{"at": "cutoff"}}', 1),
            (now() - interval '10 minutes' - {TICK}, 'edge.raw', '{{"at": "older"}}', 1);
        INSERT INTO skiplock.samples_rollup (resolution, bucket, metric, labels, samples) VALUES
            ('minute', now() - interval '1 day', 'edge.minute', '{{"at": "cutoff"}}', 1),
            ('minute', now() - interval '1 day' - {TICK}, 'edge.minute', '{{"at": "older"}}', 1),
            ('hour', now() - interval '2 days', 'edge.hour', '{{"at": "cutoff"}}', 1),
            ('hour', now() - interval '2 days' - {TICK}, 'edge.hour', '{{"at": "older"}}', 1)""")  # noqa: S608

    result = retention.run(tx_conn, settings)  # now() is the transaction's: the cutoffs are exact

    assert (result.deleted["raw"], result.deleted["minute"], result.deleted["hour"]) == (1, 1, 1)
    left = tx_conn.execute("""SELECT 'raw', labels->>'at' FROM skiplock.samples WHERE metric = 'edge.raw'
                              UNION ALL
                              SELECT resolution, labels->>'at' FROM skiplock.samples_rollup
                              WHERE metric = 'edge.' || resolution
                              ORDER BY 1""").fetchall()
    assert left == [("hour", "cutoff"), ("minute", "cutoff"), ("raw", "cutoff")]
    tx_conn.rollback()


# --- alert silences ---------------------------------------------------------------------------

def test_a_silence_holds_from_its_start_instant_to_just_before_its_end(conn):
    rule = parse_rule({"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s",
                       "summary": "queue {queue} waited {value}s"})
    rules = RuleSet(rules={"queue_age": rule}, destinations={"ops": parse_destination({"name": "ops", "url": "http://127.0.0.1:9/ops"})})
    settings = ev.AlertSettings(repeat_interval=300, hysteresis=0.1, series_window=120)
    silence = ev.silence(conn, rule="queue_age", labels={"queue": "mail"}, duration=timedelta(hours=1),
                         reason="migrating the mail queue", actor="bob", ruleset=rules)
    start, end = silence["starts_at"], silence["ends_at"]
    assert end - start == timedelta(hours=1)

    def outbox() -> list[str]:
        return [r[0] for r in conn.execute("SELECT notification->'alert'->'labels'->>'queue' FROM skiplock.alert_outbox "
                                           "ORDER BY id").fetchall()]

    for at in (start, end - timedelta(microseconds=1)):  # silenced from its first instant to its last
        samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, at)])
        ev.evaluate(conn, rules, settings, now=at)
        assert outbox() == [], at
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, end)])
    ev.evaluate(conn, rules, settings, now=end)  # the end instant is no longer silenced
    assert outbox() == ["mail"]
