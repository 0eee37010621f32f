"""Seeing the tenants (issue 31, item 4) against a real PostgreSQL: a fair queue's groups as
samples (console/collectors/groups.py), alert rules that name a group, /metrics' group series
within its cardinality policy (console/metrics.py), the settings that bound them, the cost of
the read with a 100,000-job tenant, and the Groups panel that shows the same figures.

The collector reads what the queue page's Groups panel reads (console/queue/limits.py
group_rows), so each figure is checked against jobs put in every state by hand: eligible,
scheduled (not counted), running, dead letters inside and outside the window, completed (not
counted), another queue's and an ordinary queue's (not counted).
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.alerts import evaluate as ev
from console.alerts.rules import RuleError, RuleSet, parse_destination, parse_rule
from console.collectors import Options
from console.config import ConfigError, load_config
from console.metrics import render_samples
from console.queue import limits
from console.samples import Sample
from tests.collector_helpers import cycle, value, values

WINDOW = 900.0


def fair(conn, name: str = "fair", n: int = 2) -> None:
    limits.set_limits(conn, name, group_concurrency=n, actor="t")
    limits.keep_claim_indexes(conn)


def add(conn, group: str | None, status: str = "pending", n: int = 1, *, queue: str = "fair",
        ago: float = 60.0, finished_ago: float | None = None) -> None:
    """`n` jobs of `group` in `status`; a pending job due `ago` seconds ago (negative: later);
    a finished one `finished_ago` seconds ago (default `ago`)."""
    finished = None if status in ("pending", "running") else (ago if finished_ago is None else finished_ago)
    conn.execute(
        "INSERT INTO skiplock.jobs (queue, kind, group_key, status, run_at, locked_by, locked_at, lease_until,"
        " attempts, finished_at)"
        " SELECT %(queue)s, 'noop', %(group)s, %(status)s, now() - make_interval(secs => %(ago)s),"
        " CASE WHEN %(status)s = 'running' THEN 'w' END, CASE WHEN %(status)s = 'running' THEN now() END,"
        " CASE WHEN %(status)s = 'running' THEN now() + interval '1 minute' END,"
        " CASE WHEN %(status)s = 'pending' THEN 0 ELSE 1 END,"
        " now() - make_interval(secs => %(finished)s)"
        " FROM generate_series(1, %(n)s)",
        {"queue": queue, "group": group, "status": status, "ago": ago, "n": n, "finished": finished})


def group_figures(report, queue: str = "fair") -> dict[str, dict[str, float]]:
    """{group: {eligible, running, age, dead, starving}} of one queue in a cycle's samples."""
    out: dict[str, dict[str, float]] = {}
    for s in report.samples:
        if s.labels.get("queue") != queue or "group" not in s.labels:
            continue
        row = out.setdefault(s.labels["group"], {})
        if s.metric == "group_depth":
            row[s.labels["state"]] = s.value
        else:
            row[{"group_age_seconds": "age", "group_dead_letters": "dead", "group_starving": "starving"}[s.metric]] = s.value
    return out


# --- the collector -----------------------------------------------------------------------------

def test_the_collector_counts_each_groups_jobs_in_each_state(dsn, conn):
    fair(conn)
    add(conn, "t1", n=3, ago=120)                        # eligible, the oldest waited 2 min
    add(conn, "t1", ago=-3600)                           # scheduled for later: not eligible
    add(conn, "t1", "running", n=2)
    add(conn, "t1", "failed", finished_ago=60)           # a dead letter inside the window
    add(conn, "t1", "failed", finished_ago=WINDOW + 600)  # and one before it
    add(conn, "t1", "completed", n=4)                    # never counted
    add(conn, "t2", ago=30)
    add(conn, None, n=2, ago=45)                         # the NULL group
    add(conn, "t3", "failed", n=2, finished_ago=10)      # only dead letters, nothing waiting
    add(conn, "t4", "running")                           # only running
    add(conn, "t1", n=5, queue="elsewhere")              # another queue's t1
    add(conn, "t1", "failed", queue="elsewhere", finished_ago=5)
    add(conn, "x", n=3, queue="plain")                   # an ordinary queue: no group series
    conn.execute("INSERT INTO skiplock.queues (name) VALUES ('plain') ON CONFLICT DO NOTHING")

    report = cycle(dsn, Options(rate_window=WINDOW), only=("groups",))
    assert report.errors == {}
    got = group_figures(report)
    assert set(got) == {"t1", "t2", "_none", "t3", "t4"}
    assert got["t1"]["eligible"] == 3 and got["t1"]["running"] == 2 and got["t1"]["dead"] == 1
    assert 118 <= got["t1"]["age"] < 180
    assert got["t2"] == {"eligible": 1, "running": 0, "dead": 0, "starving": 0, "age": pytest.approx(30, abs=30)}
    assert got["_none"]["eligible"] == 2 and got["_none"]["running"] == 0
    assert got["t3"] == {"eligible": 0, "running": 0, "dead": 2, "starving": 0, "age": 0}
    assert got["t4"] == {"eligible": 0, "running": 1, "dead": 0, "starving": 0, "age": 0}
    assert value(report, "queue_groups", queue="fair") == 5
    assert value(report, "group_series_folded", queue="fair") == 0
    assert not [s for s in report.samples if s.labels.get("queue") in ("plain", "elsewhere")]
    # The panel says the same (it reads the same walk).
    panel = {g["group"]: g for g in limits.fair_groups(conn, "fair", window=WINDOW, top=20)["groups"]}
    assert {k: (g["eligible"], g["running"], g["failed"]) for k, g in panel.items()} == {
        (k if k != "_none" else None): (v["eligible"], v["running"], v["dead"]) for k, v in got.items()}


def test_a_starving_group_is_a_sample(dsn, conn):
    fair(conn)
    for i in range(4):
        add(conn, f"t{i}", ago=60)
    add(conn, "stuck", ago=3600)
    got = group_figures(cycle(dsn, only=("groups",)))
    assert got["stuck"]["starving"] == 1 and got["stuck"]["age"] >= 3600
    assert [g for g, row in got.items() if row["starving"]] == ["stuck"]


def test_the_cap_keeps_the_longest_waiting_groups_and_folds_the_rest_into_other(dsn, conn):
    """Fifteen groups, four series: the four that waited longest by name, the eleven others in
    _other (their jobs summed, the oldest of their ages), counted by group_series_folded."""
    fair(conn)
    for i in range(15):
        add(conn, f"t{i:02d}", n=i + 1, ago=100 + i * 10)  # t14 waited longest
    report = cycle(dsn, Options(group_series=4), only=("groups",))
    got = group_figures(report)
    assert set(got) == {"t14", "t13", "t12", "t11", "_other"}
    assert got["_other"]["eligible"] == sum(range(1, 12))  # t00..t10: 1 + ... + 11 jobs
    assert 200 <= got["_other"]["age"] < 260  # t10's 200 s, not a sum
    assert sum(v for v in values(report, "group_depth", queue="fair", state="eligible")) == sum(range(1, 16))
    assert value(report, "group_series_folded", queue="fair") == 11
    assert value(report, "queue_groups", queue="fair") == 15


def test_the_total_cap_serves_the_queue_whose_group_waits_longest_first(dsn, conn):
    fair(conn, "a")
    fair(conn, "b")
    for i in range(5):
        add(conn, f"a{i}", queue="a", ago=60)
        add(conn, f"b{i}", queue="b", ago=600)  # b's groups wait longer: b is served first
    report = cycle(dsn, Options(group_series=4, group_series_total=6), only=("groups",))
    a, b = group_figures(report, "a"), group_figures(report, "b")
    assert len(set(b) - {"_other"}) == 4 and len(set(a) - {"_other"}) == 2
    assert value(report, "group_series_folded", queue="b") == 1 and value(report, "group_series_folded", queue="a") == 3
    assert a["_other"]["eligible"] == 3 and b["_other"]["eligible"] == 1
    named = [s for s in report.samples if s.metric == "group_age_seconds" and s.labels["group"] != "_other"]
    assert len(named) == 6


# --- alert rules that name a group -------------------------------------------------------------

def rules(*records) -> RuleSet:
    return RuleSet(rules={r["name"]: parse_rule(r) for r in records},
                   destinations={"ops": parse_destination({"name": "ops", "url": "http://127.0.0.1:9/ops"})})


def alerts(conn) -> dict[tuple[str, str | None], str]:
    return {(r, g): s for r, g, s in conn.execute(
        "SELECT rule, labels->>'group', state FROM skiplock.alerts")}


def test_a_rule_with_a_group_selector_fires_for_that_group_and_resolves(dsn, conn):
    """tenant-42's oldest job waits 10 min: the rule on group="tenant-42" fires, and only for
    it (tenant-7 waits as long); the queue-wide rule (no group) fires for both. Its look-here
    link opens the queue page's Groups panel. Once tenant-42's old job is done, it resolves."""
    fair(conn)
    add(conn, "tenant-42", ago=600)
    add(conn, "tenant-7", ago=600)
    ruleset = rules(
        {"name": "tenant-42-waits", "metric": "group_age_seconds", "labels": {"queue": "fair", "group": "tenant-42"},
         "op": ">", "threshold": 300, "summary": "Group {group} of queue {queue} waited {value}s"},
        {"name": "any-tenant-waits", "metric": "group_age_seconds", "labels": {"queue": "fair"}, "op": ">",
         "threshold": 300})
    cycle(dsn, only=("groups",))
    report = ev.evaluate(conn, ruleset)
    assert alerts(conn) == {("tenant-42-waits", "tenant-42"): "firing", ("any-tenant-waits", "tenant-42"): "firing",
                            ("any-tenant-waits", "tenant-7"): "firing"}
    assert {(t.rule, t.labels["group"], t.kind) for t in report.transitions} >= {("tenant-42-waits", "tenant-42", "firing")}
    doc = conn.execute("SELECT notification FROM skiplock.alert_outbox WHERE notification->'alert'->>'rule' = "
                       "'tenant-42-waits'").fetchone()[0]
    assert doc["alert"]["labels"]["group"] == "tenant-42"
    assert doc["alert"]["summary"].startswith("Group tenant-42 of queue fair waited")
    assert doc["alert"]["look_here"][0]["path"] == "/queues/fair#queue-groups"

    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() WHERE group_key = 'tenant-42'")
    add(conn, "tenant-42", ago=0)  # a new job, just due: the group waits no more
    cycle(dsn, only=("groups",))
    ev.evaluate(conn, ruleset)
    assert alerts(conn)[("tenant-42-waits", "tenant-42")] == "ok"
    assert alerts(conn)[("any-tenant-waits", "tenant-7")] == "firing"


def test_a_group_selector_is_refused_on_a_metric_without_groups():
    with pytest.raises(RuleError, match="has no label 'group'"):
        parse_rule({"name": "x", "metric": "queue_age_seconds", "labels": {"group": "t"}, "op": ">", "threshold": 1})
    rule = parse_rule({"name": "x", "metric": "group_starving", "labels": "queue=fair, group=tenant-42", "op": ">=",
                       "threshold": 1})
    assert rule.labels == {"queue": "fair", "group": "tenant-42"}


# --- /metrics ----------------------------------------------------------------------------------

def families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_show_the_top_groups_and_the_policy(web_settings, dsn, conn):
    """Six groups collected; /metrics with web.metrics_group_series = 2 names the two that waited
    longest, folds the other four into _other without losing a job, and says so."""
    from console.web import create_app

    fair(conn)
    for i in range(6):
        add(conn, f"t{i}", n=i + 1, ago=100 + 100 * i)
    cycle(dsn, only=("groups",))
    app = create_app({**web_settings, "web.metrics_group_series": 2})
    try:
        found = families(app.test_client().get("/metrics").data)
    finally:
        app.extensions["skiplock"].close()
    depth = {s.labels["group"]: s.value for s in found["skiplock_group_depth"].samples if s.labels["state"] == "eligible"}
    assert depth == {"t5": 6, "t4": 5, "_other": 1 + 2 + 3 + 4}
    ages = {s.labels["group"]: s.value for s in found["skiplock_group_age_seconds"].samples}
    assert 400 <= ages["_other"] < 460  # t3's wait: the oldest of the folded, not a sum
    assert found["skiplock_metrics_group_series_limit"].samples[0].value == 2
    assert found["skiplock_metrics_groups_folded"].samples[0].value == 4
    dropped = {s.labels["metric"]: s.value for s in found["skiplock_metrics_series_dropped"].samples}
    assert dropped["group_age_seconds"] == 4 and dropped["group_depth"] == 8 and dropped["queue_groups"] == 0
    assert found["skiplock_queue_groups"].samples[0].value == 6


def test_a_folded_queues_groups_become_one_series():
    """A fair queue folded into queue="_other" takes its groups along into group="_other": one
    series per metric, not one per tenant; the collector's own _other joins them."""
    samples = []
    for queue, age in (("worst", 900.0), ("calm", 10.0)):
        samples.append(Sample("queue_age_seconds", {"queue": queue, "system": "skiplock"}, age))
        for i, group in enumerate(("a", "b", "_other")):
            samples.append(Sample("group_age_seconds", {"queue": queue, "group": group}, age - i))
            samples.append(Sample("group_depth", {"queue": queue, "group": group, "state": "eligible"}, 1.0))
    found = families(render_samples(samples, queue_limit=1, group_limit=10))
    depth = {(s.labels["queue"], s.labels["group"]): s.value for s in found["skiplock_group_depth"].samples}
    assert depth == {("worst", "a"): 1, ("worst", "b"): 1, ("worst", "_other"): 1, ("_other", "_other"): 3}
    ages = {(s.labels["queue"], s.labels["group"]): s.value for s in found["skiplock_group_age_seconds"].samples}
    assert ages[("_other", "_other")] == 10.0
    assert found["skiplock_metrics_groups_folded"].samples[0].value == 0
    dropped = {s.labels["metric"]: s.value for s in found["skiplock_metrics_series_dropped"].samples}
    assert dropped["group_depth"] == 3


# --- the settings ------------------------------------------------------------------------------

SETTINGS = ("scheduler.group_series", "scheduler.group_series_total", "web.metrics_group_series")


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("bad", [0, -3, 2.5, "many"])
def test_a_bad_group_limit_is_refused_naming_the_setting(setting, bad):
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        load_config(env={}, overrides={setting: bad})


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_bad_group_limit_in_the_file_or_environment_is_refused(setting, tmp_path):
    section, key = setting.split(".")
    path = tmp_path / "skiplock.toml"
    path.write_text(f"[{section}]\n{key} = 0\n")
    with pytest.raises(ConfigError, match=rf"{setting}.*must be greater than 0"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=rf"{setting}.*SKIPLOCK_{section.upper()}_{key.upper()}"):
        load_config(env={f"SKIPLOCK_{section.upper()}_{key.upper()}": "1.5"})
    assert getattr(getattr(load_config(env={f"SKIPLOCK_{section.upper()}_{key.upper()}": "7"}), section), key) == 7
    assert Options.from_config(load_config(env={"SKIPLOCK_SCHEDULER_GROUP_SERIES": "3"})).group_series == 3


# --- the read is bounded -------------------------------------------------------------------------

def test_a_100000_job_tenant_costs_a_cycle_what_it_costs_the_panel(dsn, conn):
    """The collector's read (the panel's walk, on the collector's own connection and settings)
    counts the big tenant up to 10,000 and reads a bounded number of buffers, not its backlog;
    the small tenants are exact."""
    from console.collectors import collector_connection
    from console.sqlfiles import query

    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) SELECT 'fair', 'noop', 'big', "
                 "now() - interval '2 hours' + g * interval '1 microsecond' FROM generate_series(1, 100000) AS g")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) SELECT 'fair', 'noop', 't' || (g % 10), "
                 "now() - interval '1 minute' FROM generate_series(1, 100) AS g")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, status, attempts, finished_at) SELECT 'other', 'noop', "
                 "'failed', 1, now() - interval '1 minute' FROM generate_series(1, 1000)")
    fair(conn)
    conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    report = cycle(dsn, Options(group_series=20), only=("groups",))
    got = group_figures(report)
    assert got["big"]["eligible"] == limits.GROUP_COUNT_CAP and got["big"]["age"] >= 7000
    assert all(got[f"t{i}"]["eligible"] == 10 for i in range(10))
    params = {"queues": ["fair"], "groups": limits.GROUPS_SCANNED, "cap": limits.GROUP_COUNT_CAP, "window": 900.0,
              "failed_cap": 5000}
    with collector_connection(dsn) as collector:
        plan = collector.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("limits", "fair_groups"),
                                 params).fetchone()[0][0]
    top = plan["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    assert buffers < 1500, f"the groups read of a 100,000-job tenant read {buffers} buffers"
    print(f"groups read: {buffers} buffers, {plan['Execution Time']:.1f} ms")


# --- the panel shows what the samples say --------------------------------------------------------

def test_the_groups_panel_shows_each_groups_dead_letters_and_groups_with_nothing_waiting(client_as, conn):
    fair(conn)
    add(conn, "t1", n=2)
    add(conn, "t1", "failed", finished_ago=30)
    add(conn, "only-failed", "failed", n=3, finished_ago=30)
    add(conn, "only-running", "running")
    client = client_as("viewer")
    groups = {g["group"]: g for g in client.get("/api/v1/queues/fair").get_json()["groups"]["groups"]}
    assert {k: (g["eligible"], g["running"], g["failed"]) for k, g in groups.items()} == {
        "t1": (2, 0, 1), "only-failed": (0, 0, 3), "only-running": (0, 1, 0)}
    page = client.get("/queues/fair").get_data(as_text=True)
    assert "Dead letters (15 min)" in page and "only-failed" in page and "only-running" in page


def test_the_walk_stops_at_its_group_limit_in_each_queue_read_together(dsn, conn, monkeypatch):
    """One statement reads several fair queues; each stops after GROUPS_SCANNED groups with
    pending jobs (a queue with more says so), and a small queue read with it is whole."""
    monkeypatch.setattr(limits, "GROUPS_SCANNED", 5)
    fair(conn, "a")
    fair(conn, "b")
    for i in range(8):
        add(conn, f"a{i}", queue="a")
    for i in range(3):
        add(conn, f"b{i}", queue="b")
    found = limits.group_rows(conn, ["a", "b"])
    assert [len(found[q]["groups"]) for q in ("a", "b")] == [5, 3]
    assert found["a"]["truncated"] and not found["b"]["truncated"]
    report = cycle(dsn, only=("groups",))
    assert value(report, "queue_groups", queue="a") == 5 and value(report, "queue_groups", queue="b") == 3


def test_a_group_that_drains_reports_its_zeros_once_more(dsn, conn):
    """A drained group is in none of the walk's rows: without the pairs remembered from the last
    cycle, its last backlog stayed the newest sample (for /metrics and the rules)."""
    fair(conn)
    add(conn, "t1", n=2, ago=600)
    busy = cycle(dsn, only=("groups",))
    assert group_figures(busy)["t1"]["age"] >= 600

    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() WHERE group_key = 't1'")
    drained = cycle(dsn, only=("groups",))
    assert group_figures(drained)["t1"] == {"eligible": 0, "running": 0, "age": 0, "dead": 0, "starving": 0}
    latest = conn.execute("SELECT value FROM skiplock.samples_latest WHERE metric = 'group_age_seconds'"
                          " AND labels->>'group' = 't1'").fetchall()
    assert latest == [(0,)]

    gone = cycle(dsn, only=("groups",))
    assert "t1" not in group_figures(gone)
