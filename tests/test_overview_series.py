"""The overview's charts split by queue only when they can draw each queue (console.web.overview,
`_series`): up to charts.MAX_LINES queues each get a line; past that one total line is drawn,
and the split series is never fetched (at 5,000 queues it was 600,000 rows read and thrown away
per chart, each cycle: docs/benchmarks.md, "Width"). Real samples in a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import samples
from console.web import charts, overview

DEPTH = next(f for f in overview.FIGURES if f.key == "depth")


def store_depths(conn, queues: int, *, external: int = 0) -> None:
    now = datetime.now(UTC)
    for minutes_ago in (3, 2, 1):
        at = now - timedelta(minutes=minutes_ago)
        rows = [samples.Sample("queue_depth", {"queue": f"q{i}", "state": "eligible"}, 2.0) for i in range(queues)]
        rows += [samples.Sample("queue_depth", {"queue": f"x{i}", "state": "eligible", "external": "pgq"}, 5.0)
                 for i in range(external)]
        samples.store(conn, rows, at=at)


@pytest.fixture
def calls(monkeypatch):
    """The splits chart_lines was asked for (the real function runs)."""
    made: list[str | None] = []
    real = overview.chart_lines

    def spy(conn, metric, window, **kw):
        made.append(kw.get("split_by"))
        return real(conn, metric, window, **kw)

    monkeypatch.setattr(overview, "chart_lines", spy)
    return made


def test_a_few_queues_get_a_line_each(conn, calls):
    store_depths(conn, 3, external=9)  # an external source's series are not Skiplock's queues
    assert overview.split_keys(conn, "queue_depth", timedelta(hours=1), "queue", where={"state": "eligible"}) == 3
    lines = overview._series(conn, DEPTH, timedelta(hours=1))
    assert sorted(line.label for line in lines) == ["q0", "q1", "q2"]
    assert calls == ["queue"]


def test_more_queues_than_lines_draw_one_total_without_fetching_each_queue(conn, calls):
    queues = charts.MAX_LINES + 2
    store_depths(conn, queues)
    assert overview.split_keys(conn, "queue_depth", timedelta(hours=1), "queue", where={"state": "eligible"}) == queues
    lines = overview._series(conn, DEPTH, timedelta(hours=1))
    assert [line.label for line in lines] == ["all"]
    assert {value for _, value in lines[0].points} == {2.0 * queues}
    assert calls == [None], "the split series was fetched only to be thrown away"


def test_series_older_than_the_window_do_not_count(conn):
    store_depths(conn, charts.MAX_LINES + 2)
    assert overview.split_keys(conn, "queue_depth", timedelta(seconds=30), "queue") == 0
