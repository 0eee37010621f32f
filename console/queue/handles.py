"""How a named statement of sql/queue.sql runs on each handle an application holds.

The producer (console.queue.producer) decides what to run: it yields `Step`s (a statement's name
and its parameters, psycopg's `%(name)s` style) and reads the rows back. An adapter here says
only how one step executes on one kind of handle, so every handle runs the same SQL with the
same options and the same checks:

| handle                                               | adapter          | how a step runs                          |
|------------------------------------------------------|------------------|------------------------------------------|
| psycopg `Connection`                                 | `Psycopg`        | a cursor; COPY for long key-less batches |
| psycopg `AsyncConnection`                            | `AsyncPsycopg`   | an async cursor; COPY likewise           |
| asyncpg `Connection` (or a pool's connection)        | `Asyncpg`        | `fetch` with `$n` placeholders           |
| SQLAlchemy 2 `Session`, `Connection` (psycopg)       | `SQLAlchemy`     | `exec_driver_sql` on its connection      |
| SQLAlchemy `AsyncSession`, `AsyncConnection`         | `AsyncSQLAlchemy`| `exec_driver_sql`, psycopg or asyncpg    |
| Django's `connection` (PostgreSQL on psycopg 3)      | `Django`         | `connection.cursor()`                    |

Every step goes through the handle's own execution path (SQLAlchemy's `exec_driver_sql`,
Django's cursor), never around it to the driver underneath: that path is what joins the
transaction the application opened (SQLAlchemy's asyncpg dialect sends its BEGIN only there),
and what its instrumentation sees.

asyncpg numbers its placeholders (`$1`): `dollar_query` translates a named query once per
process, and a parameter dict becomes the tuple in that order. JSON values travel as
`JsonText` (text the producer checked and encoded once): psycopg binds it as jsonb, asyncpg as
the text its jsonb codec expects.

A handle is recognised by its class, looked up among the modules the application has already
imported (`sys.modules`): this module never imports asyncpg, SQLAlchemy or Django, so the base
install needs none of them (tests/test_imports.py).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from console.sqlfiles import query

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session


class DjangoConnection(Protocol):
    """What a type checker knows of Django's connection (Django ships no types of its own)."""

    vendor: str
    alias: str

    def cursor(self) -> Any: ...


class AsyncpgConnection(Protocol):
    """What a type checker knows of an asyncpg connection (asyncpg ships no types of its own)."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]: ...

    def is_in_transaction(self) -> bool: ...


# The handles each call takes, for type checkers (handles the application's libraries would
# type as Any are protocols, so a sync handle given to an async call is still an error).
SyncHandle: TypeAlias = "psycopg.Connection[Any] | Session | scoped_session[Any] | SAConnection | DjangoConnection"
AsyncHandle: TypeAlias = ("psycopg.AsyncConnection[Any] | AsyncpgConnection | AsyncSession | async_scoped_session[Any]"
                          " | SAAsyncConnection")
Rows: TypeAlias = list[tuple[Any, ...]]
CONCERN = "queue"  # the producer's statements live in sql/queue.sql


class JsonText(str):
    """JSON text, checked and encoded once, bound as a jsonb parameter."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Step:
    """Run the named query of sql/queue.sql with these parameters; the rows come back."""

    name: str
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CopyStep:
    """Stream `text` (COPY's text format) into the named COPY ... FROM STDIN statement."""

    name: str
    text: str


T = TypeVar("T")
# What a producer function is: it yields the steps to run and is sent each one's rows back.
Steps: TypeAlias = Generator[Step | CopyStep, Rows, T]


class SyncAdapter(Protocol):
    copies: bool  # runs CopySteps (only psycopg's connections do)

    def run(self, step: Step) -> Rows: ...

    def copy(self, step: CopyStep) -> None: ...

    def atomic(self) -> contextlib.AbstractContextManager[Any]: ...


class AsyncAdapter(Protocol):
    copies: bool

    async def run(self, step: Step) -> Rows: ...

    async def copy(self, step: CopyStep) -> None: ...

    def atomic(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


# --- parameters -----------------------------------------------------------------------------


def _verbatim(text: Any) -> str:
    return str(text)


def _psycopg_value(value: Any) -> Any:
    if isinstance(value, JsonText):
        return Jsonb(value, dumps=_verbatim)
    if isinstance(value, list) and value and isinstance(value[0], JsonText):
        return [Jsonb(v, dumps=_verbatim) for v in value]
    return value


def psycopg_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` for a driver that takes psycopg's `%(name)s` and its Jsonb wrapper."""
    return {name: _psycopg_value(value) for name, value in params.items()}


def _plain_value(value: Any) -> Any:
    if isinstance(value, JsonText):
        return str(value)
    if isinstance(value, list) and value and isinstance(value[0], JsonText):
        return [str(v) for v in value]
    return value


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@cache
def dollar_query(name: str) -> tuple[str, tuple[str, ...]]:
    """The named query with `$1, $2, ...` for its `%(name)s` parameters (a name used twice keeps
    its number), and the names in number order. Whole-line comments are left out: a
    placeholder named in a comment would otherwise number a parameter the statement never uses,
    whose type the server cannot infer."""
    text = "\n".join(line for line in query(CONCERN, name).splitlines() if not line.lstrip().startswith("--"))
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        key = match.group(1)
        if key not in names:
            names.append(key)
        return f"${names.index(key) + 1}"

    return _PLACEHOLDER.sub(number, text), tuple(names)


def dollar_params(step: Step) -> tuple[str, tuple[Any, ...]]:
    """The statement and its positional arguments for a `$n` driver (asyncpg)."""
    text, names = dollar_query(step.name)
    return text, tuple(_plain_value(step.params[name]) for name in names)


def _tuples(rows: Sequence[Any]) -> Rows:
    return [tuple(row) for row in rows]


# --- psycopg --------------------------------------------------------------------------------


class Psycopg:
    """A psycopg `Connection`: the caller's transaction, or each statement its own when the
    connection is in autocommit (an enqueue then commits at once)."""

    copies = True

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def run(self, step: Step) -> Rows:
        with self.conn.cursor() as cur:
            cur.execute(query(CONCERN, step.name), psycopg_params(step.params))
            return _tuples(cur.fetchall()) if cur.description else []

    def copy(self, step: CopyStep) -> None:
        with self.conn.cursor() as cur, cur.copy(query(CONCERN, step.name)) as copy:
            copy.write(step.text)

    def atomic(self) -> contextlib.AbstractContextManager[Any]:
        """The COPY path's statements must commit together: on an autocommit connection, in a
        transaction of their own; otherwise in the caller's."""
        return self.conn.transaction() if self.conn.autocommit else contextlib.nullcontext()


class AsyncPsycopg:
    """A psycopg `AsyncConnection`, as `Psycopg`."""

    copies = True

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def run(self, step: Step) -> Rows:
        async with self.conn.cursor() as cur:
            await cur.execute(query(CONCERN, step.name), psycopg_params(step.params))
            return _tuples(await cur.fetchall()) if cur.description else []

    async def copy(self, step: CopyStep) -> None:
        async with self.conn.cursor() as cur, cur.copy(query(CONCERN, step.name)) as copy:
            await copy.write(step.text)

    def atomic(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.conn.transaction() if self.conn.autocommit else _async_nothing()


@contextlib.asynccontextmanager
async def _async_nothing() -> AsyncIterator[None]:
    yield


# --- asyncpg --------------------------------------------------------------------------------


class Asyncpg:
    """An asyncpg connection. Inside `async with conn.transaction()` the job joins it; outside,
    asyncpg commits each statement at once (it has no implicit transaction)."""

    copies = False

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def run(self, step: Step) -> Rows:
        text, args = dollar_params(step)
        return _tuples(await self.conn.fetch(text, *args))

    async def copy(self, step: CopyStep) -> None:  # pragma: no cover - copies is False
        raise NotImplementedError

    def atomic(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return _async_nothing()


# --- SQLAlchemy -----------------------------------------------------------------------------

SQLALCHEMY_DRIVERS = {"psycopg": "pyformat", "asyncpg": "dollar"}  # the async psycopg dialect is "psycopg" too


def _sqlalchemy_style(connection: Any) -> str:
    driver = connection.dialect.driver
    if connection.dialect.name != "postgresql" or driver not in SQLALCHEMY_DRIVERS:
        raise TypeError(f"SQLAlchemy's {connection.dialect.name}+{driver} dialect is not supported: "
                        "use postgresql+psycopg (sync or async) or postgresql+asyncpg")
    return SQLALCHEMY_DRIVERS[driver]


def _sqlalchemy_statement(style: str, step: Step) -> tuple[str, Any]:
    if style == "dollar":
        return dollar_params(step)
    return query(CONCERN, step.name), psycopg_params(step.params)


class SQLAlchemy:
    """A SQLAlchemy 2 `Connection`, or a `Session` (its connection for the current transaction,
    begun if none is: the job commits with the session). Savepoints (`begin_nested`) are SQL
    savepoints on that connection, so a rolled-back savepoint takes its jobs with it."""

    copies = False

    def __init__(self, handle: Any, *, session: bool) -> None:
        self.connection = handle.connection() if session else handle
        self.style = _sqlalchemy_style(self.connection)

    def run(self, step: Step) -> Rows:
        result = self.connection.exec_driver_sql(*_sqlalchemy_statement(self.style, step))
        return _tuples(result.fetchall()) if result.returns_rows else []

    def copy(self, step: CopyStep) -> None:  # pragma: no cover - copies is False
        raise NotImplementedError

    def atomic(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


class AsyncSQLAlchemy:
    """A SQLAlchemy `AsyncConnection`, or an `AsyncSession`'s connection, as `SQLAlchemy`."""

    copies = False

    def __init__(self, handle: Any, *, session: bool) -> None:
        self.handle = handle
        self.session = session
        self.connection: Any = None
        self.style = ""

    async def _connection(self) -> Any:
        if self.connection is None:
            self.connection = await self.handle.connection() if self.session else self.handle
            self.style = _sqlalchemy_style(self.connection)
        return self.connection

    async def run(self, step: Step) -> Rows:
        connection = await self._connection()
        result = await connection.exec_driver_sql(*_sqlalchemy_statement(self.style, step))
        return _tuples(result.fetchall()) if result.returns_rows else []

    async def copy(self, step: CopyStep) -> None:  # pragma: no cover - copies is False
        raise NotImplementedError

    def atomic(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return _async_nothing()


# --- Django ---------------------------------------------------------------------------------


class Django:
    """Django's connection (`django.db.connection` or `connections[alias]`): inside
    `transaction.atomic()` the job joins the block, a nested atomic is a savepoint; outside
    any, Django's autocommit commits it at once. PostgreSQL on psycopg 3 only."""

    copies = False

    def __init__(self, connection: Any) -> None:
        if connection.vendor != "postgresql" or getattr(connection.Database, "__name__", "") != "psycopg":
            raise TypeError(f"Django's {connection.vendor!r} connection ({connection.alias!r}) is not supported: "
                            "Skiplock needs the postgresql backend on psycopg 3")
        self.connection = connection

    def run(self, step: Step) -> Rows:
        with self.connection.cursor() as cur:
            cur.execute(query(CONCERN, step.name), psycopg_params(step.params))
            return _tuples(cur.fetchall()) if cur.description else []

    def copy(self, step: CopyStep) -> None:  # pragma: no cover - copies is False
        raise NotImplementedError

    def atomic(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


# --- which adapter --------------------------------------------------------------------------

SUPPORTED = ("a psycopg Connection, a SQLAlchemy Session or Connection, or Django's connection "
             "(skiplock.enqueue); a psycopg AsyncConnection, an asyncpg connection, or a SQLAlchemy "
             "AsyncSession or AsyncConnection (await skiplock.enqueue_async)")


def _classes(*where: tuple[str, str]) -> tuple[type, ...]:
    """The classes named (module, class) whose module the application already imported."""
    found = []
    for module_name, class_name in where:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def _is(handle: Any, *where: tuple[str, str]) -> bool:
    classes = _classes(*where)
    return bool(classes) and isinstance(handle, classes)


_SA_SESSION = (("sqlalchemy.orm.session", "Session"), ("sqlalchemy.orm.scoping", "scoped_session"))
_SA_CONNECTION = (("sqlalchemy.engine.base", "Connection"),)
_SA_ASYNC_SESSION = (("sqlalchemy.ext.asyncio.session", "AsyncSession"),
                     ("sqlalchemy.ext.asyncio.scoping", "async_scoped_session"))
_SA_ASYNC_CONNECTION = (("sqlalchemy.ext.asyncio.engine", "AsyncConnection"),)
_ASYNCPG = (("asyncpg.connection", "Connection"), ("asyncpg.pool", "PoolConnectionProxy"))
_DJANGO = (("django.db.backends.base.base", "BaseDatabaseWrapper"), ("django.utils.connection", "ConnectionProxy"))
# Handles that hold no transaction to join: named in the error, with what to pass instead.
_NO_TRANSACTION = ((("sqlalchemy.engine.base", "Engine"), ("sqlalchemy.ext.asyncio.engine", "AsyncEngine"),
                    ("psycopg_pool", "ConnectionPool"), ("psycopg_pool", "AsyncConnectionPool"),
                    ("asyncpg.pool", "Pool")))


def _refuse(handle: Any, call: str) -> TypeError:
    name = f"{type(handle).__module__}.{type(handle).__qualname__}"
    if _is(handle, *_NO_TRANSACTION):
        return TypeError(f"{call}: {name} holds no transaction to join; pass the connection or session "
                         "whose transaction the job belongs to")
    return TypeError(f"{call}: cannot enqueue on {name}; pass {SUPPORTED}")


def sync_adapter(handle: Any, call: str = "enqueue") -> SyncAdapter:
    """The adapter for a synchronous handle; TypeError naming the handle otherwise (and the
    call to use instead for an asynchronous one)."""
    if isinstance(handle, psycopg.Connection):
        return Psycopg(handle)
    if _is(handle, *_SA_SESSION):
        return SQLAlchemy(handle, session=True)
    if _is(handle, *_SA_CONNECTION):
        return SQLAlchemy(handle, session=False)
    if _is(handle, *_DJANGO):
        return Django(handle)
    if isinstance(handle, psycopg.AsyncConnection) or _is(handle, *_ASYNCPG, *_SA_ASYNC_SESSION, *_SA_ASYNC_CONNECTION):
        raise TypeError(f"{call}: {type(handle).__qualname__} is asynchronous: "
                                f"use `await {call}_async(...)`")
    raise _refuse(handle, call)


def async_adapter(handle: Any, call: str = "enqueue_async") -> AsyncAdapter:
    """The adapter for an asynchronous handle; TypeError naming the handle otherwise."""
    if isinstance(handle, psycopg.AsyncConnection):
        return AsyncPsycopg(handle)
    if _is(handle, *_ASYNCPG):
        return Asyncpg(handle)
    if _is(handle, *_SA_ASYNC_SESSION):
        return AsyncSQLAlchemy(handle, session=True)
    if _is(handle, *_SA_ASYNC_CONNECTION):
        return AsyncSQLAlchemy(handle, session=False)
    sync_call = call.removesuffix("_async")
    if _is(handle, *_DJANGO):
        raise TypeError(f"{call}: Django's connection is synchronous: call {sync_call}(...) "
                                "(in an async view, inside sync_to_async with the transaction)")
    if isinstance(handle, psycopg.Connection) or _is(handle, *_SA_SESSION, *_SA_CONNECTION):
        raise TypeError(f"{call}: {type(handle).__qualname__} is synchronous: use {sync_call}(...)")
    raise _refuse(handle, call)


def run(adapter: SyncAdapter, steps: Steps[T]) -> T:
    """Drive a producer's steps on a synchronous adapter; the generator's return value."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, CopyStep):
                adapter.copy(step)
                step = steps.send([])
            else:
                step = steps.send(adapter.run(step))
    except StopIteration as done:
        value: T = done.value
        return value


async def run_async(adapter: AsyncAdapter, steps: Steps[T]) -> T:
    """The same for an asynchronous adapter: the producer's logic is shared, only the I/O awaits."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, CopyStep):
                await adapter.copy(step)
                step = steps.send([])
            else:
                step = steps.send(await adapter.run(step))
    except StopIteration as done:
        value: T = done.value
        return value
