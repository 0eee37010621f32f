"""The alerts' part of the scheduler: evaluate after every collection, deliver on an interval.

`AlertJobs(config)` is created by `console.scheduler.Scheduler` with the process's config:
- `after_collection(conn, report)` runs after each stored collection cycle (an after-collection
  hook) and evaluates every rule;
- `deliver(conn)` is the `alerts_deliver` job (every `[alerts] delivery_interval` seconds): it
  first evaluates the rules over derived metrics (the dead man's switch `collectors_stale`, so a
  collector that stopped is noticed even though it writes nothing), then works the outbox, and
  now and then prunes the delivery log.

Both run only on the leader (the scheduler sees to that) and never hold a transaction across a
webhook call.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import psycopg

from console.alerts import outbox
from console.alerts.evaluate import AlertSettings, evaluate
from console.alerts.rules import check_config, load

log = logging.getLogger(__name__)

PRUNE_EVERY = 3600.0  # seconds between two retention passes over the delivery log


class AlertJobs:
    def __init__(self, config: Any, *, database: str = "default", home: bool = True):
        check_config(config)  # a bad [[alerts.rules]] stops the scheduler at start-up
        self.config = config
        self.settings = AlertSettings.from_config(config).for_database(database, home=home)
        self.enabled = bool(getattr(getattr(config, "alerts", None), "evaluate", True))
        self.interval = self.settings.delivery_interval
        self._last_prune = 0.0

    def after_collection(self, conn: psycopg.Connection, report: Any = None) -> None:
        if not self.enabled:
            return
        result = evaluate(conn, load(conn, self.config), self.settings)
        if result.held_rules:
            log.warning("collectors are stale: %d alert rules held", len(result.held_rules))

    def deliver(self, conn: psycopg.Connection) -> outbox.SendReport:
        ruleset = load(conn, self.config)
        if self.enabled:
            evaluate(conn, ruleset, self.settings, only_derived=True)
        sender = outbox.Sender(conn, lambda: ruleset.destinations, self.settings)
        report = sender.run_once()
        if report.attempted:
            log.info("alert deliveries: %d delivered, %d retrying, %d failed, %d gave up",
                     report.delivered, report.retried, report.failed, report.gave_up)
        if time.monotonic() - self._last_prune >= PRUNE_EVERY:
            self._last_prune = time.monotonic()
            outbox.prune(conn, keep=timedelta(days=self.settings.keep_days))
            outbox.prune_events(conn, keep=self.settings.events_retention)
        return report
