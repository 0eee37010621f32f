"""Realistic data for the on-call pages' tests and screenshots: an hour of stored samples (as
the collectors would write them) and dead letters in two error groups."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

from console import audit, samples
from console import queue as q
from console.samples import Sample

QUEUES = ("default", "mail", "billing")


def store_history(conn, *, failing: str | None = "billing", minutes: int = 60, step_s: int = 60,
                  now: datetime | None = None) -> None:
    """`minutes` of samples every `step_s` seconds. With `failing`, that queue's failures and
    dead letters climb over the last 20 minutes and its oldest job ages past 5 minutes."""
    now = now or datetime.now(UTC)
    steps = minutes * 60 // step_s
    for i in range(steps + 1):
        at = now - timedelta(seconds=(steps - i) * step_s)
        late = failing is not None and i > steps * 2 / 3
        wave = 1 + 0.3 * math.sin(i / 5)
        rows: list[Sample] = []
        for n, queue in enumerate(QUEUES):
            bad = late and queue == failing
            eligible = (40 + 15 * n) * wave + (i * 12 if bad else 0)
            rows += [
                Sample("queue_depth", {"queue": queue, "state": "eligible"}, round(eligible)),
                Sample("queue_depth", {"queue": queue, "state": "scheduled"}, 5 + n),
                Sample("queue_depth", {"queue": queue, "state": "running"}, 8 + n),
                Sample("queue_depth", {"queue": queue, "state": "failed"}, 3 + (i - steps * 2 // 3) * 9 if bad else 3),
                Sample("queue_age_seconds", {"queue": queue}, (400.0 + i * 3) if bad else 4.0 * wave),
                Sample("stuck_leases", {"queue": queue}, 0),
                Sample("dead_letters", {"queue": queue}, 3 + (i - steps * 2 // 3) * 9 if bad else 3),
                Sample("dead_letter_growth", {"queue": queue}, 540.0 if bad else 0.0),
            ]
        rows += [
            Sample("throughput", {"outcome": "completed"}, 42.0 * wave),
            Sample("throughput", {"outcome": "failed"}, 14.0 if late else 0.2),
            Sample("throughput", {"outcome": "retried"}, 3.0 if late else 0.5),
            Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": "p95"}, 0.004 * wave),
            Sample("workers_live", {}, 4),
            Sample("workers_in_flight", {}, 27),
            Sample("table_dead_tuples", {"table": "jobs"}, 20_000 + 900 * (i % 20)),
            Sample("table_live_tuples", {"table": "jobs"}, 250_000),
            Sample("table_dead_ratio", {"table": "jobs"}, 0.08),
            Sample("table_autovacuum_threshold", {"table": "jobs"}, 50_050),
            Sample("table_autovacuum_behind", {"table": "jobs"}, 0),
            Sample("table_last_autovacuum_age_seconds", {"table": "jobs"}, 40.0 + (i % 20) * 6),
            Sample("table_xid_age", {"table": "jobs", "part": "heap"}, 1_200_000 + i * 100),
            Sample("xmin_horizon_age_seconds", {"holder": "any"}, 2.0),
            Sample("wal_bytes_per_second", {}, 350_000 * wave),
            Sample("connections", {"state": "active"}, 6),
            Sample("connections", {"state": "idle"}, 14),
            Sample("max_connections", {}, 100),
        ]
        samples.store(conn, rows, at=at)


def make_dead_letters(conn, *, smtp: int = 6, card: int = 3, queue_smtp: str = "mail", queue_card: str = "billing") -> dict[str, list[int]]:
    """Failed jobs in two error groups: SMTP timeouts (mail) and declined cards (billing)."""
    ids: dict[str, list[int]] = {"smtp": [], "card": []}
    for i in range(smtp):
        q.enqueue(conn, "send_mail", {"to": f"user{i}@example.com", "template": "receipt"}, queue=queue_smtp, max_attempts=1)
    for i in range(card):
        q.enqueue(conn, "charge_card", {"customer": 1000 + i, "amount_cents": 1999}, queue=queue_card, max_attempts=1)
    for queue, key, make in ((queue_smtp, "smtp", lambda j: TimeoutError(f"SMTP server smtp.example.com timed out after 30 s (job {j.id})")),
                             (queue_card, "card", lambda j: ValueError(f"card declined for customer {j.payload['customer']}"))):
        for job in q.claim(conn, f"{queue}-1:4{len(queue)}1", queues=[queue], limit=100, lease=60):
            try:
                _handler(make(job))
            except Exception as exc:  # a real traceback, as a worker records it
                q.fail(conn, job, exc)
            ids[key].append(job.id)
    return ids


def _handler(error: Exception) -> None:
    """Stands in for a task handler that raises."""
    raise error


def wait_audited(conn, action: str, outcome: str = "ok", timeout: float = 10) -> list[dict]:
    """The runner writes its final audit row just after it marks the operation done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = audit.search(conn, action=action)
        if any(r["outcome"] == outcome for r in rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"no {outcome} audit row for {action} after {timeout} s")


def horizon_rule(conn, threshold: float) -> None:
    """The vacuum_blocked rule in force, overridden in the UI as an admin would: the Database
    page's holders panel judges holders by it (console.signals.horizon_threshold)."""
    from console.alerts.rules import save_rule

    save_rule(conn, {"name": "vacuum_blocked", "metric": "xmin_horizon_age_seconds", "labels": {"holder": "any"},
                     "op": ">", "threshold": threshold, "for": "0s", "severity": "warning",
                     "summary": "horizon {value}s"}, actor="admin", reason="test threshold")
