"""Alerts: rules over the stored samples, a state machine with hysteresis, silences and
acknowledgements, and durable webhook delivery through an outbox.

    rules.py       rule and destination model, validation, loading (defaults < UI < config file)
    defaults.py    the rules shipped enabled (runbooks in docs/alerts.md)
    evaluate.py    ok -> pending -> firing -> resolved; silence; acknowledge
    outbox.py      notifications written with the transition; the sender (retries, give-up)
    transports.py  JSON (signed), Slack-compatible, PagerDuty Events v2

The faces (scheduler, CLI, web) call the functions below; none of them is imported here.
"""

from __future__ import annotations

import psycopg

from console.alerts.evaluate import AlertSettings, EvaluationReport
from console.alerts.evaluate import evaluate as evaluate_rules
from console.alerts.outbox import Sender, SendReport
from console.alerts.rules import RuleError, RuleSet, check_config, load


def settings(config) -> AlertSettings:
    return AlertSettings.from_config(config)


def evaluate_now(conn: psycopg.Connection, config, *, only_derived: bool = False, now=None) -> EvaluationReport:
    """Load the rules in force and evaluate them once (what the scheduler runs after a collection)."""
    return evaluate_rules(conn, load(conn, config), settings(config), only_derived=only_derived, now=now)


def deliver(conn: psycopg.Connection, config, *, limit: int | None = None, budget: float | None = None) -> SendReport:
    """Send what is due in the outbox (what the scheduler's delivery job runs)."""
    return Sender(conn, lambda: load(conn, config).destinations, settings(config)).run_once(limit=limit, budget=budget)


__all__ = ["AlertSettings", "EvaluationReport", "RuleError", "RuleSet", "SendReport", "Sender", "check_config",
           "deliver", "evaluate_now", "evaluate_rules", "load", "settings"]
