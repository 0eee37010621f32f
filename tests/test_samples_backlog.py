"""Each queue's eligible backlog per cycle (migration 035, skiplock.samples_backlog): what the
Queues page's drain estimates read for the rows it shows, instead of every queue's samples of
15 minutes (docs/benchmarks.md, "The pages and one cycle at width"). The table must say what
the samples say: these tests compare it, and `backlog_points` read from it, with the samples
themselves. Real samples in a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console import browse, samples
from console.samples import Sample

QUEUES = ["a", "b", "c", "dual"]


def cycle(conn, at: datetime, step: int, *, only: list[str] | None = None) -> None:
    """One cycle as the collectors store it: each queue's depth by state (a NULL now and then),
    a queue served by both backends (two eligible series, summed), an external source's series
    (left out), other metrics (left out)."""
    rows = []
    for i, name in enumerate(only or QUEUES):
        q = {"queue": name, "system": "skiplock"}
        eligible = None if (name == "b" and step % 3 == 0) else float(10 * i + step)
        rows += [Sample("queue_depth", {**q, "state": "eligible"}, eligible),
                 Sample("queue_depth", {**q, "state": "running"}, 1.0),
                 Sample("queue_age_seconds", q, 5.0)]
        if name == "dual":
            rows.append(Sample("queue_depth", {"queue": name, "state": "eligible", "backend": "nats"}, 100.0 + step))
    rows.append(Sample("queue_depth", {"queue": "a", "state": "eligible", "external": "pgq"}, 1000.0))
    samples.store(conn, rows, at=at)


def kept(conn) -> dict[tuple[str, datetime], float]:
    return {(q, at): v for q, at, v in conn.execute("SELECT queue, collected_at, value FROM skiplock.samples_backlog")}


def summed(conn) -> dict[tuple[str, datetime], float]:
    """The same from the samples of the last 30 minutes, as backlog_points summed them before 035."""
    rows = conn.execute("""
        SELECT labels ->> 'queue', collected_at, sum(value)
        FROM skiplock.samples
        WHERE metric = 'queue_depth' AND labels ->> 'state' = 'eligible' AND NOT labels ? 'external'
          AND value IS NOT NULL AND collected_at >= now() - interval '30 minutes'
        GROUP BY 1, 2""").fetchall()
    return {(q, at): v for q, at, v in rows}


def from_samples(conn, monkeypatch, **kwargs):
    """backlog_points as it read before 035: every queue's samples of the window."""
    with monkeypatch.context() as m:
        m.setattr(browse, "BACKLOG_KEPT", timedelta(0))
        return browse.backlog_points(conn, **kwargs)


def test_each_cycle_keeps_each_queues_backlog_as_its_samples_sum_it(conn, monkeypatch):
    now = datetime.now(UTC)
    for step in range(12):
        cycle(conn, now - timedelta(minutes=22) + timedelta(minutes=2 * step), step,
              only=QUEUES if step >= 4 else ["a", "dual"])  # b and c appear later
    got = kept(conn)
    assert got == summed(conn) and len(got) == 4 * 8 + 2 * 4 - 2  # b's two NULLs are no row
    newest = max(at for _, at in got)
    assert got[("dual", newest)] == 30.0 + 11 + 100.0 + 11  # both backends, the external left out
    # The page's read: the same points as from the samples, for the queues asked only.
    for queues in (["b", "dual"], ["c"], ["a", "b", "c", "dual", "nowhere"]):
        points = browse.backlog_points(conn, queues=queues)
        assert points == {q: p for q, p in from_samples(conn, monkeypatch).items() if q in queues and p}, queues
        assert set(points) <= set(queues)
    assert browse.backlog_points(conn) == {q: p for q, p in from_samples(conn, monkeypatch).items() if p}
    # A window longer than the table keeps reads the samples.
    assert browse.backlog_points(conn, timedelta(hours=1), queues=["c"]) == \
        from_samples(conn, monkeypatch, window=timedelta(hours=1), queues=["c"])


def test_a_cycle_stored_in_parts_adds_up(conn):
    at = datetime.now(UTC)
    samples.store(conn, [Sample("queue_depth", {"queue": "q", "state": "eligible"}, 3.0)], at=at)
    samples.store(conn, [Sample("queue_depth", {"queue": "q", "state": "eligible", "backend": "nats"}, 4.0),
                         Sample("queue_depth", {"queue": "q", "state": "eligible", "backend": "x"}, None)], at=at)
    assert kept(conn) == summed(conn) == {("q", at): 7.0}


def test_old_rows_go_and_old_history_is_not_copied(conn):
    now = datetime.now(UTC)
    cycle(conn, now - timedelta(minutes=45), 1)  # a script storing history: not copied
    assert kept(conn) == {}
    cycle(conn, now - timedelta(minutes=29), 2)
    assert len(kept(conn)) == 4
    conn.execute("INSERT INTO skiplock.samples_backlog VALUES ('a', now() - interval '31 minutes', 1)")
    cycle(conn, now, 4)  # the next insert deletes what is older than 30 minutes
    assert kept(conn) == summed(conn) and len(kept(conn)) == 8


def test_deletes_updates_and_truncates_of_samples_keep_it_right(conn):
    now = datetime.now(UTC)
    for step in range(3):
        cycle(conn, now - timedelta(minutes=3 - step), step + 1)
    # A delete of recent samples (a script, a test): the touched pairs summed again.
    conn.execute("DELETE FROM skiplock.samples WHERE labels @> '{\"queue\": \"dual\", \"backend\": \"nats\"}'")
    conn.execute("DELETE FROM skiplock.samples WHERE labels @> '{\"queue\": \"c\", \"state\": \"eligible\"}' "
                 "AND collected_at = (SELECT min(collected_at) FROM skiplock.samples)")
    assert kept(conn) == summed(conn)
    # An update (moving samples in time, changing a value): both the old and new pairs again.
    conn.execute("UPDATE skiplock.samples SET value = value * 2 WHERE labels @> '{\"queue\": \"a\"}'")
    conn.execute("UPDATE skiplock.samples SET collected_at = collected_at - interval '1 minute' "
                 "WHERE labels @> '{\"queue\": \"b\"}'")
    assert kept(conn) == summed(conn)
    # Retention deletes samples 48 h old: nothing here moves.
    before = kept(conn)
    cycle(conn, now - timedelta(hours=49), 9)
    conn.execute("DELETE FROM skiplock.samples WHERE collected_at < now() - interval '48 hours'")
    assert kept(conn) == before
    conn.execute("TRUNCATE skiplock.samples")
    assert kept(conn) == {}
