"""Page reads on a database's replica (`replica_dsn`), against a real streaming standby.

A private primary and one hot standby made by `pg_basebackup -R` (console.pgcluster
`start_standby`), this module's own (like tests/test_replica.py: a standby would slow every other
test), stopped in a `finally`. Each test gets a fresh database on the primary, which the standby
replays; the console is configured with `[[databases]] name = "east"`, dsn the primary's
database and replica_dsn the same database on the standby.

The replica is told apart from the primary by what it holds: replay is paused on the standby
(`pg_wal_replay_pause()`) while the primary changes, so a page that shows the old state read the
replica, and one that shows the new state read the primary.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator

import pytest

from console import queue as q
from console.config import load_config
from console.db import connect, migrate
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster
from tests.collector_helpers import eventually
from tests.web_fixtures import CSRF

TEMPLATE = "reads_template"
_names = itertools.count()


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)  # [[databases]] names the database


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    # wal_keep_size: no slot, and the checkpoint of each test's CREATE DATABASE must not recycle
    # WAL the standby has yet to receive while its replay is paused
    primary = PrivateCluster(settings={**RELAXED_DURABILITY, "wal_keep_size": "256MB"}, exit_guard=True)
    standby = None
    try:
        primary.start()
        with connect(primary.dsn) as admin:
            admin.execute(f'CREATE DATABASE "{TEMPLATE}"')
        with connect(primary.dsn_for(TEMPLATE)) as template:
            migrate(template)
        standby = primary.start_standby("reads-standby")
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")


@pytest.fixture
def standby(clusters) -> PrivateCluster:
    standby = clusters[1]
    if not standby.running:  # a test halted it
        standby.start()
    return standby


@pytest.fixture
def dbname(clusters, standby) -> Iterator[str]:
    primary = clusters[0]
    name = f"reads_{next(_names)}"
    with connect(primary.dsn) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}" STRATEGY FILE_COPY')

    def on_standby():
        with connect(standby.dsn) as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    eventually(on_standby, timeout=20, interval=0.2)
    yield name
    if standby.running:
        with connect(standby.dsn) as conn:  # a test may leave replay paused
            conn.execute("SELECT pg_wal_replay_resume()")
    with connect(primary.dsn) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(clusters, dbname) -> str:
    """The test's database on the primary (replaces conftest's `dsn`, so `conn` is the primary)."""
    return clusters[0].dsn_for(dbname)


@pytest.fixture
def replica_dsn(standby, dbname) -> str:
    return standby.dsn_for(dbname)


@pytest.fixture
def no_replica() -> bool:
    """Asked for by a test: the console's database has no replica_dsn."""
    return True


@pytest.fixture
def replica_is_the_primary() -> bool:
    """Asked for by a test: replica_dsn names the primary itself (a configuration mistake)."""
    return True


@pytest.fixture
def web_app(request, tmp_path, dsn, replica_dsn):
    from console.web import create_app

    replica = "" if "no_replica" in request.fixturenames else \
        f'replica_dsn = "{dsn if "replica_is_the_primary" in request.fixturenames else replica_dsn}"\n'
    path = tmp_path / "skiplock.toml"
    # fleet_seconds = 0: the fleet page reads the replica's lag on every request (its caching has
    # tests of its own in tests/test_databases.py)
    path.write_text('[web]\nsecret_key = "k"\nproduction = false\ndb_wait = 2.0\nfleet_seconds = 0\n\n'
                    f'[[databases]]\nname = "east"\ndsn = "{dsn}"\n{replica}', encoding="utf-8")
    app = create_app(load_config(str(path), env={}))
    yield app
    app.extensions["skiplock"].close()


def replayed(standby_dsn: str, primary_conn) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    lsn = primary_conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # commits are async here
    with connect(standby_dsn) as conn:
        eventually(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0],
                   timeout=20, interval=0.1)


def queues_of(client) -> tuple[str, dict[str, bool]]:
    response = client.get("/api/v1/queues")
    assert response.status_code == 200, response.data
    return response.headers["X-Skiplock-Read-From"], {r["queue"]: r["paused"] for r in response.get_json()["queues"]}


def pause_replay(replica_dsn: str):
    control = connect(replica_dsn)
    control.execute("SELECT pg_wal_replay_pause()")
    eventually(lambda: control.execute("SELECT pg_get_wal_replay_pause_state() = 'paused'").fetchone()[0], timeout=10)
    return control


# --- which route reads where ---------------------------------------------------------------

def test_every_get_route_says_whether_it_may_read_the_replica(web_app):
    from console.web.database import PRIMARY_READS, REPLICA_READS

    gets = {rule.endpoint for rule in web_app.url_map.iter_rules() if "GET" in rule.methods}
    assert not REPLICA_READS & set(PRIMARY_READS)
    unclassified = gets - REPLICA_READS - set(PRIMARY_READS)
    assert not unclassified, f"GET routes that must choose REPLICA_READS or PRIMARY_READS: {sorted(unclassified)}"
    assert not (REPLICA_READS | set(PRIMARY_READS)) - gets, "names in the tables that are no GET route"
    for endpoint in ("health.index", "advisor.index", "workers.index", "maintenance.index", "admin.users",
                     "deadletters.operation", "metrics.metrics"):
        assert endpoint in PRIMARY_READS


def test_the_replica_pool_is_read_only_and_time_limited(web_app, replica_dsn):
    registry = web_app.extensions["skiplock"].databases
    with registry.replica_pool("east").connection() as conn:
        assert conn.info.port == int(re.search(r":(\d+)/", replica_dsn).group(1))  # the standby
        assert conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        assert conn.execute("SHOW statement_timeout").fetchone()[0] != "0"
        assert conn.info.get_parameters()["tcp_user_timeout"] == "2000"  # libpq's own, on the client socket
        assert conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                            ).fetchone()[0] == "skiplock-web-replica"


def test_a_replica_dsn_that_is_no_standby_is_read_only_and_pages_read_the_primary(
        replica_is_the_primary, web_app, conn, client_as):
    """The replica pool's sessions are READ ONLY by their options, not only because a standby
    refuses writes; and a replica_dsn that is no standby is not read by pages."""
    import psycopg

    with web_app.extensions["skiplock"].databases.replica_pool("east").connection() as rconn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            rconn.execute("INSERT INTO skiplock.queues (name) VALUES ('never')")
    page = client_as("viewer").get("/queues")
    assert page.status_code == 200 and page.headers["X-Skiplock-Read-From"] == "primary"
    assert "Read from the primary: the replica_dsn of east is not a standby" in page.get_data(as_text=True)


# --- reads on the replica, actions on the primary ------------------------------------------

def test_pages_read_the_lagging_replica_while_an_action_acts_on_the_primary_and_its_author_sees_it(
        conn, replica_dsn, client_as):
    q.enqueue(conn, "noop", queue="mail")
    viewer, operator = client_as("viewer"), client_as("operator")
    replayed(replica_dsn, conn)
    assert queues_of(viewer) == ("replica", {"mail": False})
    # the replica's own pg_stat_activity has the page's session: the replica pool's name
    with connect(replica_dsn) as rconn:
        assert rconn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-web-replica'"
                             ).fetchone()[0] >= 1

    control = pause_replay(replica_dsn)
    try:
        q.enqueue(conn, "noop", queue="bulk")  # on the primary only, while replay is paused
        source, seen = queues_of(viewer)
        assert (source, seen) == ("replica", {"mail": False})  # the replica's state: no bulk yet
        html = viewer.get("/queues").get_data(as_text=True)
        assert 'data-read-from="replica"' in html and "Read from the replica of east, lag " in html
        assert "bulk" not in re.sub(r"<(script|nav)[^>]*>.*?</\1>", "", html.split("<main>")[1], flags=re.S)

        # the action acts on the primary at once, although the queue is not on the replica yet
        paused = operator.post("/api/v1/queues/bulk/pause", data={"reason": "drill"},
                               headers={"X-CSRF-Token": CSRF})
        assert paused.status_code == 200, paused.data
        assert paused.headers.get("X-Skiplock-Read-From", "primary") == "primary"
        assert conn.execute("SELECT paused FROM skiplock.queues WHERE name = 'bulk'").fetchone()[0] is True
        assert conn.execute("SELECT actor FROM skiplock.audit_log WHERE target = 'queue:bulk'").fetchone()[0] == \
            "operator"
        # its author reads the primary until the replica has replayed the change, and is told so
        assert queues_of(operator) == ("primary", {"mail": False, "bulk": True})
        assert "has not yet replayed your last change" in operator.get("/queues").get_data(as_text=True)
        # someone else still reads the replica
        assert queues_of(viewer) == ("replica", {"mail": False})
    finally:
        control.execute("SELECT pg_wal_replay_resume()")
        control.close()

    replayed(replica_dsn, conn)
    assert queues_of(operator) == ("replica", {"mail": False, "bulk": True})
    assert queues_of(viewer) == ("replica", {"mail": False, "bulk": True})


def test_the_primary_only_pages_read_the_primary_with_a_replica_configured(conn, replica_dsn, client_as):
    viewer = client_as("viewer")
    replayed(replica_dsn, conn)
    for url in ("/health", "/api/v1/workers", "/maintenance", "/api/v1/advisor"):
        response = viewer.get(url)
        assert response.status_code == 200, (url, response.data[:300])
        assert response.headers["X-Skiplock-Read-From"] == "primary", url
    assert 'data-read-from' not in viewer.get("/health").get_data(as_text=True)


def test_every_replica_route_answers_from_a_real_standby_without_a_write_or_a_failed_panel(
        conn, replica_dsn, client_as, web_app, caplog):
    """A GET in REPLICA_READS that wrote (or read something a standby refuses) would fail on the
    READ ONLY replica: as a 500, or as a panel that says "not available" (logged)."""
    from console.web.database import REPLICA_READS

    job = q.enqueue(conn, "noop", queue="mail")
    alert_id = conn.execute("INSERT INTO skiplock.alerts (rule, state, value, fired_at) "
                            "VALUES ('deep', 'firing', 1, now()) RETURNING id").fetchone()[0]
    replayed(replica_dsn, conn)
    values = {"job_id": job, "name": "mail", "alert_id": alert_id, "fmt": "csv"}
    viewer = client_as("viewer")
    caplog.set_level("WARNING", logger="console.web")
    checked = []
    for rule in web_app.url_map.iter_rules():
        if rule.endpoint not in REPLICA_READS:
            continue
        url = rule.rule
        for arg in rule.arguments:
            url = re.sub(rf"<(?:\w+:)?{arg}>", str(values[arg]), url)
        response = viewer.get(url, query_string={"q": "nothing like it"} if "search" in rule.endpoint else None)
        assert response.status_code == 200, (url, response.status_code, response.data[:300])
        assert response.headers.get("X-Skiplock-Read-From") == "replica", url
        response.close()  # an export streams: end its request context here, not at garbage collection
        checked.append(url)
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert not failed, failed
    assert len(checked) == len(REPLICA_READS)


# --- the replica's lag ---------------------------------------------------------------------

def test_the_replicas_lag_is_shown_in_the_layout_the_fleet_and_the_api(conn, replica_dsn, client_as):
    viewer = client_as("viewer")
    q.enqueue(conn, "noop", queue="mail")
    replayed(replica_dsn, conn)
    [row] = viewer.get("/api/v1/databases").get_json()["databases"]
    assert row["replica"] == {"configured": True, "reachable": True, "lag_seconds": 0.0}

    control = pause_replay(replica_dsn)
    try:
        time.sleep(1.6)  # the last replayed commit grows old ...
        q.enqueue(conn, "noop", queue="mail")  # ... and the primary has written more since

        def lagging():
            [row] = viewer.get("/api/v1/databases").get_json()["databases"]
            return row if (row["replica"]["lag_seconds"] or 0) >= 1.5 else None
        row = eventually(lagging, timeout=10, interval=0.2)
        assert row["reachable"] is True and row["replica"]["reachable"] is True
        html = viewer.get("/databases").get_data(as_text=True)
        assert re.search(r'<td data-replica="up">lag \d+\.\d s</td>', html), html
        page = viewer.get("/overview").get_data(as_text=True)
        lag = float(re.search(r'data-read-from="replica" data-lag-seconds="([0-9.]+)"', page).group(1))
        assert lag >= 1.5
    finally:
        control.execute("SELECT pg_wal_replay_resume()")
        control.close()
    replayed(replica_dsn, conn)
    [row] = viewer.get("/api/v1/databases").get_json()["databases"]
    assert row["replica"]["lag_seconds"] == 0.0


def test_a_database_without_a_replica_says_so_in_the_fleet_and_reads_the_primary(no_replica, client_as):
    viewer = client_as("viewer")
    [row] = viewer.get("/api/v1/databases").get_json()["databases"]
    assert row["replica"] == {"configured": False, "reachable": None, "lag_seconds": None}
    assert viewer.get("/api/v1/queues").headers["X-Skiplock-Read-From"] == "primary"
    assert "data-read-from" not in viewer.get("/queues").get_data(as_text=True)


# --- a replica that goes away --------------------------------------------------------------

def test_a_replica_that_stops_makes_pages_read_the_primary_with_a_note_never_a_500(
        conn, standby, replica_dsn, client_as):
    viewer = client_as("viewer")
    q.enqueue(conn, "noop", queue="mail")
    replayed(replica_dsn, conn)
    assert queues_of(viewer)[0] == "replica"  # the replica pool holds a connection now

    standby.halt()  # the replica goes down while the console reads it
    q.enqueue(conn, "noop", queue="bulk")
    t0 = time.perf_counter()
    page = viewer.get("/queues")
    first_s = time.perf_counter() - t0
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert page.headers["X-Skiplock-Read-From"] == "primary"
    assert 'data-read-from="primary"' in html and "Read from the primary: the replica of east is unreachable" in html
    assert first_s < 5.0
    # the next pages do not wait for it again (REPLICA_WAIT_S each): read the primary at once,
    # and say why
    for _ in range(3):
        t0 = time.perf_counter()
        source, seen = queues_of(viewer)
        assert time.perf_counter() - t0 < 0.8
        assert (source, seen) == ("primary", {"mail": False, "bulk": False})
    assert "did not answer lately" in viewer.get("/jobs").get_data(as_text=True)
    [row] = viewer.get("/api/v1/databases").get_json()["databases"]
    assert row["reachable"] is True and row["replica"] == {"configured": True, "reachable": False,
                                                           "lag_seconds": None}
    assert 'data-replica="down"><strong>unreachable</strong>' in viewer.get("/databases").get_data(as_text=True)
