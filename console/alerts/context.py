"""What an alert's page shows around it: the metric's series over the alert's lifetime and what
operators changed just before it fired (pauses, limit changes, replays: the audit log).

Both reads are bounded: the series is one metric's samples over at most `MAX_SPAN`, reduced to
about `POINTS` buckets in the database (`samples_metric_time_idx`); the changes are at most
`limit` audit rows of a `CHANGES_BEFORE` window (`audit_log_at_idx`). The caller runs them under
a statement timeout (the web's `run_panel`).

This module draws nothing and sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.sqlfiles import query

CHANGES_BEFORE = timedelta(minutes=30)  # "what changed": the audit log this long before firing
MARGIN = timedelta(minutes=30)          # the chart starts this long before firing
MAX_SPAN = timedelta(days=2)            # a long-firing alert shows its last two days
POINTS = 120
QUIET_ACTIONS = ("login",)              # audit rows that change nothing about the queue


@dataclass(frozen=True)
class Window:
    since: datetime  # the chart's start
    fired: datetime  # when the alert fired (or entered its current state, if it never fired)
    until: datetime  # resolved, or now

    def as_dict(self) -> dict[str, str]:
        return {"since": self.since.isoformat(), "fired": self.fired.isoformat(), "until": self.until.isoformat()}


def window(alert: Mapping[str, Any], now: datetime) -> Window:
    """The alert's lifetime with a margin before it: [fired - MARGIN, resolved or now]."""
    fired = alert.get("fired_at") or alert["state_since"]
    resolved = alert.get("resolved_at")
    until = resolved if alert.get("state") == "ok" and resolved and resolved >= fired else now
    until = max(until, fired)
    since = max(fired - MARGIN, until - MAX_SPAN)
    return Window(since=since, fired=fired, until=until)


def series(conn: psycopg.Connection, metric: str, labels: Mapping[str, str], win: Window, *,
           op: str = ">") -> list[tuple[datetime, float | None]]:
    """The alert's series over the window, in about POINTS buckets: each bucket's worst value
    (max for a `>` rule, min for a `<` rule), so a crossing is never averaged away."""
    step = max((win.until - win.since) / POINTS, timedelta(seconds=1))
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("alerts", "alert_series"), {
            "metric": metric, "labels": Jsonb(dict(labels)), "since": win.since, "until": win.until,
            "step": step, "agg": "min" if op.startswith("<") else "max",
        }).fetchall()
    return [(r["at"], r["value"]) for r in rows]


def changes(conn: psycopg.Connection, fired: datetime, *, before: timedelta = CHANGES_BEFORE,
            limit: int = 50) -> list[dict[str, Any]]:
    """Audit rows in [fired - before, fired], newest first (sign-ins left out)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("audit", "between"), {
            "since": fired - before, "until": fired, "exclude": list(QUIET_ACTIONS), "limit": limit,
        }).fetchall()


__all__ = ["CHANGES_BEFORE", "Window", "changes", "series", "window"]
