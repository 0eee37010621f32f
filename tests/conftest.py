"""The test harness: one private PostgreSQL cluster per test session, a fresh database per test.

Unless DATABASE_URL names a server to use, the session starts a throwaway cluster with
`console.pgcluster.PrivateCluster` (pg_stat_statements preloaded, durability off because the
data is thrown away) and always stops it, even when the run is killed or times out
(`exit_guard=True`: atexit, signal handlers and a watchdog process; docs/reliability.md). Each
test gets its own database, created from a template that was migrated once, so tests never see
each other's rows.

Under CI (CI=true, which .ci/run sets) a skipped test is a failure and a missing Chromium stops
the run: a guard that quietly checks less is a witness, not a guard.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import psycopg
import pytest

from console.db import connect, migrate
from console.pgcluster import RELAXED_DURABILITY, PostgresNotFound, PrivateCluster, find_bindir
from tests.spare_databases import COPY_STRATEGY, SpareDatabases
from tests.timeouts import pytest_sessionstart, pytest_terminal_summary, pytest_timeout_set_timer  # noqa: F401 (hooks)

TEMPLATE = "skiplock_template"
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
_counter = itertools.count()


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_addoption(parser):
    parser.addoption(
        "--postgresql", metavar="MAJOR", type=int, default=None,
        help="run the session's private cluster on this PostgreSQL major (16, 17, 18: the binaries "
             "scripts/bootstrap.sh --test unpacks; default: the machine's own, 15). `make test` runs "
             "the matrix files (Makefile PG_MATRIX_QUEUE and PG_MATRIX_READS) once per major with it.",
    )


def pytest_report_header(config):
    major = config.getoption("--postgresql")
    return f"PostgreSQL: {major} (--postgresql)" if major is not None else None


def _file_weight(items) -> dict[str, int]:
    """0 for a file with a slow-marked test, 1 for one with a browser test, 2 for the rest."""
    weight: dict[str, int] = {}
    for item in items:
        mine = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("browser") else 2
        weight[item.fspath.strpath] = min(weight.get(item.fspath.strpath, 2), mine)
    return weight


def pytest_collection_modifyitems(config, items):
    """Files with slow tests first, then browser tests, then the rest, each file kept whole and
    in its own order. `make test` runs two pytest workers that take whole files in this order
    (`-n 2 --dist loadfile --no-loadscope-reorder`; by default xdist would hand out the
    files with the most tests first, which left the one-test soak for last): handing out the long files first keeps one worker from starting
    the soak or the demo's end to end when the other has nothing left to do.

    In CI, browser tests must run: no Chromium is an error, never a quiet skip."""
    weight = _file_weight(items)
    items.sort(key=lambda item: weight[item.fspath.strpath])  # stable: files and tests keep their order
    if in_ci() and not CHROMIUM.exists() and any(
        item.get_closest_marker("browser") or "page" in getattr(item, "fixturenames", ()) for item in items
    ):
        raise pytest.UsageError(f"CI=true but {CHROMIUM} is missing: the browser tests cannot run (scripts/bootstrap.sh --test installs it)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip is a failure: an environment that makes tests skip must be fixed, not hidden."""
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which is not allowed: {reason}"


@pytest.fixture(scope="session", autouse=True)
def cheap_password_hashing():
    """Passwords hashed and checked in this process use argon2id's cheapest parameters.

    The product's argon2 parameters (console.users.HASH_*) cost tens of milliseconds a hash or
    check on a quiet machine and more on a loaded one, on purpose; the sign-in, throttling and
    session tests check hundreds of passwords and are about who gets in, not about the cost. Processes the tests start (the CLI,
    `skiplock serve`, the demo) keep the product's parameters, and
    tests/test_security_login.py::test_the_product_hashes_with_the_documented_argon2id_parameters
    pins them."""
    from argon2 import PasswordHasher
    from argon2.profiles import CHEAPEST

    import console.users

    product = console.users._hasher
    console.users._hasher = PasswordHasher.from_parameters(CHEAPEST)
    console.users._dummy_hash.cache_clear()
    yield
    console.users._hasher = product
    console.users._dummy_hash.cache_clear()


@pytest.fixture(scope="session")
def pg_cluster(request):
    """The PrivateCluster (None when DATABASE_URL points at an existing server), on the major
    `--postgresql` names or the machine's default one."""
    major = request.config.getoption("--postgresql")
    if os.environ.get("DATABASE_URL"):
        if major is not None:
            raise pytest.UsageError("--postgresql starts a private cluster of that major: unset DATABASE_URL")
        yield None
        return
    try:
        bindir = find_bindir(major) if major is not None else None
    except PostgresNotFound as exc:
        raise pytest.UsageError(str(exc)) from None
    # max_prepared_transactions: tests of the horizon holders prepare real two-phase transactions.
    cluster = PrivateCluster(settings={**RELAXED_DURABILITY, "autovacuum_naptime": "1s", "max_prepared_transactions": "10"},
                             exit_guard=True, bindir=bindir)
    try:
        cluster.start()
        if major is not None:  # the binaries found are the major asked for, not a neighbour's
            with connect(cluster.dsn) as conn:
                running = conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()[0]
            assert running == major, f"--postgresql {major} started PostgreSQL {running} ({bindir})"
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def admin_dsn(pg_cluster) -> str:
    return os.environ["DATABASE_URL"] if pg_cluster is None else pg_cluster.dsn


def dsn_for(admin_dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)


@pytest.fixture(scope="session")
def template_db(admin_dsn) -> str:
    with connect(admin_dsn) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    with connect(dsn_for(admin_dsn, TEMPLATE)) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        migrate(conn)
    return TEMPLATE


def _database_name() -> str:
    return f"t_{os.getpid()}_{next(_counter)}"


@pytest.fixture(scope="session")
def spare_databases(admin_dsn, template_db):
    """Copies of the template made ahead, while tests run (tests/spare_databases.py)."""
    spares = SpareDatabases(admin_dsn, template_db, _database_name)
    yield spares
    spares.stop()


@pytest.fixture
def make_database(admin_dsn, template_db, spare_databases):
    """Factory: a new migrated database (or, with template=None, an empty one); dropped after the test."""
    created: list[str] = []

    def make(template: str | None = template_db) -> str:
        if template == template_db:
            name = spare_databases.take()
        else:
            name = _database_name()
            with connect(admin_dsn) as conn:
                if template:
                    conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY {COPY_STRATEGY}')
                else:
                    conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return dsn_for(admin_dsn, name)

    yield make
    with connect(admin_dsn) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(make_database) -> str:
    """A fresh, migrated database for this test."""
    return make_database()


@pytest.fixture
def conn(dsn):
    """An autocommit connection to the test's database."""
    with connect(dsn, application_name="skiplock-test") as connection:
        yield connection


@pytest.fixture
def tx_conn(dsn):
    """A connection with autocommit off, as application code usually has."""
    with connect(dsn, application_name="skiplock-test", autocommit=False) as connection:
        yield connection


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def subprocess_env(dsn) -> dict[str, str]:
    """Environment for child processes (workers, CLI): the test's database and the tests folder
    on the path, so `--tasks tests.sample_tasks` imports."""
    env = dict(os.environ)
    env["DATABASE_URL"] = dsn
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def workers(subprocess_env):
    """Real worker processes (tests/workers.py) for the test's database, all stopped at its end."""
    from tests.workers import WorkerProcs

    procs = WorkerProcs(subprocess_env)
    yield procs
    procs.stop_all()


# The web console's fixtures (app, personas, signed-in clients, live server, Chromium args).
from tests.web_fixtures import *  # noqa: E402,F401,F403
