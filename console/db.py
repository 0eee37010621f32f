"""The connection lifecycle: connecting, pools, time limits and migrations.

Everything that talks to PostgreSQL gets its connection here, so a bad DSN or a database
that was never migrated produces one clear message wherever it is met. SQL text comes from
`sql/` through `console.sqlfiles`.

It does not decide what to query; the domain modules (queue, maintenance, collectors, ...) do.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from console.resources import resource_dir

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


def connect(dsn: str, *, application_name: str = "skiplock", autocommit: bool = True, **kwargs) -> psycopg.Connection:
    try:
        return psycopg.connect(dsn, autocommit=autocommit, application_name=application_name, **kwargs)
    except psycopg.ProgrammingError as exc:
        raise DatabaseError(f"invalid database address {_redact(dsn)!r}: {exc}") from None
    except psycopg.OperationalError as exc:
        reason = "; ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip()) or exc.__class__.__name__
        raise DatabaseError(f"cannot connect to {_redact(dsn)}: {reason}") from None


def make_pool(dsn: str, *, application_name: str, size: int = 4, statement_timeout_ms: int | None = None) -> ConnectionPool:
    """A pool whose connections are autocommit and carry a name the collectors can exclude."""
    options = f"-c statement_timeout={statement_timeout_ms}" if statement_timeout_ms else None
    kwargs = {"autocommit": True, "application_name": application_name}
    if options:
        kwargs["options"] = options
    return ConnectionPool(dsn, min_size=1, max_size=size, kwargs=kwargs, open=True, timeout=10, name=application_name)


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
    if not schema_exists(conn):
        raise SchemaMissing()


# --- migrations -------------------------------------------------------------------------

_MIGRATION_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


def migration_files() -> list[tuple[int, str, Path]]:
    found = []
    for path in sorted((resource_dir("sql") / "migrations").iterdir()):
        match = _MIGRATION_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2), path))
    versions = [v for v, _, _ in found]
    if len(versions) != len(set(versions)):
        raise DatabaseError("two migration files share a version number")
    return found


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply the missing migrations in order; return the names applied (empty when current).

    The whole run is one transaction under an advisory lock, so two processes migrating at once
    apply each file exactly once (the second waits, then finds nothing to do), and a failing
    file leaves the database as it was.
    """
    applied_now: list[str] = []
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
        done = {row[0]: row[1] for row in conn.execute("SELECT version, checksum FROM skiplock.schema_migrations")}
        for version, name, path in migration_files():
            text = path.read_text(encoding="utf-8")
            checksum = hashlib.sha256(text.encode()).hexdigest()
            if version in done:
                continue
            conn.execute(text)
            conn.execute(
                "INSERT INTO skiplock.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (version, name, checksum),
            )
            applied_now.append(f"{version:03d}_{name}")
    return applied_now
