"""The collection runner: one cycle stores samples, state and a run row; a collector that
times out records its error and "not available" while the others run; `skiplock collect
--once`; and the Prometheus exposition of the stored cycle."""

import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families
from psycopg.types.json import Jsonb

from console import collectors, samples
from console.collectors import Options, latest_details
from console.db import connect
from console.metrics import render_metrics
from tests.collector_helpers import cycle, value


def test_a_cycle_stores_samples_state_and_a_run_row(dsn, conn):
    report = cycle(dsn, leader="test")
    assert not report.errors
    assert set(report.collectors) == {c.name for c in collectors.COLLECTORS}
    stored = samples.latest_cycle(conn)
    assert len(stored) == len(report.samples)
    run = samples.last_collection(conn)
    assert run["leader"] == "test"
    assert set(run["collectors"]) == set(report.collectors)
    assert all(c["error"] is None for c in run["collectors"].values())
    states = {r[0] for r in conn.execute("SELECT name FROM skiplock.collector_state")}
    assert states == set(report.collectors)
    assert latest_details(conn)["details"]["xmin_holders"] == []
    for name in report.collectors:
        assert value(report, "collector_duration_seconds", collector=name) > 0
        assert value(report, "collector_errors", collector=name) == 0
    assert value(report, "collection_duration_seconds") > 0


def test_a_collector_that_times_out_records_it_and_the_others_still_run(dsn, conn):
    from console import queue as q

    q.enqueue(conn, "noop", queue="a")
    first = cycle(dsn)
    assert value(first, "queue_depth", queue="a", state="eligible") == 1
    with connect(dsn, application_name="skiplock-test-ddl", autocommit=False) as ddl:
        ddl.execute("LOCK TABLE skiplock.jobs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        report = cycle(dsn, Options(lock_timeout_ms=100))
        elapsed = time.monotonic() - started
        ddl.rollback()
    assert elapsed < 10  # without lock_timeout it would wait out the statement timeout
    assert "lock timeout" in report.errors["queue"]
    assert value(report, "collector_errors", collector="queue") == 1
    # What the queue collector reported last time is "not available" now, not stale.
    assert value(report, "queue_depth", queue="a", state="eligible") is None
    assert value(report, "collector_errors", collector="horizon") == 0
    assert value(report, "xmin_horizon_age_seconds", holder="any") is not None
    run = samples.last_collection(conn)
    assert "lock timeout" in run["collectors"]["queue"]["error"]
    # The failed collector's previous state is kept, so the next good cycle still has a baseline.
    after = cycle(dsn)
    assert value(after, "queue_depth", queue="a", state="eligible") == 1
    assert value(after, "dead_letter_growth", queue="a") == 0


def test_collect_once_prints_what_it_stored(subprocess_env, conn):
    result = subprocess.run([sys.executable, "-m", "console", "collect", "--once"], env=subprocess_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "queue_depth" in result.stdout or "workers_live" in result.stdout
    assert "stored" in result.stdout and "collection run" in result.stdout
    assert conn.execute("SELECT count(*) FROM skiplock.collection_runs").fetchone()[0] == 1


def test_collect_once_without_the_schema_says_so(make_database, python_exe):
    import os

    env = {**os.environ, "DATABASE_URL": make_database(template=None)}
    result = subprocess.run([python_exe, "-m", "console", "collect", "--once"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "skiplock migrate" in result.stderr
    assert "Traceback" not in result.stderr


def test_metrics_exposition_of_the_newest_cycle(dsn, conn):
    from console import queue as q

    q.enqueue(conn, "noop", queue="mail")
    cycle(dsn)
    body, content_type = render_metrics(conn)
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    depth = {(s.labels["queue"], s.labels["state"]): s.value for s in families["skiplock_queue_depth"].samples}
    assert depth[("mail", "eligible")] == 1
    for name in ("skiplock_queue_age_seconds", "skiplock_stuck_leases", "skiplock_dead_letters",
                 "skiplock_claim_latency_seconds", "skiplock_table_dead_tuples", "skiplock_xmin_horizon_age_seconds",
                 "skiplock_lock_waits", "skiplock_collector_duration_seconds", "skiplock_collection_age_seconds"):
        assert name in families, name
    probe = [s for s in families["skiplock_claim_latency_seconds"].samples if s.labels["source"] == "probe"]
    # system/external (an [[external_queues]] source's series) are empty here: Prometheus reads "" as absent
    assert probe and {k for k, v in probe[0].labels.items() if v} == {"queue", "source", "quantile"}
    assert {s.labels["table"] for s in families["skiplock_table_dead_tuples"].samples} == {"jobs", "jobs_archive"}
    # "Not available" values are left out rather than exported as a number.
    assert "skiplock_throughput" not in families


def test_metrics_before_any_collection(conn):
    body, _ = render_metrics(conn)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    # Only the age of the (absent) collection and the series policy (web.metrics_queue_series,
    # web.metrics_group_series): no queue or group was folded and no series dropped.
    assert sorted(families) == ["skiplock_collection_age_seconds", "skiplock_metrics_group_series_limit",
                                "skiplock_metrics_groups_folded", "skiplock_metrics_queue_series_limit",
                                "skiplock_metrics_queues_folded", "skiplock_metrics_series_dropped"]
    assert families["skiplock_metrics_queues_folded"].samples[0].value == 0
    assert families["skiplock_metrics_groups_folded"].samples[0].value == 0
    assert families["skiplock_metrics_series_dropped"].samples[0].value == 0


def test_a_wide_cycle_is_stored_past_the_pages_statement_timeout(conn):
    """One statement stores a whole cycle (45,000 samples at 5,000 queues, with the triggers that
    keep samples_latest): at load 7 it took longer than the 2 s `statement_timeout` the pages
    and collectors share, and the cycle was lost. The store has a limit of its own
    (STORE_TIMEOUT_MS); here the session's limit is 100 ms and 40,000 samples (about half a
    second) still land."""
    from datetime import UTC, datetime

    from console.samples import Sample

    wide = [Sample("queue_depth", {"queue": f"q{i}", "state": "eligible"}, float(i)) for i in range(40_000)]
    report = collectors.CollectionReport(started_at=datetime.now(UTC), duration_s=0.1, samples=wide, collectors={})
    conn.execute("SET statement_timeout = '100ms'")
    try:
        assert collectors._store(conn, report, {}, None) > 0
    finally:
        conn.execute("RESET statement_timeout")
    assert conn.execute("SELECT count(*) FROM skiplock.samples_latest WHERE metric = 'queue_depth'").fetchone()[0] == 40_000
    assert conn.execute("SHOW statement_timeout").fetchone()[0] != "15s"  # SET LOCAL: the session's own limit is back


def test_each_collectors_series_are_stored_again_only_when_they_changed(dsn, conn):
    """The list of series a failing collector reports as "not available" (collector_state.series,
    migration 034: 45,000 pairs at 5,000 queues) is sent only when it changed, or when another
    scheduler stored since this one did; otherwise the stored list is kept."""
    from console import queue as q

    def stored() -> list:
        return conn.execute("SELECT series FROM skiplock.collector_state WHERE name = 'queue'").fetchone()[0]

    def queues() -> set[str]:
        return {labels.get("queue") for metric, labels in stored() if metric == "queue_depth"}

    marker = ["queue_depth", {"queue": "marker", "state": "eligible"}]
    q.enqueue(conn, "noop", queue="a")
    cycle(dsn)
    assert queues() == {"a"}
    # The same series: the stored list stays as it is (the marker shows it was not sent again).
    conn.execute("UPDATE skiplock.collector_state SET series = series || %s::jsonb WHERE name = 'queue'",
                 (Jsonb([marker]),))
    cycle(dsn)
    assert queues() == {"a", "marker"}
    # A queue came: the list is sent again.
    q.enqueue(conn, "noop", queue="b")
    cycle(dsn)
    assert queues() == {"a", "b"}
    # Another scheduler stored since (its taken_at): sent again though the series are the same.
    conn.execute("UPDATE skiplock.collector_state SET series = series || %s::jsonb, taken_at = taken_at - interval '1 s' "
                 "WHERE name = 'queue'", (Jsonb([marker]),))
    cycle(dsn)
    assert queues() == {"a", "b"}
