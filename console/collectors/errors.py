"""The collectors' own failures, as the pages show them: per collector and per
[[external_queues]] source, how many of the recent cycles failed and the newest error with when.

A cycle records each collector's error (skiplock.collection_runs.collectors) and each source's
(its details, `external_sources`); the samples only say 1 (`collector_errors`,
`external_source_errors`). This module reads the messages back so that every error counted is
also shown, even after a later cycle went well. It reads the cycles of a bounded window (an hour
by default, at most `MAX_RUNS` of them) through the started_at index; it does not collect.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from console.sqlfiles import query

WINDOW_S = 3600.0
MAX_RUNS = 1000  # an hour of cycles at 3.6 s; the default interval is 10 s (360)


def recent_errors(conn: psycopg.Connection, window_s: float = WINDOW_S) -> list[dict[str, Any]]:
    """[{kind: collector|external, name, cycles, errors, last_error, last_error_at, last_cycle_at,
    failing_now}], collectors first, by name."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("collectors_runs", "recent_errors"),
                           {"window": window_s, "max_runs": MAX_RUNS}).fetchall()


__all__ = ["MAX_RUNS", "WINDOW_S", "recent_errors"]
