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
