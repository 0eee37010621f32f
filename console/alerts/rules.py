"""Alert rules and webhook destinations: the model and its validation.

A rule compares the newest value of one metric (canonical name from `console.catalog`, or one of
the derived metrics below) against a threshold, per label set, and must hold for a duration
before it fires. Rules come from three places, lowest precedence first: the defaults shipped in
`console.alerts.defaults`, rules an admin saved in the UI (`skiplock.alert_rules`), and
`[[alerts.rules]]` in the config file. The file wins on conflict; the UI says so.

Every problem is a `RuleError` (a ValueError) whose message names the rule or destination and
the field, so a typo in the config file stops start-up with a sentence, and the same sentence
is the UI's 400.

This module does not read samples or send anything (`evaluate` and `outbox` do).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.catalog import UnknownMetric, check_metric
from console.sqlfiles import query

OPS = (">", ">=", "<", "<=")
SEVERITIES = ("critical", "warning", "info")
KINDS = ("json", "slack", "pagerduty")
SOURCES = ("default", "ui", "file")
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}
# Headers the transports set themselves; a destination may not replace them.
RESERVED_HEADERS = {"content-type", "content-length", "host", "x-skiplock-signature", "idempotency-key"}

# Metrics computed at evaluation time rather than read from samples.
DERIVED_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collection_age_seconds": (
        "Seconds since the newest collection cycle finished (from skiplock.collection_runs): the "
        "dead man's switch, evaluated from the clock because a stale collector writes no sample.",
        (),
    ),
}


class RuleError(ValueError):
    """A rule or destination is invalid; the message names it and the field."""


MAX_DURATION = 366 * 86400.0  # a year: longer than any sensible `for` or silence, far from overflow


def parse_duration(value: Any) -> float:
    """A duration in seconds from 90, "90s", "15m", "1h", "7d"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 1h)")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 1h)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 1h)")
    if seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is too long (at most {MAX_DURATION // 86400:.0f}d)")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_value(value: float | None) -> str:
    """A number as a person reads it: 412, 0.253, 52,428,800; "n/a" when not available."""
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def compare(op: str, value: float, threshold: float) -> bool:
    if op == ">":
        return value > threshold
    if op == ">=":
        return value >= threshold
    if op == "<":
        return value < threshold
    return value <= threshold


def metric_labels(metric: str) -> tuple[str, ...]:
    """The labels a metric carries; UnknownMetric when it is neither catalogued nor derived."""
    if metric in DERIVED_METRICS:
        return DERIVED_METRICS[metric][1]
    return check_metric(metric).labels


@dataclass(frozen=True)
class Guard:
    """A second condition that must also hold ("while jobs are eligible"): true when ANY series
    of `metric` matching `labels` satisfies `op threshold`."""

    metric: str
    labels: dict[str, str]
    op: str
    threshold: float

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "labels": dict(self.labels), "op": self.op, "threshold": self.threshold}

    def describe(self) -> str:
        return f"{self.metric}{_selector_text(self.labels)} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    op: str
    threshold: float
    labels: dict[str, str] = field(default_factory=dict)
    for_seconds: float = 0.0
    severity: str = "warning"
    summary: str = ""
    runbook: str = ""
    webhooks: tuple[str, ...] = ()  # empty: every destination
    guard: Guard | None = None
    clear: float | None = None  # the value that resolves a firing alert; None: derived from hysteresis
    enabled: bool = True
    source: str = "file"

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())

    def condition(self, value: float) -> bool:
        """True when the value is in alarm (entering pending/firing)."""
        return compare(self.op, value, self.threshold)

    def clear_threshold(self, hysteresis: float) -> float:
        """The boundary a firing alert must cross back over to resolve.

        `clear` when the rule gives one; otherwise the threshold moved by `hysteresis` times its
        size away from the alarm side (for `> 100` and 0.1: resolves at 90 or below), so a value
        hovering at the threshold neither resolves nor re-fires every cycle.
        """
        if self.clear is not None:
            return self.clear
        margin = abs(self.threshold) * hysteresis
        return self.threshold - margin if self.op in (">", ">=") else self.threshold + margin

    def still_firing(self, value: float, hysteresis: float) -> bool:
        return compare(self.op, value, self.clear_threshold(hysteresis))

    def describe(self) -> str:
        text = f"{self.metric}{_selector_text(self.labels)} {self.op} {self.threshold:g}"
        if self.guard:
            text += f" while {self.guard.describe()}"
        if self.for_seconds:
            text += f" for {format_duration(self.for_seconds)}"
        return text

    def render_summary(self, labels: Mapping[str, str], value: float | None) -> str:
        """The summary with {value}, {threshold}, {metric}, {rule} and each label substituted.
        Only plain `{name}` fields are replaced (no attribute or index access)."""
        context = {**labels, "value": format_value(value), "threshold": format_value(self.threshold),
                   "metric": self.metric, "rule": self.name, "op": self.op}
        template = self.summary or "{rule}: {metric} is {value} ({op} {threshold})"
        return re.sub(r"\{([a-z_][a-z0-9_]*)\}", lambda m: str(context.get(m.group(1), m.group(0))), template)

    def as_record(self) -> dict[str, Any]:
        """The rule as the config file would spell it (also what the API returns)."""
        record: dict[str, Any] = {
            "name": self.name, "metric": self.metric, "labels": dict(self.labels), "op": self.op,
            "threshold": self.threshold, "for": format_duration(self.for_seconds), "severity": self.severity,
            "summary": self.summary, "runbook": self.runbook, "webhooks": list(self.webhooks),
            "enabled": self.enabled, "source": self.source,
        }
        if self.clear is not None:
            record["clear"] = self.clear
        if self.guard is not None:
            record["when"] = self.guard.as_dict()
        return record


def _selector_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def parse_selector(text: str) -> dict[str, str]:
    """'queue=mail, state=eligible' (the UI's text box) -> {'queue': 'mail', 'state': 'eligible'}."""
    labels: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip().strip('"')
        if not sep or not key or not value:
            raise ValueError(f"label selector {part!r} is not key=value")
        labels[key] = value
    return labels


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} {value!r} is not a finite number")
    return number


def _labels(value: Any, metric: str, what: str) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = parse_selector(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a table of label = \"value\" (got {type(value).__name__})")
    allowed = metric_labels(metric)
    labels: dict[str, str] = {}
    for key, raw in value.items():
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"{what}: metric {metric} has no label {key!r} (its labels: {known})")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float) or str(raw) == "":
            raise ValueError(f"{what}: label {key!r} must have a non-empty string value")
        labels[str(key)] = str(raw)
    return labels


def _metric(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("metric is required")
    metric_labels(value)  # raises UnknownMetric (a ValueError) naming the known ones
    return value


def _op(value: Any, what: str = "op") -> str:
    if value not in OPS:
        raise ValueError(f"{what} {value!r} must be one of {' '.join(OPS)}")
    return value


RULE_FIELDS = {"name", "metric", "labels", "op", "threshold", "for", "severity", "summary", "runbook",
               "webhooks", "when", "clear", "enabled"}


def parse_rule(record: Mapping[str, Any], *, source: str = "file", where: str = "") -> Rule:
    """Validate one rule given as the config file spells it; RuleError naming the rule otherwise."""
    name = record.get("name") if isinstance(record, Mapping) else None
    label = f"alert rule {name!r}" if isinstance(name, str) and name else "alert rule (unnamed)"
    if where:
        label += f" {where}"
    try:
        if not isinstance(record, Mapping):
            raise ValueError("must be a table")
        unknown = sorted(set(record) - RULE_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(RULE_FIELDS))})")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError("name must be lower-case letters, digits, '_', '.', '-' (starting with a letter)")
        metric = _metric(record.get("metric"))
        op = _op(record.get("op"))
        if "threshold" not in record or record["threshold"] in (None, ""):
            raise ValueError("threshold is required")
        threshold = _number(record["threshold"], "threshold")
        clear = None if record.get("clear") in (None, "") else _number(record["clear"], "clear")
        if clear is not None and ((op in (">", ">=") and clear > threshold) or (op in ("<", "<=") and clear < threshold)):
            raise ValueError(f"clear {clear:g} must be on the healthy side of threshold {threshold:g} (or equal)")
        try:
            for_seconds = parse_duration(record.get("for", 0) or 0)
        except ValueError as exc:
            raise ValueError(f"for: {exc}") from None
        severity = record.get("severity", "warning") or "warning"
        if severity not in SEVERITIES:
            raise ValueError(f"severity {severity!r} must be one of {', '.join(SEVERITIES)}")
        summary = record.get("summary", "") or ""
        runbook = record.get("runbook", "") or ""
        if not isinstance(summary, str) or "\n" in summary or len(summary) > 500:
            raise ValueError("summary must be one line of at most 500 characters")
        if not isinstance(runbook, str) or any(c.isspace() for c in runbook):
            raise ValueError("runbook must be a URL or a docs path without spaces")
        if runbook.startswith(("http://", "https://")):
            check_url(runbook, "runbook")
        webhooks = record.get("webhooks", []) or []
        if isinstance(webhooks, str):
            webhooks = [w.strip() for w in webhooks.split(",") if w.strip()]
        if not isinstance(webhooks, list | tuple) or not all(isinstance(w, str) and _NAME.match(w) for w in webhooks):
            raise ValueError("webhooks must be a list of destination names")
        enabled = record.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError("enabled must be true or false")
        guard = _guard(record.get("when"))
        labels = _labels(record.get("labels"), metric, "labels")
    except RuleError:
        raise
    except (UnknownMetric, ValueError) as exc:
        raise RuleError(f"{label}: {exc}") from None
    return Rule(name=name, metric=metric, op=op, threshold=threshold, labels=labels, for_seconds=for_seconds,
                severity=severity, summary=summary, runbook=runbook, webhooks=tuple(webhooks), guard=guard,
                clear=clear, enabled=enabled, source=source)


def _guard(value: Any) -> Guard | None:
    if value in (None, "", {}):
        return None
    if not isinstance(value, Mapping):
        raise ValueError("when must be a table {metric, labels, op, threshold}")
    unknown = sorted(set(value) - {"metric", "labels", "op", "threshold"})
    if unknown:
        raise ValueError(f"when: unknown field(s) {', '.join(unknown)}")
    metric = _metric(value.get("metric"))
    if "threshold" not in value:
        raise ValueError("when: threshold is required")
    return Guard(metric=metric, labels=_labels(value.get("labels"), metric, "when.labels"),
                 op=_op(value.get("op"), "when.op"), threshold=_number(value["threshold"], "when.threshold"))


def check_url(url: Any, what: str = "url") -> str:
    if not isinstance(url, str) or not url:
        raise ValueError(f"{what} is required")
    if any(c.isspace() for c in url):
        raise ValueError(f"{what} must not contain spaces")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"{what} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http:// or https:// URL with a host")
    return url


# --- destinations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """Where notifications go. `secret` signs (json) or is the routing key (pagerduty); it is
    never rendered back to a browser nor written to a log (see `public()`)."""

    name: str
    kind: str
    url: str
    secret: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    source: str = "file"

    def __repr__(self) -> str:  # keep secrets and webhook paths out of tracebacks and logs
        return f"Destination(name={self.name!r}, kind={self.kind!r}, url={self.display_url()!r})"

    def display_url(self) -> str:
        """The URL with its path hidden for Slack (the path is the credential) and any query or
        userinfo removed."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        path = parts.path if self.kind == "json" else ("/…" if parts.path not in ("", "/") else "")
        return f"{parts.scheme}://{host}{path}"

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "url": self.display_url(), "has_secret": bool(self.secret),
                "headers": sorted(self.headers), "source": self.source}

    def redact(self, text: str) -> str:
        """Remove this destination's secret, URL and header values from a message."""
        for sensitive in [self.secret, self.url, *self.headers.values()]:
            if sensitive and len(sensitive) >= 4:
                text = text.replace(sensitive, "***")
        return text


DESTINATION_FIELDS = {"name", "url", "kind", "secret", "headers"}


def parse_destination(record: Mapping[str, Any], *, source: str = "file", where: str = "") -> Destination:
    name = record.get("name") if isinstance(record, Mapping) else None
    label = f"webhook {name!r}" if isinstance(name, str) and name else "webhook (unnamed)"
    if where:
        label += f" {where}"
    try:
        if not isinstance(record, Mapping):
            raise ValueError("must be a table")
        unknown = sorted(set(record) - DESTINATION_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(DESTINATION_FIELDS))})")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError("name must be lower-case letters, digits, '_', '.', '-' (starting with a letter)")
        kind = record.get("kind", "json") or "json"
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} must be one of {', '.join(KINDS)}")
        url = check_url(record.get("url"))
        secret = record.get("secret") or None
        if secret is not None and not isinstance(secret, str):
            raise ValueError("secret must be a string")
        if kind == "pagerduty" and not secret:
            raise ValueError("a pagerduty destination needs secret = the integration's routing key")
        headers = record.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise ValueError("headers must be a table of name = \"value\"")
        clean: dict[str, str] = {}
        for key, value in headers.items():
            if not isinstance(key, str) or not _HEADER_NAME.match(key):
                raise ValueError(f"header name {key!r} is not a valid HTTP header name")
            if key.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {key!r} is set by Skiplock and cannot be overridden")
            if not isinstance(value, str) or "\r" in value or "\n" in value:
                raise ValueError(f"header {key!r} must be a one-line string")
            clean[key] = value
    except ValueError as exc:
        raise RuleError(f"{label}: {exc}") from None
    return Destination(name=name, kind=kind, url=url, secret=secret, headers=clean, source=source)


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
    from console.alerts.defaults import DEFAULT_RULES

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
