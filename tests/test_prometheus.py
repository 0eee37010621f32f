"""docs/prometheus/: the alerting rules and the Grafana dashboard are the generator's output, name
only what /metrics exports, pass promtool (syntax and the unit tests beside them), and work in a
real Prometheus scraping a live console with the metrics token."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from console import queue as q
from console.alerts.defaults import DEFAULT_RULES
from console.catalog import METRICS
from console.cli import main
from console.metrics import render_samples
from console.prometheus import (
    ALERT_ONLY_LABELS,
    TARGET_LABELS,
    dashboard_document,
    dashboard_json,
    rules_document,
    rules_yaml,
)
from console.samples import Sample
from tests.collector_helpers import cycle

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "prometheus"
RULES = DOCS / "skiplock-rules.yml"
RULES_TESTS = DOCS / "skiplock-rules.test.yml"
DASHBOARD = DOCS / "skiplock-dashboard.json"
TOKEN = "prometheus-scrape-token"

SERIES = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(by|on|ignoring)\s*\(([^)]*)\)")
PROMQL_WORDS = {"max", "sum", "by", "on", "ignoring", "and", "or", "unless", "ALERTS"}


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool is missing (scripts/bootstrap.sh --test installs Debian's prometheus)")
    return path


def exported() -> dict[str, set[str]]:
    """Family name -> label names, from /metrics' own renderer given one sample of every metric."""
    samples = [Sample(m.name, {label: "x" for label in m.labels}, 1.0) for m in METRICS.values()]
    body = render_samples(samples).decode()
    return {f.name: {label for s in f.samples for label in s.labels} for f in text_string_to_metric_families(body)}


def names_in(expr: str) -> list[tuple[str, set[str]]]:
    """(series name, label names matched) for every selector in a PromQL expression."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    without_grouping = GROUPING.sub(" ", without_strings)
    found = []
    for match in SERIES.finditer(without_grouping):
        name = match.group(1)
        if name in PROMQL_WORDS - {"ALERTS"}:
            continue
        found.append((name, set(MATCHER.findall(match.group(2) or ""))))
    return found


def check_expression(expr: str, families: dict[str, set[str]]) -> list[str]:
    problems = []
    selectors = names_in(expr)
    if not any(name.startswith("skiplock_") for name, _ in selectors):
        problems.append(f"{expr!r} names no skiplock metric")
    for name, labels in selectors:
        allowed = {"alertname", "alertstate"} if name == "ALERTS" else families.get(name)
        if allowed is None:
            problems.append(f"{name} is not exported by /metrics")
            continue
        unknown = labels - allowed - set(TARGET_LABELS)
        if unknown:
            problems.append(f"{name} has no label(s) {sorted(unknown)}")
    for kind, labels in GROUPING.findall(expr):
        names = {label.strip() for label in labels.split(",") if label.strip()}
        known = set(TARGET_LABELS) | set(ALERT_ONLY_LABELS) | set().union(*families.values())
        if names - known:
            problems.append(f"{kind}({labels}) names labels no series has")
    return problems


def dashboard_targets(document: dict) -> list[dict]:
    return [t for panel in document["panels"] for t in panel.get("targets", [])]


# --- the committed files ----------------------------------------------------------------------


def test_committed_files_are_the_generated_output():
    assert RULES.read_text(encoding="utf-8") == rules_yaml(), \
        "regenerate: .venv/bin/skiplock prometheus rules > docs/prometheus/skiplock-rules.yml"
    assert DASHBOARD.read_text(encoding="utf-8") == dashboard_json(), \
        "regenerate: .venv/bin/skiplock prometheus dashboard > docs/prometheus/skiplock-dashboard.json"


def test_rules_mirror_the_defaults_and_name_exported_series():
    families = exported()
    rules = rules_document()["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [r.name for r in DEFAULT_RULES]
    for rule, default in zip(rules, DEFAULT_RULES, strict=True):
        assert rule["labels"] == {"severity": default.severity}
        assert rule.get("for", "0s") == (f"{default.for_seconds / 60:g}m" if default.for_seconds else "0s")
        assert rule["annotations"]["runbook_url"] == default.runbook
        assert f"skiplock_{default.metric}" in rule["expr"]
        assert check_expression(rule["expr"], families) == [], rule["alert"]


def test_dashboard_queries_name_exported_series_and_follow_the_database_variable():
    families = exported()
    document = dashboard_document()
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["database"]["includeAll"] and variables["database"]["allValue"] == ".*"
    targets = dashboard_targets(document)
    assert len(targets) >= 20
    problems = [p for t in targets for p in check_expression(t["expr"], families)]
    assert problems == []
    assert all('database=~"$database"' in t["expr"] and "database" in t["expr"].split("(")[1] for t in targets)
    named = {name.removeprefix("skiplock_") for t in targets for name, _ in names_in(t["expr"])}
    wanted = {"queue_depth", "queue_age_seconds", "throughput", "dead_letters", "claim_latency_seconds",
              "table_dead_tuples", "xmin_horizon_age_seconds", "slru_blocks_read_per_second", "wal_bytes_per_second"}
    assert wanted <= named


def test_promtool_accepts_the_rules_their_unit_tests_and_the_dashboard_queries(tmp_path):
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(DEFAULT_RULES)} rules found" in checked.stdout
    tested = subprocess.run([tool, "test", "rules", RULES_TESTS.name], cwd=DOCS, capture_output=True, text=True,
                            timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # The dashboard's PromQL, with the template variables at "All", as recording rules: promtool
    # parses each expression (one call for all of them).
    records = [{"record": f"dashboard:{i}", "expr": t["expr"].replace("$job", ".*").replace("$database", ".*")}
               for i, t in enumerate(dashboard_targets(dashboard_document()))]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": records}]}))  # JSON is YAML
    parsed = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr


def test_a_queue_moving_to_nats_shows_both_sides_added_up_once_per_scraped_process(tmp_path):
    """During a move a queue has jobs on both backends; two web processes scraped as one job
    export the same stored cycle. The depth and dead-letter panels show 30 + 20, not the larger
    side (30) and not each process counted twice (100)."""
    tool = promtool()
    by_metric = {t["expr"].split("skiplock_")[1].split("{")[0]: t["expr"] for t in dashboard_targets(dashboard_document())}
    records = [{"record": f"dashboard:{metric}", "expr": by_metric[metric].replace("$job", ".*").replace("$database", ".*")}
               for metric in ("queue_depth", "dead_letters")]
    (tmp_path / "records.yml").write_text(json.dumps({"groups": [{"name": "dashboard", "rules": records}]}))
    series = []
    for instance in ("web-1:8080", "web-2:8080"):
        for backend, depth in (("postgres", 30), ("nats", 20)):
            common = f'job="skiplock",instance="{instance}",queue="billing",backend="{backend}"'
            series.append({"series": f'skiplock_queue_depth{{{common},state="eligible"}}', "values": f"{depth}x4"})
            series.append({"series": f"skiplock_dead_letters{{{common}}}", "values": f"{depth // 10}x4"})
    unit = {"rule_files": ["records.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": "dashboard:queue_depth", "eval_time": "2m",
             "exp_samples": [{"labels": 'dashboard:queue_depth{job="skiplock",queue="billing",state="eligible"}', "value": 50}]},
            {"expr": "dashboard:dead_letters", "eval_time": "2m",
             "exp_samples": [{"labels": 'dashboard:dead_letters{job="skiplock",queue="billing"}', "value": 5}]},
        ]}]}
    (tmp_path / "records_test.yml").write_text(json.dumps(unit))
    tested = subprocess.run([tool, "test", "rules", "records_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_command_prints_the_files():
    runner = CliRunner()
    out = runner.invoke(main, ["prometheus", "rules", "--runbook-base-url", "https://runbooks.example/skiplock/"])
    assert out.exit_code == 0, out.output
    assert 'runbook_url: "https://runbooks.example/skiplock/docs/alerts.md#queue_age"' in out.output
    assert runner.invoke(main, ["prometheus", "dashboard"]).output == dashboard_json()
    bad = runner.invoke(main, ["prometheus", "rules", "--runbook-base-url", "javascript:x"])
    assert bad.exit_code == 2 and "--runbook-base-url" in bad.output and "scheme javascript:" in bad.output


# --- a real Prometheus ----------------------------------------------------------------------------


@pytest.fixture
def web_settings(web_settings):
    return {**web_settings, "web.metrics_token": TOKEN}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Loopback only: never through a proxy the environment may name.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> dict:
    with _opener.open(url, timeout=5) as response:
        return json.load(response)


def _wait_for(what: str, check, log: Path, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # not listening yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout}s (last: {last!r}); prometheus log:\n"
                         f"{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def prometheus(tmp_path, live_server):
    """A real Prometheus on a free loopback port scraping live_server's /metrics every second
    with the bearer token and evaluating docs/prometheus/skiplock-rules.yml; always stopped."""
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("prometheus is missing (scripts/bootstrap.sh --test installs Debian's prometheus)")
    (tmp_path / "token").write_text(TOKEN)
    target = urllib.parse.urlsplit(live_server).netloc
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "skiplock", "authorization": {"credentials_file": str(tmp_path / "token")},
                            "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port = _free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"

        def ready():
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited ({process.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
            with _opener.open(f"{base}/-/ready", timeout=2) as response:
                return response.status == 200

        _wait_for("prometheus ready", ready, log)
        yield base, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _query(base: str, promql: str) -> list[dict]:
    return _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")["data"]["result"]


@pytest.fixture
def stale_cycle(conn, dsn):
    """One stored cycle with an eligible job in queue mail, ten minutes old."""
    q.enqueue(conn, "noop", queue="mail")
    cycle(dsn)
    # The newest cycle is ten minutes old: the scheduler is down, and the dead man's switch
    # (collectors_stale, > 300 s with no `for`) must fire at the next evaluation.
    conn.execute("UPDATE skiplock.collection_runs SET started_at = started_at - interval '10 minutes', "
                 "finished_at = finished_at - interval '10 minutes'")
    conn.execute("UPDATE skiplock.samples SET collected_at = collected_at - interval '10 minutes'")


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_console_and_fires_a_default_rule(prometheus, stale_cycle):
    # Prometheus first: its scrape manager applies new targets on a 5 s tick, so the data is
    # stored while it waits.
    base, log = prometheus

    depth = _wait_for("the scraped queue depth", lambda: _query(
        base, 'skiplock_queue_depth{job="skiplock",queue="mail",state="eligible"}'), log)
    assert float(depth[0]["value"][1]) == 1
    # Every series carries the database it came from (database="default" with one database).
    assert depth[0]["metric"]["database"] == "default"
    # The dashboard's query with the database variable at "All" matches every database.
    panel = next(p for p in dashboard_document()["panels"] if p["title"] == "Queue depth")
    promql = panel["targets"][0]["expr"].replace("$job", ".*").replace("$database", ".*")
    assert any(r["metric"].get("queue") == "mail" for r in _query(base, promql))

    def firing():
        alerts = _get(f"{base}/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "collectors_stale" and a["state"] == "firing"]

    alert = _wait_for("collectors_stale firing", firing, log)[0]
    assert alert["labels"] == {"alertname": "collectors_stale", "severity": "critical", "job": "skiplock",
                               "database": "default", "instance": depth[0]["metric"]["instance"]}
    assert float(alert["value"]) >= 600
    assert alert["annotations"]["runbook_url"] == "docs/alerts.md#collectors_stale"
    assert alert["annotations"]["summary"].startswith("No collection cycle finished for 6")
