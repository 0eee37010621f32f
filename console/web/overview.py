"""The overview: is the queue healthy, and if not, why? One verdict line, the key figures with
trend charts, firing alerts, and a queues table.

GET /overview?window=1h|6h|24h|7d          the page (bad window -> 400)
GET /overview/_verdict, /_figures, /_queues the fragments it includes (htmx polls them)
GET /api/v1/overview?window=...            the same as JSON

Where the verdict comes from: the worst of firing alerts (`console.alerts`, when installed), the
advisor's one-line verdict (`console.advisor.verdict_line`, when installed), and the latest
stored samples. Samples older than `STALE_AFTER` make the verdict say that measurements stopped.

Panels and verdict agree: every figure, queue row and chart line is coloured by the alert rules
in force (`Judge`: the shipped defaults, the UI's and the config file's rules, as
`console.alerts.rules.load` gives them), red where a critical alert fires, amber where a warning
one does or a critical one is near; only the failure ratio, which no rule watches, uses `RULES`
below. `assess()` computes the figures' levels and the verdict's reasons in one pass, and each
reason names the panel that shows it (`why[].panel`), so the verdict never says what no panel on
the screen shows.

Everything here reads stored samples (`console.samples`) and the small `skiplock.queues` and
alerts tables: no query touches the jobs table, so the page costs the same on 10 M rows.

Why one module of about 575 lines: the verdict, the figures and the queues table are three
fragments of one page computed from the same latest samples, and the verdict's thresholds
(`RULES`) belong next to the figures that show them. The per-queue charts at the end are the
seam if it grows.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    jsonify,
    render_template,
    request,
    url_for,
)
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import samples, signals, timefmt
from console.catalog import METRICS, check_metric
from console.sqlfiles import query
from console.web import charts, cycle, cycle_store, listing
from console.web.api import (
    ANY,
    BOOL,
    INT,
    NUM,
    OBJ,
    STR,
    TIME,
    Param,
    api_doc,
    arr,
    obj,
    opt,
    panel,
)
from console.web.auth import requires
from console.web.database import Panel, run_panel

bp = Blueprint("overview", __name__)
log = logging.getLogger(__name__)

WINDOWS: dict[str, timedelta] = {"1h": timedelta(hours=1), "6h": timedelta(hours=6),
                                 "24h": timedelta(hours=24), "7d": timedelta(days=7)}
DEFAULT_WINDOW = "1h"
STALE_AFTER = timedelta(minutes=5)
# What the overview lists of what a producer can make long (console/web/listing.py): the worst
# queues and alerts, and the verdict's first reasons, each with the count of the rest and a
# link to the page that has them all (search, paging).
OVERVIEW_ROWS = 20
VERDICT_REASONS = 10
JOBS_TABLES = ("jobs", "skiplock.jobs")

# (warn at, bad at) for the one figure no alert rule watches: failed / (completed + failed) over
# the rate window. Every other figure is coloured by the alert rules in force (`Judge`).
RULES: dict[str, tuple[float, float]] = {
    "failure_ratio": (0.05, 0.25),
}
LEVELS = ["unknown", "good", "warn", "bad"]  # worst last


def window_arg() -> tuple[str, timedelta]:
    name = request.args.get("window", DEFAULT_WINDOW)
    if name not in WINDOWS:
        abort(400, f"window: {name!r} is not one of {', '.join(WINDOWS)}")
    return name, WINDOWS[name]


# --- latest samples -------------------------------------------------------------------------

@dataclass
class Latest:
    """The newest sample of each (metric, labels), with lookups that sum or take the max.

    The rows are indexed by metric once: a page asks a few dozen questions of the same samples,
    and 5,000 queues make about 45,000 of them, so a scan of every row per question cost seconds."""

    rows: list[samples.Sample]
    _by_metric: dict[str, list[samples.Sample]] = field(init=False, repr=False, compare=False)
    _values: dict[tuple, list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_metric = {}
        self._values = {}  # the rows never change after this: an answer stays true
        for s in self.rows:
            self._by_metric.setdefault(s.metric, []).append(s)

    def of(self, metric: str) -> list[samples.Sample]:
        """The samples of one metric (in the order stored)."""
        return self._by_metric.get(metric, [])

    def values(self, metric: str, **where: str) -> list[float]:
        key = (metric, *sorted(where.items()))
        found = self._values.get(key)
        if found is None:
            found = self._values[key] = [s.value for s in self.of(metric) if s.value is not None
                                         and all(s.labels.get(k) == v for k, v in where.items())]
        return found

    def total(self, metric: str, **where: str) -> float | None:
        vals = self.values(metric, **where)
        return sum(vals) if vals else None

    def most(self, metric: str, **where: str) -> float | None:
        vals = self.values(metric, **where)
        return max(vals) if vals else None

    def newest(self) -> datetime | None:
        return max((s.at for s in self.rows if s.at), default=None)

    def by_label(self, metric: str, label: str, **where: str) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for s in self.of(metric):
            if all(s.labels.get(k) == v for k, v in where.items()) and label in s.labels:
                key = s.labels[label]
                out[key] = (out.get(key) or 0) + s.value if s.value is not None else out.get(key)
        return out

    def jobs_table(self, metric: str) -> float | None:
        for name in JOBS_TABLES:
            value = self.total(metric, table=name)
            if value is not None:
                return value
        return None


def _latest(conn) -> Latest:
    # Skiplock's own figures; [[external_queues]] series (label `external`) have their own panel.
    return Latest([s for s in samples.latest(conn, within=timedelta(minutes=15)) if "external" not in s.labels])


def level(value: float | None, rule: str) -> str:
    """good / warn / bad for a figure no alert rule watches (`RULES`), or 'unknown'."""
    if value is None:
        return "unknown"
    warn, bad = RULES[rule]
    return "bad" if value >= bad else "warn" if value >= warn else "good"


def worst(levels) -> str:
    return max(levels, key=LEVELS.index, default="unknown")


class Judge:
    """Colours a figure by the alert rules in force (defaults, then the UI's, then the config
    file's: `console.alerts.rules.load`), so a panel turns red exactly where a critical alert
    would fire and amber where a warning one would, or where a critical one is near (past its
    clear value: the rule's `clear`, else the threshold less `alerts.hysteresis`). A metric
    with no enabled rule gets no colour from here ("neutral"). Guards ("while jobs are
    eligible") are checked against the same latest samples."""

    def __init__(self, rules, hysteresis: float = 0.1, latest: Latest | None = None, source: str = "rules"):
        self.rules = [r for r in rules if r.enabled]
        self.hysteresis = hysteresis
        self.latest = latest
        self.source = source
        # Asked once per sample (per_label): the rules of one metric, and each guard's answer
        # over these latest samples, are looked up, not found again by a scan.
        self._by_metric: dict[str, list] = {}
        for r in self.rules:
            self._by_metric.setdefault(r.metric, []).append(r)
        self._guards: dict[int, bool] = {}

    def with_latest(self, latest: Latest) -> Judge:
        return Judge(self.rules, self.hysteresis, latest, self.source)

    def rules_for(self, metric: str, labels: dict[str, str] | None = None) -> list:
        return [r for r in self._by_metric.get(metric, ()) if r.matches(labels or {})]

    def _guard_holds(self, rule) -> bool:
        guard = rule.guard
        if guard is None:
            return True
        if self.latest is None:
            return False
        held = self._guards.get(id(rule))
        if held is None:
            from console.alerts.rules import compare

            held = self._guards[id(rule)] = any(
                compare(guard.op, v, guard.threshold) for v in self.latest.values(guard.metric, **guard.labels))
        return held

    def level(self, metric: str, value: float | None, labels: dict[str, str] | None = None) -> str:
        """bad / warn / good by the rules on `metric` matching `labels`; 'neutral' without a
        rule; 'unknown' when not measured."""
        from console.alerts.rules import compare

        rules = self.rules_for(metric, labels)
        if not rules:
            return "neutral"
        if value is None:
            return "unknown"
        out = "good"
        for rule in rules:
            if not self._guard_holds(rule):
                continue
            if rule.condition(value):
                lv = "bad" if rule.severity == "critical" else "warn" if rule.severity == "warning" else "good"
            elif rule.severity == "critical" and compare(rule.op, value, rule.clear_threshold(self.hysteresis)):
                lv = "warn"
            else:
                lv = "good"
            out = worst([out, lv])
        return out

    def bounds(self, metric: str, labels: dict[str, str] | None = None) -> tuple[float | None, float | None]:
        """(amber at, red at) for a figure's chart and note, from the rules on `metric` whose
        label selector the figure's own labels satisfy; None where no rule says."""
        amber: list[float] = []
        red: list[float] = []
        for rule in self.rules_for(metric, labels):
            if rule.op not in (">", ">="):
                continue
            if rule.severity == "critical":
                red.append(rule.threshold)
                amber.append(rule.clear_threshold(self.hysteresis))
            elif rule.severity == "warning":
                amber.append(rule.threshold)
        return (min(amber) if amber else None), (min(red) if red else None)

    def per_label(self, metric: str, label: str) -> dict[str, tuple[float | None, str]]:
        """{label value: (latest value, level)} for a per-queue (or per-table) metric: of several
        series with that label value (a queue on both backends), the worst level, and of equal
        levels the larger value."""
        out: dict[str, tuple[float | None, str]] = {}
        for s in (self.latest.of(metric) if self.latest else []):
            if label in s.labels:
                key = s.labels[label]
                lv = self.level(metric, s.value, s.labels)
                rank = LEVELS.index(_rank(lv))
                held = out.get(key)
                if held is None:
                    out[key] = (s.value, lv)
                    continue
                held_value, held_rank = held[0], LEVELS.index(_rank(held[1]))
                if rank > held_rank or (rank == held_rank and s.value is not None
                                        and (held_value is None or s.value > held_value)):
                    out[key] = (s.value, lv)
        return out


def _rank(lv: str) -> str:
    return lv if lv in LEVELS else "good"  # neutral counts as good when taking the worst


def default_judge(latest: Latest | None = None) -> Judge:
    from console.alerts.defaults import DEFAULT_RULES

    return Judge(DEFAULT_RULES, latest=latest, source="defaults")


def load_judge(conn) -> Judge:
    """The Judge of the rules in force; the built-in defaults when a rule cannot be loaded (the
    alerts page reports that)."""
    from console.web import state

    config = state().config
    load = _optional("console.alerts.rules", "load")
    if load is None:
        return default_judge()
    try:
        ruleset = load(conn, config)
    except ValueError as exc:
        log.warning("alert rules could not be loaded for the overview's colours: %s", exc)
        return default_judge()
    return Judge(ruleset.rules.values(), config.alerts.hysteresis)


def claim_p95(latest: Latest) -> float | None:
    for where in ({"source": "workers", "quantile": "p95"}, {"source": "pg_stat_statements"}, {"source": "probe"}):
        value = latest.most("claim_latency_seconds", **where)
        if value is not None:
            return value
    return latest.most("claim_latency_seconds")


def failure_ratio(latest: Latest) -> float | None:
    """Jobs failing for good over jobs finished, over the rate window (the workers collector's
    `failure_ratio`); from the newest interval's throughput only where that is not stored (a
    history from before it, or seeded samples). One interval of a few seconds mostly holds no
    failure at all, then one: 0 % and 20 % in turn for a steady 2 %."""
    stored = latest.total("failure_ratio")
    if stored is not None:
        return stored
    done = latest.total("throughput", outcome="completed")
    failed = latest.total("throughput", outcome="failed")
    if done is None and failed is None:
        return None
    finished = (done or 0) + (failed or 0)
    return (failed or 0) / finished if finished else 0.0


# --- the verdict ----------------------------------------------------------------------------

def _optional(module: str, attr: str) -> Callable[..., Any] | None:
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None


def active_alerts(conn) -> list[dict[str, Any]] | None:
    """Pending and firing alerts (firing first, critical before warning), or None when the
    alerts package is not installed."""
    active = _optional("console.alerts.evaluate", "active_alerts")
    load = _optional("console.alerts.rules", "load")
    if active is None or load is None:
        return None
    from console.web import state

    try:
        ruleset = load(conn, state().config)
    except ValueError as exc:  # a bad rule is the alerts page's to report; the overview goes on
        log.warning("alert rules could not be loaded for the overview: %s", exc)
        ruleset = None
    from console.web.redact import notification_keys

    return active(conn, ruleset, secret_keys=notification_keys(), links_for=OVERVIEW_ROWS)


def firing_alerts(conn) -> list[dict[str, Any]] | None:
    """Firing alerts only (the fleet page counts them), or None without the alerts package."""
    found = active_alerts(conn)
    return None if found is None else [a for a in found if a["state"] == "firing"]


@dataclass(frozen=True)
class Finding:
    """One reason for the verdict, and the panel of the overview that shows it: a figure's key
    (`data-figure`), `queue:<name>` (a row of the queues table), `alerts` (the firing alerts),
    `advisor` (the advisor's line) or `measurements` (the verdict's "measured ..." line). The
    verdict lists nothing a panel on the same screen does not show in the same colour.
    `metric` and `queue` say which alert rule's series it is about (None: a figure no rule
    watches), so the verdict does not say twice what an alert already says."""

    level: str  # warn / bad
    text: str
    panel: str
    metric: str | None = None
    queue: str | None = None


def assess(latest: Latest, judge: Judge | None = None) -> tuple[dict[str, str], list[Finding]]:
    """The level of each figure and the findings, from the latest samples, computed once for
    both: the figures' colours and the verdict's reasons cannot disagree."""
    judge = (judge or default_judge()).with_latest(latest)
    levels: dict[str, str] = {}
    found: list[Finding] = []

    def note(lv: str, text: str, panel: str, metric: str | None = None, queue: str | None = None) -> None:
        if lv in ("warn", "bad"):
            found.append(Finding(lv, text, panel, metric, queue))

    def per_queue(metric: str, panel: str, text) -> str:
        values = judge.per_label(metric, "queue")
        for queue, (value, lv) in sorted(values.items(), key=lambda kv: -(kv[1][0] or 0)):
            note(lv, text(queue, value), panel, metric, queue)
        if not values:
            return judge.level(metric, None)
        return worst(_rank(lv) for _, lv in values.values()) if judge.rules_for(metric, None) or any(
            lv != "neutral" for _, lv in values.values()) else "neutral"

    levels["age"] = per_queue("queue_age_seconds", "age", lambda q, v: (
        f"queue {q}: the oldest job has waited {charts.format_value(v, 'seconds')}"))
    levels["dead_letters"] = per_queue("dead_letter_growth", "dead_letters", lambda q, v: (
        f"queue {q}: {charts.format_value(v, 'jobs/h')} new dead letters"))
    for queue, (value, lv) in sorted(judge.per_label("stuck_leases", "queue").items()):
        note(lv, f"queue {queue}: {charts.format_value(value, 'jobs')} with an expired lease not yet reaped",
             f"queue:{queue}", "stuck_leases", queue)

    ratio = failure_ratio(latest)
    levels["failures"] = level(ratio, "failure_ratio")
    note(levels["failures"], f"{charts.format_value(ratio, 'ratio')} of finished jobs are failing", "failures")

    claim = claim_p95(latest)
    levels["claim"] = judge.level("claim_latency_seconds", claim, dict(CLAIM_LABELS))
    note(levels["claim"], f"claiming a job takes {charts.format_value(claim, 'seconds')} (p95)", "claim",
         "claim_latency_seconds")

    # Dead rows are news when they pass the autovacuum threshold with no vacuum running (the
    # autovacuum_behind rule): the panel shows the dead rows against that threshold's line.
    behind = latest.jobs_table("table_autovacuum_behind")
    levels["dead_tuples"] = judge.level("table_autovacuum_behind", behind, {"table": "jobs"})
    dead = latest.jobs_table("table_dead_tuples")
    threshold = latest.jobs_table("table_autovacuum_threshold")
    # When the last vacuum ran and removed nothing, "no vacuum is running" points at autovacuum's
    # tuning; the cause is the xmin horizon (the Database page says the same).
    why = ("vacuum ran but removed none of them: something holds the xmin horizon"
           if latest.jobs_table("vacuum_removed_nothing") else "no vacuum is running")
    note(levels["dead_tuples"], f"{charts.format_value(dead, '')} dead rows in the jobs table, past its autovacuum "
         f"threshold of {charts.format_value(threshold, '')}, and {why}", "dead_tuples",
         "table_autovacuum_behind")

    eligible = latest.total("queue_depth", state="eligible") or 0
    workers = judge.level("workers_live", latest.total("workers_live"), {})
    levels["depth"] = workers if workers in ("warn", "bad") else "neutral"
    note(levels["depth"], f"no live workers and {charts.format_value(eligible, 'jobs')} waiting", "depth",
         "workers_live")
    found.sort(key=lambda f: f.level != "bad")  # stable: bad first, each in the order found
    return levels, found


def sample_verdict(latest: Latest, judge: Judge | None = None) -> tuple[str, list[str]]:
    """healthy / degraded / failing and the reasons, from the latest samples alone."""
    _, found = assess(latest, judge)
    if any(f.level == "bad" for f in found):
        return "failing", [f.text for f in found]
    if found:
        return "degraded", [f.text for f in found]
    return "healthy", []


_ORDER = ["unknown", "healthy", "degraded", "failing"]


def _covers(alert: dict[str, Any], finding: Finding) -> bool:
    """Whether an active alert is about the same series as a finding of the samples."""
    if finding.metric is None or alert.get("metric") != finding.metric:
        return False
    return finding.queue is None or (alert.get("labels") or {}).get("queue") in (None, finding.queue)


def _alert_note(alert: dict[str, Any], now: datetime) -> str:
    """What an active alert's state adds to the line of the series it is about."""
    if alert.get("silence"):
        return "alert silenced"
    if alert["state"] == "firing":
        return "alert firing" + (f", acknowledged by {alert['acknowledged_by']}" if alert.get("acknowledged_by") else "")
    since = alert.get("state_since")
    held = (now - since).total_seconds() if since else 0.0
    remaining = max((alert.get("for_seconds") or 0.0) - held, 0.0)
    return f"alert pending: fires if this lasts {charts.format_value(remaining, 'seconds')} more"


def verdict(conn, latest: Latest, alerts: list[dict[str, Any]] | None | str = "load",
            judge: Judge | None = None) -> dict[str, Any]:
    """The worst of: the active alerts (when installed), the advisor's line (when installed),
    and the latest samples judged by the alert rules in force. Each fact is said once, naming
    the panel that shows it (`why`: text, level, panel): a finding of the samples that an
    active alert is about carries the alert's state ("alert firing", "alert pending: fires if
    this lasts 40 s more", "alert silenced") instead of a second line with the alert's summary,
    and an alert no figure shows (vacuum_blocked, lock waits ...) has its own line (panel
    `alerts`). The alerts panel beside the verdict lists pending alerts too, so a red verdict
    never stands beside "no alerts" without saying which alert is on its way. Alerts need time
    to fire (their `for` duration) and may be silenced; the samples see a problem at once, so
    neither alone decides."""
    now = datetime.now(UTC)
    newest = latest.newest()
    stale = newest is None or now - newest > STALE_AFTER
    states: list[str] = []
    why: list[dict[str, str]] = []
    sources: list[str] = []
    advisor_text = None

    seen: set[str] = set()  # a set, not a scan of `why`: one reason per queue can be thousands

    def add(text: str, lv: str, panel: str) -> None:
        if text not in seen:
            seen.add(text)
            why.append({"text": text, "level": lv, "panel": panel})

    if alerts == "load":
        alerts = active_alerts(conn)
    found: list[Finding] = []
    if newest is not None:
        _, found = assess(latest, judge)
    said: set[int] = set()  # the alerts a finding already speaks for
    notes: dict[int, list[str]] = {}
    # Alerts by (metric, queue label): each finding looks up its own, instead of every finding
    # against every alert (5,000 late queues and their 5,000 alerts made that 25 million pairs).
    by_series: dict[tuple[str | None, str | None], list[tuple[int, dict[str, Any]]]] = {}
    for n, a in enumerate(alerts or []):
        by_series.setdefault((a.get("metric"), (a.get("labels") or {}).get("queue")), []).append((n, a))
    for i, f in enumerate(found):
        if f.metric is None:
            continue
        if f.queue is None:
            candidates = [pair for (metric, _), pairs in by_series.items() if metric == f.metric for pair in pairs]
        else:
            candidates = by_series.get((f.metric, None), []) + by_series.get((f.metric, f.queue), [])
        for _, a in sorted(candidates, key=lambda pair: pair[0]):  # in the alerts' own order
            if _covers(a, f):
                said.add(a["id"])
                notes.setdefault(i, []).append(_alert_note(a, now))
    if alerts is not None:
        live = [a for a in alerts if not a.get("silence")]
        firing = [a for a in live if a["state"] == "firing"]
        pending = [a for a in live if a["state"] == "pending"]
        states.append("failing" if any(a.get("severity") == "critical" for a in firing)
                      else "degraded" if firing or pending else "healthy")
        for a in live:
            if a["id"] in said:
                continue
            lv = "bad" if a["state"] == "firing" and a.get("severity") == "critical" else "warn"
            text = a.get("summary") or a["rule"]
            add(text if a["state"] == "firing" else f"{text} ({_alert_note(a, now)})", lv, "alerts")
        sources.append("alerts")
    advisor_line = _optional("console.advisor", "verdict_line")
    if advisor_line is not None and not stale:
        line = advisor_line(conn, newest=newest)
        if isinstance(line, dict) and line.get("state") in _ORDER:
            states.append(line["state"])
            for r in line.get("reasons") or []:
                advisor_text = r
                add(r, "warn", "advisor")
            sources.append("advisor")
    if newest is not None:
        states.append("failing" if any(f.level == "bad" for f in found) else "degraded" if found else "healthy")
        for i, f in enumerate(found):
            add(f"{f.text} ({'; '.join(notes[i])})" if i in notes else f.text, f.level, f.panel)
        sources.append("samples")
    if stale:
        add("no measurements stored yet: is `skiplock scheduler` running?" if newest is None else
            f"the newest measurement is {charts.format_value((now - newest).total_seconds(), 'seconds')} "
            "old: is `skiplock scheduler` running?", "warn", "measurements")
        states.append("degraded" if newest is not None else "unknown")
    state = max(states, key=_ORDER.index) if states else "unknown"
    if newest is None and state == "healthy":
        state = "unknown"  # nothing measured: "no alerts firing" means nothing
    more = 0
    if len(why) > VERDICT_REASONS:
        # One reason per queue and per alert: 5,000 late queues would be 5,000 lines. The first
        # VERDICT_REASONS, stale measurements and the red ones first, and the count of the rest
        # (the queues and alerts panels list them worst first).
        why = sorted(why, key=lambda w: (w["panel"] != "measurements", w["level"] != "bad"))
        more, why = len(why) - VERDICT_REASONS, why[:VERDICT_REASONS]
    return {"state": state, "reasons": [w["text"] for w in why], "why": why, "why_more": more,
            "advisor": advisor_text, "source": "+".join(sources) or "none", "measured_at": newest}


# --- figures and charts ---------------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    metric: str
    unit: str
    where: tuple[tuple[str, str], ...] = ()
    split_by: str | None = None
    agg: str = "sum"
    rule: str | None = None  # the metric whose alert rules colour it (failures: RULES)
    help: str = ""


FIGURES: tuple[Figure, ...] = (
    Figure("depth", "Jobs waiting", "queue_depth", "jobs", (("state", "eligible"),), split_by="queue",
           help="Pending jobs that are due now, by queue. Rising while throughput is flat: add workers or find the slow kind."),
    Figure("age", "Oldest waiting job", "queue_age_seconds", "seconds", split_by="queue", agg="max",
           rule="queue_age_seconds",
           help="How long the head of each queue has waited. Red: jobs are late; check workers and paused queues."),
    Figure("throughput", "Throughput", "throughput", "jobs/s", split_by="outcome",
           help="Jobs finished per second, by outcome (from worker counters)."),
    Figure("failures", "Failures", "throughput", "jobs/s", (("outcome", "failed"),), rule="failure_ratio",
           help="Jobs failing for good per second. Red: open Dead letters and look at the biggest error group."),
    Figure("claim", "Claim latency (p95)", "claim_latency_seconds", "seconds",
           (("source", "workers"), ("quantile", "p95")), agg="max", rule="claim_latency_seconds",
           help="Time for a worker to claim a batch. Climbing with dead tuples: vacuum is behind (see Database)."),
    Figure("dead_letters", "Dead letters", "dead_letters", "jobs", split_by="queue", rule="dead_letter_growth",
           help="Jobs that failed for good. Red when they grow fast: see Dead letters, replay once the cause is fixed."),
    Figure("dead_tuples", "Dead tuples (jobs table)", "table_dead_tuples", "rows", (("table", "jobs"),),
           rule="table_autovacuum_behind",
           help="Dead rows waiting for vacuum in the hot table; the dashed line is the autovacuum threshold."),
)


def figure_value(fig: Figure, latest: Latest) -> float | None:
    if fig.key == "dead_tuples":
        return latest.jobs_table("table_dead_tuples")
    if fig.key == "claim":
        return claim_p95(latest)
    where = dict(fig.where)
    return latest.most(fig.metric, **where) if fig.agg == "max" else latest.total(fig.metric, **where)


CLAIM_LABELS = (("source", "workers"), ("quantile", "p95"))


CHART_POINTS = 120  # about one point per 3 px of a chart: enough detail, little to fetch


def chart_lines(conn, metric: str, window: timedelta, *, where: dict[str, str] | None = None,
                split_by: str | None = None, agg: str = "sum") -> list[charts.Line]:
    """A metric's series over the window as chart lines, reduced to ~CHART_POINTS buckets in
    the database (sql/overview.sql). Like `samples.series`, windows over 6 h read the
    per-minute rollup and over 2 days the hourly one, falling back to raw samples when the
    rollup is empty. A total across queues (not split, `samples.has_total`) reads the
    per-cycle totals instead (`total_lines`)."""
    check_metric(metric)
    if split_by is None and samples.has_total(metric, where, agg):
        return total_lines(conn, metric, window, where=where, agg=agg)
    return _sample_lines(conn, metric, window, where=where, split_by=split_by, agg=agg)


def _sample_lines(conn, metric: str, window: timedelta, *, where: dict[str, str] | None = None,
                  split_by: str | None = None, agg: str = "sum", since: datetime | None = None,
                  until: datetime | None = None) -> list[charts.Line]:
    """`chart_lines` from the samples (or their rollup). `since` (default: the window back
    from now) is also the buckets' origin; `until` ends the window early (exclusive)."""
    since = since or datetime.now(UTC) - window
    step = max(window / CHART_POINTS, timedelta(seconds=1))
    params = {"metric": metric, "since": since, "until": until, "labels": Jsonb(where) if where else None,
              "split": split_by, "agg": agg, "step": step}
    rows: list[dict[str, Any]] = []
    with conn.cursor(row_factory=dict_row) as cur:
        if window > timedelta(hours=6):
            resolution = "minute" if window <= timedelta(days=2) else "hour"
            rows = cur.execute(query("overview", "series_rollup"), {**params, "resolution": resolution}).fetchall()
        if not rows:
            rows = cur.execute(query("overview", "series_raw"), params).fetchall()
    lines: dict[str, list[tuple[datetime, float | None]]] = {}
    for r in rows:
        lines.setdefault(r["key"], []).append((r["at"], r["value"]))
    return [charts.Line(key or "all", pts) for key, pts in sorted(lines.items())]


def total_lines(conn, metric: str, window: timedelta, *, where: dict[str, str] | None = None,
                agg: str = "sum") -> list[charts.Line]:
    """The total across queues of `metric` over the window, one line ("all"), from the
    per-cycle totals (skiplock.samples_totals, migration 032): a row a cycle, where summing
    the samples read every queue's (1.2 million rows an hour at 5,000 queues). When the first
    total in the window is past its first bucket (history stored before 031, or older than raw
    samples are kept), the buckets up to and including the one holding that first total are
    summed from the samples (or their rollup) as before, the later ones read the totals."""
    since = datetime.now(UTC) - window
    step = max(window / CHART_POINTS, timedelta(seconds=1))
    params = {"metric": metric, "since": since, "labels": Jsonb(where) if where else None, "agg": agg, "step": step}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("overview", "series_totals"), params).fetchall()
    if not rows:
        return _sample_lines(conn, metric, window, where=where, agg=agg, since=since)
    points = [(r["at"], r["value"]) for r in rows]
    cut = rows[0]["at"]  # the bucket holding the oldest total in the window
    if cut > since:  # the same origin, so the buckets of both reads line up
        older = _sample_lines(conn, metric, window, where=where, agg=agg, since=since, until=cut + step)
        points = [(at, v) for line in older for at, v in line.points if at <= cut] + [p for p in points if p[0] > cut]
    return [charts.Line("all", points)]


def _series(conn, fig: Figure, window: timedelta) -> list[charts.Line]:
    where = dict(fig.where)
    if fig.key == "dead_tuples":
        table = next((t for t in JOBS_TABLES if t in _tables_with(conn, fig.metric)), "jobs")
        where = {"table": table}
    split_by = fig.split_by
    if split_by and split_keys(conn, fig.metric, window, split_by, where=where) > charts.MAX_LINES:
        split_by = None  # too many queues for separate lines: one total, without fetching each queue's
    lines = chart_lines(conn, fig.metric, window, where=where, split_by=split_by, agg=fig.agg)
    if split_by and len(lines) > charts.MAX_LINES:
        lines = chart_lines(conn, fig.metric, window, where=where, agg=fig.agg)  # keys came in since the count
    return lines


def split_keys(conn, metric: str, window: timedelta, split_by: str, *, where: dict[str, str] | None = None) -> int:
    """How many lines `metric` split by the `split_by` label would draw over the window."""
    since = datetime.now(UTC) - window
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("overview", "split_keys"), {
            "metric": metric, "since": since, "split": split_by, "labels": Jsonb(where) if where else None}).fetchone()
    return int(row["keys"])


def _tables_with(conn, metric: str) -> set[str]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("overview", "tables_with"), {"metric": metric}).fetchall()
    return {r["table_name"] for r in rows}


def rule_bounds(judge: Judge, fig: Figure) -> tuple[float | None, str, str | None]:
    """(chart line, its label, the card's note) from the alert rules on the figure's metric:
    "red at" the critical threshold (else "amber at" the warning one), as the alerts fire."""
    if fig.key not in ("age", "claim"):
        return None, "threshold", None
    amber, red = judge.bounds(fig.rule, dict(fig.where))
    parts = [f"{name} at {charts.format_value(v, fig.unit)}" for name, v in (("amber", amber), ("red", red)) if v is not None]
    line, label = (red, "red at") if red is not None else (amber, "amber at")
    return line, label, (" · ".join(parts) + " (alert rules)") if parts else "no alert rule"


def _rate_window() -> timedelta:
    """`[scheduler] rate_window` of the running console (the default outside a request)."""
    from console.web import state

    try:
        return signals.rate_window(state().config)
    except RuntimeError:  # no application context
        return signals.rate_window(None)


def figures_data(conn, latest: Latest, window: timedelta, *, draw: bool = True,
                 judge: Judge | None = None) -> list[dict[str, Any]]:
    end = datetime.now(UTC)
    start = end - window
    out = []
    judge = (judge or default_judge()).with_latest(latest)
    levels, _ = assess(latest, judge)
    threshold_dead = latest.jobs_table("table_autovacuum_threshold")
    for fig in FIGURES:
        lines = _series(conn, fig, window)
        value = figure_value(fig, latest)
        threshold, threshold_label, note = rule_bounds(judge, fig)
        if fig.key == "dead_tuples" and threshold_dead:
            threshold, threshold_label = threshold_dead, "autovacuum at"
        item = {
            "key": fig.key,
            "title": fig.title,
            "metric": fig.metric,
            "unit": fig.unit,
            "help": fig.help,
            "value": value,
            "display": charts.format_value(value, fig.unit),
            "level": levels.get(fig.key) or ("unknown" if value is None else "neutral"),
            "note": note,
            "summary": charts.summary(lines, fig.unit),
            "series": [{"label": ln.label, "points": [[at, v] for at, v in ln.points]} for ln in lines],
        }
        if fig.key == "failures":
            ratio = failure_ratio(latest)
            # The headline is the last collection interval's rate (often 0 between two failures);
            # the ratio is over the rate window: say so, or the two read as a contradiction.
            item["note"] = None if ratio is None else \
                f"{charts.format_value(ratio, 'ratio')} of finished jobs in the last {timefmt.duration(_rate_window())}"
        if fig.key == "dead_letters":
            growth = latest.total("dead_letter_growth")
            item["note"] = None if growth is None else f"+{charts.format_value(growth, 'jobs/h')}"
        if fig.key == "dead_tuples" and threshold_dead:
            item["note"] = f"autovacuum at {charts.format_value(threshold_dead, 'rows')}"
        if fig.key == "depth" and item["level"] in ("warn", "bad"):
            item["note"] = "no live workers"
        if draw:
            item["chart"] = charts.line_chart(lines, unit=fig.unit, start=start, end=end, title=fig.title,
                                              threshold=threshold, threshold_label=threshold_label)
            item["legend"] = charts.legend(lines)
        out.append(item)
    return out


# --- the queues table -----------------------------------------------------------------------

def _paused(conn) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        "SELECT name, paused, paused_at, paused_by FROM skiplock.queues ORDER BY name"
    ).fetchall()
    return {r[0]: {"paused": r[1], "paused_at": r[2], "paused_by": r[3]} for r in rows}


def queues_data(conn, latest: Latest, judge: Judge | None = None) -> list[dict[str, Any]]:
    """A row per queue: the latest samples' queues, the paused ones, and every queue sampled in
    the last 24 h (an emptied queue stays listed, `idle_since` its last sample with work). Each
    row's level is the worst its figures get from the alert rules in force."""
    judge = (judge or load_judge(conn)).with_latest(latest)
    depth: dict[str, dict[str, float | None]] = {}
    for s in latest.of("queue_depth"):
        if "queue" in s.labels:  # a queue on both backends (a move's dual run): the two added
            row = depth.setdefault(s.labels["queue"], {})
            state_ = s.labels.get("state", "?")
            before = row.get(state_)
            row[state_] = s.value if before is None else before + (s.value or 0.0)
    ages = judge.per_label("queue_age_seconds", "queue")
    stuck = judge.per_label("stuck_leases", "queue")
    growth = judge.per_label("dead_letter_growth", "queue")
    paused = _paused(conn)
    activity = samples.queue_activity(conn)
    names = sorted(set(depth) | set(paused) | set(activity))
    out = []
    now = datetime.now(UTC)
    from console.web import state

    window = signals.rate_window(state().config)
    for name in names:
        d = depth.get(name, {})
        age, age_lv = ages.get(name, (None, "unknown"))
        n_stuck, stuck_lv = stuck.get(name, (None, "unknown"))
        n_growth, growth_lv = growth.get(name, (None, "unknown"))
        lv = worst(_rank(x) for x in (age_lv, stuck_lv, growth_lv))
        p = paused.get(name, {})
        last_busy = (activity.get(name) or {}).get("last_busy")
        idle, idle_since = signals.queue_idle(d, last_busy, now=now, window=window)
        out.append({
            "queue": name,
            "eligible": d.get("eligible"), "scheduled": d.get("scheduled"), "running": d.get("running"),
            "failed": d.get("failed"), "oldest_age_s": age, "stuck": n_stuck,
            "dead_letter_growth": n_growth, "paused": bool(p.get("paused")),
            "paused_by": p.get("paused_by"), "level": lv, "idle": idle,
            "idle_since": idle_since, "last_busy": last_busy,
        })
    # Worst first: the level the rules give, then stuck leases, the longest wait, dead-letter
    # growth (as the Queues page orders them); the overview shows the first OVERVIEW_ROWS.
    out.sort(key=lambda q: (["bad", "warn", "good", "unknown"].index(q["level"]), -(q["stuck"] or 0),
                            -(q["oldest_age_s"] or 0), -(q["dead_letter_growth"] or 0), q["queue"]))
    return out


# --- routes ---------------------------------------------------------------------------------

PARTS = ("verdict", "figures", "queues", "alerts")


def overview_data(window_name: str, window: timedelta, *, draw: bool, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Each part is its own time-limited panel; a fragment computes only its own part."""
    latest = run_panel(_latest)
    out: dict[str, Any] = {"window": window_name, "windows": list(WINDOWS)}
    alerts = run_panel(active_alerts) if ("alerts" in parts or "verdict" in parts) else None
    # One set of rules for every part: the verdict's reasons and the panels' colours agree.
    judged = run_panel(load_judge)
    judge = judged.data if judged.ok else default_judge()
    if "verdict" in parts:
        if latest.ok:
            out["verdict"] = run_panel(verdict, latest.data, alerts.data if alerts.ok else "load", judge)
        else:
            out["verdict"] = latest
    if "figures" in parts:
        out["figures"] = run_panel(figures_data, latest.data, window, draw=draw, judge=judge) if latest.ok else latest
    if "queues" in parts:
        out["queues"] = run_panel(queues_data, latest.data, judge=judge) if latest.ok else latest
        out["queues_shown"] = listing.top(out["queues"].data if out["queues"].ok else [], OVERVIEW_ROWS)
    if "alerts" in parts:
        out["alerts"] = alerts
        out["alerts_shown"] = listing.top(alerts.data if alerts.ok and alerts.data else [], OVERVIEW_ROWS)
        # Counted here, once per model: the template counting 10,000 alerts per poll cost 200 ms.
        states = [a["state"] for a in (alerts.data if alerts.ok and alerts.data else [])]
        out["alerts_firing"], out["alerts_pending"] = states.count("firing"), states.count("pending")
    return out


def overview_model(window_name: str, window: timedelta, *, draw: bool,
                   parts: tuple[str, ...] = PARTS) -> tuple[dict[str, Any], cycle.Generation]:
    """(overview_data as of the newest collection cycle, its generation): the model the
    scheduler stored for this cycle when there is one (the default window: every part, drawn;
    console/web/cycle_store.py), else built once per generation in this process and shared by
    every viewer (console/web/cycle.py); not kept when a panel failed."""
    if window_name == STORED_WINDOW:
        found = cycle_store.stored(STORED_NAME, _stored_build, keep=_every_panel_ok)
        if found is not None:
            data, shown = found
            return (data if draw else _undrawn(data)), shown
    return cycle.cached("overview", lambda: overview_data(window_name, window, draw=draw, parts=parts),
                        window_name, draw, parts, keep=_every_panel_ok)


# The model the scheduler's leader stores after every cycle (console/web/cycle_store.py): the
# default window with every part drawn, which the page, its three polled fragments and (without
# the drawings, `_undrawn`) the API all read. Other windows are built in the web process.
STORED_WINDOW = DEFAULT_WINDOW
STORED_NAME = f"overview:{STORED_WINDOW}"


def _stored_build() -> dict[str, Any]:
    return _trimmed(overview_data(STORED_WINDOW, WINDOWS[STORED_WINDOW], draw=True))


def _trimmed(data: dict[str, Any]) -> dict[str, Any]:
    """The model without what no page or API answer of it shows: of every queue's row and every
    alert, the OVERVIEW_ROWS shown (`queues_shown`, `alerts_shown` keep the totals; the panels
    are only asked whether they hold any). At 5,000 queues and 10,000 alerts the whole lists
    were 8.5 MB of JSON a cycle, and a third of the leader's build encoding them."""
    out = dict(data)
    for part in ("queues", "alerts"):
        found, shown = data.get(part), data.get(f"{part}_shown")
        if isinstance(found, Panel) and found.ok and found.data is not None and shown is not None:
            out[part] = Panel(True, list(shown.rows))
    return out


STORED: dict[str, tuple[Callable[[], Any], Callable[[Any], bool]]] = {
    STORED_NAME: (_stored_build, lambda data: _every_panel_ok(data)),
}


def _undrawn(data: dict[str, Any]) -> dict[str, Any]:
    """The drawn model as `draw=False` builds it: the figures without their chart and legend."""
    figures = data.get("figures")
    if not isinstance(figures, Panel) or not figures.ok:
        return data
    plain = [{k: v for k, v in item.items() if k not in ("chart", "legend")} for item in figures.data]
    return {**data, "figures": Panel(True, plain)}


def _every_panel_ok(data: dict[str, Any]) -> bool:
    return all(v.ok for v in data.values() if isinstance(v, Panel))


def tab_state(v) -> str:
    if not v.ok:
        return ""
    return {"failing": "FAILING", "degraded": "degraded", "unknown": "no data"}.get(v.data["state"], "")


def _links() -> dict[str, Any]:
    views = current_app.view_functions

    def queue_url(name: str) -> str:
        if "queues.detail" in views:
            return url_for("queues.detail", name=name)
        return url_for("jobs.index", queue=name)

    def deadletters_url(**args: Any) -> str:
        if "deadletters.index" in views:
            return url_for("deadletters.index", **args)
        return url_for("jobs.index", state="failed", **args)

    return {"queue_url": queue_url, "deadletters_url": deadletters_url,
            "has_alerts_page": "alerts.index" in views}


def _page(template: str, parts: tuple[str, ...] = PARTS):
    """A polled fragment: 304 while the generation it was built from holds."""
    name, window = window_arg()
    data, shown = overview_model(name, window, draw=True, parts=parts)
    state = tab_state(data["verdict"]) if "verdict" in data else ""
    return cycle.respond(shown, lambda: render_template(template, tab_state=state, **data, **_links()), shared=True)


@bp.get("/overview")
@requires("viewer")
def index():
    from console.web.external_panel import external_panel

    name, window = window_arg()
    data, _ = overview_model(name, window, draw=True)
    state = tab_state(data["verdict"]) if "verdict" in data else ""
    return render_template("overview/index.html", tab_state=state, external=external_panel(), **data, **_links())


@bp.get("/overview/_verdict")
@requires("viewer")
def verdict_fragment():
    return _page("overview/_verdict.html", ("verdict", "alerts"))


@bp.get("/overview/_figures")
@requires("viewer")
def figures_fragment():
    return _page("overview/_figures.html", ("figures",))


@bp.get("/overview/_queues")
@requires("viewer")
def queues_fragment():
    return _page("overview/_queues.html", ("queues",))


def _panel_json(p) -> Any:
    return p.data if p.ok else {"available": False, "error": p.error}


@bp.get("/api/v1/overview")
@requires("viewer")
@api_doc("The overview: verdict, key figures with their series, firing alerts, queues", params=[
    Param("window", enum=tuple(WINDOWS), description=f"chart window (default {DEFAULT_WINDOW})"),
], description="verdict.state is healthy, degraded, failing or unknown; reasons say why. "
               "Each figure has its latest value, a level (good/warn/bad/neutral/unknown) and its series "
               "as [time, value] pairs (value null = not measured). A panel whose query failed is "
               "{available: false, error}. `alerts` is null when the alerts package is not installed. "
               "Levels come from the alert rules in force; each of verdict.why names the panel that shows it "
               "(a figure key, queue:<name>, alerts, advisor or measurements). What a producer can make long is "
               f"bounded: the {OVERVIEW_ROWS} worst queues and the first {OVERVIEW_ROWS} alerts "
               "(`queues_total` and `alerts_total` count them all: /api/v1/queues and /api/v1/alerts page through "
               f"them), and the first {VERDICT_REASONS} reasons (`verdict.why_more` counts the rest).",
   response=obj({"window": {"enum": list(WINDOWS)},
                 "verdict": panel(obj({"state": {"enum": ["healthy", "degraded", "failing", "unknown"]},
                                       "reasons": arr(STR),
                                       "why": arr(obj({"text": STR, "level": {"enum": ["warn", "bad"]},
                                                       "panel": STR})), "why_more": INT})),
                 "figures": panel(arr(obj({"key": STR, "metric": STR, "unit": STR, "value": opt(NUM), "level": STR,
                                           "series": arr(OBJ)}))),
                 "alerts": opt(panel(arr(OBJ))),
                 "queues": panel(arr(obj({"queue": STR, "level": STR, "idle": BOOL, "idle_since": opt(TIME)}))),
                 "alerts_total": INT, "queues_total": INT, "metrics": OBJ}))
def api_index():
    name, window = window_arg()
    data, shown = overview_model(name, window, draw=False)
    alerts, queues = data["alerts"], data["queues"]
    return cycle.respond(shown, lambda: jsonify({
        "window": name,
        "verdict": _panel_json(data["verdict"]),
        "figures": _panel_json(data["figures"]),
        "alerts": data["alerts_shown"].rows if alerts.ok and alerts.data is not None else _panel_json(alerts),
        "alerts_total": data["alerts_shown"].total,
        "queues": data["queues_shown"].rows if queues.ok else _panel_json(queues),
        "queues_total": data["queues_shown"].total,
        "metrics": {f.key: {"metric": f.metric, "unit": f.unit, "help": METRICS[f.metric].help} for f in FIGURES},
    }))


# --- one queue's charts (a fragment the queue page loads) -----------------------------------

QUEUE_FIGURES: tuple[Figure, ...] = (
    Figure("depth", "Jobs by state", "queue_depth", "jobs", split_by="state",
           help="Eligible (due now), scheduled (due later), running and failed jobs in this queue."),
    Figure("age", "Oldest waiting job", "queue_age_seconds", "seconds", agg="max", rule="queue_age_seconds",
           help="How long the head of the queue has waited."),
    Figure("dead_letters", "Dead letters", "dead_letters", "jobs",
           help="Jobs of this queue that failed for good."),
)


def queue_charts_data(conn, name: str, window: timedelta, *, draw: bool) -> list[dict[str, Any]]:
    judge = load_judge(conn)
    end = datetime.now(UTC)
    out = []
    for fig in QUEUE_FIGURES:
        lines = chart_lines(conn, fig.metric, window, where={"queue": name}, split_by=fig.split_by, agg=fig.agg)
        amber, red = judge.bounds(fig.rule, {"queue": name}) if fig.rule else (None, None)
        threshold = red if red is not None else amber
        item = {"key": fig.key, "title": fig.title, "unit": fig.unit, "help": fig.help,
                "summary": charts.summary(lines, fig.unit),
                "series": [{"label": ln.label, "points": [[at, v] for at, v in ln.points]} for ln in lines]}
        if draw:
            item["chart"] = charts.line_chart(lines, unit=fig.unit, start=end - window, end=end, title=fig.title,
                                              threshold=threshold, threshold_label="red at" if red is not None else "amber at")
            item["legend"] = charts.legend(lines)
        out.append(item)
    return out


@bp.get("/overview/queue/<name>/_charts")
@requires("viewer")
def queue_charts(name: str):
    window_name, window = window_arg()
    p = run_panel(queue_charts_data, name, window, draw=True)
    return render_template("overview/_queue_charts.html", queue=name, window=window_name,
                           windows=list(WINDOWS), charts_panel=p)


@bp.get("/api/v1/overview/queue/<name>")
@requires("viewer")
@api_doc("One queue's trend series (depth by state, oldest waiting job, dead letters) over a window",
         params=[Param("window", enum=tuple(WINDOWS), description=f"default {DEFAULT_WINDOW}")],
         response=obj({"queue": STR, "window": {"enum": list(WINDOWS)},
                       "figures": panel(arr(obj({"key": STR, "unit": STR, "series": arr(
                           obj({"label": STR, "points": arr(arr(ANY))}))})))}))
def api_queue_charts(name: str):
    window_name, window = window_arg()
    p = run_panel(queue_charts_data, name, window, draw=False)
    return jsonify({"queue": name, "window": window_name, "figures": _panel_json(p)})
