"""The signal scenario suite's harness (issue 25: "the signal must be true").

A scenario injects a real condition into a real PostgreSQL (a stalled queue, a dead-letter
stream, a worker killed with SIGKILL, a session idle in transaction, a lock convoy ...), drives
the console as it runs in production (the scheduler's leader: a collection cycle and the alert
evaluation after it, the reaper, the webhook delivery to a real local receiver) and then reads
what an on-call engineer would: the alert, the overview's verdict, the page the alert's
"look here" opens, the panel and JSON API that show the same figure, `/metrics`, the webhook.

`Console.expect_firing()` asserts, for one alert:
- it fires within the rule's `for` plus two collection intervals of the moment its condition
  started to hold (`since`: the scenario knows it, e.g. the oldest job became older than the
  threshold; for a rate, when the rate over its window crossed the threshold);
- the verdict names it exactly once (`mention`), at the level its severity says;
- the first "look here" page shows the offending thing (`offender`) to a viewer;
- `/metrics` serves a value of the rule's series that meets its condition, and the firing
  notification reaches the webhook receiver.
`Console.expect_resolved()` then asserts it resolves (and says so to the receiver) once the
scenario ends the condition, and `Console.expect_quiet()` that nothing fires or is pending.

Every rule is scaled down, not changed in kind: `for` of a few seconds, thresholds a test can
reach, the rate window of 20 s; the collection interval is `INTERVAL`. Time to fire is
measured, printed and kept in `MEASURED` (docs/alerts.md quotes it).

`COVERED` maps every rule of the catalog (console.alerts.defaults) to the scenario tests that
inject its condition; tests/test_scenarios_catalog.py fails when a rule has none.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from console.alerts.defaults import DEFAULT_RULES
from console.alerts.model import format_duration
from console.config import load_config
from tests.alert_receiver import Receiver
from tests.web_fixtures import CSRF
from tests.workers import wait_for

INTERVAL = 1.0      # seconds between collection cycles (the scheduler's collect_interval)
RATE_WINDOW = 20.0  # [scheduler] rate_window of every scenario
SLACK = 1.0         # one more second for a loaded machine: a cycle itself takes time
CONDITION_WAIT = 30.0  # how long a scenario's condition may take to appear (expect_firing's `holds`)

# Every default rule, scaled: `for` and the thresholds a test reaches in seconds. Anything not
# given keeps the default's (op, labels, severity, summary, guard).
SCALED: dict[str, dict[str, Any]] = {
    "queue_age": {"threshold": 6, "clear": 3, "for": "3s"},
    "stuck_leases": {"for": "2s"},
    "dead_letter_growth": {"threshold": 720, "for": "3s"},     # 4 in the 20 s window
    "new_error_group": {},  # fires at once on one dead letter; the scenario shortens error_group_new_for
    "retry_rate": {"for": "3s"},
    "claim_latency_p95": {"threshold": 0.15, "for": "3s"},
    "workers_zero": {"for": "2s"},
    "periodic_late": {},
    "autovacuum_behind": {"for": "3s"},
    "vacuum_blocked": {"threshold": 4, "clear": 1, "for": "2s"},
    "jobs_lock_waits": {"for": "2s"},
    "multixact_spike": {"threshold": 40, "for": "3s"},
    "wraparound_age": {},  # the threshold is the test's: above the table's age at the start
    "replica_lag": {"threshold": 3, "clear": 1, "for": "2s"},
    # The test cluster copies a template database now and then (tests/spare_databases.py), a
    # burst of WAL that must not be what fires it.
    "wal_rate": {"threshold": 16 * 1024 * 1024, "for": "3s"},   # 16 MiB/s
    "collectors_stale": {"threshold": 5, "clear": 2},
    "scheduler_restarts": {},
}

# rule -> the scenario tests that inject its condition (tests/test_scenarios_catalog.py checks
# every rule has one and every name exists)
COVERED: dict[str, tuple[str, ...]] = {
    "queue_age": ("test_scenarios_queue.py::test_a_stalled_queue",
                  "test_scenarios_queue.py::test_a_burst",
                  "test_scenarios_queue.py::test_a_paused_queue_with_work",
                  "test_scenarios_queue.py::test_a_limited_queue_at_its_limit",
                  "test_scenarios_external.py::test_an_external_queue_nobody_consumes"),
    "stuck_leases": ("test_scenarios_queue.py::test_stuck_leases_after_a_kill_9",),
    "dead_letter_growth": ("test_scenarios_failures.py::test_a_dead_letter_stream",
                           "test_scenarios_failures.py::test_a_poison_kind",
                           "test_scenarios_external.py::test_dead_letter_growth_of_an_external_queue"),
    "new_error_group": ("test_scenarios_failures.py::test_new_and_regressed_error_groups",),
    "retry_rate": ("test_scenarios_failures.py::test_a_retry_storm",),
    "claim_latency_p95": ("test_scenarios_database.py::test_claims_wait_on_a_table_lock",),
    "workers_zero": ("test_scenarios_queue.py::test_the_worker_fleet_gone",),
    "periodic_late": ("test_scenarios_queue.py::test_a_periodic_job_that_keeps_failing",),
    "autovacuum_behind": ("test_scenarios_database.py::test_autovacuum_behind",),
    "vacuum_blocked": ("test_scenarios_database.py::test_an_xmin_holder",
                       "test_scenarios_replica.py::test_a_standby_holds_the_horizon"),
    "jobs_lock_waits": ("test_scenarios_database.py::test_a_lock_convoy",),
    "multixact_spike": ("test_scenarios_database.py::test_a_multixact_spike",),
    "wraparound_age": ("test_scenarios_database.py::test_wraparound_age",),
    "replica_lag": ("test_scenarios_replica.py::test_replica_lag",),
    "wal_rate": ("test_scenarios_database.py::test_a_wal_flood",),
    "collectors_stale": ("test_scenarios_queue.py::test_the_scheduler_gone",),
    "scheduler_restarts": ("test_scenarios_queue.py::test_the_scheduler_crashed_and_restarted",),
}

# The converse: conditions that must fire nothing and read healthy.
QUIET = ("test_scenarios_queue.py::test_healthy_busy_traffic_fires_nothing",
         "test_scenarios_queue.py::test_a_slow_but_steady_queue_fires_nothing",
         "test_scenarios_failures.py::test_a_known_error_group_failing_now_and_then_fires_nothing",
         "test_scenarios_database.py::test_a_long_transaction_that_holds_no_horizon_fires_nothing")

# Time to fire measured by this run: rule -> [(scenario, seconds after the condition held,
# the rule's `for`)]. SKIPLOCK_SCENARIO_REPORT=path writes them as JSON at the end of a test.
MEASURED: dict[str, list[tuple[str, float, float]]] = {}


def rule_records(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """[[alerts.rules]] records: every default rule scaled (SCALED), then `overrides`."""
    out = []
    for rule in DEFAULT_RULES:
        record = rule.as_record()
        record = {k: v for k, v in record.items() if v is not None and v != [] and v != {} and k != "source"}
        record.update(SCALED.get(rule.name, {}))
        record.update((overrides or {}).get(rule.name, {}))
        out.append(record)
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def write_config(path: Path, *, receiver_url: str, settings: Mapping[str, Any],
                 rules: list[dict[str, Any]], extra: str = "") -> Path:
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in settings.items():
        section, key = dotted.split(".", 1)
        sections.setdefault(section, {})[key] = value
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    lines += ["[[webhooks]]", 'name = "oncall"', 'kind = "json"', f"url = {json.dumps(receiver_url)}", ""]
    for record in rules:
        lines.append("[[alerts.rules]]")
        lines += [f"{json.dumps(k) if not re.fullmatch(r'[a-z_]+', k) else k} = {_toml_value(v)}"
                  for k, v in record.items()]
        lines.append("")
    path.write_text("\n".join(lines) + extra, encoding="utf-8")
    return path


SETTINGS: dict[str, Any] = {
    "scheduler.collect_interval": INTERVAL,
    "scheduler.rate_window": f"{int(RATE_WINDOW)}s",
    "scheduler.reap_interval": 3600.0,      # the reaper runs when a scenario says so
    "scheduler.periodic_interval": 1.0,
    "alerts.allow_private_destinations": True,  # the receiver listens on loopback
    "alerts.series_window": 4.0,            # a collection older than this is stale
    "alerts.console_url": "http://console.test",
    "worker.flush_interval": 0.5,           # as tests/workers.py FAST_SETTINGS
    "web.stale_worker_after": 2.0,          # live = seen within 2 s
    "web.production": False,
    "web.secret_key": "scenario-secret",
    "database.statement_timeout_ms": 5000,
}


def _text(html: str) -> str:
    """A page's text, for a failure message."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@dataclass
class Fired:
    """A firing alert as the scenario found it."""

    id: int
    rule: str
    labels: dict[str, str]
    value: float | None
    seconds: float  # from `since` to the evaluation that fired it


@dataclass
class Console:
    """The console of one scenario: the scheduler's leader driven tick by tick, the web app read
    as a viewer, a webhook receiver. Use `scenario_console()`."""

    dsn: str
    config: Any
    scheduler: Any
    client: Any
    receiver: Receiver
    conn: psycopg.Connection
    name: str = "scenario"
    ticks: list[float] = field(default_factory=list)  # each collection cycle's duration

    # --- driving the scheduler ------------------------------------------------------------------

    def tick(self) -> None:
        """An election tick (the leader says it is alive) and one collection cycle with the
        evaluation after it (the `collect` job), as the scheduler does on its intervals."""
        started = time.monotonic()
        assert self.scheduler.elect(), "the scenario's scheduler lost the lead"
        assert self.scheduler.run_job("collect"), "the collect job failed (see the log)"
        self.ticks.append(time.monotonic() - started)

    def reap(self) -> None:
        assert self.scheduler.run_job("reap")

    def deliver(self) -> None:
        assert self.scheduler.run_job("alerts_deliver")

    def run_job(self, name: str) -> None:
        assert self.scheduler.run_job(name), f"job {name} failed"

    def run(self, until: Callable[[], Any], *, budget: float, what: str, every: Callable[[], None] | None = None) -> Any:
        """Tick every INTERVAL until `until()` is truthy; fail after `budget` seconds with what
        the alerts looked like."""
        deadline = time.monotonic() + budget
        while True:
            started = time.monotonic()
            if every is not None:
                every()
            self.tick()
            found = until()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out after {budget:.1f}s waiting for {what}; "
                                     f"alerts: {self.alerts()}")
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))

    def budget(self, rule: str) -> float:
        """The rule's `for` plus two collection intervals (a cycle longer than INTERVAL counts
        as the interval it really was), plus SLACK."""
        interval = max([INTERVAL, *self.ticks[-5:]])
        return self.rule(rule).for_seconds + 2 * interval + SLACK

    def rule(self, name: str):
        from console.alerts.rules import load

        return load(self.conn, self.config).rules[name]

    # --- reading what the on-call engineer reads ------------------------------------------------

    def alerts(self) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT id, rule, labels, state, value, state_since, fired_at FROM skiplock.alerts "
                               "WHERE state <> 'ok' ORDER BY id").fetchall()

    def alert(self, rule: str, state: str | None = None, **labels: str) -> dict[str, Any] | None:
        for a in self.alerts():
            if a["rule"] == rule and all(a["labels"].get(k) == v for k, v in labels.items()) \
                    and (state is None or a["state"] == state):
                return a
        return None

    def api(self, path: str) -> Any:
        resp = self.client.get(path)
        assert resp.status_code == 200, f"GET {path}: {resp.status_code} {resp.get_data(as_text=True)[:300]}"
        return resp.get_json()

    def page(self, path: str) -> str:
        resp = self.client.get(path)
        assert resp.status_code == 200, f"GET {path}: {resp.status_code}"
        return resp.get_data(as_text=True)

    def sampled(self, metric: str, /, **labels: str) -> list[float]:
        """Values of `metric` in the newest collection cycle's samples whose labels include `labels`."""
        rows = self.conn.execute(
            "SELECT value FROM skiplock.samples WHERE metric = %s AND labels @> %s::jsonb AND value IS NOT NULL "
            "AND collected_at = (SELECT max(collected_at) FROM skiplock.samples WHERE metric = %s)",
            (metric, json.dumps(labels), metric)).fetchall()
        return [r[0] for r in rows]

    def metric(self, metric: str, /, **labels: str) -> list[float]:
        """Values of skiplock_<metric> on /metrics whose labels include `labels`."""
        text = self.page("/metrics")
        out = []
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == f"skiplock_{metric}" and all(s.labels.get(k) == v for k, v in labels.items()):
                    out.append(s.value)
        return out

    def verdict(self) -> dict[str, Any]:
        return self.api("/api/v1/overview")["verdict"]

    # --- the checks -------------------------------------------------------------------------

    def expect_firing(self, rule: str, *, since: float, mention: str, offender: str | Callable[[str], bool],
                      labels: Mapping[str, str] | None = None, every: Callable[[], None] | None = None,
                      scenario: str = "", extra_budget: float = 0.0,
                      holds: Callable[[], bool] | None = None) -> Fired:
        """Run until `rule` fires (for `labels`), then check the verdict, the look-here page,
        /metrics and the webhook. `since`: time.monotonic() when the condition began to hold.
        `holds`: for a condition whose start the scenario cannot time itself (it depends on
        other processes, which a loaded machine slows): the budget runs from the start of the
        first collection cycle whose samples meet it, waited for up to CONDITION_WAIT seconds
        after `since`. That is one interval more lenient than timing the condition itself: the
        cycle that first sees it may start up to one interval after it began."""
        labels = dict(labels or {})
        if holds is not None:
            self.run(holds, budget=max(CONDITION_WAIT - (time.monotonic() - since), INTERVAL), every=every,
                     what=f"{rule}'s condition to hold in the samples")
            since = time.monotonic() - self.ticks[-1]
        budget = self.budget(rule) + extra_budget
        loaded = os.getloadavg()[0] > (os.cpu_count() or 1)
        left = budget - (time.monotonic() - since) + (CONDITION_WAIT if loaded else 0.0)
        found = self.run(lambda: self.alert(rule, "firing", **labels), budget=max(left, INTERVAL), every=every,
                         what=f"{rule} {labels} to fire (budget {budget:.1f}s: for + 2 intervals)")
        seconds = time.monotonic() - since
        if loaded:
            # On a machine loaded past its cores the scenario's own load generators (workers,
            # a WAL flood, a locker) fall behind, and the condition reaches the samples late:
            # the budget then runs from one interval before the first evaluation that saw it
            # (its `pending` event), and that first sight may come at most CONDITION_WAIT late.
            seen = self.conn.execute(
                "SELECT extract(epoch FROM clock_timestamp() - min(at)) FROM skiplock.alert_events "
                "WHERE alert_id = %s AND kind = 'pending'", (found["id"],)).fetchone()[0]
            if seen is not None:
                interval = max([INTERVAL, *self.ticks[-5:]])
                late = seconds - float(seen) - interval
                assert late <= CONDITION_WAIT, f"{rule}: its condition reached the samples {late:.1f}s late"
                if late > 0:
                    print(f"scenario {scenario or self.name}: loaded machine (load {os.getloadavg()[0]:.1f}); "
                          f"{rule}'s condition reached the samples {late:.1f}s late, timed from there")
                    seconds -= late
        definition = self.rule(rule)
        assert seconds <= budget + INTERVAL, f"{rule} fired {seconds:.1f}s after its condition held; budget {budget:.1f}s"
        MEASURED.setdefault(rule, []).append((scenario or self.name, round(seconds, 1), definition.for_seconds))
        print(f"scenario {scenario or self.name}: {rule} fired {seconds:.1f}s after its condition held "
              f"(for {format_duration(definition.for_seconds)}, budget {budget:.1f}s)")
        fired = Fired(found["id"], rule, found["labels"], found["value"], seconds)

        # The verdict names it once, at its severity's level.
        verdict = self.verdict()
        about = [w for w in verdict["why"] if mention in w["text"]]
        assert len(about) == 1, f"the verdict should name {mention!r} once: {verdict['why']}"
        assert len({w["text"] for w in verdict["why"]}) == len(verdict["why"]), f"a fact twice: {verdict['why']}"
        expected_state = "failing" if definition.severity == "critical" else "degraded"
        assert verdict["state"] in (expected_state, "failing"), verdict
        if definition.severity == "critical":
            assert verdict["state"] == "failing", verdict

        # The alert's first "look here" page shows the offending thing.
        detail = self.api(f"/api/v1/alerts/{fired.id}")
        links = detail["alert"]["look_here"]
        assert links, f"{rule}: no look-here link"
        html = self.page(links[0]["path"])
        if callable(offender):
            assert offender(html), f"{rule}: {links[0]['path']} does not show the offending thing:\n" + _text(html)[:4000]
        else:
            assert offender in html, f"{rule}: {links[0]['path']} does not show {offender!r}"

        # /metrics serves the same series, past the threshold.
        if definition.metric != "collection_age_seconds":
            series = {k: v for k, v in fired.labels.items()}
            values = self.metric(definition.metric, **series)
            assert values and any(definition.condition(v) for v in values), \
                f"/metrics {definition.metric} {series} = {values}: does not meet {definition.describe()}"

        # The webhook receiver gets the firing notification.
        self.deliver()
        docs = [d for d in self.receiver.json_bodies() if d["alert"]["id"] == fired.id and d["event"] == "firing"]
        assert docs, f"{rule}: no firing notification reached the receiver"
        assert docs[-1]["alert"]["look_here"][0]["path"] == links[0]["path"]
        return fired

    def expect_resolved(self, fired: Fired, *, budget: float, every: Callable[[], None] | None = None) -> float:
        started = time.monotonic()
        self.run(lambda: self._state(fired.id) == "ok", budget=budget, every=every,
                 what=f"{fired.rule} {fired.labels} to resolve")
        self.deliver()
        docs = [d for d in self.receiver.json_bodies() if d["alert"]["id"] == fired.id and d["event"] == "resolved"]
        assert docs, f"{fired.rule}: no resolved notification reached the receiver"
        return time.monotonic() - started

    def _state(self, alert_id: int) -> str:
        return self.conn.execute("SELECT state FROM skiplock.alerts WHERE id = %s", (alert_id,)).fetchone()[0]

    def expect_quiet(self, seconds: float, *, every: Callable[[], None] | None = None,
                     verdict: str = "healthy") -> None:
        """Tick for `seconds`: no alert pending or firing at any cycle, and the verdict reads
        `verdict` with no reason at the end."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            if every is not None:
                every()
            self.tick()
            active = self.alerts()
            assert not active, f"{self.name}: nothing should fire or be pending, found {active}"
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))
        found = self.verdict()
        assert found["state"] == verdict and not found["why"], found


@contextmanager
def scenario_console(dsn: str, tmp_path: Path, *, name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None,
                     settings: Mapping[str, Any] | None = None, extra_config: str = "") -> Iterator[Console]:
    """A Console on `dsn`: config written to a file (scaled rules, a webhook to a local
    receiver), the scheduler elected leader in this process, a viewer signed in to the app."""
    from console.scheduler import Scheduler
    from console.users import start_session
    from console.web import create_app

    with Receiver() as receiver, psycopg.connect(dsn, autocommit=True) as conn:
        path = write_config(tmp_path / f"{name}.toml", receiver_url=receiver.url,
                            settings={**SETTINGS, "database.dsn": dsn, **(settings or {})},
                            rules=rule_records(overrides), extra=extra_config)
        config = load_config(path, env={})
        scheduler = Scheduler(dsn, config)
        assert scheduler.elect(), "the scenario's scheduler must lead"
        app = create_app(config)
        conn.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES ('viewer', 'x', 'viewer') "
                     "ON CONFLICT DO NOTHING")
        client = app.test_client()
        with client.session_transaction() as session:
            session["csrf"] = CSRF
            session["sid"] = start_session(conn, "viewer", "127.0.0.1", "scenario")
        console = Console(dsn=dsn, config=config, scheduler=scheduler, client=client, receiver=receiver, conn=conn,
                          name=name)
        try:
            yield console
        finally:
            scheduler.close()
            app.extensions["skiplock"].close()


def live_workers(conn, n: int = 1) -> None:
    """Wait until `n` workers have reported within the last 2 s (the scenario's traffic is running)."""
    wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers WHERE last_seen > now() - interval '2 seconds' "
                                  "AND stopped_at IS NULL").fetchone()[0] >= n, timeout=30, what=f"{n} live worker(s)")


def shows_all(ids: list[int]):
    """An `offender` check: the page names every one of these jobs."""
    return lambda html: all(f">{i}<" in html for i in ids)
