"""Skiplock in someone else's Prometheus and Grafana: the alerting rules file and the dashboard,
generated from `console.catalog` and the default alert rules so their names never drift.

`rules_yaml()` is docs/prometheus/skiplock-rules.yml and `dashboard_json()` is
docs/prometheus/skiplock-dashboard.json (`skiplock prometheus rules|dashboard` print them;
tests/test_prometheus.py checks the committed files equal this output). Every expression names
`skiplock_<catalog name>` with the catalog's labels, exactly what `/metrics` exports
(console/metrics.py).

How a Skiplock rule becomes a Prometheus rule (docs/metrics.md, "Prometheus and Grafana"):
- `metric{labels} op threshold` with `for`, labels `severity`, annotations `summary` (the same
  template), `description` (the rule as Skiplock states it) and `runbook_url`.
- Hysteresis (a firing alert resolves only past its clear value): the expression also keeps a
  series whose value is past the clear value while this rule's own `ALERTS{alertstate="firing"}`
  series exists (the ALERTS series the evaluating Prometheus stores itself: a ruler that does
  not see its own ALERTS loses the hysteresis, not the alert).
- A `when` guard: `and on(job, instance, database)` the guard's condition, so it is read in the
  same scrape target (and the same database, once series carry that label). Where Skiplock
  holds the alert's state while the guard has no data, Prometheus resolves it.
- Stale data: Skiplock holds every sample-based rule while the collectors are stale; `/metrics`
  keeps exporting the newest cycle's values, so Prometheus keeps evaluating those frozen values
  (and `collectors_stale` fires) instead.

The hysteresis is the default `[alerts] hysteresis` for rules without `clear`. This module
reads no database and no config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin

from console.alerts.defaults import DEFAULT_RULES
from console.alerts.model import Rule, format_duration, format_value
from console.catalog import METRICS, check_metric
from console.config import SETTINGS
from console.metrics import PREFIX

DEFAULT_HYSTERESIS = next(s.default for s in SETTINGS if s.section == "alerts" and s.key == "hysteresis")
# Labels Prometheus adds on scrape (job, instance) and the one a multi-database console adds.
TARGET_LABELS = ("job", "instance", "database")
# A rule's `when` guard must hold in the same scrape target and database as the rule's series.
GUARD_MATCH = "on(job, instance, database)"
# The labels an alert carries that its series does not; ignored when matching ALERTS.
ALERT_ONLY_LABELS = ("alertname", "alertstate", "severity")
GROUP = "skiplock"

# Skiplock's format_value in Go's template language: integers with no exponent from 1000 up,
# three significant digits below (Go cannot group thousands with commas, Skiplock does).
VALUE_TEMPLATE = ('{{ if or (ge $value 1000.0) (le $value -1000.0) }}{{ printf "%.0f" $value }}'
                  '{{ else }}{{ printf "%.3g" $value }}{{ end }}')


def series(metric: str, labels: Mapping[str, str] | None = None, *, extra: str = "") -> str:
    """`skiplock_<metric>{label="value",...}` for a catalogued metric (UnknownMetric otherwise)."""
    meta = check_metric(metric)
    unknown = sorted(set(labels or {}) - set(meta.labels))
    if unknown:
        raise ValueError(f"metric {metric} has no label(s) {', '.join(unknown)} (its labels: {', '.join(meta.labels) or 'none'})")
    matchers = [f"{key}={json.dumps(str(value))}" for key, value in sorted((labels or {}).items())]
    if extra:
        matchers.insert(0, extra)
    return PREFIX + metric + ("{" + ",".join(matchers) + "}" if matchers else "")


def _number(value: float) -> str:
    # 12 significant digits: exact for every default, and 0.18 rather than 0.17999999999999997
    return f"{value:.12g}"


def _condition(metric: str, labels: Mapping[str, str], op: str, threshold: float) -> str:
    return f"{series(metric, labels)} {op} {_number(threshold)}"


def rule_expression(rule: Rule, hysteresis: float = DEFAULT_HYSTERESIS) -> str:
    """The PromQL of one Skiplock rule (see the module docstring for what differs)."""
    guard = ""
    if rule.guard is not None:
        g = rule.guard
        guard = f"\n  and {GUARD_MATCH}\n  {_condition(g.metric, g.labels, g.op, g.threshold)}"
    enter = _condition(rule.metric, rule.labels, rule.op, rule.threshold)
    clear = rule.clear_threshold(hysteresis)
    if clear == rule.threshold:
        return f"{enter}{guard}" if not guard else f"(\n  {enter}{guard}\n)"
    still = _condition(rule.metric, rule.labels, rule.op, clear)
    firing = f'ALERTS{{alertname={json.dumps(rule.name)},alertstate="firing"}}'
    return (f"(\n  {enter}{guard}\n)\nor\n(\n  {still}\n  and ignoring({', '.join(ALERT_ONLY_LABELS)})\n"
            f"  {firing}{guard}\n)")


def summary_template(rule: Rule) -> str:
    """The rule's summary with Skiplock's {fields} as Prometheus template expressions."""
    fixed = {"threshold": format_value(rule.threshold), "metric": rule.metric, "rule": rule.name, "op": rule.op}
    labels = set(check_metric(rule.metric).labels)

    def field(match: re.Match) -> str:
        name = match.group(1)
        if name == "value":
            return VALUE_TEMPLATE
        if name in fixed:
            return fixed[name]
        if name in labels:
            return f"{{{{ $labels.{name} }}}}"
        return match.group(0)

    template = rule.summary or "{rule}: {metric} is {value} ({op} {threshold})"
    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", field, template)


def _condition_text(metric: str, labels: Mapping[str, str], op: str, threshold: float) -> str:
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{selector}}} {op} {format_value(threshold)}" if selector else f"{metric} {op} {format_value(threshold)}"


def _description(rule: Rule, hysteresis: float) -> str:
    """The rule as Skiplock states it (console names, thresholds as the console prints them)."""
    text = f"Skiplock rule {rule.name}: {_condition_text(rule.metric, rule.labels, rule.op, rule.threshold)}"
    if rule.guard is not None:
        g = rule.guard
        text += f" while {_condition_text(g.metric, g.labels, g.op, g.threshold)}"
    if rule.for_seconds:
        text += f" for {format_duration(rule.for_seconds)}"
    clear = rule.clear_threshold(hysteresis)
    if clear != rule.threshold:
        healthy = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}[rule.op]
        text += f"; once firing, it resolves when the value is {healthy} {format_value(clear)}"
    return text + "."


def prometheus_rule(rule: Rule, *, hysteresis: float = DEFAULT_HYSTERESIS, runbook_base_url: str = "") -> dict:
    """One alerting rule as a mapping in Prometheus's rule-file shape."""
    runbook = rule.runbook
    if runbook and runbook_base_url and not runbook.startswith(("http://", "https://")):
        runbook = urljoin(runbook_base_url, runbook)
    record = {"alert": rule.name, "expr": rule_expression(rule, hysteresis)}
    if rule.for_seconds:
        record["for"] = format_duration(rule.for_seconds)
    record["labels"] = {"severity": rule.severity}
    record["annotations"] = {"summary": summary_template(rule), "description": _description(rule, hysteresis)}
    if runbook:
        record["annotations"]["runbook_url"] = runbook
    return record


def rules_document(rules: Iterable[Rule] = DEFAULT_RULES, **options) -> dict:
    return {"groups": [{"name": GROUP, "rules": [prometheus_rule(r, **options) for r in rules if r.enabled]}]}


RULES_HEADER = """\
# Skiplock's default alert rules as Prometheus alerting rules (console/alerts/defaults.py:
# same names, thresholds, durations and severities; runbooks in docs/alerts.md).
# Generated by `skiplock prometheus rules`; do not edit: regenerate with
#   skiplock prometheus rules > docs/prometheus/skiplock-rules.yml
# docs/metrics.md ("Prometheus and Grafana") says how to load it and where it differs from the
# console's own evaluation (hysteresis through ALERTS, `when` guards, stale data).
"""


def _scalar(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def rules_yaml(rules: Iterable[Rule] = DEFAULT_RULES, **options) -> str:
    """The rules file: YAML written by hand (every string quoted) so no YAML library is needed."""
    lines = [RULES_HEADER.rstrip("\n"), "groups:"]
    for group in rules_document(rules, **options)["groups"]:
        lines += [f"  - name: {_scalar(group['name'])}", "    rules:"]
        for rule in group["rules"]:
            lines.append(f"      - alert: {_scalar(rule['alert'])}")
            lines.append("        expr: |-")
            lines += [f"          {line}" for line in rule["expr"].splitlines()]
            if "for" in rule:
                lines.append(f"        for: {rule['for']}")
            for section in ("labels", "annotations"):
                lines.append(f"        {section}:")
                lines += [f"          {key}: {_scalar(value)}" for key, value in rule[section].items()]
    return "\n".join(lines) + "\n"


# --- the Grafana dashboard ------------------------------------------------------------------------

# Grafana unit ids for the catalog's units; anything else shows the catalog unit as a suffix.
UNITS = {"seconds": "s", "bytes": "bytes", "bytes/s": "Bps", "ratio": "percentunit", "bool": "bool"}
# Panels select these template variables; "All" is the regex .*, which also matches a series
# without the label (so the dashboard works before series carry `database`).
SELECTOR = 'job=~"$job",database=~"$database"'


@dataclass(frozen=True)
class Target:
    metric: str
    by: tuple[str, ...] = ()  # catalog labels to keep (job and database are always kept)
    labels: tuple[tuple[str, str], ...] = ()  # fixed label matchers
    # A count a queue can hold on both backends at once (during a move to NATS, its PostgreSQL
    # side drains while the broker side fills): added up across `backend`, not the larger side.
    sum_backends: bool = False

    def expr(self) -> str:
        inner = series(self.metric, dict(self.labels), extra=SELECTOR)
        keep = ("job", "database") + self.by
        # max, not sum: several web processes scraped as one job export the same stored cycle.
        if not self.sum_backends:
            return f"max by ({', '.join(keep)}) ({inner})"
        return f"sum by ({', '.join(keep)}) (max by ({', '.join(keep + ('backend',))}) ({inner}))"

    def legend(self) -> str:
        parts = [f"{{{{{label}}}}}" for label in self.by] or [self.metric]
        return " ".join(parts) + " {{database}}"


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    description: str = ""
    unit: str | None = None  # None: from the first target's catalog unit


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Queue", (
        Panel("Queue depth", (Target("queue_depth", ("queue", "state"), sum_backends=True),)),
        Panel("Queue age (oldest eligible job)", (Target("queue_age_seconds", ("queue",)),),
              "Default alert queue_age: above 300 s for 2 min."),
        Panel("Stuck leases", (Target("stuck_leases", ("queue",), sum_backends=True),)),
    )),
    ("Throughput and failures", (
        Panel("Throughput", (Target("throughput", ("outcome",)),), unit="suffix: jobs/s"),
        Panel("Dead letters", (Target("dead_letters", ("queue",), sum_backends=True),)),
        Panel("Dead-letter growth", (Target("dead_letter_growth", ("queue",), sum_backends=True),), unit="suffix: jobs/h"),
        Panel("Retry rate", (Target("retry_rate"),)),
    )),
    ("Workers and claims", (
        Panel("Claim latency", (Target("claim_latency_seconds", ("source", "quantile", "queue")),),
              "Workers' p50/p95/max, pg_stat_statements mean, and the rolled-back probe claim."),
        Panel("Claim buffers per call", (Target("claim_buffers_per_call", ("statement",)),
                                         Target("claim_rows_per_call", ("statement",))),
              "Buffers climbing while rows stay flat: the claim walks dead index entries.", unit="short"),
        Panel("Pickup delay", (Target("pickup_delay_seconds", ("quantile",)),)),
        Panel("Workers", (Target("workers_live"), Target("workers_in_flight")), unit="short"),
    )),
    ("Jobs tables", (
        Panel("Dead tuples", (Target("table_dead_tuples", ("table",)),)),
        Panel("Dead ratio", (Target("table_dead_ratio", ("table",)),)),
        Panel("Autovacuum behind", (Target("table_autovacuum_behind", ("table",)),)),
        Panel("Transaction-ID age", (Target("table_xid_age", ("table", "part")),)),
    )),
    ("Database", (
        Panel("xmin horizon age", (Target("xmin_horizon_age_seconds", ("holder",)),),
              "Oldest holder by kind; any = the oldest. Default alert vacuum_blocked: any above 600 s for 5 min."),
        Panel("SLRU blocks read", (Target("slru_blocks_read_per_second", ("slru",)),),
              "Reads on multixact_* or subtransaction: SLRU thrashing."),
        Panel("MultiXact consumption", (Target("multixact_consumption_per_second"),
                                        Target("multixact_members_per_second")), unit="short"),
        Panel("WAL rate", (Target("wal_bytes_per_second"),)),
        Panel("Lock waits", (Target("lock_waits", ("relation",)),)),
        Panel("Replica lag", (Target("replica_lag_seconds", ("standby", "client")),)),
        Panel("Connections", (Target("connections", ("state",)), Target("max_connections"))),
    )),
    ("The console", (
        Panel("Collection age", (Target("collection_age_seconds"),),
              "Seconds since the newest collection cycle; grows when the scheduler is down."),
        Panel("Collector errors", (Target("collector_errors", ("collector",)),)),
        Panel("Collection duration", (Target("collection_duration_seconds"),)),
    )),
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _unit(panel: Panel) -> str:
    if panel.unit:
        return panel.unit
    unit = METRICS[panel.targets[0].metric].unit
    return UNITS.get(unit, f"suffix: {unit}")


def _variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query, "query": query,
        "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "sort": 1, "hide": 0,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [],
    }


def dashboard_document() -> dict:
    panels: list[dict] = []
    y = 0
    next_id = iter(range(1, 1000))
    for row_title, row_panels in ROWS:
        panels.append({"type": "row", "title": row_title, "id": next(next_id), "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        width = 24 // min(len(row_panels), 4)
        for index, panel in enumerate(row_panels):
            if index and index % 4 == 0:
                y += 8
            description = panel.description or " ".join(METRICS[t.metric].help for t in panel.targets)
            panels.append({
                "type": "timeseries", "title": panel.title, "id": next(next_id), "datasource": DATASOURCE,
                "description": description,
                "gridPos": {"h": 8, "w": width, "x": (index % 4) * width, "y": y},
                "fieldConfig": {"defaults": {"unit": _unit(panel), "custom": {"spanNulls": False}}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": t.expr(),
                             "legendFormat": t.legend()} for i, t in enumerate(panel.targets)],
            })
        y += 8
    return {
        "title": "Skiplock", "uid": "skiplock", "description":
            "The queue and its PostgreSQL, from Skiplock's /metrics. Generated by `skiplock prometheus dashboard`.",
        "tags": ["skiplock", "postgresql", "queue"], "editable": True, "graphTooltip": 1,
        "schemaVersion": 38, "version": 1, "refresh": "30s", "timezone": "",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": [{"builtIn": 1, "type": "dashboard", "name": "Annotations & Alerts", "enable": True,
                                  "hide": True, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "iconColor": "rgba(0, 211, 255, 1)"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "options": []},
            _variable("job", "Job", f"label_values({PREFIX}collection_age_seconds, job)"),
            _variable("database", "Database", f'label_values({PREFIX}collection_age_seconds{{job=~"$job"}}, database)'),
        ]},
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard_document(), indent=2) + "\n"


__all__ = ["DEFAULT_HYSTERESIS", "ROWS", "dashboard_document", "dashboard_json", "prometheus_rule",
           "rule_expression", "rules_document", "rules_yaml", "series", "summary_template"]
