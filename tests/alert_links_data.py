"""Seeding for the look-here tests: fire one of the default rules the way the scheduler would
(a sample in the newest cycle, then the evaluator), and deliver its notifications to real
local receivers."""

from __future__ import annotations

from dataclasses import replace

from console import samples
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.rules import RuleSet
from console.samples import Sample

DEFAULTS = {r.name: r for r in DEFAULT_RULES}


def fire_default(conn, name: str, labels: dict[str, str], value: float, *, destinations=None,
                 settings: ev.AlertSettings | None = None) -> int:
    """Store `value` for the default rule `name`'s metric with `labels` (now, by the database's
    clock) and evaluate that rule alone with `for` = 0, so it fires at once. Returns the alert id."""
    rule = replace(DEFAULTS[name], for_seconds=0.0, guard=None)
    now = conn.execute("SELECT now()").fetchone()[0]
    samples.store(conn, [Sample(rule.metric, {**rule.labels, **labels}, value, now)])
    ev.evaluate(conn, RuleSet(rules={name: rule}, destinations=destinations or {}), settings or ev.AlertSettings(), now=now)
    row = conn.execute("SELECT id, state FROM skiplock.alerts WHERE rule = %s AND labels @> %s::jsonb",
                       (name, __import__("json").dumps(labels))).fetchone()
    assert row and row[1] == "firing", f"{name} did not fire: {row}"
    return row[0]


def deliver(conn, destinations, settings: ev.AlertSettings) -> outbox.SendReport:
    return outbox.Sender(conn, lambda: destinations, settings).run_once()
