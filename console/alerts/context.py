"""What an alert shows around it: where to look first (with a new error group, which needs the
database), the metric's series over the alert's lifetime and what operators changed just before
it fired (pauses, limit changes, replays: the audit log).

`look_here` is the one list of links for an alert that the alert page, its API and every webhook
payload show (the evaluator calls it when it writes a notification), so they never disagree.

Every read is bounded: the series is one metric's samples over at most `MAX_SPAN`, reduced to
about `POINTS` buckets in the database (`samples_metric_time_idx`); the changes are at most
`limit` audit rows of a `CHANGES_BEFORE` window (`audit_log_at_idx`); the new error groups are
the dead-letters page's groups query (an index-only scan of `jobs_failed_groups_idx`). The
caller runs the series and the changes under a statement timeout (the web's `run_panel`);
`look_here` sets its own.

This module draws nothing and sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.alerts import links
from console.db import time_limited
from console.redaction import DEFAULT_KEYS, redact_text
from console.sqlfiles import query

log = logging.getLogger(__name__)

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


def new_error_groups(conn: psycopg.Connection, queue: str, fired: datetime, *,
                     timeout_ms: int) -> list[dict[str, Any]]:
    """Error groups of `queue` first seen since CHANGES_BEFORE before `fired` (among its 100
    largest), largest first: the groups the dead-letters page shows, so the link lands on them."""
    from console.maintenance.deadletters import groups

    since = fired - CHANGES_BEFORE
    return [g for g in groups(conn, queue=queue, limit=100, timeout_ms=timeout_ms)
            if g["first_seen"] and g["first_seen"] >= since]


def error_group(conn: psycopg.Connection, metric: str | None, labels: Mapping[str, str] | None, *,
                timeout_ms: int, secret_keys: frozenset[str] = DEFAULT_KEYS) -> dict[str, Any] | None:
    """What the console remembers of the error group a new_error_group alert is about (metric
    `error_group_new`, label `fingerprint`): when it was first and last seen, how long it was
    quiet before it came back, its kinds, queues and an example, with the values of
    `secret_keys` hidden (the alert page and every webhook show it). None for another metric, a
    group the console does not remember, or a read that failed or timed out (logged; a lost
    connection raises)."""
    fingerprint = (labels or {}).get("fingerprint")
    if metric != "error_group_new" or not fingerprint:
        return None
    try:
        with time_limited(conn, timeout_ms) as cur:
            row = cur.execute(query("error_groups", "get"), {"fingerprint": fingerprint}).fetchone()
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        log.warning("error group of an alert not read: %s", exc.__class__.__name__)
        return None
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        log.warning("error group of an alert not read: %s (%s)", exc.__class__.__name__, exc.sqlstate)
        return None
    if row is None:
        return None

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {"fingerprint": redact_text(row["fingerprint"], secret_keys), "change": row["change"],
            "first_seen": iso(row["first_seen"]), "last_seen": iso(row["last_seen"]),
            "change_at": iso(row["change_at"]), "previous_seen": iso(row["previous_seen"]),
            "kinds": list(row["kinds"]), "queues": list(row["queues"]),
            "example": redact_text(row["example"], secret_keys) if row["example"] else None,
            "example_job": row["example_job"], "ignored": row["ignored_at"] is not None}


def look_here(conn: psycopg.Connection, metric: str | None, labels: Mapping[str, str] | None, fired: datetime, *,
              console_url: str = "", timeout_ms: int, secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[links.Link]:
    """Where to look first for an alert of `metric` with `labels` that fired at `fired`:
    `links.look_here`, and for a dead-letter alert a link per new error group of its queue in
    front (named from the error with the values of `secret_keys` hidden: links.new_error_group).
    The groups are read in a savepoint under `timeout_ms`: a slow or failed read leaves
    those links out (logged) and the caller's transaction goes on; a lost connection raises."""
    found = links.look_here(metric, labels, console_url)
    queue = (labels or {}).get("queue")
    if (metric not in links.DEAD_LETTER_METRICS or not queue or "external" in (labels or {})
            or (labels or {}).get("backend") == "nats"):
        return found  # an external or broker queue's dead letters are not in Skiplock's error groups
    try:
        fresh = new_error_groups(conn, queue, fired, timeout_ms=timeout_ms)
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        log.warning("new error groups of queue %s not read: %s", queue, exc.__class__.__name__)
        return found
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        log.warning("new error groups of queue %s not read: %s (%s)", queue, exc.__class__.__name__, exc.sqlstate)
        return found
    return links.with_new_groups(found, queue, fresh, console_url, secret_keys)


__all__ = ["CHANGES_BEFORE", "Window", "changes", "error_group", "look_here", "new_error_groups", "series", "window"]
