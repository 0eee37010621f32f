"""Helpers for the collector tests: run a cycle, read values out of its report, wait for
statistics (PostgreSQL flushes a backend's counters about once a second after commit)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from console.collectors import CollectionReport, Options, collect, collector_connection


def cycle(dsn: str, options: Options | None = None, **kwargs: Any) -> CollectionReport:
    options = options or Options()
    with collector_connection(dsn, options) as conn:
        return collect(conn, options, **kwargs)


def values(report: CollectionReport, metric: str, **labels: str) -> list[float | None]:
    return [s.value for s in report.samples if s.metric == metric and all(s.labels.get(k) == v for k, v in labels.items())]


def value(report: CollectionReport, metric: str, **labels: str) -> float | None:
    found = values(report, metric, **labels)
    assert len(found) == 1, f"{metric} {labels}: expected one sample, got {found}"
    return found[0]


def flush_stats(conn) -> None:
    """Ask this backend to flush its pending statistics when it goes idle (PG 15+), instead of
    waiting up to the 1-10 s PostgreSQL otherwise allows itself."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")


def eventually(check: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.2) -> Any:
    """Retry `check` until it returns something truthy (statistics arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        time.sleep(interval)
