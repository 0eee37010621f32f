"""Which databases the console watches: the `[[databases]]` list, and one pool per database.

A database is a named connection. Either the config file lists them:

    [[databases]]
    name = "east"                        # the label pages, samples and /metrics use
    dsn = "postgresql://…/east"
    replica_dsn = "postgresql://…"       # optional: a streaming standby of dsn, for page reads

or there is no `[[databases]]` and `--dsn` / DATABASE_URL / `[database] dsn` names one
database, called `default`. Both at once is refused (which one would `skiplock scheduler`
run?): pick one of the list with `--database NAME` instead.

`load_databases()` validates the list at start-up; every complaint names the entry (its
position and, when it has one, its name). `Registry` owns one connection pool per database
(each with the `[database]` pool size and statement timeout), opened lazily and closed
together; the faces pick a database by name and hand its connection to the domain, which never
reads this module or the config.

A database with `replica_dsn` also gets a replica pool (`Registry.replica_pool`), opened on
first use with the same size and statement timeout, whose sessions are READ ONLY
(`default_transaction_read_only`) and whose connection attempts give up after a few seconds
(and a connection whose host stops acknowledging, after two: `tcp_user_timeout`). Which
requests read it is the web console's choice (console/web/database.py, `REPLICA_READS`); the
scheduler, the workers, the CLI and every action use the primary only. A replica that failed is
left alone for `REPLICA_REST_S` (`replica_failed` / `replica_resting`), so pages do not wait on it
again and again while it is down.

This module does not query anything and keeps no global state (a registry's replica rest
times are its own).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from console.config import ConfigError
from console.db import DatabaseError, make_pool

DEFAULT_NAME = "default"
# A label safe in a URL path segment, a Prometheus label value, a log line and a file name.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_KEYS = {"name", "dsn", "replica_dsn"}
# After a replica failed to answer, how long pages read the primary without trying it again.
REPLICA_REST_S = 30.0
# Each connection attempt to a replica (libpq's connect_timeout, whole seconds, at least 2).
REPLICA_CONNECT_TIMEOUT_S = 2
# A pooled replica connection whose host stops acknowledging is dropped after this (not how long
# a query may run: that is the statement timeout).
REPLICA_TCP_USER_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Database:
    name: str
    dsn: str
    replica_dsn: str | None = None

    def __repr__(self) -> str:  # never print a DSN (it may carry a password)
        return f"Database({self.name!r})"


class UnknownDatabase(DatabaseError, ValueError):
    """`--database NAME` (or /db/NAME) names no configured database; the message lists them."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        super().__init__(f"unknown database {name!r} (configured: {', '.join(known)})")


def _entry_error(index: int, entry: Any, message: str) -> ConfigError:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    label = f"[[databases]] entry {index + 1}" + (f" (name {name!r})" if isinstance(name, str) and name else "")
    return ConfigError(f"{label}: {message}")


def parse_databases(records: list[Any]) -> list[Database]:
    """Validate the `[[databases]]` records; ConfigError naming the entry at the first problem."""
    out: list[Database] = []
    seen: set[str] = set()
    for index, entry in enumerate(records):
        if not isinstance(entry, Mapping):
            raise _entry_error(index, entry, "must be a table with name and dsn")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise _entry_error(index, entry, f"unknown key {unknown[0]!r} (known: dsn, name, replica_dsn)")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise _entry_error(index, entry, "name is required (a label such as \"east\")")
        if not NAME_PATTERN.match(name):
            raise _entry_error(index, entry, "name must be lower-case letters, digits, '-' or '_', start with a "
                                             "letter and be at most 63 characters")
        if name in seen:
            raise _entry_error(index, entry, "name is used by an earlier entry: names must be unique")
        seen.add(name)
        dsn = entry.get("dsn")
        if not isinstance(dsn, str) or not dsn.strip():
            raise _entry_error(index, entry, "dsn is required (a PostgreSQL connection string)")
        replica = entry.get("replica_dsn")
        if replica is not None and (not isinstance(replica, str) or not replica.strip()):
            raise _entry_error(index, entry, "replica_dsn must be a non-empty connection string when given")
        out.append(Database(name, dsn, replica))
    return out


def load_databases(config: Any, dsn: str | None = None, *, env: Mapping[str, str] | None = None) -> list[Database]:
    """The databases of this process, in config order (the first is the web console's home).

    `dsn` is an explicit `--dsn`. Without `[[databases]]` it, DATABASE_URL or `[database] dsn`
    is the one database `default`; with `[[databases]]`, giving one as well is refused.
    """
    env = os.environ if env is None else env
    records = config.tables.get("databases") if config is not None else None
    single = dsn or env.get("DATABASE_URL") or (config.database.dsn if config is not None else "")
    if records:
        listed = parse_databases(records)
        if single:
            names = ", ".join(d.name for d in listed)
            raise ConfigError(
                "[[databases]] lists the databases, but --dsn, DATABASE_URL or [database] dsn names one as well: "
                f"remove that and pick one of the list with --database NAME ({names})"
            )
        return listed
    if not single:
        raise DatabaseError("no database given: pass --dsn, set DATABASE_URL, or list [[databases]] in the config file")
    return [Database(DEFAULT_NAME, single)]


def select(databases: list[Database], name: str | None) -> Database:
    """The database called `name`; the first one when `name` is None."""
    if name is None:
        return databases[0]
    for database in databases:
        if database.name == name:
            return database
    raise UnknownDatabase(name, [d.name for d in databases])


class Registry:
    """One connection pool per database (and one per replica), made on first use, all closed by `close()`."""

    def __init__(self, databases: list[Database], *, application_name: str, size: int = 4,
                 statement_timeout_ms: int | None = None):
        if not databases:
            raise ValueError("a registry needs at least one database")
        self.databases = list(databases)
        self.application_name = application_name
        self.size = size
        self.statement_timeout_ms = statement_timeout_ms
        self._pools: dict[str, Any] = {}
        self._replica_pools: dict[str, Any] = {}
        self._replica_failed_at: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.databases]

    @property
    def home(self) -> Database:
        """The first database: the one unprefixed pages, users and sessions live in."""
        return self.databases[0]

    def get(self, name: str | None = None) -> Database:
        return select(self.databases, name)

    def pool(self, name: str | None = None):
        database = self.get(name)
        with self._lock:
            pool = self._pools.get(database.name)
            if pool is None:
                pool = make_pool(database.dsn, application_name=self.application_name, size=self.size,
                                 statement_timeout_ms=self.statement_timeout_ms)
                self._pools[database.name] = pool
            return pool

    def replica_pool(self, name: str | None = None):
        """The read-only pool of database `name`'s replica; None when it has no replica_dsn."""
        database = self.get(name)
        if not database.replica_dsn:
            return None
        with self._lock:
            pool = self._replica_pools.get(database.name)
            if pool is None:
                pool = make_pool(database.replica_dsn, application_name=f"{self.application_name}-replica",
                                 size=self.size, statement_timeout_ms=self.statement_timeout_ms, read_only=True,
                                 connect_timeout=REPLICA_CONNECT_TIMEOUT_S,
                                 tcp_user_timeout_ms=REPLICA_TCP_USER_TIMEOUT_MS)
                self._replica_pools[database.name] = pool
            return pool

    def replica_failed(self, name: str) -> None:
        """The replica of `name` did not answer: rest it for REPLICA_REST_S."""
        with self._lock:
            self._replica_failed_at[name] = time.monotonic()

    def replica_resting(self, name: str) -> bool:
        with self._lock:
            failed = self._replica_failed_at.get(name)
            if failed is not None and time.monotonic() - failed >= REPLICA_REST_S:
                del self._replica_failed_at[name]
                failed = None
            return failed is not None

    def __iter__(self) -> Iterator[Database]:
        return iter(self.databases)

    def __len__(self) -> int:
        return len(self.databases)

    def close(self) -> None:
        with self._lock:
            pools = [*self._pools.values(), *self._replica_pools.values()]
            self._pools, self._replica_pools = {}, {}
        for pool in pools:
            pool.close()
