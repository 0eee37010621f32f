"""The connection lifecycle: connecting, pools, time limits and migrations.

Everything that talks to PostgreSQL gets its connection here, so a bad DSN or a database
that was never migrated produces one clear message wherever it is met. SQL text comes from
`sql/` through `console.sqlfiles`.

It does not decide what to query; the domain modules (queue, maintenance, collectors, ...) do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from console.jsonbounds import read_json
from console.resources import resource_dir

log = logging.getLogger("skiplock.db")

SCHEMA = "skiplock"
MIGRATION_LOCK_KEY = 0x5C1B_10C4  # advisory lock serialising concurrent `skiplock migrate`


class DatabaseError(RuntimeError):
    """A connection problem stated for a human: what failed and what to do."""


class SchemaMissing(DatabaseError):
    def __init__(self) -> None:
        super().__init__("the skiplock schema is missing from this database: run `skiplock migrate` first")


def resolve_dsn(dsn: str | None = None, config=None) -> str:
    """--dsn wins, then DATABASE_URL, then `[database] dsn` from the config."""
    chosen = dsn or os.environ.get("DATABASE_URL") or (config.database.dsn if config else "")
    if not chosen:
        raise DatabaseError("no database given: pass --dsn or set DATABASE_URL")
    return chosen


def _redact(dsn: str) -> str:
    """A DSN fit for a log line: the password is never printed."""
    dsn = re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn)


def error_text(exc: BaseException) -> str:
    """An error for a log line: its class and its message on one line, a DSN's password masked
    (libpq quotes the connection string in some of its errors), e.g. "OperationalError:
    consuming input failed: terminating connection due to administrator command"."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    name = type(exc).__name__
    return f"{name}: {_redact(text)}"[:500] if text else name


def connect(dsn: str, *, application_name: str = "skiplock", autocommit: bool = True, **kwargs) -> psycopg.Connection:
    try:
        return psycopg.connect(dsn, autocommit=autocommit, application_name=application_name, **kwargs)
    except psycopg.ProgrammingError as exc:
        raise DatabaseError(f"invalid database address {_redact(dsn)!r}: {exc}") from None
    except psycopg.OperationalError as exc:
        reason = "; ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip()) or exc.__class__.__name__
        raise DatabaseError(f"cannot connect to {_redact(dsn)}: {reason}") from None


def make_pool(dsn: str, *, application_name: str, size: int = 4, statement_timeout_ms: int | None = None,
              read_only: bool = False, connect_timeout: int | None = None,
              tcp_user_timeout_ms: int | None = None) -> ConnectionPool:
    """A pool whose connections are autocommit and carry a name the collectors can exclude.

    `read_only` makes every transaction of its sessions READ ONLY (a replica's pool: a write that
    slipped onto it fails at once, on a standby and on a primary alike); `connect_timeout` bounds
    each connection attempt (libpq counts at least 2 s); `tcp_user_timeout_ms` drops a pooled
    connection whose server stopped acknowledging what is sent (a host gone from the network
    would otherwise hold a query for the kernel's minutes of retransmissions).

    Every connection is checked (one empty round trip, `ConnectionPool.check_connection`) as it
    leaves the pool: after a PostgreSQL restart or failover every pooled session is dead, and
    unchecked, each would fail the one request that borrowed it before the pool replaced it.

    Its connections read json/jsonb with console.jsonbounds.read_json: a stored value nested
    deeper than Python's json can take arrives as a short marker string, not as a
    RecursionError in the middle of a page."""
    settings = []
    if statement_timeout_ms:
        settings.append(f"-c statement_timeout={statement_timeout_ms}")
    if read_only:
        settings.append("-c default_transaction_read_only=on")
    kwargs: dict = {"autocommit": True, "application_name": application_name}
    if settings:
        kwargs["options"] = " ".join(settings)
    if connect_timeout:
        kwargs["connect_timeout"] = connect_timeout
    if tcp_user_timeout_ms:
        kwargs["tcp_user_timeout"] = tcp_user_timeout_ms
    return ConnectionPool(dsn, min_size=1, max_size=size, kwargs=kwargs, open=True, timeout=10, name=application_name,
                          check=ConnectionPool.check_connection, configure=_bounded_json)


def _bounded_json(conn: psycopg.Connection) -> None:
    set_json_loads(read_json, conn)


@contextmanager
def time_limited(conn: psycopg.Connection, timeout_ms: int, *, lock_timeout_ms: int | None = None) -> Iterator[psycopg.Cursor]:
    """A cursor inside a short transaction with `SET LOCAL statement_timeout` (and lock_timeout).

    Console panels and collectors read through this, so a slow query is cancelled by the server
    and reported as "not available" rather than holding the page or the database.
    """
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_timeout_ms or timeout_ms)}ms",))
        yield cur


def schema_exists(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL").fetchone()
    return bool(row and row[0])


def require_schema(conn: psycopg.Connection) -> None:
    """The schema is there, no applied migration file has changed since, and every migration of
    this release is applied (every process checks this at start-up: worker, scheduler, CLI
    commands; the web console in create_app).

    A database that also has migrations this release does not know was migrated by a later
    release, in the middle of a rolling upgrade or after a rollback: that is accepted, and said
    once in the log. A release's migrations only add (a column with a default, a table, an
    index), so the processes of the release before keep working on them; the rule and its test
    are in docs/reliability.md, "Upgrades"."""
    if not schema_exists(conn):
        raise SchemaMissing()
    files = migration_files()
    verify_migrations(conn, files)
    state = migration_state(conn, files)
    if state.pending:
        raise MigrationsPending(state.pending)
    if state.newer and state.newer != _newer_said.get(conn.info.dbname):
        _newer_said[conn.info.dbname] = state.newer
        log.info("database %s has migrations newer than this release (%s): a later release migrated it, and "
                 "this one runs on it (docs/reliability.md, Upgrades)", conn.info.dbname, ", ".join(state.newer))


_newer_said: dict[str, list[str]] = {}  # said once per process and database, not at every CLI connection


# --- migrations -------------------------------------------------------------------------
#
# Migrations are the files sql/migrations/NNN_name.sql, applied in version order, each once;
# `skiplock.schema_migrations` records the version, name and SHA-256 of every applied file.
# An applied file must never change (a fresh database and a deployed one would differ), so
# `migrate` and every process's start-up refuse a database whose recorded checksum differs from
# the file's. Versions run 1, 2, 3, ... without holes, except the ones in KNOWN_GAPS.

_MIGRATION_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

# Version numbers deliberately left unused, with the reason. A hole not listed here is refused
# (a migration file lost in a merge or a packaging step looks exactly like a hole).
KNOWN_GAPS: dict[int, str] = {
    7: "Numbers were handed out to parallel pieces of work in advance; the one given 007 shipped "
       "no schema change, so no 007 file was ever committed (`git log --all -- "
       "'sql/migrations/007*'` is empty). 008 and 009 are applied in deployed databases and keep "
       "their numbers.",
}


class MigrationError(DatabaseError):
    """The migration files or the applied migrations are not what they must be."""


class MigrationChanged(MigrationError):
    """An applied migration's file differs from what was applied."""


class MigrationsPending(MigrationError):
    """The database lacks migrations of this release: an earlier release migrated it."""

    def __init__(self, pending: list[str]) -> None:
        self.pending = pending
        super().__init__(
            f"this database lacks {len(pending)} migration(s) of this release ({installed_release()}): "
            f"{', '.join(pending)}; run `skiplock migrate` first (the processes already running on it "
            "keep working meanwhile: docs/reliability.md, Upgrades)"
        )


def package_version() -> str | None:
    """'0.2.0', the installed package's version (what `skiplock --version` says); None for a
    checkout run without installing it. Workers write it to their registry row (migration 024)."""
    try:
        return importlib.metadata.version("skiplock")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_release() -> str:
    """'skiplock 0.2.0', from the installed package's metadata (what `skiplock --version` says)."""
    version = package_version()
    return f"skiplock {version}" if version else "skiplock, version unknown"


@dataclass(frozen=True)
class MigrationState:
    """How a database's applied migrations compare with this release's files, by name
    ('017_worker_signals'): `pending` are this release's and not applied, `newer` are applied
    and not this release's (a later release migrated the database)."""

    applied: list[str]
    pending: list[str]
    newer: list[str]


def migration_state(conn: psycopg.Connection, files: list[tuple[int, str, Path]] | None = None) -> MigrationState:
    files = files if files is not None else migration_files()
    if conn.execute("SELECT to_regclass('skiplock.schema_migrations') IS NULL").fetchone()[0]:
        return MigrationState([], [f"{v:03d}_{name}" for v, name, _ in files], [])
    applied = {v: name for v, name in conn.execute("SELECT version, name FROM skiplock.schema_migrations ORDER BY version")}
    known = {v for v, _, _ in files}
    return MigrationState(
        applied=[f"{v:03d}_{name}" for v, name in sorted(applied.items())],
        pending=[f"{v:03d}_{name}" for v, name, _ in files if v not in applied],
        newer=[f"{v:03d}_{name}" for v, name in sorted(applied.items()) if v not in known],
    )


def migration_checksum(path: Path) -> str:
    return hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest()


def check_numbering(versions: list[int]) -> None:
    """Refuse duplicate versions, unexplained holes, and a file reusing a known gap's number."""
    if len(versions) != len(set(versions)):
        dupes = sorted({v for v in versions if versions.count(v) > 1})
        raise MigrationError(f"two migration files share version {', '.join(f'{v:03d}' for v in dupes)}")
    reused = sorted(set(versions) & set(KNOWN_GAPS))
    if reused:
        raise MigrationError(
            f"migration {reused[0]:03d} is a known gap (KNOWN_GAPS in console/db.py): a new migration "
            f"takes the number after the highest, {max(versions) + 1:03d}"
        )
    missing = [v for v in range(1, max(versions, default=0) + 1) if v not in versions and v not in KNOWN_GAPS]
    if missing:
        gap = missing[0]
        raise MigrationError(
            f"migration {gap:03d} is missing (there are files numbered after it, up to {max(versions):03d}). "
            "Restore the file, or if the number was skipped on purpose, add it to KNOWN_GAPS in "
            "console/db.py with the reason"
        )


def migration_files(folder: Path | None = None) -> list[tuple[int, str, Path]]:
    """(version, name, path) of every migration file, in version order; numbering checked."""
    folder = folder or resource_dir("sql") / "migrations"
    found = []
    for path in sorted(folder.iterdir()):
        match = _MIGRATION_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2), path))
    check_numbering([v for v, _, _ in found])
    return found


def changed_migrations(conn: psycopg.Connection, files: list[tuple[int, str, Path]] | None = None) -> list[str]:
    """One sentence per applied migration whose file no longer matches its recorded checksum."""
    if conn.execute("SELECT to_regclass('skiplock.schema_migrations') IS NULL").fetchone()[0]:
        return []
    applied = {v: (name, checksum) for v, name, checksum in
               conn.execute("SELECT version, name, checksum FROM skiplock.schema_migrations ORDER BY version")}
    changed = []
    for version, name, path in files if files is not None else migration_files():
        if version not in applied:
            continue
        if applied[version][0] != name:
            # Not an edit: another migration under this number, from a build of main that no
            # release shipped (CHANGELOG.md, 0.1.0, says which and what to do).
            changed.append(
                f"applied migration {version:03d} is {applied[version][0]!r}, which this release does not have "
                f"(its {version:03d} is {path.name}): the database was migrated by an unreleased build; see "
                "CHANGELOG.md, 'Upgrade notes'"
            )
        elif applied[version][1] != (now := migration_checksum(path)):
            changed.append(
                f"applied migration {path.name} has changed since it was applied "
                f"(applied checksum {applied[version][1]}, file checksum {now})"
            )
    return changed


def verify_migrations(conn: psycopg.Connection, files: list[tuple[int, str, Path]] | None = None) -> None:
    """Raise MigrationChanged naming each applied migration whose file changed."""
    changed = changed_migrations(conn, files)
    if changed:
        raise MigrationChanged(
            "; ".join(changed) + ". An applied migration must never be edited: restore the file "
            "and put the change in a new migration"
        )


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply the missing migrations in order; return the names applied (empty when current).

    The whole run is one transaction under an advisory lock, so two processes migrating at once
    apply each file exactly once (the second waits, then finds nothing to do), and a failing
    file leaves the database as it was. An applied file that changed since (its checksum differs
    from the recorded one) stops the run before anything is applied: `MigrationChanged`.
    """
    applied_now: list[str] = []
    files = migration_files()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            """
            CREATE TABLE IF NOT EXISTS skiplock.schema_migrations (
                version     integer PRIMARY KEY,
                name        text NOT NULL,
                checksum    text NOT NULL,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        verify_migrations(conn, files)
        done = {row[0] for row in conn.execute("SELECT version FROM skiplock.schema_migrations")}
        for version, name, path in files:
            if version in done:
                continue
            text = path.read_text(encoding="utf-8")
            checksum = hashlib.sha256(text.encode()).hexdigest()
            conn.execute(text)
            conn.execute(
                "INSERT INTO skiplock.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (version, name, checksum),
            )
            applied_now.append(f"{version:03d}_{name}")
    return applied_now
