"""The outbox: durable, ordered, retried delivery of notifications.

`enqueue()` runs inside the evaluator's transaction, so a notification exists if and only if
the transition that caused it committed. `Sender.run_once()` (the scheduler's delivery job, or
`skiplock alerts deliver`) then works the outbox one row at a time:

1. claim the oldest due row whose earlier siblings for the same alert and destination are all
   settled (in order per alert), in one autocommit statement that sets a lease
   (`locked_until`); no transaction is open during the HTTP call;
2. send it with the destination's transport (one deadline for the whole exchange, and the
   address policy checked on the addresses the host resolves to now);
3. settle it in one short transaction with a delivery-log row: `delivered`; `pending` again
   with exponential backoff (`retry_base` doubling up to `retry_cap`, or the receiver's
   Retry-After) for a transient failure; `failed` for a permanent one (4xx other than 408/429);
   `gave_up` when a transient failure happens after `give_up_after` seconds.

A sender that dies mid-send leaves a lease that expires; the next sender (a restarted scheduler)
claims the row again and sends it with the same idempotency key, so receivers that honour the
key see each transition once, and nothing is lost. Delivery is at least once.

This module does not decide what to notify (`evaluate` does) nor how to format it (`transports`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.alerts.rules import Destination
from console.alerts.transports import DeliveryError, PermanentError, TransientError, transport_for
from console.db import time_limited
from console.sqlfiles import query

log = logging.getLogger(__name__)

LEASE_MARGIN = 30.0  # seconds beyond the send timeout before another sender may take a row over


def enqueue(conn: psycopg.Connection, *, alert_id: int | None, event_id: int | None, destinations: Iterable[str],
            notification: Mapping[str, Any]) -> int:
    """Write one outbox row per destination in the caller's transaction; return how many.
    A second enqueue of the same idempotency key to the same destination is a no-op. Rows are
    stamped with the database clock (give-up and backoff count from there)."""
    count = 0
    with conn.cursor() as cur:
        for name in destinations:
            row = cur.execute(query("alerts", "outbox_insert"), {
                "event_id": event_id, "alert_id": alert_id, "destination": name,
                "idempotency_key": notification["idempotency_key"], "notification": Jsonb(dict(notification)),
            }).fetchone()
            count += row is not None
    return count


def backoff(attempt: int, base: float, cap: float, *, jitter: float = 0.1) -> float:
    """Seconds before retry number `attempt` (1-based): base, 2*base, 4*base ... up to cap,
    shortened by up to `jitter` of itself so retries to one receiver do not synchronise."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return delay * (1 - random.random() * jitter)


@dataclass
class SendReport:
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    gave_up: int = 0
    outcomes: list[tuple[int, str, str]] = field(default_factory=list)  # (outbox id, destination, outcome)

    @property
    def attempted(self) -> int:
        return self.delivered + self.retried + self.failed + self.gave_up


class Sender:
    """Works the outbox. `destinations` is a callable returning the destinations in force
    (re-read each run, so a URL fixed in the UI applies to the next retry)."""

    def __init__(self, conn: psycopg.Connection, destinations: Callable[[], Mapping[str, Destination]], settings,
                 *, lease: float | None = None):
        if not conn.autocommit:
            raise ValueError("the sender needs an autocommit connection (each step is its own short transaction)")
        self.conn = conn
        self.destinations = destinations
        self.settings = settings
        # How long a claimed row stays ours: past it, another sender may take the row over.
        self.lease = lease if lease is not None else settings.delivery_timeout * 2 + LEASE_MARGIN

    def run_once(self, *, limit: int | None = None, budget: float | None = None) -> SendReport:
        """Send due notifications until none is due, `limit` were attempted or `budget` seconds
        passed; return what happened."""
        limit = limit or self.settings.delivery_batch
        deadline = time.monotonic() + budget if budget else None
        report = SendReport()
        known = dict(self.destinations())
        while report.attempted < limit and (deadline is None or time.monotonic() < deadline):
            row = self._claim()
            if row is None:
                break
            outcome = self._deliver(row, known.get(row["destination"]))
            report.outcomes.append((row["id"], row["destination"], outcome))
            setattr(report, outcome, getattr(report, outcome) + 1)
        return report

    def _claim(self) -> dict[str, Any] | None:
        with time_limited(self.conn, self.settings.statement_timeout_ms) as cur:
            return cur.execute(query("alerts", "outbox_claim"), {"lease": self.lease}).fetchone()

    def _deliver(self, row: Mapping[str, Any], destination: Destination | None) -> str:
        status: int | None = None
        duration: float | None = None
        retry_after: float | None = None
        if destination is None:
            outcome, error = "failed", f"destination {row['destination']!r} is no longer configured"
        else:
            try:
                transport = transport_for(destination, timeout=self.settings.delivery_timeout,
                                          allow_private=self.settings.allow_private_destinations)
                result = transport.send(row["notification"])
                outcome, error, status, duration = "delivered", None, result.status, result.duration_ms
            except PermanentError as exc:
                outcome, error, status, duration = "failed", str(exc), exc.status, exc.duration_ms
            except TransientError as exc:
                outcome, error, status, duration = "retried", str(exc), exc.status, exc.duration_ms
                retry_after = exc.retry_after
            except DeliveryError as exc:  # pragma: no cover - every transport raises a subclass
                outcome, error, status, duration = "failed", str(exc), exc.status, exc.duration_ms
        next_at = None
        if outcome == "retried":
            age = (self._now() - row["created_at"]).total_seconds()
            if age >= self.settings.give_up_after:
                outcome = "gave_up"
                error = f"{error}; gave up after {age:.0f}s and {row['attempts']} attempts"
            else:
                delay = backoff(row["attempts"], self.settings.retry_base, self.settings.retry_cap)
                if retry_after is not None:
                    delay = min(max(delay, retry_after), self.settings.retry_cap)
                next_at = self._now() + timedelta(seconds=delay)
        status_column = {"delivered": "delivered", "retried": "pending", "failed": "failed", "gave_up": "gave_up"}[outcome]
        log_outcome = {"delivered": "delivered", "retried": "retry", "failed": "failed", "gave_up": "gave_up"}[outcome]
        with time_limited(self.conn, self.settings.statement_timeout_ms):
            settled = self.conn.execute(query("alerts", "outbox_settle"), {
                "id": row["id"], "attempt": row["attempts"], "status": status_column, "next_attempt_at": next_at,
                "error": error,
            }).fetchone()
            if settled is None:
                # Our lease ran out and another sender took the row over: it records its own attempt.
                log.warning("outbox %s: lease lost before settling attempt %s", row["id"], row["attempts"])
            self.conn.execute(query("alerts", "delivery_log_insert"), {
                "outbox_id": row["id"], "destination": row["destination"], "attempt": row["attempts"],
                "outcome": log_outcome, "http_status": status, "error": error, "duration_ms": duration,
            })
        if outcome != "delivered":
            log.warning("alert delivery %s to %s (attempt %s): %s: %s", row["id"], row["destination"],
                        row["attempts"], log_outcome, error)
        return outcome

    def _now(self) -> datetime:
        return self.conn.execute("SELECT now()").fetchone()[0]


@dataclass(frozen=True)
class TestResult:
    ok: bool
    status: int | None
    message: str
    duration_ms: float | None


def send_test(conn: psycopg.Connection | None, destination: Destination, *, timeout: float = 10.0,
              allow_private: bool = False) -> TestResult:
    """Send a test notification now (no outbox, no retry) and return the receiver's real answer;
    logged in the delivery log when a connection is given. `allow_private` is the address policy's
    setting (alerts.allow_private_destinations)."""
    transport = transport_for(destination, timeout=timeout, allow_private=allow_private)
    try:
        result = transport.send(transport.test_notification())
        outcome = TestResult(True, result.status, f"HTTP {result.status}" + (f": {result.answer}" if result.answer else ""),
                             result.duration_ms)
    except DeliveryError as exc:
        kind = "permanent" if isinstance(exc, PermanentError) else "temporary"
        outcome = TestResult(False, exc.status, f"{exc} ({kind} failure)", exc.duration_ms)
    if conn is not None:
        with conn.transaction():
            conn.execute(query("alerts", "delivery_log_insert"), {
                "outbox_id": None, "destination": destination.name, "attempt": 1,
                "outcome": "test_ok" if outcome.ok else "test_failed", "http_status": outcome.status,
                "error": None if outcome.ok else outcome.message, "duration_ms": outcome.duration_ms,
            })
    return outcome


def delivery_log(conn: psycopg.Connection, *, limit: int = 50, before_id: int | None = None,
                 destination: str | None = None, alert_id: int | None = None) -> list[dict[str, Any]]:
    if not 1 <= limit <= 500:
        raise ValueError("limit must be between 1 and 500")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "delivery_log"), {"limit": limit, "before_id": before_id,
                                                             "destination": destination, "alert_id": alert_id}).fetchall()


def pending_summary(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "outbox_pending_summary")).fetchall()


def recent(conn: psycopg.Connection, *, limit: int = 50, alert_id: int | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "outbox_recent"), {"limit": limit, "alert_id": alert_id}).fetchall()


def prune_events(conn: psycopg.Connection, *, keep: timedelta, batch: int = 1000, max_batches: int = 10) -> int:
    """Delete alert history (`alert_events`) older than `keep`, in batches of `batch` rows, each
    its own short transaction; events of alerts not ok now and events a notification still
    references stay. Returns how many rows went."""
    cutoff = conn.execute("SELECT now()").fetchone()[0] - keep
    removed = 0
    for _ in range(max_batches):
        with conn.transaction():
            count = conn.execute(query("alerts", "prune_events"), {"cutoff": cutoff, "batch": batch}).rowcount
        removed += count
        if count < batch:
            break
    return removed


def prune(conn: psycopg.Connection, *, keep: timedelta, batch: int = 1000, max_batches: int = 10) -> int:
    """Delete delivery-log rows and settled notifications older than `keep`, in batches of
    `batch` rows (each its own short transaction); return how many rows went."""
    cutoff = conn.execute("SELECT now()").fetchone()[0] - keep
    removed = 0
    for name in ("prune_deliveries", "prune_outbox"):
        for _ in range(max_batches):
            with conn.transaction():
                count = conn.execute(query("alerts", name), {"cutoff": cutoff, "batch": batch}).rowcount
            removed += count
            if count < batch:
                break
    return removed
