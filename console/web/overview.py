"""The overview: is the queue healthy, and if not, why? One verdict line, the key figures with
trend charts, firing alerts, and a queues table.

GET /overview?window=1h|6h|24h|7d          the page (bad window -> 400)
GET /overview/_verdict, /_figures, /_queues the fragments it includes (htmx polls them)
GET /api/v1/overview?window=...            the same as JSON

Where the verdict comes from, best first: firing alerts (`console.alerts`, when installed),
else the advisor's one-line verdict (`console.advisor.verdict_line`, when installed), else the
latest stored samples judged against the thresholds in `RULES` below. Samples older than
`STALE_AFTER` make the verdict say that measurements stopped.

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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request, url_for
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import samples
from console.catalog import METRICS, check_metric
from console.sqlfiles import query
from console.web import charts
from console.web.api import ANY, NUM, OBJ, STR, Param, api_doc, arr, obj, opt, panel
from console.web.auth import requires
from console.web.database import run_panel

bp = Blueprint("overview", __name__)
log = logging.getLogger(__name__)

WINDOWS: dict[str, timedelta] = {"1h": timedelta(hours=1), "6h": timedelta(hours=6),
                                 "24h": timedelta(hours=24), "7d": timedelta(days=7)}
DEFAULT_WINDOW = "1h"
STALE_AFTER = timedelta(minutes=5)
JOBS_TABLES = ("jobs", "skiplock.jobs")

# (warn at, bad at) for the figures the sample-based verdict judges. Alert rules, when
# installed, take over the verdict; these still colour the cards.
RULES: dict[str, tuple[float, float]] = {
    "age": (60.0, 300.0),            # oldest eligible job waiting, seconds
    "failure_ratio": (0.05, 0.25),   # failed / (completed + failed), latest interval
    "stuck": (1.0, 50.0),            # expired leases not yet reaped
    "claim": (0.1, 1.0),             # claim latency p95, seconds
    "dead_growth": (1.0, 100.0),     # dead letters added per hour
    "dead_ratio": (0.2, 0.5),        # dead tuples / (live + dead) on the jobs table
}


def window_arg() -> tuple[str, timedelta]:
    name = request.args.get("window", DEFAULT_WINDOW)
    if name not in WINDOWS:
        abort(400, f"window: {name!r} is not one of {', '.join(WINDOWS)}")
    return name, WINDOWS[name]


# --- latest samples -------------------------------------------------------------------------

@dataclass
class Latest:
    """The newest sample of each (metric, labels), with lookups that sum or take the max."""

    rows: list[samples.Sample]

    def values(self, metric: str, **where: str) -> list[float]:
        return [s.value for s in self.rows if s.metric == metric and s.value is not None
                and all(s.labels.get(k) == v for k, v in where.items())]

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
        for s in self.rows:
            if s.metric == metric and all(s.labels.get(k) == v for k, v in where.items()) and label in s.labels:
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
    return Latest(samples.latest(conn, within=timedelta(minutes=15)))


def level(value: float | None, rule: str) -> str:
    """good / warn / bad for a figure, or 'unknown' when it was not measured."""
    if value is None:
        return "unknown"
    warn, bad = RULES[rule]
    return "bad" if value >= bad else "warn" if value >= warn else "good"


def claim_p95(latest: Latest) -> float | None:
    for where in ({"source": "workers", "quantile": "p95"}, {"source": "pg_stat_statements"}, {"source": "probe"}):
        value = latest.most("claim_latency_seconds", **where)
        if value is not None:
            return value
    return latest.most("claim_latency_seconds")


def failure_ratio(latest: Latest) -> float | None:
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


def firing_alerts(conn) -> list[dict[str, Any]] | None:
    """Firing alerts (newest state first), or None when the alerts package is not installed."""
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
    return [a for a in active(conn, ruleset) if a["state"] == "firing"]


def sample_verdict(latest: Latest) -> tuple[str, list[str]]:
    """healthy / degraded / failing and the reasons, from the latest samples alone."""
    bad: list[str] = []
    warn: list[str] = []

    def judge(value: float | None, rule: str, text: str) -> None:
        lv = level(value, rule)
        if lv == "bad":
            bad.append(text)
        elif lv == "warn":
            warn.append(text)

    ages = latest.by_label("queue_age_seconds", "queue")
    for queue, age in sorted(ages.items(), key=lambda kv: -(kv[1] or 0)):
        judge(age, "age", f"queue {queue}: the oldest job has waited {charts.format_value(age, 'seconds')}")
    ratio = failure_ratio(latest)
    judge(ratio, "failure_ratio", f"{charts.format_value(ratio, 'ratio')} of finished jobs are failing")
    for queue, growth in latest.by_label("dead_letter_growth", "queue").items():
        judge(growth, "dead_growth", f"queue {queue}: {charts.format_value(growth, 'jobs/h')} new dead letters")
    stuck = latest.total("stuck_leases")
    judge(stuck, "stuck", f"{charts.format_value(stuck, 'jobs')} with an expired lease not yet reaped")
    claim = claim_p95(latest)
    judge(claim, "claim", f"claiming a job takes {charts.format_value(claim, 'seconds')} (p95)")
    # A small table is mostly dead rows right after each archiver batch, and that is fine: the
    # ratio is news only once dead rows pass the point where autovacuum should have started.
    dead = latest.jobs_table("table_dead_tuples")
    threshold = latest.jobs_table("table_autovacuum_threshold")
    if dead is not None and threshold is not None and dead > threshold:
        judge(latest.jobs_table("table_dead_ratio"), "dead_ratio", "the jobs table is mostly dead rows: vacuum is behind")
    eligible = latest.total("queue_depth", state="eligible") or 0
    if latest.total("workers_live") == 0 and eligible > 0:
        bad.append(f"no live workers and {charts.format_value(eligible, 'jobs')} waiting")
    if bad:
        return "failing", bad + warn
    if warn:
        return "degraded", warn
    return "healthy", []


_ORDER = ["unknown", "healthy", "degraded", "failing"]


def verdict(conn, latest: Latest, alerts: list[dict[str, Any]] | None | str = "load") -> dict[str, Any]:
    """The worst of: firing alerts (when installed), the advisor's line (when installed), and
    the latest samples. Alerts need time to fire (their `for` duration) and may be silenced;
    the samples see a problem at once, so neither alone decides."""
    now = datetime.now(UTC)
    newest = latest.newest()
    stale = newest is None or now - newest > STALE_AFTER
    states: list[str] = []
    reasons: list[str] = []
    sources: list[str] = []
    if alerts == "load":
        alerts = firing_alerts(conn)
    if alerts is not None:
        live = [a for a in alerts if not a.get("silence")]
        states.append("failing" if any(a.get("severity") == "critical" for a in live) else "degraded" if live else "healthy")
        reasons += [a.get("summary") or a["rule"] for a in live]
        sources.append("alerts")
    advisor_line = _optional("console.advisor", "verdict_line")
    if advisor_line is not None and not stale:
        line = advisor_line(conn)
        if isinstance(line, dict) and line.get("state") in _ORDER:
            states.append(line["state"])
            reasons += [r for r in line.get("reasons") or [] if r not in reasons]
            sources.append("advisor")
    if newest is not None:
        state, sample_reasons = sample_verdict(latest)
        states.append(state)
        reasons += [r for r in sample_reasons if r not in reasons]
        sources.append("samples")
    if stale:
        reasons.append("no measurements stored yet: is `skiplock scheduler` running?" if newest is None else
                       f"the newest measurement is {charts.format_value((now - newest).total_seconds(), 'seconds')} "
                       "old: is `skiplock scheduler` running?")
        states.append("degraded" if newest is not None else "unknown")
    state = max(states, key=_ORDER.index) if states else "unknown"
    if newest is None and state == "healthy":
        state = "unknown"  # nothing measured: "no alerts firing" means nothing
    return {"state": state, "reasons": reasons, "source": "+".join(sources) or "none", "measured_at": newest}


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
    rule: str | None = None
    help: str = ""


FIGURES: tuple[Figure, ...] = (
    Figure("depth", "Jobs waiting", "queue_depth", "jobs", (("state", "eligible"),), split_by="queue",
           help="Pending jobs that are due now, by queue. Rising while throughput is flat: add workers or find the slow kind."),
    Figure("age", "Oldest waiting job", "queue_age_seconds", "seconds", split_by="queue", agg="max", rule="age",
           help="How long the head of each queue has waited. Red: jobs are late; check workers and paused queues."),
    Figure("throughput", "Throughput", "throughput", "jobs/s", split_by="outcome",
           help="Jobs finished per second, by outcome (from worker counters)."),
    Figure("failures", "Failures", "throughput", "jobs/s", (("outcome", "failed"),), rule="failure_ratio",
           help="Jobs failing for good per second. Red: open Dead letters and look at the biggest error group."),
    Figure("claim", "Claim latency (p95)", "claim_latency_seconds", "seconds",
           (("source", "workers"), ("quantile", "p95")), agg="max", rule="claim",
           help="Time for a worker to claim a batch. Climbing with dead tuples: vacuum is behind (see Database)."),
    Figure("dead_letters", "Dead letters", "dead_letters", "jobs", split_by="queue", rule="dead_growth",
           help="Jobs that failed for good. Red when they grow fast: see Dead letters, replay once the cause is fixed."),
    Figure("dead_tuples", "Dead tuples (jobs table)", "table_dead_tuples", "rows", (("table", "jobs"),),
           rule="dead_ratio",
           help="Dead rows waiting for vacuum in the hot table; the dashed line is the autovacuum threshold."),
)


def figure_value(fig: Figure, latest: Latest) -> float | None:
    if fig.key == "dead_tuples":
        return latest.jobs_table("table_dead_tuples")
    if fig.key == "claim":
        return claim_p95(latest)
    where = dict(fig.where)
    return latest.most(fig.metric, **where) if fig.agg == "max" else latest.total(fig.metric, **where)


def figure_level(fig: Figure, latest: Latest, value: float | None) -> str:
    if fig.rule is None:
        return "unknown" if value is None else "neutral"
    if fig.rule == "failure_ratio":
        return level(failure_ratio(latest), "failure_ratio")
    if fig.rule == "dead_growth":
        return level(latest.most("dead_letter_growth"), "dead_growth")
    if fig.rule == "dead_ratio":
        return level(latest.jobs_table("table_dead_ratio"), "dead_ratio")
    return level(value, fig.rule)


CHART_POINTS = 120  # about one point per 3 px of a chart: enough detail, little to fetch


def chart_lines(conn, metric: str, window: timedelta, *, where: dict[str, str] | None = None,
                split_by: str | None = None, agg: str = "sum") -> list[charts.Line]:
    """A metric's series over the window as chart lines, reduced to ~CHART_POINTS buckets in
    the database (sql/overview.sql). Like `samples.series`, windows over 6 h read the
    per-minute rollup and over 2 days the hourly one, falling back to raw samples when the
    rollup is empty."""
    check_metric(metric)
    since = datetime.now(UTC) - window
    step = max(window / CHART_POINTS, timedelta(seconds=1))
    params = {"metric": metric, "since": since, "labels": Jsonb(where) if where else None,
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


def _series(conn, fig: Figure, window: timedelta) -> list[charts.Line]:
    where = dict(fig.where)
    if fig.key == "dead_tuples":
        table = next((t for t in JOBS_TABLES if t in _tables_with(conn, fig.metric)), "jobs")
        where = {"table": table}
    lines = chart_lines(conn, fig.metric, window, where=where, split_by=fig.split_by, agg=fig.agg)
    if fig.split_by and len(lines) > charts.MAX_LINES:
        lines = chart_lines(conn, fig.metric, window, where=where, agg=fig.agg)  # too many queues: one total
    return lines


def _tables_with(conn, metric: str) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT labels ->> 'table' FROM skiplock.samples "
        "WHERE metric = %s AND collected_at >= now() - interval '15 minutes'", (metric,)).fetchall()
    return {r[0] for r in rows}


def figures_data(conn, latest: Latest, window: timedelta, *, draw: bool = True) -> list[dict[str, Any]]:
    end = datetime.now(UTC)
    start = end - window
    out = []
    threshold_dead = latest.jobs_table("table_autovacuum_threshold")
    for fig in FIGURES:
        lines = _series(conn, fig, window)
        value = figure_value(fig, latest)
        threshold, threshold_label = None, "threshold"
        if fig.rule in ("age", "claim"):
            threshold, threshold_label = RULES[fig.rule][1], "red at"
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
            "level": figure_level(fig, latest, value),
            "summary": charts.summary(lines, fig.unit),
            "series": [{"label": ln.label, "points": [[at, v] for at, v in ln.points]} for ln in lines],
        }
        if fig.key == "failures":
            ratio = failure_ratio(latest)
            item["note"] = None if ratio is None else f"{charts.format_value(ratio, 'ratio')} of finished jobs"
        if fig.key == "dead_letters":
            growth = latest.total("dead_letter_growth")
            item["note"] = None if growth is None else f"+{charts.format_value(growth, 'jobs/h')}"
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


def queues_data(conn, latest: Latest) -> list[dict[str, Any]]:
    depth: dict[str, dict[str, float | None]] = {}
    for s in latest.rows:
        if s.metric == "queue_depth" and "queue" in s.labels:
            depth.setdefault(s.labels["queue"], {})[s.labels.get("state", "?")] = s.value
    ages = latest.by_label("queue_age_seconds", "queue")
    stuck = latest.by_label("stuck_leases", "queue")
    growth = latest.by_label("dead_letter_growth", "queue")
    paused = _paused(conn)
    names = sorted(set(depth) | set(paused))
    out = []
    for name in names:
        d = depth.get(name, {})
        age = ages.get(name)
        lv = max((level(age, "age"), level(stuck.get(name), "stuck"), level(growth.get(name), "dead_growth")),
                 key=["unknown", "good", "warn", "bad"].index)
        p = paused.get(name, {})
        out.append({
            "queue": name,
            "eligible": d.get("eligible"), "scheduled": d.get("scheduled"), "running": d.get("running"),
            "failed": d.get("failed"), "oldest_age_s": age, "stuck": stuck.get(name),
            "dead_letter_growth": growth.get(name), "paused": bool(p.get("paused")),
            "paused_by": p.get("paused_by"), "level": lv,
        })
    out.sort(key=lambda q: (["bad", "warn", "good", "unknown"].index(q["level"]), q["queue"]))
    return out


# --- routes ---------------------------------------------------------------------------------

PARTS = ("verdict", "figures", "queues", "alerts")


def overview_data(window_name: str, window: timedelta, *, draw: bool, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Each part is its own time-limited panel; a fragment computes only its own part."""
    latest = run_panel(_latest)
    out: dict[str, Any] = {"window": window_name, "windows": list(WINDOWS)}
    alerts = run_panel(firing_alerts) if ("alerts" in parts or "verdict" in parts) else None
    if "verdict" in parts:
        if latest.ok:
            out["verdict"] = run_panel(verdict, latest.data, alerts.data if alerts.ok else "load")
        else:
            out["verdict"] = latest
    if "figures" in parts:
        out["figures"] = run_panel(figures_data, latest.data, window, draw=draw) if latest.ok else latest
    if "queues" in parts:
        out["queues"] = run_panel(queues_data, latest.data) if latest.ok else latest
    if "alerts" in parts:
        out["alerts"] = alerts
    return out


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
    name, window = window_arg()
    data = overview_data(name, window, draw=True, parts=parts)
    state = tab_state(data["verdict"]) if "verdict" in data else ""
    return render_template(template, tab_state=state, **data, **_links())


@bp.get("/overview")
@requires("viewer")
def index():
    return _page("overview/index.html")


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
               "{available: false, error}. `alerts` is null when the alerts package is not installed.",
   response=obj({"window": {"enum": list(WINDOWS)},
                 "verdict": panel(obj({"state": {"enum": ["healthy", "degraded", "failing", "unknown"]},
                                       "reasons": arr(STR)})),
                 "figures": panel(arr(obj({"key": STR, "metric": STR, "unit": STR, "value": opt(NUM), "level": STR,
                                           "series": arr(OBJ)}))),
                 "alerts": opt(panel(arr(OBJ))), "queues": panel(arr(obj({"queue": STR}))), "metrics": OBJ}))
def api_index():
    name, window = window_arg()
    data = overview_data(name, window, draw=False)
    return jsonify({
        "window": name,
        "verdict": _panel_json(data["verdict"]),
        "figures": _panel_json(data["figures"]),
        "alerts": _panel_json(data["alerts"]),
        "queues": _panel_json(data["queues"]),
        "metrics": {f.key: {"metric": f.metric, "unit": f.unit, "help": METRICS[f.metric].help} for f in FIGURES},
    })


# --- one queue's charts (a fragment the queue page loads) -----------------------------------

QUEUE_FIGURES: tuple[Figure, ...] = (
    Figure("depth", "Jobs by state", "queue_depth", "jobs", split_by="state",
           help="Eligible (due now), scheduled (due later), running and failed jobs in this queue."),
    Figure("age", "Oldest waiting job", "queue_age_seconds", "seconds", agg="max", rule="age",
           help="How long the head of the queue has waited."),
    Figure("dead_letters", "Dead letters", "dead_letters", "jobs",
           help="Jobs of this queue that failed for good."),
)


def queue_charts_data(conn, name: str, window: timedelta, *, draw: bool) -> list[dict[str, Any]]:
    end = datetime.now(UTC)
    out = []
    for fig in QUEUE_FIGURES:
        lines = chart_lines(conn, fig.metric, window, where={"queue": name}, split_by=fig.split_by, agg=fig.agg)
        threshold = RULES[fig.rule][1] if fig.rule else None
        item = {"key": fig.key, "title": fig.title, "unit": fig.unit, "help": fig.help,
                "summary": charts.summary(lines, fig.unit),
                "series": [{"label": ln.label, "points": [[at, v] for at, v in ln.points]} for ln in lines]}
        if draw:
            item["chart"] = charts.line_chart(lines, unit=fig.unit, start=end - window, end=end, title=fig.title,
                                              threshold=threshold, threshold_label="red at")
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
