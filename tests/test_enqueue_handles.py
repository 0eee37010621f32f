"""Transactional enqueue from every handle an application holds (issue 29 item 1).

Each stack below is the real library on the test's PostgreSQL: psycopg (sync and async), asyncpg
(a connection and a pool's), SQLAlchemy 2 (Session, Connection, AsyncSession, AsyncConnection;
the async ones on psycopg and on asyncpg) and Django (its connection in `transaction.atomic()`).
For each, the same scenarios prove that the job exists if and only if the surrounding
transaction commits (commit, rollback, an exception in the block, a rolled-back savepoint,
nested blocks), that the doorbell (NOTIFY) rings only at commit, that every option reaches the
row, and that bad options give the same InvalidJob message from every handle and write nothing.

The scenarios are synchronous; an async stack runs each of its steps on its own event loop
(`Loop.run`, with a deadline), so one copy of each scenario serves every stack (and Django, which
refuses ORM calls while an event loop runs in its thread, is not fighting the harness).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import django
import psycopg
import pytest
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import skiplock
from console.queue import handles, producer
from console.sqlfiles import query

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 30.0  # seconds any one async step may take


class Boom(Exception):
    """Raised inside a block to roll it back."""


# --- the stacks -----------------------------------------------------------------------------


class Loop:
    """One event loop per async stack, run step by step (each with a deadline).

    The loop runs in a thread of its own: in a test process that already ran a Playwright
    (sync API) test, the main thread still counts as running an event loop, and
    run_until_complete there would refuse to start."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack-loop", daemon=True)
        self.thread.start()

    def run(self, awaitable: Any) -> Any:
        async def bounded() -> Any:
            return await asyncio.wait_for(awaitable, DEADLINE)

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result(DEADLINE + 5)

    @contextlib.contextmanager
    def enter(self, manager: Any) -> Iterator[Any]:
        value = self.run(manager.__aenter__())
        try:
            yield value
        except BaseException as exc:
            if not self.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.run(manager.__aexit__(None, None, None))

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE)
        self.loop.close()


def asyncpg_options(dsn: str) -> dict[str, Any]:
    info = conninfo_to_dict(dsn)
    return {"host": info.get("host"), "port": int(info.get("port", 5432)), "user": info.get("user"),
            "database": info.get("dbname"), "password": info.get("password")}


class Stack:
    """A handle's library: open a transaction (`begin`), a savepoint inside it, and enqueue."""

    name = ""
    is_async = False

    def open(self, dsn: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def begin(self, *, commit: bool = True) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def savepoint(self, handle: Any) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def enqueue(self, handle: Any, kind: str, payload: Any = None, **options: Any) -> int:
        if self.is_async:
            return self.loop.run(skiplock.enqueue_async(handle, kind, payload, **options))
        return skiplock.enqueue(handle, kind, payload, **options)

    def enqueue_many(self, handle: Any, jobs: Any) -> list[int]:
        if self.is_async:
            return self.loop.run(skiplock.enqueue_many_async(handle, jobs))
        return skiplock.enqueue_many(handle, jobs)


class PsycopgStack(Stack):
    name = "psycopg"

    def open(self, dsn):
        self.conn = psycopg.connect(dsn)

    def close(self):
        self.conn.close()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        with self.conn.transaction():
            yield self.conn
            if not commit:
                raise psycopg.Rollback()

    def savepoint(self, handle):
        return handle.transaction()


class AsyncPsycopgStack(Stack):
    name = "psycopg-async"
    is_async = True

    def open(self, dsn):
        self.loop = Loop()
        self.conn = self.loop.run(psycopg.AsyncConnection.connect(dsn))

    def close(self):
        self.loop.run(self.conn.close())
        self.loop.close()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        @contextlib.asynccontextmanager
        async def block():
            async with self.conn.transaction():
                yield self.conn
                if not commit:
                    raise psycopg.Rollback()

        with self.loop.enter(block()) as handle:
            yield handle

    def savepoint(self, handle):
        return self.loop.enter(handle.transaction())


class AsyncpgStack(Stack):
    name = "asyncpg"
    is_async = True
    pooled = False

    def open(self, dsn):
        self.loop = Loop()
        options = asyncpg_options(dsn)
        if self.pooled:
            async def make_pool():  # the pool binds to the loop running when it is made
                return await asyncpg.create_pool(min_size=1, max_size=1, **options)

            self.pool = self.loop.run(make_pool())
            self.conn = self.loop.run(self.pool.acquire())
        else:
            self.conn = self.loop.run(asyncpg.connect(**options))

    def close(self):
        if self.pooled:
            self.loop.run(self.pool.release(self.conn))
            self.loop.run(self.pool.close())
        else:
            self.loop.run(self.conn.close())
        self.loop.close()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        transaction = self.conn.transaction()
        self.loop.run(transaction.start())
        try:
            yield self.conn
        except BaseException:
            self.loop.run(transaction.rollback())
            raise
        self.loop.run(transaction.commit() if commit else transaction.rollback())

    def savepoint(self, handle):
        return self.loop.enter(handle.transaction())  # nested: a savepoint


class AsyncpgPoolStack(AsyncpgStack):
    name = "asyncpg-pool"
    pooled = True


class SessionStack(Stack):
    name = "sqlalchemy-session"

    def open(self, dsn):
        self.engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
        self.session = Session(self.engine)

    def close(self):
        self.session.close()
        self.engine.dispose()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        try:
            yield self.session
        except BaseException:
            self.session.rollback()
            raise
        self.session.commit() if commit else self.session.rollback()

    def savepoint(self, handle):
        return handle.begin_nested()


class ConnectionStack(Stack):
    name = "sqlalchemy-connection"

    def open(self, dsn):
        self.engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
        self.connection = self.engine.connect()

    def close(self):
        self.connection.close()
        self.engine.dispose()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        transaction = self.connection.begin()
        try:
            yield self.connection
        except BaseException:
            transaction.rollback()
            raise
        transaction.commit() if commit else transaction.rollback()

    def savepoint(self, handle):
        return handle.begin_nested()


def async_engine(driver: str, dsn: str) -> Any:
    if driver == "asyncpg":
        return create_async_engine("postgresql+asyncpg://", poolclass=NullPool,
                                   async_creator=lambda: asyncpg.connect(**asyncpg_options(dsn)))
    return create_async_engine("postgresql+psycopg://", poolclass=NullPool,
                               async_creator=lambda: psycopg.AsyncConnection.connect(dsn))


class AsyncSessionStack(Stack):
    is_async = True
    driver = "psycopg"

    @property
    def name(self):
        return f"sqlalchemy-asyncsession-{self.driver}"

    def open(self, dsn):
        self.loop = Loop()
        self.engine = async_engine(self.driver, dsn)
        self.session = AsyncSession(self.engine)

    def close(self):
        self.loop.run(self.session.close())
        self.loop.run(self.engine.dispose())
        self.loop.close()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        try:
            yield self.session
        except BaseException:
            self.loop.run(self.session.rollback())
            raise
        self.loop.run(self.session.commit() if commit else self.session.rollback())

    def savepoint(self, handle):
        return self.loop.enter(handle.begin_nested())


class AsyncSessionAsyncpgStack(AsyncSessionStack):
    driver = "asyncpg"


class AsyncConnectionStack(Stack):
    is_async = True
    driver = "psycopg"

    @property
    def name(self):
        return f"sqlalchemy-asyncconnection-{self.driver}"

    def open(self, dsn):
        self.loop = Loop()
        self.engine = async_engine(self.driver, dsn)
        self.connection = self.loop.run(self.engine.connect())

    def close(self):
        self.loop.run(self.connection.close())
        self.loop.run(self.engine.dispose())
        self.loop.close()

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        transaction = self.loop.run(self.connection.begin())
        try:
            yield self.connection
        except BaseException:
            self.loop.run(transaction.rollback())
            raise
        self.loop.run(transaction.commit() if commit else transaction.rollback())

    def savepoint(self, handle):
        return self.loop.enter(handle.begin_nested())


class AsyncConnectionAsyncpgStack(AsyncConnectionStack):
    driver = "asyncpg"


def configure_django() -> None:
    if not settings.configured:
        # The database is set per test (DjangoStack.open); these are the settings a project has.
        settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres"}},
                           USE_TZ=True, INSTALLED_APPS=[])
        django.setup()


class DjangoStack(Stack):
    name = "django"

    def open(self, dsn):
        configure_django()
        from django.db import connection, connections

        # Django refuses sync ORM calls in a thread where an event loop runs; after a Playwright
        # (sync API) test in the same process, the main thread counts as one although nothing
        # async happens here. Say so only then, so a real async misuse still shows elsewhere.
        self.unsafe_before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
        if asyncio.events._get_running_loop() is not None:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

        info = conninfo_to_dict(dsn)
        connections["default"].close()
        connections["default"].settings_dict.update(NAME=info["dbname"], HOST=info.get("host", ""),
                                                    PORT=info.get("port", ""), USER=info.get("user", ""),
                                                    PASSWORD=info.get("password", ""))
        self.connection = connection  # the ConnectionProxy application code imports

    def close(self):
        from django.db import connections

        connections["default"].close()
        if self.unsafe_before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = self.unsafe_before

    @contextlib.contextmanager
    def begin(self, *, commit=True):
        from django.db import transaction

        with transaction.atomic():
            yield self.connection
            if not commit:
                transaction.set_rollback(True)

    def savepoint(self, handle):
        from django.db import transaction

        return transaction.atomic()  # nested: a savepoint


STACKS = [PsycopgStack, AsyncPsycopgStack, AsyncpgStack, AsyncpgPoolStack, SessionStack, ConnectionStack,
          AsyncSessionStack, AsyncSessionAsyncpgStack, AsyncConnectionStack, AsyncConnectionAsyncpgStack,
          DjangoStack]


@pytest.fixture(params=STACKS, ids=lambda cls: cls().name)
def stack(request, dsn):
    opened = request.param()
    opened.open(dsn)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def listener(dsn):
    """A connection listening for the workers' doorbell."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN skiplock_jobs")
        yield conn


def rings(listener: psycopg.Connection, wait: float) -> list[str]:
    """The doorbell's payloads (queue names) heard within `wait` seconds."""
    return [n.payload for n in listener.notifies(timeout=wait)]


def first_ring(listener: psycopg.Connection, deadline: float = 10.0, stop_after: int = 1) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=deadline, stop_after=stop_after)]


def kinds(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT kind, count(*) FROM skiplock.jobs GROUP BY kind").fetchall()
    return {kind: n for kind, n in rows}


# --- commit, rollback, exception, savepoints, nesting ---------------------------------------


def test_a_committed_block_keeps_its_jobs_and_rings_the_doorbell_at_commit(stack, conn, listener):
    with stack.begin() as handle:
        one = stack.enqueue(handle, "handles_one", {"n": 1}, queue="mail")
        many = stack.enqueue_many(handle, [skiplock.NewJob("handles_many", {"n": 2}, queue="bulk"),
                                           {"kind": "handles_many", "payload": {"n": 3}, "queue": "bulk"}])
        # Inside the block: nobody else sees the jobs, and no worker was woken.
        assert kinds(conn) == {}
        assert rings(listener, 0.3) == []
    assert kinds(conn) == {"handles_one": 1, "handles_many": 2}
    assert sorted(first_ring(listener, stop_after=2)) == ["bulk", "mail"]  # one per statement's queue
    ids = [r[0] for r in conn.execute("SELECT id FROM skiplock.jobs ORDER BY id").fetchall()]
    assert ids == [one, *many]


def test_a_rolled_back_block_leaves_no_job_and_rings_no_bell(stack, conn, listener):
    with stack.begin(commit=False) as handle:
        stack.enqueue(handle, "handles_one", queue="mail")
        stack.enqueue_many(handle, [{"kind": "handles_many"}, {"kind": "handles_many", "idempotency_key": "k1"}])
    assert kinds(conn) == {}
    assert rings(listener, 0.5) == []


def test_an_exception_in_the_block_leaves_no_job(stack, conn, listener):
    with pytest.raises(Boom), stack.begin() as handle:
        stack.enqueue(handle, "handles_one")
        stack.enqueue_many(handle, [{"kind": "handles_many"}])
        raise Boom
    assert kinds(conn) == {}
    assert rings(listener, 0.5) == []


def test_a_rolled_back_savepoint_takes_its_jobs_and_the_block_keeps_the_rest(stack, conn, listener):
    with stack.begin() as handle:
        stack.enqueue(handle, "handles_outer", queue="outer")
        with pytest.raises(Boom), stack.savepoint(handle):
            stack.enqueue(handle, "handles_inner", queue="inner")
            stack.enqueue_many(handle, [{"kind": "handles_inner", "queue": "inner"}])
            raise Boom
        stack.enqueue(handle, "handles_after", queue="outer")
    assert kinds(conn) == {"handles_outer": 1, "handles_after": 1}
    assert first_ring(listener) == ["outer"]
    assert rings(listener, 0.3) == []  # nothing for the savepoint's queue


def test_nested_blocks_commit_with_the_outermost_only(stack, conn):
    # The inner block ends normally (its savepoint released), the outer one fails: nothing stays.
    with pytest.raises(Boom), stack.begin() as handle:
        with stack.savepoint(handle):
            stack.enqueue(handle, "handles_inner")
            with stack.savepoint(handle):
                stack.enqueue(handle, "handles_innermost")
        raise Boom
    assert kinds(conn) == {}
    # The same blocks under an outer one that commits: both stay.
    with stack.begin() as handle:
        with stack.savepoint(handle):
            stack.enqueue(handle, "handles_inner")
            with stack.savepoint(handle):
                stack.enqueue(handle, "handles_innermost")
    assert kinds(conn) == {"handles_inner": 1, "handles_innermost": 1}


def test_a_big_batch_commits_or_rolls_back_whole(stack, conn):
    # Long enough for the COPY path where the handle has one (psycopg), the INSERT elsewhere.
    jobs = [{"kind": "handles_bulk", "payload": {"i": i, "text": "tab\there"}} for i in range(producer.COPY_THRESHOLD + 50)]
    with stack.begin(commit=False) as handle:
        stack.enqueue_many(handle, jobs)
    assert kinds(conn) == {}
    with stack.begin() as handle:
        ids = stack.enqueue_many(handle, jobs)
    rows = conn.execute("SELECT id, payload FROM skiplock.jobs ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ids and [r[1] for r in rows] == [j["payload"] for j in jobs]


# --- the options ----------------------------------------------------------------------------


def test_every_option_reaches_the_row(stack, conn):
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    payload = {"order": 42, "lines": [1, 2.5, None, True], "name": "Zoë ☃", "deep": {"a": {"b": {}}}}
    with stack.begin() as handle:
        job = stack.enqueue(handle, "handles_opts", payload, queue="mail", priority=7, run_at=run_at,
                            idempotency_key="receipt-42", max_attempts=3)
        again = stack.enqueue(handle, "handles_opts", {"other": 1}, idempotency_key="receipt-42")
        unique = stack.enqueue(handle, "handles_unique", idempotency_key="u-1", unique_for=timedelta(minutes=5))
        unique_again = stack.enqueue(handle, "handles_unique", idempotency_key="u-1", unique_for=300)
        batch = stack.enqueue_many(handle, [{"kind": "handles_batch", "idempotency_key": "receipt-42"},
                                            {"kind": "handles_batch", "priority": -3, "run_at": run_at},
                                            {"kind": "handles_batch", "idempotency_key": "b-2", "max_attempts": 9}])
    assert again == job and unique_again == unique and batch[0] == job
    row = conn.execute("SELECT queue, kind, payload, priority, run_at, max_attempts, idempotency_key "
                       "FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()
    assert row == ("mail", "handles_opts", payload, 7, run_at, 3, "receipt-42")
    window = conn.execute("SELECT job_id, expires_at - created_at FROM skiplock.unique_keys "
                          "WHERE kind = 'handles_unique' AND idempotency_key = 'u-1'").fetchone()
    assert window == (unique, timedelta(minutes=5))
    assert conn.execute("SELECT priority, run_at = %s, max_attempts FROM skiplock.jobs WHERE id = ANY(%s) ORDER BY id",
                        (run_at, batch[1:])).fetchall() == [(-3, True, 5), (0, False, 9)]
    assert kinds(conn) == {"handles_opts": 1, "handles_unique": 1, "handles_batch": 2}


BAD = [
    ({"kind": ""}, "kind must be a non-empty string"),
    ({"kind": "k", "queue": " "}, "queue must be a non-empty string"),
    ({"kind": "k", "priority": 40000}, "priority must be an integer between -32768 and 32767"),
    ({"kind": "k", "max_attempts": 0}, "max_attempts must be a positive integer"),
    ({"kind": "k", "run_at": datetime(2030, 1, 1)}, "run_at must be timezone-aware"),
    ({"kind": "k", "run_at": "tomorrow"}, "run_at must be a datetime (or None for now)"),
    ({"kind": "k", "idempotency_key": 42}, "idempotency_key must be a string (or None)"),
    ({"kind": "k", "payload": {"x": float("nan")}}, "payload is not JSON-serialisable: Out of range float values are not JSON compliant"),
    ({"kind": "k", "payload": {1, 2}}, "payload is not JSON-serialisable: Object of type set is not JSON serializable"),
    ({"kind": "k", "payload": json.loads("[" * 101 + "]" * 101)}, "payload: nested deeper than 100 levels"),
    ({"kind": "k", "unique_for": timedelta(minutes=1)}, "unique_for needs an idempotency_key"),
    ({"kind": "k", "idempotency_key": "x", "unique_for": 0}, "unique_for must be more than 0 seconds"),
]
BAD_BATCHES = [
    ([{"kind": "k", "idempotency_key": "same"}, {"kind": "k", "idempotency_key": "same"}],
     "the same idempotency key appears twice in one batch"),
    ([{"kind": "k"}, {"kind": "k", "colour": "red"}], "job 2: unknown option(s) colour"),
    ([{"kind": "k"}, {"kind": "k", "priority": 1.5}], "job 2: priority must be an integer"),
    ({"kind": "k"}, "enqueue_many takes an iterable of jobs"),
]


def test_bad_options_give_the_same_errors_from_every_handle_and_write_nothing(stack, conn):
    with stack.begin() as handle:
        for options, message in BAD:
            options = dict(options)
            kind = options.pop("kind")
            payload = options.pop("payload", None)
            with pytest.raises(skiplock.InvalidJob) as raised:
                stack.enqueue(handle, kind, payload, **options)
            assert str(raised.value).startswith(message), (options, str(raised.value))
        for jobs, message in BAD_BATCHES:
            with pytest.raises(skiplock.InvalidJob) as raised:
                stack.enqueue_many(handle, jobs)
            assert str(raised.value).startswith(message), (jobs, str(raised.value))
        # The checks ran before any statement: the transaction is intact and goes on.
        stack.enqueue(handle, "handles_good")
    assert kinds(conn) == {"handles_good": 1}


# --- which handles, and the library's absence -----------------------------------------------


def test_a_handle_of_the_wrong_kind_is_named_with_the_call_to_use(dsn):
    loop = Loop()
    try:
        async_conn = loop.run(psycopg.AsyncConnection.connect(dsn))
        with pytest.raises(TypeError, match=r"enqueue: AsyncConnection is asynchronous: use `await enqueue_async"):
            skiplock.enqueue(async_conn, "k")
        with pytest.raises(TypeError, match=r"enqueue_many: AsyncConnection is asynchronous: use `await enqueue_many_async"):
            skiplock.enqueue_many(async_conn, [{"kind": "k"}])
        loop.run(async_conn.close())
        with psycopg.connect(dsn) as sync_conn:
            with pytest.raises(TypeError, match=r"enqueue_async: Connection is synchronous: use enqueue\(\.\.\.\)"):
                loop.run(skiplock.enqueue_async(sync_conn, "k"))
        engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
        with pytest.raises(TypeError, match=r"Engine holds no transaction to join; pass the connection or session"):
            skiplock.enqueue(engine, "k")
        with pytest.raises(TypeError, match=r"enqueue: cannot enqueue on builtins.str; pass a psycopg Connection"):
            skiplock.enqueue(dsn, "k")
        configure_django()
        from django.db import connection

        with pytest.raises(TypeError, match=r"Django's connection is synchronous: call enqueue_many\(\.\.\.\)"):
            loop.run(skiplock.enqueue_many_async(connection, [{"kind": "k"}]))
        sqlite = create_engine("sqlite://")
        with sqlite.connect() as lite, pytest.raises(TypeError, match=r"SQLAlchemy's sqlite\+pysqlite dialect is not supported"):
            skiplock.enqueue(lite, "k")
    finally:
        loop.close()


def test_the_base_install_imports_none_of_the_optional_libraries(dsn):
    """With asyncpg, SQLAlchemy and Django made unimportable, the engine imports and enqueues on
    psycopg; and importing it never loads them."""
    script = """
import sys
import threading
for name in ("asyncpg", "sqlalchemy", "django"):
    sys.modules[name] = None  # import raises ImportError
import psycopg
import skiplock, console, console.queue.worker, console.queue.handles, console.queue.periodic
with psycopg.connect(sys.argv[1]) as conn:
    job = skiplock.enqueue(conn, "base_install", {"ok": True})
    ids = skiplock.enqueue_many(conn, [{"kind": "base_install"}] * 250)
print(job, len(ids), sorted(n for n in sys.modules if n.split(".")[0] in ("asyncpg", "sqlalchemy", "django") and sys.modules[n]))
"""
    out = subprocess.run([sys.executable, "-c", script, dsn], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    job, count, loaded = out.stdout.split(maxsplit=2)
    assert int(job) > 0 and count == "250" and loaded.strip() == "[]"


# --- asyncpg's placeholders -----------------------------------------------------------------

PRODUCER_STATEMENTS = ("enqueue", "enqueue_unique", "ids_by_keys", "unique_holder", "unique_point", "enqueue_many",
                       "reserve_ids", "notify_queues")


@pytest.mark.parametrize("name", PRODUCER_STATEMENTS)
def test_each_statement_translates_to_numbered_placeholders_once(name):
    text, names = handles.dollar_query(name)
    assert "%(" not in text
    numbers = {int(n) for n in re.findall(r"\$(\d+)", text)}
    assert numbers == set(range(1, len(names) + 1))
    assert set(names) == set(re.findall(r"%\((\w+)\)s", "\n".join(
        line for line in query("queue", name).splitlines() if not line.lstrip().startswith("--"))))
    assert handles.dollar_query(name) is handles.dollar_query(name)  # translated once per process


def test_the_translation_numbers_a_repeated_name_once_and_unescapes_percent():
    pattern = handles._PLACEHOLDER
    assert pattern.sub(lambda m: "%" if m.group(0) == "%%" else "$", "%(a)s %% %(b)s") == "$ % $"
    text, names = handles.dollar_query("enqueue_unique")
    assert names.count("kind") == 1 and text.count(f"${names.index('kind') + 1}::text") == 3  # the window, the job, the outbox row
