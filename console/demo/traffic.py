"""The demo's traffic generator: a small shop's producers, so the console has something to show.

Run by `skiplock demo` as its own process (`python -m console.demo.traffic --dsn ...`). It
enqueues, each in its own short transaction the way application code would:

- orders (a card charge at priority 10 plus a receipt e-mail), partner webhooks, image
  thumbnails and now and then a slow report, at `--rate` jobs per second on average, swelling and
  ebbing by a third over ten minutes so the charts have a shape;
- transient failures that pass on retry (greylisted mail, a partner answering 503 once) and a few
  permanent ones that become dead letters in three error groups (declined cards, a partner that
  is down, report requests missing a field); see `console.demo.tasks`;
- a burst of low-priority search reindex jobs every few minutes, which raises queue age;
- every 20 minutes (the first after 90 s) a session left idle in transaction for six minutes
  (REPEATABLE READ with an xid), which holds back the xmin horizon so dead tuples climb until it
  ends (the demo's vacuum_blocked rule fires after 30 s of it).

The orchestrator passes the schedule (`console.demo.democonfig.traffic_args`, divided by
`--pace`); the defaults below are the schedule at pace 1.

Killing a worker (stuck leases for the reaper) is the orchestrator's job: it owns the processes.
This module never deletes or updates jobs; the workers and the scheduler do.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from console import queue as q
from console.db import DatabaseError, connect
from console.sqlfiles import query

log = logging.getLogger("skiplock.demo.traffic")

IDLE_APPLICATION_NAME = "report-export (demo: left idle in transaction)"
PARTNERS = (
    "https://hooks.partner-a.example/skiplock",
    "https://hooks.partner-b.example/events",
    "https://hooks.partner-c.example/v2/notify",
    "https://hooks.partner-d.example/in",
)


@dataclass
class TrafficOptions:
    rate: float = 5.0  # jobs per second, on average
    duration: float | None = None  # seconds; None runs until stopped
    burst_every: float = 240.0
    burst_size: int = 450
    first_burst_after: float = 45.0
    idle_every: float = 1200.0
    idle_for: float = 360.0
    first_idle_after: float = 90.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be greater than 0 jobs per second")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be greater than 0")
        if self.burst_size < 0 or self.burst_every <= 0 or self.idle_every <= 0 or self.idle_for < 0:
            raise ValueError("burst and idle intervals must be positive")


@dataclass
class Counts:
    events: int = 0
    jobs: int = 0
    bursts: int = 0
    idle_sessions: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Shop:
    """Builds the jobs of one business event. Pure: no database, a seeded random source."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.order_no = rng.randrange(10_000, 90_000)

    def _ms(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def order(self) -> list[q.NewJob]:
        self.order_no += 1
        declined = self.rng.random() < 0.02
        card = "0002" if declined else self.rng.choice(["4242", "1881", "0005", "5556", "4444"])
        return [
            q.NewJob("billing.charge_card", {"order": self.order_no, "amount_cents": self.rng.randint(500, 25_000),
                                             "card_last4": card, "ms": self._ms(80, 400)},
                     queue="billing", priority=10, max_attempts=5),
            q.NewJob("mail.send_receipt", {"order": self.order_no, "to": f"customer{self.rng.randint(1, 9999)}@example.com",
                                           "greylisted": self.rng.random() < 0.08, "ms": self._ms(40, 250)},
                     queue="mail", priority=0, max_attempts=5),
        ]

    def webhook(self) -> list[q.NewJob]:
        roll = self.rng.random()
        endpoint = PARTNERS[2] if roll < 0.03 else PARTNERS[1] if roll < 0.18 else self.rng.choice((PARTNERS[0], PARTNERS[3]))
        return [q.NewJob("webhooks.deliver", {"endpoint": endpoint, "event": self.rng.choice(["order.paid", "order.shipped", "refund.created"]),
                                              "ms": self._ms(50, 500)}, queue="webhooks", priority=0, max_attempts=3)]

    def image(self) -> list[q.NewJob]:
        return [q.NewJob("images.thumbnail", {"image": f"img_{self.rng.randrange(1_000_000)}.jpg", "ms": self._ms(100, 700)},
                         queue="default", priority=0)]

    def report(self) -> list[q.NewJob]:
        payload: dict[str, Any] = {"report": self.rng.choice(["monthly-sales", "refunds", "inventory"]), "ms": self._ms(2000, 8000)}
        if self.rng.random() >= 0.05:
            payload["customer_id"] = self.rng.randint(1, 5000)
        return [q.NewJob("reports.build", payload, queue="reports", priority=-5, max_attempts=2)]

    def burst(self, size: int) -> list[q.NewJob]:
        batch = self.rng.randrange(1_000_000)
        return [q.NewJob("search.reindex", {"batch": batch, "product": i, "ms": self._ms(150, 400)}, queue="search", priority=-10)
                for i in range(size)]

    def event(self) -> list[q.NewJob]:
        builders = (self.order, self.webhook, self.image, self.report)
        return self.rng.choices(builders, weights=(3.0, 3.0, 2.0, 0.4))[0]()


class Traffic:
    def __init__(self, dsn: str, options: TrafficOptions):
        self.dsn = dsn
        self.options = options
        self.shop = Shop(random.Random(options.seed))
        self.counts = Counts()
        self.stop_event = threading.Event()
        self._conn: psycopg.Connection | None = None

    # --- producing ------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, application_name="demo-shop", autocommit=False)
        return self._conn

    def _enqueue(self, jobs: list[q.NewJob]) -> None:
        """One producer transaction, as application code would write it."""
        conn = self._connection()
        with conn.transaction():
            q.enqueue_many(conn, jobs)
        self.counts.jobs += len(jobs)
        for job in jobs:
            self.counts.by_kind[job.kind] = self.counts.by_kind.get(job.kind, 0) + 1

    def rate_at(self, elapsed: float) -> float:
        """The target rate, swelling and ebbing by a third over ten minutes."""
        return self.options.rate * (1.0 + math.sin(2 * math.pi * elapsed / 600.0) / 3.0)

    def run(self) -> Counts:
        opts = self.options
        started = time.monotonic()
        deadline = started + opts.duration if opts.duration else None
        next_burst = started + opts.first_burst_after
        next_idle = started + opts.first_idle_after
        next_report = started + 60.0
        budget = 0.0
        pending = self.shop.event()
        last = started
        idle_thread: threading.Thread | None = None
        retry_delay = 0.5
        while not self.stop_event.is_set():
            now = time.monotonic()
            if deadline and now >= deadline:
                break
            budget += self.rate_at(now - started) * (now - last)
            last = now
            try:
                while budget >= len(pending) and not self.stop_event.is_set():
                    self._enqueue(pending)
                    self.counts.events += 1
                    budget -= len(pending)
                    pending = self.shop.event()
                if opts.burst_size and now >= next_burst:
                    self._enqueue(self.shop.burst(opts.burst_size))
                    self.counts.bursts += 1
                    log.info("burst: %d search.reindex jobs at priority -10 (queue age on 'search' will climb)", opts.burst_size)
                    next_burst = now + opts.burst_every
                retry_delay = 0.5
            except (psycopg.OperationalError, DatabaseError) as exc:
                log.warning("database unavailable (%s); retrying in %.1fs", type(exc).__name__, retry_delay)
                if self._conn is not None:
                    self._conn.close()
                self.stop_event.wait(retry_delay)
                retry_delay = min(retry_delay * 2, 10.0)
                budget = min(budget, 10 * opts.rate)  # do not catch up with a flood after an outage
                continue
            if opts.idle_for and now >= next_idle and (idle_thread is None or not idle_thread.is_alive()):
                idle_thread = threading.Thread(target=self._idle_in_transaction, name="idle-in-transaction", daemon=True)
                idle_thread.start()
                next_idle = now + opts.idle_every
            if now >= next_report:
                log.info("enqueued %d jobs in %d transactions so far (%d bursts, %d idle sessions)",
                         self.counts.jobs, self.counts.events, self.counts.bursts, self.counts.idle_sessions)
                next_report = now + 60.0
            self.stop_event.wait(0.1)
        self.stop_event.set()
        if idle_thread is not None:
            idle_thread.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        return self.counts

    # --- the bad neighbour -----------------------------------------------------------------

    def _idle_in_transaction(self) -> None:
        """Open a transaction that takes a snapshot and an xid, then sits idle: the horizon holder."""
        try:
            with connect(self.dsn, application_name=IDLE_APPLICATION_NAME, autocommit=False) as conn:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute(query("demo", "forgotten_transaction")).fetchone()
                self.counts.idle_sessions += 1
                log.info("a session is now idle in transaction for %ds (pid %d): it holds back the xmin horizon",
                         self.options.idle_for, conn.info.backend_pid)
                self.stop_event.wait(self.options.idle_for)
                conn.rollback()
                log.info("the idle-in-transaction session ended; vacuum can catch up")
        except (psycopg.Error, DatabaseError) as exc:
            log.warning("idle-in-transaction session failed: %s", type(exc).__name__)


def parse_args(argv: list[str] | None = None) -> tuple[str, TrafficOptions]:
    parser = argparse.ArgumentParser(prog="python -m console.demo.traffic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rate", type=float, default=5.0, help="jobs per second on average (default 5)")
    parser.add_argument("--duration", type=float, default=None, help="seconds to run (default: until stopped)")
    parser.add_argument("--burst-every", type=float, default=240.0, help="seconds between bursts")
    parser.add_argument("--burst-size", type=int, default=450, help="jobs per burst (0: no bursts)")
    parser.add_argument("--first-burst-after", type=float, default=45.0)
    parser.add_argument("--idle-every", type=float, default=1200.0, help="seconds between idle-in-transaction sessions")
    parser.add_argument("--idle-for", type=float, default=360.0, help="seconds each stays idle (0: never)")
    parser.add_argument("--first-idle-after", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        options = TrafficOptions(
            rate=args.rate, duration=args.duration, burst_every=args.burst_every, burst_size=args.burst_size,
            first_burst_after=args.first_burst_after, idle_every=args.idle_every, idle_for=args.idle_for,
            first_idle_after=args.first_idle_after, seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return args.dsn, options


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    dsn, options = parse_args(argv)
    traffic = Traffic(dsn, options)

    def on_signal(signum, _frame):
        traffic.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("traffic generator started: %.1f jobs/s on average", options.rate)
    counts = traffic.run()
    log.info("traffic generator stopped: %d jobs in %d transactions", counts.jobs, counts.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
