"""Alert rules and webhook destinations: the model and its validation.

A rule compares the newest value of one metric (canonical name from `console.catalog`, or one of
the derived metrics below) against a threshold, per label set, and must hold for a duration
before it fires. Rules come from three places, lowest precedence first: the defaults shipped in
`console.alerts.defaults`, rules an admin saved in the UI (`skiplock.alert_rules`), and
`[[alerts.rules]]` in the config file. The file wins on conflict; the UI says so.

Every problem is a `RuleError` (a ValueError) whose message names the rule or destination and
the field, so a typo in the config file stops start-up with a sentence, and the same sentence
is the UI's 400.

The model and its validation live in `console.alerts.model` (rules) and
`console.alerts.destinations` (webhooks); this module loads and stores them, and re-exports
their names so `from console.alerts.rules import Rule` keeps working. It does not read
samples or send anything (`evaluate` and `outbox` do).
"""


from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import caps
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.destinations import (
    DESTINATION_FIELDS,
    KINDS,
    RESERVED_HEADERS,
    Destination,
    parse_destination,
)
from console.alerts.model import (
    DERIVED_METRICS,
    MAX_DURATION,
    OPS,
    RULE_FIELDS,
    SEVERITIES,
    SOURCES,
    Guard,
    Rule,
    RuleError,
    check_url,
    compare,
    format_duration,
    format_value,
    link_problem,
    metric_labels,
    parse_duration,
    parse_rule,
    parse_selector,
)
from console.caps import Caps
from console.sqlfiles import query

__all__ = [
    "DERIVED_METRICS", "DESTINATION_FIELDS", "KINDS", "MAX_DURATION", "OPS", "RESERVED_HEADERS", "RULE_FIELDS",
    "SEVERITIES", "SOURCES", "Destination", "Guard", "Rule", "RuleError", "RuleSet", "check_address",
    "check_config", "check_url", "compare", "db_destinations", "db_rules", "delete_destination", "delete_rule",
    "file_destinations", "file_rules", "format_duration", "format_value", "link_problem", "load",
    "metric_labels", "parse_destination", "parse_duration", "parse_rule", "parse_selector", "save_destination",
    "save_rule", "with_source",
]


# --- loading: defaults < UI (database) < config file -------------------------------------------


@dataclass
class RuleSet:
    rules: dict[str, Rule]
    destinations: dict[str, Destination]
    # names saved in the UI but shadowed by the config file: the UI says "defined in config file"
    shadowed_rules: set[str] = field(default_factory=set)
    shadowed_destinations: set[str] = field(default_factory=set)

    def enabled(self) -> list[Rule]:
        return [r for r in self.rules.values() if r.enabled]

    def targets(self, rule: Rule) -> list[Destination]:
        names = rule.webhooks or tuple(sorted(self.destinations))
        return [self.destinations[n] for n in names if n in self.destinations]


def file_destinations(tables: Mapping[str, Any]) -> dict[str, Destination]:
    found: dict[str, Destination] = {}
    for index, record in enumerate(tables.get("webhooks", []) or []):
        dest = parse_destination(record, where=f"([[webhooks]] #{index + 1} in the config file)")
        if dest.name in found:
            raise RuleError(f"webhook {dest.name!r} is defined twice in the config file")
        found[dest.name] = dest
    return found


def file_rules(tables: Mapping[str, Any]) -> dict[str, Rule]:
    found: dict[str, Rule] = {}
    for index, record in enumerate(tables.get("alerts.rules", []) or []):
        rule = parse_rule(record, where=f"([[alerts.rules]] #{index + 1} in the config file)")
        if rule.name in found:
            raise RuleError(f"alert rule {rule.name!r} is defined twice in the config file")
        found[rule.name] = rule
    return found


def check_address(dest: Destination, config, *, where: str = "") -> None:
    """The address policy at save time (console.alerts.addresses): RuleError naming the
    destination and the refused address, unless alerts.allow_private_destinations is on."""
    from console.alerts.addresses import AddressRefused, allowed_private, check_url

    try:
        check_url(dest.url, allow_private=allowed_private(config))
    except AddressRefused as exc:
        raise RuleError(f"webhook {dest.name!r}{' ' + where if where else ''}: {exc}") from None


def check_config(config) -> None:
    """Validate `[[webhooks]]` and `[[alerts.rules]]` (start-up calls this so a typo stops it),
    and apply the address policy to the webhooks' hosts."""
    destinations = file_destinations(config.tables)
    for dest in destinations.values():
        check_address(dest, config, where="(in the config file)")
    for rule in file_rules(config.tables).values():
        _check_webhook_names(rule, destinations)


def _check_webhook_names(rule: Rule, destinations: Mapping[str, Destination]) -> None:
    missing = [w for w in rule.webhooks if w not in destinations]
    if missing:
        raise RuleError(f"alert rule {rule.name!r}: webhooks {', '.join(missing)} not defined "
                        f"(defined: {', '.join(sorted(destinations)) or 'none'})")


def db_rules(conn: psycopg.Connection) -> dict[str, Rule]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("alerts", "ui_rules")).fetchall()
    found = {}
    for row in rows:
        record = {"name": row["name"], "metric": row["metric"], "labels": row["labels"], "op": row["op"],
                  "threshold": row["threshold"], "for": row["for_seconds"], "severity": row["severity"],
                  "summary": row["summary"], "runbook": row["runbook"], "webhooks": list(row["webhooks"]),
                  "when": row["guard"], "clear": row["clear"], "enabled": row["enabled"]}
        try:
            found[row["name"]] = parse_rule(record, source="ui", where="(saved in the UI)")
        except RuleError:
            continue  # e.g. a metric renamed since it was saved; the rules page shows it as invalid
    return found


def db_destinations(conn: psycopg.Connection) -> dict[str, Destination]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("alerts", "ui_destinations")).fetchall()
    found = {}
    for row in rows:
        record = {k: row[k] for k in ("name", "kind", "url", "secret", "headers")}
        try:
            found[row["name"]] = parse_destination(record, source="ui")
        except RuleError:
            continue
    return found


def load(conn: psycopg.Connection | None, config, *, defaults: Iterable[Rule] | None = None) -> RuleSet:
    """Every rule and destination in force: defaults, then the UI's, then the file's."""
    tables = getattr(config, "tables", {}) if config is not None else {}
    rules = {r.name: r for r in (DEFAULT_RULES if defaults is None else defaults)}
    destinations: dict[str, Destination] = {}
    ui_rules = db_rules(conn) if conn is not None else {}
    ui_dests = db_destinations(conn) if conn is not None else {}
    rules.update(ui_rules)
    destinations.update(ui_dests)
    f_rules, f_dests = file_rules(tables), file_destinations(tables)
    rules.update(f_rules)
    destinations.update(f_dests)
    return RuleSet(rules=rules, destinations=destinations,
                   shadowed_rules=set(ui_rules) & set(f_rules), shadowed_destinations=set(ui_dests) & set(f_dests))


# --- UI-managed rules and destinations ----------------------------------------------------------


def _check_cap(conn: psycopg.Connection, counting: str, name: str, limit: int, setting: str, what: str) -> None:
    """In the save's transaction: CapReached when a new name would pass the cap (an update of a
    saved one is always allowed: it adds nothing)."""
    caps.serialise(conn, counting)
    held, exists = conn.execute(query("alerts", counting), {"name": name}).fetchone()
    if not exists:
        caps.within(held, limit, what=what, setting=setting, advice="delete one you no longer need")


def save_rule(conn: psycopg.Connection, record: Mapping[str, Any], *, actor: str, config=None,
              reason: str | None = None) -> Rule:
    """Validate and upsert a UI rule (audited). RuleError when invalid or when the config file
    defines the same name (the file wins, so the UI may not edit it)."""
    from console import audit

    rule = parse_rule(record, source="ui", where="(from the UI)")
    tables = getattr(config, "tables", {}) if config is not None else {}
    if rule.name in file_rules(tables):
        raise RuleError(f"alert rule {rule.name!r} is defined in the config file; change it there")
    known = {**db_destinations(conn), **file_destinations(tables)}
    _check_webhook_names(rule, known)
    with conn.transaction():
        _check_cap(conn, "caps_ui_rules", rule.name, Caps.from_config(config).alert_rules, "caps.alert_rules",
                   "alert rules saved from the console in this database")
        conn.execute(query("alerts", "upsert_ui_rule"), {
            "name": rule.name, "metric": rule.metric, "labels": Jsonb(rule.labels), "op": rule.op,
            "threshold": rule.threshold, "clear": rule.clear, "for_seconds": rule.for_seconds,
            "severity": rule.severity, "summary": rule.summary, "runbook": rule.runbook,
            "webhooks": list(rule.webhooks), "guard": Jsonb(rule.guard.as_dict()) if rule.guard else None,
            "enabled": rule.enabled, "actor": actor,
        })
        audit.record(conn, actor=actor, action="alert_rule_save", target=f"rule:{rule.name}",
                     selection={"rule": rule.name}, reason=reason, rows=1, detail=rule.as_record())
    return rule


def delete_rule(conn: psycopg.Connection, name: str, *, actor: str, reason: str | None = None) -> bool:
    from console import audit

    with conn.transaction():
        row = conn.execute(query("alerts", "delete_ui_rule"), {"name": name}).fetchone()
        if row:
            audit.record(conn, actor=actor, action="alert_rule_delete", target=f"rule:{name}",
                         selection={"rule": name}, reason=reason, rows=1)
    return bool(row)


def save_destination(conn: psycopg.Connection, record: Mapping[str, Any], *, actor: str, config=None,
                     reason: str | None = None) -> Destination:
    """Validate and upsert a UI destination (audited, without the secret). An empty secret keeps
    the one saved before, so the form never needs to show it."""
    from console import audit

    record = dict(record)
    tables = getattr(config, "tables", {}) if config is not None else {}
    if record.get("name") in file_destinations(tables):
        raise RuleError(f"webhook {record.get('name')!r} is defined in the config file; change it there")
    if not record.get("secret"):
        previous = db_destinations(conn).get(record.get("name"))
        record["secret"] = previous.secret if previous else None
    dest = parse_destination(record, source="ui", where="(from the UI)")
    check_address(dest, config)
    with conn.transaction():
        _check_cap(conn, "caps_ui_destinations", dest.name, Caps.from_config(config).destinations, "caps.destinations",
                   "webhook destinations saved from the console in this database")
        conn.execute(query("alerts", "upsert_ui_destination"), {
            "name": dest.name, "kind": dest.kind, "url": dest.url, "secret": dest.secret,
            "headers": Jsonb(dest.headers), "actor": actor,
        })
        audit.record(conn, actor=actor, action="alert_destination_save", target=f"webhook:{dest.name}",
                     selection={"webhook": dest.name}, reason=reason, rows=1,
                     detail={"kind": dest.kind, "url": dest.display_url(), "headers": sorted(dest.headers)})
    return dest


def delete_destination(conn: psycopg.Connection, name: str, *, actor: str, reason: str | None = None) -> bool:
    from console import audit

    with conn.transaction():
        row = conn.execute(query("alerts", "delete_ui_destination"), {"name": name}).fetchone()
        if row:
            audit.record(conn, actor=actor, action="alert_destination_delete", target=f"webhook:{name}",
                         selection={"webhook": name}, reason=reason, rows=1)
    return bool(row)


def with_source(rule: Rule, source: str) -> Rule:
    return replace(rule, source=source)
