"""[[external_queues]] with system = "table": a hand-rolled SKIP LOCKED queue watched by the
collectors (config checks, start-up validation against the real table, the samples, /metrics,
a missing table as that source's error)."""

import json
import subprocess
import sys
import threading

import pytest

from console import external
from console.collectors import Options
from console.config import ConfigError, ExternalQueue, load_config
from console.metrics import render_samples
from tests.collector_helpers import cycle, value, values

APP_JOBS = """
CREATE TABLE public.app_jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    status text NOT NULL DEFAULT 'new',
    created_at timestamptz NOT NULL DEFAULT now(),
    locked_until timestamptz
);
CREATE INDEX app_jobs_claim ON public.app_jobs (created_at) WHERE status = 'new';
"""

APP = dict(name="app", system="table", table="public.app_jobs", queue_column="queue",
           pending="status = 'new'", running="status = 'working'", failed="status = 'dead'",
           enqueued_at="created_at", lease_until="locked_until")


def entry(**over) -> ExternalQueue:
    return ExternalQueue(**{**APP, **over})


def config_with(tmp_path, body: str):
    path = tmp_path / "skiplock.toml"
    path.write_text(body)
    from console.config import external_queues

    return external_queues(load_config(path, env={}))


@pytest.mark.parametrize("body, complaint", [
    ('name = "x"\nsystem = "kafka"', "'x': unknown system 'kafka'"),
    ('name = "x"\nsystem = "oban"', "'x': unknown system 'oban' (supported: table, pgqueuer, procrastinate, graphile-worker, pg-boss, bullmq, pgmq)"),
    ('name = "x"\nsystem = "pgqueuer"\nactions = "yes"', "'x': actions must be true or false (got 'yes')"),
    ('name = "x"\nsystem = "table"\ntable = "t"\npending = "true"\nactions = true',
     "'x': actions = true, but system 'table' offers no actions"),
    ('name = "x"\nsystem = "table"\npending = "true"', "'x': table is required"),
    ('name = "x"\nsystem = "table"\ntable = "t"\npending = "true; DROP TABLE t"', "'x': pending contains a semicolon"),
    ('name = "x"\nsystem = "table"\ntable = "a.b.c"\npending = "true"', "'x': table = 'a.b.c' is not"),
    ('name = "x"\nsystem = "pgqueuer"\npending = "true"', "'x': unknown key(s) pending"),
])
def test_bad_entries_stop_start_up_naming_the_entry(tmp_path, body, complaint):
    with pytest.raises(ConfigError) as err:
        config_with(tmp_path, "[[external_queues]]\n" + body + "\n")
    assert complaint in str(err.value)


def test_the_real_table_is_checked_at_start_up(conn):
    conn.execute(APP_JOBS)
    external.validate(conn, external.adapter_for(entry()))  # fine as declared
    for over, complaint in [
        ({"table": "public.nope"}, "table public.nope does not exist"),
        ({"enqueued_at": "born"}, "has no column born"),
        ({"pending": "status = = 'new'"}, "syntax error"),
        ({"running": "status"}, "must be type boolean"),
        ({"failed": "nosuch = 1"}, "nosuch"),
    ]:
        with pytest.raises(ConfigError) as err:
            external.validate(conn, external.adapter_for(entry(**over)))
        assert "[[external_queues]] 'app'" in str(err.value) and complaint in str(err.value), (over, err.value)


def skip_locked_worker(dsn: str, stop: threading.Event, done: list[int]) -> None:
    """The 20-line loop the PostgreSQL-as-a-queue literature teaches."""
    from console.db import connect

    with connect(dsn, application_name="app-worker") as c:
        while not stop.is_set():
            with c.transaction():
                row = c.execute("""SELECT id FROM public.app_jobs WHERE status = 'new' AND queue = 'fast'
                                   ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED""").fetchone()
                if row is None:
                    break
                c.execute("UPDATE public.app_jobs SET status = 'done' WHERE id = %s", row)
                done.append(row[0])


def test_a_hand_rolled_queue_is_sampled_like_skiplocks_own(dsn, conn, client_as):
    conn.execute(APP_JOBS)
    conn.execute("""INSERT INTO public.app_jobs (queue, status, created_at, locked_until) VALUES
        ('fast', 'new', now(), NULL), ('fast', 'new', now(), NULL),
        ('slow', 'new', now() - interval '10 minutes', NULL), ('slow', 'new', now(), NULL),
        ('slow', 'working', now(), now() - interval '1 minute'), ('slow', 'working', now(), now() + interval '1 hour'),
        ('slow', 'dead', now(), NULL)""")
    stop, done = threading.Event(), []
    worker = threading.Thread(target=skip_locked_worker, args=(dsn, stop, done))
    worker.start()
    worker.join(timeout=20)
    stop.set()
    assert len(done) == 2  # the worker drained 'fast'

    report = cycle(dsn, Options(external=(entry(),)))
    assert not report.errors, report.errors
    lbl = {"system": "table", "external": "app"}
    assert [s for s in report.samples if s.labels.get("queue") == "fast" and s.metric == "queue_depth"] == []
    assert value(report, "queue_depth", queue="slow", state="eligible", **lbl) == 2
    assert value(report, "queue_depth", queue="slow", state="running", **lbl) == 2
    assert value(report, "stuck_leases", queue="slow", **lbl) == 1
    assert 55 <= value(report, "stuck_lease_age_seconds", queue="slow", **lbl) <= 120
    assert value(report, "dead_letters", queue="slow", **lbl) == 1
    assert 590 <= value(report, "queue_age_seconds", queue="slow", **lbl) <= 700
    assert value(report, "external_source_errors", **lbl) == 0
    assert value(report, "table_size_bytes", table="app:public.app_jobs", part="heap", system="table") > 0
    assert value(report, "table_live_tuples", table="app:public.app_jobs", system="table") is not None
    body = render_samples(report.samples).decode()
    assert ('skiplock_queue_depth{backend="postgres",external="app",queue="slow",state="eligible",system="table"} 2.0'
            in body), body

    # The pages list it with its system, read-only, and keep it out of Skiplock's own queues.
    viewer = client_as("viewer")
    for url in ("/queues", "/overview"):
        page = viewer.get(url).get_data(as_text=True)
        assert 'data-external-queue="app/slow"' in page and 'data-system="table"' in page, url
        assert "read-only" in page, url
    own = viewer.get("/api/v1/queues").get_json()["queues"]
    assert "slow" not in {r["queue"] for r in own}
    assert 'data-queue="slow"' not in viewer.get("/overview").get_data(as_text=True)  # not one of Skiplock's own
    # The Database page judges its queue table beside Skiplock's own (from the stored samples).
    health = viewer.get("/health").get_data(as_text=True)
    assert 'data-external-table="app">public.app_jobs <span class="badge" data-system="table">table</span>' in health
    [ext] = viewer.get("/api/v1/health").get_json()["tables"]["external"]
    assert (ext["source"], ext["table"], ext["system"], ext["level"]) == ("app", "public.app_jobs", "table", "good")
    assert ext["live"] == value(report, "table_live_tuples", table="app:public.app_jobs", system="table")

    # Beyond the cap the depth is the planner's estimate, and says so.
    conn.execute("INSERT INTO public.app_jobs (queue) SELECT 'slow' FROM generate_series(1, 300)")
    conn.execute("ANALYZE public.app_jobs")
    capped = cycle(dsn, Options(external=(entry(),), depth_exact_limit=50))
    assert value(capped, "queue_depth_estimated", **lbl) == 1
    eligible = value(capped, "queue_depth", queue="slow", state="eligible", **lbl)
    assert 250 <= eligible <= 360

    # The panel refreshes with the pages' poll: both include the fragment the poll returns.
    fragment = viewer.get("/queues/_external").get_data(as_text=True)
    poll = '<section class="panel" id="external-queues" hx-get="/queues/_external" hx-trigger="poll" data-poll'
    assert poll in fragment and "<html" not in fragment, fragment[:400]
    assert f'<td class="num">{int(eligible):,}</td>' in fragment  # the new cycle's figures
    for url in ("/queues", "/overview"):
        assert poll in viewer.get(url).get_data(as_text=True), url


def test_a_watched_queue_that_drains_reports_its_zeros_once_more(dsn, conn):
    """A watched library deletes or moves its finished jobs, so a drained queue is in none of
    the snapshot's rows: without the queues remembered from the last cycle, the pages kept its
    last backlog as the newest reading."""
    conn.execute(APP_JOBS)
    conn.execute("INSERT INTO public.app_jobs (queue, created_at) VALUES ('burst', now() - interval '3 minutes')")
    lbl = {"system": "table", "external": "app"}
    options = Options(external=(entry(),))
    busy = cycle(dsn, options)
    assert value(busy, "queue_depth", queue="burst", state="eligible", **lbl) == 1
    assert value(busy, "queue_age_seconds", queue="burst", **lbl) >= 180

    conn.execute("DELETE FROM public.app_jobs")
    drained = cycle(dsn, options)
    assert value(drained, "queue_depth", queue="burst", state="eligible", **lbl) == 0
    assert value(drained, "queue_age_seconds", queue="burst", **lbl) == 0
    latest = conn.execute("SELECT value FROM skiplock.samples_latest WHERE metric = 'queue_age_seconds'"
                          " AND labels->>'queue' = 'burst' AND labels->>'external' = 'app'").fetchall()
    assert latest == [(0,)]

    gone = cycle(dsn, options)
    assert values(gone, "queue_depth", queue="burst", **lbl) == []


def test_a_missing_table_is_that_sources_error_not_the_cycles(dsn, conn):
    conn.execute(APP_JOBS)
    first = cycle(dsn, Options(external=(entry(),)))
    conn.execute("DROP TABLE public.app_jobs")
    conn.execute("CREATE TABLE public.t (id int); INSERT INTO public.t VALUES (1); CREATE SEQUENCE s")
    report = cycle(dsn, Options(external=(entry(),)))
    assert not report.errors, report.errors  # every collector ran, the external one included
    lbl = {"system": "table", "external": "app"}
    assert value(report, "external_source_errors", **lbl) == 1
    assert "public.app_jobs does not exist" in report.details["external_sources"]["app"]["error"]
    assert first.details["external_sources"]["app"]["error"] is None
    # Collected every cycle READ ONLY: a predicate that writes is refused, not run.
    writing = cycle(dsn, Options(external=(entry(table="public.t", pending="nextval('s') > 0", queue_column="",
                                                      enqueued_at="", lease_until="", running="", failed=""),)))
    assert "read-only transaction" in writing.details["external_sources"]["app"]["error"]


def test_the_advisor_flags_a_claim_without_skip_locked(dsn, conn, subprocess_env, tmp_path):
    """`skiplock check --external app`, as a real process, against a queue whose claim waits on
    locked rows (FOR UPDATE without SKIP LOCKED), with a foreign key pointing at it."""
    conn.execute(APP_JOBS)
    conn.execute("CREATE TABLE public.app_results (job_id bigint REFERENCES public.app_jobs (id))")
    conn.execute("INSERT INTO public.app_jobs (queue) SELECT 'q' FROM generate_series(1, 5)")
    conn.execute("SELECT pg_stat_statements_reset()")
    for _ in range(3):
        with conn.transaction():
            conn.execute("SELECT id FROM public.app_jobs WHERE status = 'new' ORDER BY created_at LIMIT 1 FOR UPDATE")
    config = tmp_path / "skiplock.toml"
    config.write_text('[[external_queues]]\nname = "app"\nsystem = "table"\ntable = "public.app_jobs"\n'
                      'queue_column = "queue"\npending = "status = \'new\'"\nenqueued_at = "created_at"\n')
    env = {**subprocess_env, "SKIPLOCK_CONFIG": str(config)}

    def check(*args):
        return subprocess.run([sys.executable, "-m", "console", "check", "--external", "app", *args],
                              env=env, capture_output=True, text=True, timeout=60)

    proc = check("--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by_id = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert by_id["ext-claim-skip-locked"]["status"] == "fail", by_id["ext-claim-skip-locked"]
    assert "FOR UPDATE" in by_id["ext-claim-skip-locked"]["evidence"][0]
    assert by_id["ext-claim-skip-locked"]["docs"] == "docs/external-queues.md#ext-claim-skip-locked"
    assert by_id["ext-partial-index"]["status"] == "ok", by_id["ext-partial-index"]  # app_jobs_claim
    assert by_id["ext-foreign-keys"]["status"] == "warn" and "app_results" in by_id["ext-foreign-keys"]["evidence"][0]
    assert by_id["ext-long-transactions"]["status"] == "ok"

    # The same claim with SKIP LOCKED passes; the old statement is gone from the history.
    conn.execute("SELECT pg_stat_statements_reset()")
    with conn.transaction():
        conn.execute("SELECT id FROM public.app_jobs WHERE status = 'new' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED")
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ok  ] ext-claim-skip-locked" in proc.stdout and "External queue app (table)" in proc.stdout

    assert "no [[external_queues]] entry named 'nope'" in subprocess.run(
        [sys.executable, "-m", "console", "check", "--external", "nope"], env=env, capture_output=True, text=True,
        timeout=60).stderr


def test_an_unreachable_source_does_not_stop_start_up(tmp_path, caplog):
    """Skiplock's own monitoring starts; the source's panel shows the error each cycle."""
    from console.external import validate_all

    path = tmp_path / "skiplock.toml"
    path.write_text('[[external_queues]]\nname = "far"\nsystem = "pgqueuer"\ndsn = "postgresql://postgres@127.0.0.1:1/x"\n')
    assert [a.name for a in validate_all(load_config(path, env={}), "postgresql://postgres@127.0.0.1:1/y")] == ["far"]
    assert "'far': not checked at start-up: cannot connect" in caplog.text


def test_a_bad_entry_stops_the_collect_command_naming_it(subprocess_env, tmp_path):
    config = tmp_path / "skiplock.toml"
    config.write_text('[[external_queues]]\nname = "app"\nsystem = "table"\ntable = "public.app_jobs"\npending = "true"\n')
    proc = subprocess.run([sys.executable, "-m", "console", "collect", "--once"], capture_output=True, text=True,
                          env={**subprocess_env, "SKIPLOCK_CONFIG": str(config)}, timeout=60)
    assert proc.returncode != 0
    assert "[[external_queues]] 'app': table public.app_jobs does not exist" in proc.stderr, proc.stderr


def test_an_entry_belongs_to_one_database_and_an_unknown_one_is_refused(tmp_path, make_database):
    """With [[databases]], an entry is collected, checked and shown by one database's console:
    the one its `database` key names, else the first. Collecting it in every database would
    look for its table where it is not and store its series twice."""
    from console.collectors.base import sources_of
    from console.scheduler import Scheduler

    east, west = make_database(), make_database()
    body = (f'[[databases]]\nname = "east"\ndsn = "{east}"\n\n[[databases]]\nname = "west"\ndsn = "{west}"\n\n'
            '[[external_queues]]\nname = "app"\nsystem = "table"\ntable = "public.app_jobs"\npending = "true"\n'
            'database = "west"\n\n'
            '[[external_queues]]\nname = "legacy"\nsystem = "table"\ntable = "public.app_jobs"\npending = "true"\n')
    path = tmp_path / "skiplock.toml"
    path.write_text(body)
    config = load_config(path, env={})
    assert [e.name for e in sources_of(config, "west")] == ["app"]
    assert [e.name for e in sources_of(config, "east")] == ["legacy"]
    assert [e.name for e in sources_of(config)] == ["legacy"]  # None: the first database
    assert [a.name for a in external.adapters(config, "west")] == ["app"]
    # the scheduler member of each database collects its own sources only
    members = {name: Scheduler(dsn, config, database=name) for name, dsn in (("east", east), ("west", west))}
    try:
        assert [e.name for e in members["west"].options.external] == ["app"]
        assert [e.name for e in members["east"].options.external] == ["legacy"]
    finally:
        for member in members.values():
            member.close()
    path.write_text(body.replace('database = "west"', 'database = "north"'))
    with pytest.raises(ConfigError, match=r"'app': database = 'north' is not one of the configured databases \(east, west\)"):
        sources_of(load_config(path, env={}))


def test_the_advisor_page_shows_each_sources_checks_from_the_stored_run(conn, web_app, client_as):
    """The page's stored run (stored by the scheduler's cycle or the button) includes the external
    checks, under the source's own heading with its system; a missing table is "not available"."""
    from tests.web_fixtures import CSRF

    conn.execute(APP_JOBS)
    conn.execute("SELECT pg_stat_statements_reset()")
    with conn.transaction():
        conn.execute("SELECT id FROM public.app_jobs WHERE status = 'new' ORDER BY created_at LIMIT 1 FOR UPDATE")
    web_app.extensions["skiplock"].config.tables["external_queues"] = [
        {k: v for k, v in APP.items() if k not in ("running", "failed")},
        {"name": "gone", "system": "table", "table": "public.nope", "pending": "true"}]
    from console.advisor import report

    report.refresh(conn, web_app.extensions["skiplock"].config)  # the scheduler's cycle stores the run
    viewer = client_as("viewer")
    html = viewer.get("/advisor").get_data(as_text=True)
    assert '<h2 data-external="app">External queue app (table)' in html and 'data-system="table"' in html
    assert 'id="check-app-ext-claim-skip-locked" data-check="ext-claim-skip-locked" data-status="fail"' in html
    assert 'id="check-gone-ext-autovacuum" data-check="ext-autovacuum" data-status="unknown"' in html
    assert "not available: table public.nope does not exist" in html
    assert 'data-check="claim-plan"' in html  # Skiplock's own checks are still there

    # Fixed: the poll shows the stored run (no re-run per request); the Re-run button runs it now.
    conn.execute("SELECT pg_stat_statements_reset()")
    with conn.transaction():
        conn.execute("SELECT id FROM public.app_jobs WHERE status = 'new' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED")
    assert 'id="check-app-ext-claim-skip-locked" data-check="ext-claim-skip-locked" data-status="fail"' in viewer.get(
        "/advisor/_checks").get_data(as_text=True)
    rerun = client_as("operator").post("/advisor/run", data={"csrf_token": CSRF}, headers={"HX-Request": "true"})
    assert 'id="check-app-ext-claim-skip-locked" data-check="ext-claim-skip-locked" data-status="ok"' in rerun.get_data(as_text=True)
    api = viewer.get("/api/v1/advisor?check=ext-foreign-keys").get_json()["checks"]
    assert [(c["external"], c["system"], c["status"]) for c in api] == [("app", "table", "ok"), ("gone", "table", "unknown")]


def test_claim_latency_per_source_from_pg_stat_statements(dsn, conn, client_as):
    """The source's claim (claim_query_like) timed from pg_stat_statements deltas between two
    cycles: on /metrics and the Queues page; a table has no completion log, and says so."""
    from console.samples import Sample, store

    conn.execute(APP_JOBS)
    conn.execute("INSERT INTO public.app_jobs (queue) SELECT 'fast' FROM generate_series(1, 5)")
    src = entry(claim_query_like="%FOR UPDATE SKIP LOCKED%")
    lbl = {"system": "table", "external": "app"}
    first = cycle(dsn, Options(external=(src,)))
    assert values(first, "claim_latency_seconds", **lbl) == []  # a latency needs two readings
    stop, done = threading.Event(), []
    skip_locked_worker(dsn, stop, done)
    assert len(done) == 5
    report = cycle(dsn, Options(external=(src,)))
    latency = value(report, "claim_latency_seconds", queue="all", source="pg_stat_statements", quantile="mean", **lbl)
    assert latency is not None and 0 < latency < 1
    assert values(report, "throughput", **lbl) == []
    info = report.details["external_sources"]["app"]
    assert info["throughput"].startswith("not available: a declared table has no log")
    assert ('skiplock_claim_latency_seconds{external="app",quantile="mean",queue="all",source="pg_stat_statements",'
            'system="table"}') in render_samples(report.samples).decode()
    page = client_as("viewer").get("/queues").get_data(as_text=True)
    assert f"<strong>{latency * 1000:.2f} ms</strong>" in page

    # An external source's throughput stays out of Skiplock's own throughput chart.
    store(conn, [Sample("throughput", {"outcome": "completed", "queue": "q", **lbl}, 5.0)])
    figures = {f["key"]: f for f in client_as("viewer").get("/api/v1/overview").get_json()["figures"]}
    assert not any(p[1] for s in figures["throughput"]["series"] for p in s["points"]), figures["throughput"]  # no worker ran


def test_the_advisor_says_whether_completed_rows_leave_the_table(conn, tmp_path):
    from console.advisor.external import run_external

    conn.execute(APP_JOBS)
    conn.execute("INSERT INTO public.app_jobs (queue, status) SELECT 'q', 'done' FROM generate_series(1, 5)")
    (tmp_path / "s.toml").write_text("[advisor]\ncompleted_rows_warn = 3\n")
    config = load_config(tmp_path / "s.toml", env={})

    def check(**over):
        return run_external(conn, external.adapter_for(entry(**over)), config).by_id("ext-completed-rows")

    warned = check(completed="status = 'done'")
    assert (warned.status, warned.data["completed"], warned.data["exact"]) == ("warn", 5, True), warned
    conn.execute("INSERT INTO public.app_jobs (queue, status) SELECT 'q', 'done' FROM generate_series(1, 30)")
    assert check(completed="status = 'done'").status == "fail"
    assert check(completed="status = 'gone'").status == "ok"
    assert check().status == "unknown"  # no `completed` predicate: cannot tell
    assert external.adapter_for(ExternalQueue(name="p", system="pgqueuer")).completed is None  # PGQueuer deletes them


def test_an_external_sources_claim_latency_does_not_move_skiplocks_verdict(conn):
    from datetime import UTC, datetime, timedelta

    from console.advisor.verdict import evaluate_verdict
    from console.samples import Sample, store

    now = datetime.now(UTC)
    lbl = {"queue": "all", "source": "pg_stat_statements", "quantile": "mean", "system": "table", "external": "app"}
    store(conn, [Sample("claim_latency_seconds", lbl, 0.003 + 0.002 * i, now - timedelta(hours=48 - i)) for i in range(49)])
    signal = {s.id: s for s in evaluate_verdict(conn).signals}["claim-latency"]
    assert signal.level == "unknown", signal
