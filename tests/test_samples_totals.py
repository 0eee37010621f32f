"""Each cycle's totals across queues (migration 031, skiplock.samples_totals): what the overview's
charts draw past charts.MAX_LINES queues, read as one series instead of every queue's samples
(docs/benchmarks.md, "The history's reads at width"). Real samples in a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console import samples
from console.collectors import retention
from console.samples import Sample
from console.web import charts, overview

FIG = {f.key: f for f in overview.FIGURES}
HOUR = timedelta(hours=1)
WIDE = charts.MAX_LINES + 2


def cycle(conn, at: datetime, queues: int, *, value: float = 2.0) -> None:
    """One cycle of `queues` queues as the queue collector stores it, plus an external source's."""
    rows = []
    for i in range(queues):
        q = {"queue": f"q{i}", "system": "skiplock"}
        rows += [Sample("queue_depth", {**q, "state": "eligible"}, value + i),
                 Sample("queue_depth", {**q, "state": "running"}, None if i == 0 else 1.0),
                 Sample("queue_age_seconds", q, 10.0 * i),
                 Sample("dead_letters", q, 3.0),
                 Sample("stuck_leases", q, 1.0)]
    rows += [Sample("queue_depth", {"queue": "x", "state": "eligible", "external": "pgq"}, 1000.0),
             Sample("queue_age_seconds", {"queue": "x", "external": "pgq"}, 99_999.0)]
    samples.store(conn, rows, at=at)


def totals(conn) -> dict[tuple, float | None]:
    rows = conn.execute("SELECT collected_at, metric, labels, value FROM skiplock.samples_totals").fetchall()
    return {(at, metric, tuple(sorted(labels.items()))): value for at, metric, labels, value in rows}


def summed(conn) -> dict[tuple, float | None]:
    """The same totals computed from the samples, as the charts summed them before 032."""
    rows = conn.execute("""
        SELECT collected_at, metric,
               CASE WHEN metric = 'queue_depth' THEN jsonb_build_object('state', labels ->> 'state') ELSE '{}' END,
               CASE WHEN metric = 'queue_age_seconds' THEN max(value) ELSE sum(value) END
        FROM skiplock.samples
        WHERE metric IN ('queue_depth', 'queue_age_seconds', 'dead_letters') AND NOT labels ? 'external'
        GROUP BY 1, 2, 3""").fetchall()
    return {(at, metric, tuple(sorted(labels.items()))): value for at, metric, labels, value in rows}


def test_each_cycle_stores_the_total_across_queues_of_what_the_charts_sum(conn):
    now = datetime.now(UTC)
    for minutes_ago in (2, 1, 0):
        cycle(conn, now - timedelta(minutes=minutes_ago), WIDE)
    got = totals(conn)
    assert got == summed(conn)
    at = max(k[0] for k in got)
    assert got[(at, "queue_depth", (("state", "eligible"),))] == sum(2.0 + i for i in range(WIDE))
    assert got[(at, "queue_depth", (("state", "running"),))] == WIDE - 1.0  # a None is not a zero
    assert got[(at, "queue_age_seconds", ())] == 10.0 * (WIDE - 1)  # the oldest, the external one left out
    assert got[(at, "dead_letters", ())] == 3.0 * WIDE
    assert not any(k[1] == "stuck_leases" for k in got)
    assert set(samples.TOTALS) == {k[1] for k in got}


def test_a_total_of_series_that_were_all_not_available_is_not_available(conn):
    samples.store(conn, [Sample("dead_letters", {"queue": f"q{i}"}, None) for i in range(3)])
    assert list(totals(conn).values()) == [None]


def test_past_the_line_limit_the_charts_read_the_totals(conn):
    now = datetime.now(UTC)
    for minutes_ago in (3, 2, 1):
        cycle(conn, now - timedelta(minutes=minutes_ago), WIDE)
    expected = {"depth": sum(2.0 + i for i in range(WIDE)), "age": 10.0 * (WIDE - 1), "dead_letters": 3.0 * WIDE}
    for key, value in expected.items():
        lines = overview._series(conn, FIG[key], HOUR)
        assert [line.label for line in lines] == ["all"]
        assert {v for _, v in lines[0].points} == {value}, key
    # The chart is what the totals say (they are what it reads), not a sum of the samples; the
    # first total is past the window's first bucket, so its bucket is summed from the samples
    # (they may hold older cycles: test_history_stored_before_the_totals_...).
    conn.execute("UPDATE skiplock.samples_totals SET value = value + 1000")
    for key, value in expected.items():
        assert [v for _, v in overview._series(conn, FIG[key], HOUR)[0].points] == [value, value + 1000, value + 1000], key


def test_a_chart_split_by_queue_or_filtered_by_another_label_reads_the_samples(conn):
    now = datetime.now(UTC)
    cycle(conn, now - timedelta(minutes=1), 3)
    conn.execute("UPDATE skiplock.samples_totals SET value = -1")
    lines = overview._series(conn, FIG["depth"], HOUR)
    assert sorted(line.label for line in lines) == ["q0", "q1", "q2"]
    assert overview.chart_lines(conn, "queue_depth", HOUR, where={"queue": "q1", "state": "eligible"})[0].points[0][1] == 3.0
    assert not samples.has_total("queue_depth", {"system": "skiplock"})
    assert not samples.has_total("queue_age_seconds", agg="sum")
    assert samples.has_total("queue_depth", {"state": "eligible"})


def test_history_stored_before_the_totals_is_summed_from_the_samples(conn):
    """Older history has no totals (stored before migration 032): those buckets are summed from
    the samples as before, the later ones read the totals; no totals at all reads the samples."""
    now = datetime.now(UTC)
    for minutes_ago in (50, 30, 10, 5):
        cycle(conn, now - timedelta(minutes=minutes_ago), WIDE)
    depth = sum(2.0 + i for i in range(WIDE))
    conn.execute("DELETE FROM skiplock.samples_totals WHERE collected_at < %s", (now - timedelta(minutes=20),))
    conn.execute("UPDATE skiplock.samples_totals SET value = value + 1000")  # marks what came from the totals
    (line,) = overview._series(conn, FIG["depth"], HOUR)
    # the bucket holding the first total is summed from the samples too (it may hold older ones)
    assert [v for _, v in line.points] == [depth, depth, depth, depth + 1000]
    assert [at for at, _ in line.points] == sorted(at for at, _ in line.points)
    conn.execute("DELETE FROM skiplock.samples_totals")
    (line,) = overview._series(conn, FIG["depth"], HOUR)
    assert [v for _, v in line.points] == [depth] * 4


def test_retention_deletes_totals_with_the_raw_samples_and_truncate_empties_them(conn):
    now = datetime.now(UTC)
    cycle(conn, now - timedelta(hours=3), 2)
    cycle(conn, now, 2)
    result = retention.run(conn, retention.RetentionSettings(raw=timedelta(hours=2)))
    assert result.deleted["totals"] == 4  # the old cycle's: two depth states, the age, the dead letters
    assert {k[0] for k in totals(conn)} == {now}
    conn.execute("TRUNCATE skiplock.samples")
    assert totals(conn) == {}
