"""Stored samples: the shared record that collectors write and pages, alerts, the advisor and
`/metrics` read. Metric names are the canonical ones in `console.catalog`.

A `Sample` is (metric, labels, value, at); `value is None` means "not available". Reads are
bounded by time and walk `samples_metric_time_idx`; none scans the whole table.

This module does not measure anything (`console.collectors` does) and does not decide what is
healthy (alerts and the advisor do).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from console.catalog import check_metric
from console.sqlfiles import query


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float | None = None
    at: datetime | None = None

    def label_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


def store(conn: psycopg.Connection, samples: Iterable[Sample], at: datetime | None = None) -> int:
    """Insert samples in one statement; `at` (default now) applies to those without their own."""
    rows = list(samples)
    if not rows:
        return 0
    for sample in rows:
        check_metric(sample.metric)
    by_time: dict[datetime, list[Sample]] = {}
    default_at = at or datetime.now(UTC)
    for sample in rows:
        by_time.setdefault(sample.at or default_at, []).append(sample)
    with conn.cursor() as cur:
        for when, group in by_time.items():
            cur.execute(
                query("samples", "insert_samples"),
                {
                    "at": when,
                    "metrics": [s.metric for s in group],
                    "labels": Jsonb([_text_labels(s.labels) for s in group]),  # one JSON array
                    "values": [None if s.value is None else float(s.value) for s in group],
                },
            )
    return len(rows)


def _text_labels(labels: dict[str, Any]) -> dict[str, str]:
    """Label values are stored as text; the collectors' are already (a copy only when not)."""
    for value in labels.values():
        if type(value) is not str:
            return {k: str(v) for k, v in labels.items()}
    return labels


def latest(conn: psycopg.Connection, metric: str | None = None, *, within: timedelta = timedelta(minutes=10)) -> list[Sample]:
    """The newest sample of each (metric, labels) stored within `within` (default 10 min)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("samples", "latest"), {"metric": metric, "within": within.total_seconds()}).fetchall()
    return [Sample(r["metric"], r["labels"], r["value"], r["collected_at"]) for r in rows]


def latest_of_queues(conn: psycopg.Connection, metric: str, queues: list[str], *,
                     within: timedelta = timedelta(minutes=10)) -> list[tuple[str, float | None]]:
    """(queue, value) of the newest sample of each series of `metric` whose queue is one of
    `queues`, an external source's left out, in `latest`'s order: what a page reads for the rows
    it shows, instead of every queue's series."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return cur.execute(query("samples", "latest_of_queues"), {
            "metric": metric, "queues": list(queues), "within": within.total_seconds()}).fetchall()


def latest_labelled(conn: psycopg.Connection, metrics: list[str], labels: dict[str, str], *,
                    within: timedelta = timedelta(minutes=10)) -> list[Sample]:
    """The newest sample of each series of `metrics` whose labels include `labels`."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("samples", "latest_labelled"), {"metrics": list(metrics), "labels": Jsonb(labels),
                                                                  "within": within.total_seconds()}).fetchall()
    return [Sample(r["metric"], r["labels"], r["value"], r["collected_at"]) for r in rows]


# The per-cycle totals across queues that migration 032's trigger stores in
# skiplock.samples_totals: {metric: (how the queues' values are combined, the labels kept)}.
# Every other label (queue, system, backend) is summed (or maxed) over; series of an external
# source (label external) are left out. A chart of one of these metrics, not split, whose
# filter names only kept labels and which combines the same way, reads the total
# (console/web/overview.py `chart_lines`). Keep in step with the trigger's SQL.
TOTALS: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue_depth": ("sum", ("state",)),
    "queue_age_seconds": ("max", ()),
    "dead_letters": ("sum", ()),
}


def has_total(metric: str, where: dict[str, str] | None = None, agg: str = "sum") -> bool:
    """Whether skiplock.samples_totals holds `metric` totalled as `agg` over every label
    `where` does not name (so the total, filtered by `where`, is the chart's line)."""
    spec = TOTALS.get(metric)
    return spec is not None and spec[0] == agg and set(where or {}) <= set(spec[1])


QUEUE_MEMORY = timedelta(hours=24)


def queue_activity(conn: psycopg.Connection, *, within: timedelta = QUEUE_MEMORY, cap: int = 1000) -> dict[str, dict[str, Any]]:
    """{queue: {last_seen, last_busy}} for every queue the collectors reported within `within`
    (default 24 h): a queue that emptied stays known, and `last_busy` (the newest sample in
    which it had eligible, scheduled or running jobs; None when none in the window) says since
    when it is idle. Reads queue_depth samples only, never the jobs table."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("samples", "queue_activity"),
                           {"within": within.total_seconds(), "cap": cap}).fetchall()
    return {r["queue"]: {"last_seen": r["last_seen"], "last_busy": r["last_busy"]} for r in rows}


def series(
    conn: psycopg.Connection,
    metric: str,
    *,
    since: datetime | timedelta,
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Points [{at, labels, value}] of one metric since a time. Windows over 6 h read the
    per-minute rollup, over 2 days the per-hour rollup, so a 7-day chart stays cheap."""
    check_metric(metric)
    start = datetime.now(UTC) - since if isinstance(since, timedelta) else since
    span = datetime.now(UTC) - start
    params = {"metric": metric, "since": start, "labels": Jsonb(labels) if labels else None}
    with conn.cursor(row_factory=dict_row) as cur:
        if span <= timedelta(hours=6):
            return cur.execute(query("samples", "series_raw"), params).fetchall()
        resolution = "minute" if span <= timedelta(days=2) else "hour"
        rows = cur.execute(query("samples", "series_rollup"), {**params, "resolution": resolution}).fetchall()
        if rows:
            return rows
        return cur.execute(query("samples", "series_raw"), params).fetchall()


def last_collection(conn: psycopg.Connection) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("samples", "last_collection")).fetchone()


def latest_cycle(conn: psycopg.Connection) -> list[Sample]:
    """Every sample stored by the newest collection cycle (empty before the first)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("samples", "latest_cycle")).fetchall()
    return [Sample(r["metric"], r["labels"], r["value"], r["collected_at"]) for r in rows]
