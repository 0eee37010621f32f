"""The alert rule: its model (`Rule`, `Guard`) and its validation (`parse_rule`).

A rule compares the newest value of one metric (canonical name from `console.catalog`, or one of
the derived metrics below) against a threshold, per label set, and must hold for a duration
before it fires; an optional `when` guard is a second condition that must also hold. Every
problem is a `RuleError` (a ValueError) whose message names the rule and the field, so a typo in
the config file stops start-up with a sentence, and the same sentence is the UI's 400.

This module reads no database and no config (`console.alerts.rules` loads and stores rules;
`console.alerts.defaults` builds the shipped ones with `parse_rule`), so both can import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from console.catalog import UnknownMetric, check_metric

OPS = (">", ">=", "<", "<=")
SEVERITIES = ("critical", "warning", "info")
SOURCES = ("default", "ui", "file")
NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}

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

    def summary_for(self, labels: Mapping[str, str], state: str, value: float | None,
                    last_over: float | None = None) -> str:
        """What an alert of this rule in `state` says, on every face (its page, the lists, the API,
        webhook payloads). Pending or firing: the summary with the value now. Resolved (`ok`): that
        it resolved, with the last value that met the condition (`last_over`, the alert's
        `last_over_value`) in the summary, never the value that cleared it, which read "has
        waited 0s (over 300s)"; without such a value, only that it resolved."""
        if state != "ok":
            return self.render_summary(labels, value)
        if last_over is None:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "database")
            return f"Resolved: {self.name}" + (f" ({shown})" if shown else "")
        side = "over" if self.op in (">", ">=") else "under"
        return f"Resolved. Last reading {side} the threshold: {self.render_summary(labels, last_over)}"

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
        if not isinstance(name, str) or not NAME.match(name):
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
        if not isinstance(runbook, str):
            raise ValueError("runbook must be a URL or a docs path without spaces")
        if runbook:
            problem = link_problem(runbook)
            if problem:
                raise ValueError(f"runbook {problem}")
        webhooks = record.get("webhooks", []) or []
        if isinstance(webhooks, str):
            webhooks = [w.strip() for w in webhooks.split(",") if w.strip()]
        if not isinstance(webhooks, list | tuple) or not all(isinstance(w, str) and NAME.match(w) for w in webhooks):
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
    try:
        metric = _metric(value.get("metric"))
    except ValueError as exc:
        raise ValueError(f"when: {exc}") from None
    if value.get("threshold") in (None, ""):
        raise ValueError("when: threshold is required")
    return Guard(metric=metric, labels=_labels(value.get("labels"), metric, "when.labels"),
                 op=_op(value.get("op"), "when.op"), threshold=_number(value["threshold"], "when.threshold"))


def link_problem(link: str) -> str | None:
    """Why `link` may not be a runbook link (an href in the console and in every message), or None.

    Allowed: an http:// or https:// URL with a host, or a path on the console's site
    ("/wiki/queue-age", "docs/alerts.md#queue-age"). Anything with another scheme
    (javascript:, data:, vbscript:, file:), a scheme-relative "//host", a backslash (browsers
    read "/\\host" as "//host"), spaces or control characters is refused: a runbook link is
    one click away for the on-call engineer, in the console and in every webhook message.
    """
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in link):
        return "must be a URL or a docs path without spaces or control characters"
    if "\\" in link:
        return "must not contain a backslash"
    try:
        parts = urlsplit(link)
    except ValueError:
        return "is not a valid URL"
    if parts.scheme:
        if parts.scheme not in ("http", "https"):
            return f"must be an http:// or https:// URL or a site path (scheme {parts.scheme}: is not allowed)"
        try:
            check_url(link, "runbook")
        except ValueError as exc:
            return str(exc).removeprefix("runbook ")
        return None
    if parts.netloc or link.startswith("//"):
        return "must be an http:// or https:// URL or a site path (a link starting with // leaves the site)"
    if ":" in link.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]:
        return "must be an http:// or https:// URL or a site path (a colon before the first / reads as a scheme)"
    return None


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
