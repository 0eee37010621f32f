"""Several databases in one console: `[[databases]]` validated at start-up, `--database NAME`,
`migrate --all`, the scheduler's election per database, and a database that goes down while
the others keep working (a second real cluster, stopped mid-test) in `collect --once`,
`/api/v1/databases`, the fleet page and `/metrics`."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from console import queue as q
from console.cli import main
from console.config import ConfigError, load_config
from console.databases import UnknownDatabase, load_databases, parse_databases, select
from console.db import connect, migrate
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster
from console.scheduler import Fleet
from tests.collector_helpers import eventually
from tests.web_fixtures import CSRF


def write_config(tmp_path, databases: dict[str, str], extra: str = "") -> str:
    path = tmp_path / "skiplock.toml"
    body = "".join(f'[[databases]]\nname = "{name}"\ndsn = "{dsn}"\n\n' for name, dsn in databases.items())
    path.write_text(extra + "\n" + body, encoding="utf-8")
    return str(path)


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch):
    # [[databases]] and DATABASE_URL together are refused; these tests name theirs in the file.
    monkeypatch.delenv("DATABASE_URL", raising=False)


# --- the configuration ----------------------------------------------------------------------

@pytest.mark.parametrize(("records", "complaint"), [
    ([{"name": "east", "dsn": "postgresql:///a"}, {"name": "east", "dsn": "postgresql:///b"}],
     "entry 2 (name 'east'): name is used by an earlier entry"),
    ([{"name": "East side", "dsn": "postgresql:///a"}], "entry 1 (name 'East side'): name must be lower-case"),
    ([{"name": "east"}], "entry 1 (name 'east'): dsn is required"),
    ([{"dsn": "postgresql:///a"}], "entry 1: name is required"),
    ([{"name": "east", "dsn": "postgresql:///a", "replica": "x"}], "unknown key 'replica'"),
])
def test_a_bad_databases_entry_stops_start_up_naming_it(records, complaint):
    with pytest.raises(ConfigError, match="databases") as raised:
        parse_databases(records)
    assert complaint in str(raised.value)


def test_one_dsn_alone_is_the_database_default_and_both_ways_at_once_are_refused(tmp_path):
    plain = load_config(env={})
    [only] = load_databases(plain, "postgresql:///x", env={})
    assert (only.name, only.dsn) == ("default", "postgresql:///x")
    assert load_databases(plain, None, env={"DATABASE_URL": "postgresql:///y"})[0].name == "default"
    listed = load_config(write_config(tmp_path, {"east": "postgresql:///e", "west": "postgresql:///w"}), env={})
    assert [d.name for d in load_databases(listed, None, env={})] == ["east", "west"]
    with pytest.raises(ConfigError, match="--database NAME"):
        load_databases(listed, None, env={"DATABASE_URL": "postgresql:///y"})
    with pytest.raises(UnknownDatabase, match=r"unknown database 'north' \(configured: east, west\)"):
        select(load_databases(listed, None, env={}), "north")


def test_migrate_all_and_database_picks_one(make_database, tmp_path):
    first, second = make_database(template=None), make_database(template=None)
    config = write_config(tmp_path, {"first": first, "second": second})
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--config", config, *args], catch_exceptions=False)

    result = run("migrate", "--all")
    assert result.exit_code == 0, result.output
    assert "first: applied 001_" in result.output and "second: applied 001_" in result.output
    assert "second: schema is up to date" in run("migrate", "--all").output
    job = run("enqueue", "--database", "second", "noop").output.strip()
    with connect(second) as conn:
        assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (int(job),)).fetchone()[0] == 1
    with connect(first) as conn:
        assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    unknown = run("enqueue", "--database", "third", "noop")
    assert unknown.exit_code != 0
    assert "unknown database 'third' (configured: first, second)" in unknown.output


# --- a second real cluster ------------------------------------------------------------------

WEST_TEMPLATE = "west_template"
_west_counter = itertools.count()


@pytest.fixture(scope="module")
def west_cluster():
    """A second real cluster for the module (started once), with a migrated template database."""
    cluster = PrivateCluster(settings=RELAXED_DURABILITY, exit_guard=True)
    try:
        cluster.start()
        with connect(cluster.dsn) as conn:
            conn.execute(f"CREATE DATABASE {WEST_TEMPLATE}")
        with connect(cluster.dsn_for(WEST_TEMPLATE)) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            migrate(conn)
        yield cluster
    finally:
        cluster.stop(mode="immediate")


@pytest.fixture
def west(west_cluster):
    """A fresh migrated database in the second cluster for each test (the configured database
    "west"): tests must not see each other's queues, whatever order they run in."""
    if not west_cluster.running:
        west_cluster.start()
    name = f"west_{next(_west_counter)}"
    with connect(west_cluster.dsn) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE {WEST_TEMPLATE}')
    yield west_cluster.dsn_for(name)
    if west_cluster.running:
        with connect(west_cluster.dsn) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def two_databases(tmp_path, dsn, west):
    """The config file: `east` (this test's database in the session cluster) and `west`."""
    return write_config(tmp_path, {"east": dsn, "west": west},
                        extra='[web]\nsecret_key = "k"\nproduction = false\ndb_wait = 1.0\n'
                              '[scheduler]\nelection_interval = 0.5\n')


def test_each_database_has_its_own_leader_and_a_dead_leader_is_replaced(two_databases):
    config = load_config(two_databases, env={})
    databases = load_databases(config, env={})
    first, second = Fleet(databases, config), Fleet(databases, config)
    try:
        assert first.elect() == {"east": True, "west": True}
        assert second.elect() == {"east": False, "west": False}
        # The first process's session in east ends (as when it dies): the second takes east over
        # at its next tick, and west stays with the first.
        first.members["east"].close()
        eventually(lambda: second.members["east"].elect(), timeout=5, interval=0.05)
        assert second.elect() == {"east": True, "west": False}
        assert first.members["west"].elect() is True
    finally:
        first.close()
        second.close()


@pytest.fixture
def web_app(request, web_settings):
    """The app of conftest's `client_as`: over east and west when the test uses them."""
    from console.web import create_app

    if "alerting_databases" in request.fixturenames:
        app = create_app(load_config(request.getfixturevalue("alerting_databases")[0], env={}))
    elif "two_databases" in request.fixturenames:
        app = create_app(load_config(request.getfixturevalue("two_databases"), env={}))
    else:
        app = create_app(web_settings)
    yield app
    app.extensions["skiplock"].close()


def metric_families(body: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body)}


class FleetClock:
    """console.web.fleet's clock, moved by the test: its buckets and the rows' ages."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fleet_clock(monkeypatch):
    from console.web import fleet

    found = FleetClock()
    monkeypatch.setattr(fleet, "clock", found)
    return found


FLEET_SECONDS = 10.0  # web.fleet_seconds's default: two_databases does not set it


def test_a_database_that_goes_down_shows_as_down_and_the_others_keep_working(
        two_databases, west_cluster, west, conn, client_as, fleet_clock):
    runner = CliRunner()
    q.enqueue(conn, "noop", queue="mail")
    with connect(west) as wconn:
        q.enqueue(wconn, "noop", queue="bulk")
        q.enqueue(wconn, "noop", queue="bulk")
    collected = runner.invoke(main, ["--config", two_databases, "collect", "--once"], catch_exceptions=False)
    assert collected.exit_code == 0, collected.output
    assert "== database east" in collected.output and "== database west" in collected.output
    viewer = client_as("viewer")

    rows = {r["name"]: r for r in viewer.get("/api/v1/databases").get_json()["databases"]}
    assert list(rows) == ["east", "west"]
    assert rows["east"]["reachable"] and rows["west"]["reachable"]
    assert (rows["east"]["depth"], rows["west"]["depth"]) == (1, 2)  # each from its own samples
    metrics = metric_families(viewer.get("/metrics").get_data(as_text=True))
    depth = {(s.labels["database"], s.labels["queue"]): s.value for s in metrics["skiplock_queue_depth"].samples
             if s.labels["state"] == "eligible"}
    assert depth == {("east", "mail"): 1, ("west", "bulk"): 2}
    assert all("database" in s.labels for f in metrics.values() for s in f.samples)

    west_cluster.halt()  # west goes down while the console watches it

    config = load_config(two_databases, env={})
    fleet = Fleet(load_databases(config, env={}), config)
    try:
        assert fleet.elect() == {"east": True, "west": False}
        assert fleet.members["east"].run_job("collect") is True
        assert fleet.members["west"].run_job("collect") is False
    finally:
        fleet.close()
    collected = runner.invoke(main, ["--config", two_databases, "collect", "--once"], catch_exceptions=False)
    assert collected.exit_code == 1
    assert "database west: not collected" in collected.output
    assert "stored " in collected.output.split("== database west")[0]  # east was collected

    fleet_clock.advance(FLEET_SECONDS)  # the fleet page's next bucket: it reads every database again
    rows = {r["name"]: r for r in viewer.get("/api/v1/databases").get_json()["databases"]}
    assert rows["west"]["reachable"] is False and rows["west"]["verdict"] == "down"
    assert rows["east"]["reachable"] is True and rows["east"]["depth"] == 1
    page = viewer.get("/databases")
    assert page.status_code == 200
    assert b'data-database="west" data-verdict="down"' in page.data
    scrape = viewer.get("/metrics")
    assert scrape.status_code == 200
    metrics = metric_families(scrape.get_data(as_text=True))
    ages = {s.labels["database"]: s.value for s in metrics["skiplock_collection_age_seconds"].samples}
    assert math.isnan(ages["west"]) and ages["east"] >= 0
    assert {s.labels["database"] for s in metrics["skiplock_queue_depth"].samples} == {"east"}


def fleet_rows(client) -> tuple[dict[str, dict], float]:
    answer = client.get("/api/v1/databases")
    assert answer.status_code == 200, answer.data
    body = answer.get_json()
    return {r["name"]: r for r in body["databases"]}, body["age_s"]


def test_a_crowd_within_one_bucket_reads_every_database_once(two_databases, west, client_as, fleet_clock):
    from console.web import fleet

    # Four at once (web.database.pool_size's default: each request holds a connection for its
    # sign-in): one reads, the others wait for that read, then ask for the page too.
    viewers = [client_as("viewer") for _ in range(4)]
    before = fleet.reads
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda c: (c.get("/api/v1/databases"), c.get("/databases")), viewers))
    for api, page in answers:
        assert api.status_code == 200 and page.status_code == 200
    assert fleet.reads - before == 1
    read_at = {json.dumps({r["name"]: r["read_at"] for r in api.get_json()["databases"]}) for api, _ in answers}
    assert len(read_at) == 1  # every answer shows the same read
    fleet_clock.advance(FLEET_SECONDS - 0.5)  # still the same bucket: still that read, saying its age
    rows, age = fleet_rows(viewers[0])
    assert fleet.reads - before == 1 and age == FLEET_SECONDS - 0.5
    assert json.dumps({n: r["read_at"] for n, r in rows.items()}) in read_at
    page = viewers[1].get("/databases").get_data(as_text=True)
    assert f'data-read-age="{FLEET_SECONDS - 0.5:.1f}">Read {round(FLEET_SECONDS - 0.5)} s ago' in page
    # an API client sending the ETag of its last answer is answered 304 until the next read
    tag = viewers[2].get("/api/v1/databases").headers["ETag"]
    assert viewers[2].get("/api/v1/databases", headers={"If-None-Match": tag}).status_code == 304
    fleet_clock.advance(0.5)  # the next bucket: one read more
    rows, age = fleet_rows(viewers[0])
    assert fleet.reads - before == 2 and age == 0.0
    assert viewers[2].get("/api/v1/databases", headers={"If-None-Match": tag}).status_code == 200


def read_until_reachable(client, fleet_clock, timeout: float = 30.0) -> dict[str, dict]:
    """The fleet's first read, once both databases answered it. A fresh pool's first connection
    can take longer than db_wait (1 s) at load 8-10 (W2: west "down" before it was stopped);
    each retry is the next bucket's read."""
    deadline = time.monotonic() + timeout
    while True:
        rows, _ = fleet_rows(client)
        if all(row["reachable"] for row in rows.values()) or time.monotonic() > deadline:
            return rows
        fleet_clock.advance(FLEET_SECONDS)


def test_a_database_stopped_while_cached_shows_down_after_its_bucket(
        two_databases, west_cluster, west, client_as, fleet_clock):
    viewer = client_as("viewer")
    rows = read_until_reachable(viewer, fleet_clock)
    assert rows["west"]["reachable"] is True
    west_cluster.halt()
    fleet_clock.advance(3.0)  # within the bucket the read stays, and says how old it is
    rows, age = fleet_rows(viewer)
    assert rows["west"]["reachable"] is True and age == 3.0
    fleet_clock.advance(FLEET_SECONDS)  # the next bucket: west is read again, and is down
    t0 = time.perf_counter()
    rows, age = fleet_rows(viewer)
    assert time.perf_counter() - t0 < 5.0  # one db_wait (1 s), not one per row
    assert rows["west"]["reachable"] is False and rows["west"]["verdict"] == "down"
    assert rows["east"]["reachable"] is True and age == 0.0
    page = viewer.get("/databases").get_data(as_text=True)
    assert 'data-database="west" data-verdict="down"' in page and "Read 0 s ago" in page


def test_while_the_fleet_is_read_again_the_previous_read_is_shown_only_if_young_enough(
        two_databases, west, client_as, fleet_clock, monkeypatch):
    """Requests arriving while one reads the databases are shown the previous read when it
    began less than 2 x fleet_seconds ago; else they wait for the new one: never older."""
    from console.web import fleet

    reading, gate = threading.Event(), threading.Event()
    gate.set()
    row = fleet.database_row

    def held(name):
        reading.set()
        assert gate.wait(20), "the test never opened the gate"
        return row(name)

    monkeypatch.setattr(fleet, "database_row", held)
    try:
        check_the_previous_read_while_reading(client_as, fleet_clock, reading, gate)
    finally:
        gate.set()  # a failed check leaves no thread held


def check_the_previous_read_while_reading(client_as, fleet_clock, reading, gate):
    owner, other = client_as("viewer"), client_as("viewer")
    first, _ = fleet_rows(owner)

    def while_reading(advance: float):
        """The owner starts the next bucket's read (held); `other` asks meanwhile."""
        fleet_clock.advance(advance)
        reading.clear()
        gate.clear()
        pool = ThreadPoolExecutor(max_workers=2)
        owned = pool.submit(fleet_rows, owner)
        assert reading.wait(10)
        asked = pool.submit(fleet_rows, other)
        return pool, owned, asked

    # 15 s after the first read (its bucket is over, 15 < 2 x 10): the previous read at once
    pool, owned, asked = while_reading(15.0)
    rows, age = asked.result(timeout=5)
    assert not owned.done() and age == 15.0
    assert rows["west"]["read_at"] == first["west"]["read_at"]
    gate.set()
    rows, age = owned.result(timeout=10)
    assert age == 0.0 and rows["west"]["read_at"] > first["west"]["read_at"]
    pool.shutdown()
    # 25 s after that read (> 2 x 10): the other request waits for the new read
    pool, owned, asked = while_reading(25.0)
    time.sleep(0.5)
    assert not asked.done(), "shown a read older than 2 x fleet_seconds"
    gate.set()
    for done in (owned, asked):
        rows, age = done.result(timeout=10)
        assert age <= 2 * FLEET_SECONDS and age == 0.0
    pool.shutdown()


def test_pages_under_db_name_are_that_databases_and_act_on_it(two_databases, west, conn, client_as):
    q.enqueue(conn, "noop", queue="mail")
    with connect(west) as wconn:
        q.enqueue(wconn, "noop", queue="bulk")
    viewer, operator = client_as("viewer"), client_as("operator")  # users live in east, the home database
    assert {r["queue"] for r in viewer.get("/api/v1/queues").get_json()["queues"]} == {"mail"}
    assert {r["queue"] for r in viewer.get("/db/west/api/v1/queues").get_json()["queues"]} == {"bulk"}
    assert {r["queue"] for r in viewer.get("/db/east/api/v1/queues").get_json()["queues"]} == {"mail"}
    # the export too (it borrows a connection per batch: from the page's database's pool)
    assert {r["queue"] for r in viewer.get("/db/west/api/v1/jobs/export.json").get_json()} == {"bulk"}
    assert {r["queue"] for r in viewer.get("/api/v1/jobs/export.json").get_json()} == {"mail"}
    unknown = viewer.get("/db/north/queues")
    assert unknown.status_code == 404 and b"configured: east, west" in unknown.data
    page = viewer.get("/db/west/queues").get_data(as_text=True)
    assert 'href="/db/west/jobs"' in page  # links stay inside the database
    assert 'href="/db/east/queues" data-switch-database="east"' in page
    assert 'data-switch-database="west" aria-current="true"' in page
    paused = operator.post("/db/west/api/v1/queues/bulk/pause", data={"reason": "west drill"},
                           headers={"X-CSRF-Token": CSRF})
    assert paused.status_code == 200, paused.data
    with connect(west) as wconn:
        assert wconn.execute("SELECT paused FROM skiplock.queues WHERE name = 'bulk'").fetchone()[0] is True
        assert wconn.execute("SELECT actor FROM skiplock.audit_log WHERE target = 'queue:bulk'").fetchone()[0] == "operator"
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE target = 'queue:bulk'").fetchone()[0] == 0
    # A CLI action with --database is audited in the database it touched, and both show it.
    cli = CliRunner().invoke(main, ["--config", two_databases, "resume", "--database", "west", "bulk",
                                    "--actor", "ops", "--reason", "drill over"], catch_exceptions=False)
    assert cli.exit_code == 0, cli.output
    entries = viewer.get("/db/west/api/v1/audit").get_json()["entries"]
    mine = {e["action"]: e["database"] for e in entries if e["target"] == "queue:bulk"}
    assert mine == {"pause": "west", "resume": "west"}, entries
    assert all(e["database"] == "east" for e in viewer.get("/api/v1/audit").get_json()["entries"])
    assert 'data-database="west">west</td>' in viewer.get("/db/west/audit").get_data(as_text=True)


def test_one_database_alone_is_labelled_default_in_metrics(web_settings, dsn, conn):
    from console.web import create_app
    from tests.collector_helpers import cycle

    q.enqueue(conn, "noop")
    cycle(dsn)
    web_settings.pop("TESTING")
    app = create_app(web_settings)
    try:
        body = app.test_client().get("/metrics").get_data(as_text=True)
    finally:
        app.extensions["skiplock"].close()
    found = metric_families(body)
    assert {s.labels["database"] for f in found.values() for s in f.samples} == {"default"}



def test_the_fleet_of_one_database_answers_for_a_signed_in_viewer(client_as):
    [row] = client_as("viewer").get("/api/v1/databases").get_json()["databases"]
    assert row["name"] == "default" and row["reachable"] is True


def test_a_database_not_migrated_or_with_a_changed_migration_does_not_lead(make_database, dsn, tmp_path):
    bare, changed = make_database(template=None), make_database()
    with connect(changed) as conn:
        conn.execute("UPDATE skiplock.schema_migrations SET checksum = 'edited' WHERE version = 1")
    config = load_config(write_config(tmp_path, {"east": dsn, "bare": bare, "changed": changed}), env={})
    fleet = Fleet(load_databases(config, env={}), config)
    try:
        assert fleet.elect() == {"east": True, "bare": False, "changed": False}
        assert fleet.members["bare"].run_job("reap") is False
        with connect(bare) as conn:
            migrate(conn)
        assert fleet.elect() == {"east": True, "bare": True, "changed": False}
    finally:
        fleet.close()


# --- alerts carry their database ------------------------------------------------------------

ALERTS = """
[alerts]
allow_private_destinations = true  # the receiver is on loopback
console_url = "https://console.example"
retry_base = 0.1
[[webhooks]]
name = "hook"
url = "{url}"
[[webhooks]]
name = "slack"
kind = "slack"
url = "{url}"
[[webhooks]]
name = "pd"
kind = "pagerduty"
url = "{url}"
secret = "routing"
[[alerts.rules]]
name = "deep"
metric = "queue_depth"
labels = {{ queue = "bulk", state = "eligible" }}
op = ">"
threshold = 0
for = "0s"
"""


@pytest.fixture
def alerting_databases(tmp_path, dsn, west):
    """(config path, receiver): east and west, three destinations (json, Slack, PagerDuty) at a
    real local receiver, one rule over west's queue bulk."""
    from tests.alert_receiver import Receiver

    with Receiver() as receiver:
        extra = '[web]\nsecret_key = "k"\nproduction = false\n' + ALERTS.format(url=receiver.url)
        yield write_config(tmp_path, {"east": dsn, "west": west}, extra=extra), receiver


def test_alerts_carry_their_database_in_pages_api_and_every_webhook(alerting_databases, west, client_as):
    path, receiver = alerting_databases
    with connect(west) as wconn:
        q.enqueue(wconn, "noop", queue="bulk")
    config = load_config(path, env={})
    fleet = Fleet(load_databases(config, env={}), config)
    try:
        assert fleet.elect() == {"east": True, "west": True}
        assert fleet.members["west"].run_job("collect") and fleet.members["west"].run_job("alerts_deliver")
    finally:
        fleet.close()
    [doc] = [d for d in receiver.json_bodies() if d.get("alert", {}).get("rule") == "deep"]
    assert doc["alert"]["labels"] == {"queue": "bulk", "state": "eligible", "system": "skiplock", "database": "west"}
    assert doc["console_url"] == f"https://console.example/db/west/alerts/{doc['alert']['id']}"
    assert doc["idempotency_key"].startswith("skiplock:db:west:alert:")
    assert doc["alert"]["look_here"] and all(k["path"].startswith("/db/west/") and
                                             k["url"].startswith("https://console.example/db/west/")
                                             for k in doc["alert"]["look_here"])
    slack = next(json.loads(r["body"])["text"] for r in receiver.delivered()
                 if r["body"].startswith(b'{"text"') and b"deep" in r["body"])
    assert "database=west" in slack and "console.example/db/west/" in slack
    pagerduty = next(json.loads(r["body"]) for r in receiver.delivered() if b"routing_key" in r["body"] and b"deep" in r["body"])
    assert "database=west" in pagerduty["payload"]["group"]
    assert pagerduty["dedup_key"].startswith("skiplock:db:west:deep:")
    assert pagerduty["payload"]["custom_details"]["labels"]["database"] == "west"

    # The console shows the same labels, and its look-here links stay inside /db/west/.
    viewer = client_as("viewer")
    page = viewer.get(f"/db/west/alerts/{doc['alert']['id']}").get_data(as_text=True)
    assert re.search(r"<p><code>queue=bulk</code>[^\n]*<code>database=west</code>", page)  # the alert's labels
    hrefs = re.findall(r'href="([^"]+)"[^>]*data-look-here', page)
    assert hrefs and all(h.startswith("/db/west/") for h in hrefs)
    [listed] = [a for a in viewer.get("/db/west/api/v1/alerts").get_json()["alerts"] if a["rule"] == "deep"]
    assert listed["labels"]["database"] == "west"
    one = viewer.get(f"/db/west/api/v1/alerts/{doc['alert']['id']}").get_json()
    assert one["alert"]["labels"]["database"] == "west"
    assert all(a["labels"]["database"] == "east" for a in viewer.get("/api/v1/alerts").get_json()["alerts"])
    events = viewer.get("/db/west/api/v1/alerts/events").get_json()["events"]
    assert events and all(e["labels"]["database"] == "west" for e in events)
    assert "<code>database=west</code>" in viewer.get("/db/west/alerts").get_data(as_text=True).split('id="events"')[1]


@pytest.mark.browser
def test_the_switcher_in_chromium_shows_the_second_databases_jobs_and_acts_there(two_databases, west, conn, page_as,
                                                                                 live_server):
    from playwright.sync_api import expect

    q.enqueue(conn, "east_only_kind", queue="eastq")
    with connect(west) as wconn:
        q.enqueue(wconn, "west_only_kind", queue="westq")
    page = page_as("operator")
    page.set_default_timeout(15_000)
    page.goto(f"{live_server}/jobs")
    expect(page.locator("main")).to_contain_text("east_only_kind")
    page.locator('[data-switch-database="west"]').click()
    page.wait_for_url(f"{live_server}/db/west/jobs**")
    expect(page.locator("main")).to_contain_text("west_only_kind")
    expect(page.locator("main")).not_to_contain_text("east_only_kind")

    page.goto(f"{live_server}/db/west/queues")
    row = page.locator("#queues-table tr", has_text="westq")
    row.locator('input[name="reason"]').fill("browser drill")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator("#queues-table tr", has_text="westq")).to_contain_text("paused")
    with connect(west) as wconn:
        assert wconn.execute("SELECT paused FROM skiplock.queues WHERE name = 'westq'").fetchone() == (True,)
        assert wconn.execute("SELECT reason FROM skiplock.audit_log WHERE target = 'queue:westq'").fetchone() == \
            ("browser drill",)
    assert conn.execute("SELECT count(*) FROM skiplock.queues WHERE name = 'westq' AND paused").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE target = 'queue:westq'").fetchone()[0] == 0


def _cluster_processes(cluster: PrivateCluster) -> list[int]:
    """The postmaster of a cluster and every process it started."""
    postmaster = int((cluster.data_dir / "postmaster.pid").read_text().splitlines()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return [postmaster, *map(int, children)]


def _runs(dsn: str) -> list:
    with connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT started_at FROM skiplock.collection_runs ORDER BY started_at")]


def test_a_database_that_hangs_never_delays_the_others_collection(tmp_path, dsn, west, west_cluster):
    """Issue 31 item 5: west's server stops answering (every process of it frozen with SIGSTOP,
    as a machine that hangs: nothing refuses a connection, no statement_timeout can fire), its
    collection hangs in its cycle; east's cycles keep their interval all the while, and west's
    resume when it answers again."""
    config_path = write_config(tmp_path, {"east": dsn, "west": west},
                               extra="[scheduler]\nelection_interval = 0.5\ncollect_interval = 1.0\n")
    config = load_config(config_path, env={})
    fleet = Fleet(load_databases(config, env={}), config)
    runner = threading.Thread(target=fleet.run, name="fleet", daemon=True)
    runner.start()
    frozen: list[int] = []
    try:
        eventually(lambda: len(_runs(dsn)) >= 2 and len(_runs(west)) >= 2, timeout=30)
        # The postmaster first, so that it forks nothing more; a backend or autovacuum worker
        # that ended since the list was read needs no freezing (a full run met one).
        for pid in _cluster_processes(west_cluster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        east_before = len(_runs(dsn))
        time.sleep(6)
        east = _runs(dsn)
        assert len(east) - east_before >= 4, f"east collected {len(east) - east_before} times in 6 s while west hung"
        gaps = [(b - a).total_seconds() for a, b in zip(east[east_before - 1:], east[east_before:], strict=False)]
        assert max(gaps) < 2.5, f"east's cycles waited on west: gaps {gaps}"
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    try:
        west_before = len(_runs(west))
        eventually(lambda: len(_runs(west)) > west_before, timeout=30)  # west collects again by itself
    finally:
        fleet.stop()
        runner.join(timeout=60)
        assert not runner.is_alive(), "the fleet did not stop"
