"""Fresh test databases made ahead of need, in a thread of their own.

Every test gets a new database copied from the migrated template (tests/conftest.py). The copy
costs 0.15 s on a quiet machine and 0.3-0.6 s on a loaded one, almost all of it waiting on
PostgreSQL, and over a thousand tests ask for one: minutes of a CI run spent in setup. Copying
the next one or two while the current test runs hides that wait. Each test still gets a
database nobody has used; only when it is made changes.

`take()` waits for a ready copy with a deadline (a stuck PostgreSQL fails the test, it does not
hang the run) and re-raises whatever stopped the thread from making one.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import psycopg

from console.db import DatabaseError, connect

# FILE_COPY: a checkpoint and a copy of the template's files, instead of every block of the
# 9 MB template written through the WAL (WAL_LOG, the default since PostgreSQL 15). A test run
# makes two thousand copies: through the WAL that is about 18 GB, and it cost 35-318 ms of server
# CPU a copy against FILE_COPY's 23-73 ms (/tmp measurements on this 2-core machine, loaded).
COPY_STRATEGY = "FILE_COPY"


class SpareDatabases:
    def __init__(self, admin_dsn: str, template: str, new_name: Callable[[], str], ahead: int = 2):
        self._admin_dsn = admin_dsn
        self._template = template
        self._new_name = new_name
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._room = threading.Semaphore(ahead)
        self._stopping = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._make_ahead, name="spare-databases", daemon=True)
        self._thread.start()

    def take(self, timeout: float = 120.0) -> str:
        try:
            item = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no test database was ready within {timeout:.0f} s") from None
        if isinstance(item, BaseException):
            self._ready.put(item)  # every later take fails the same way
            raise RuntimeError("the thread that makes test databases stopped") from item
        self._room.release()
        return item

    def stop(self) -> None:
        """Stop making copies and drop the ones nobody took."""
        self._stopping.set()
        self._room.release()
        self._thread.join(timeout=30)
        if self._conn is not None:
            self._conn.close()
        spare = []
        while not self._ready.empty():
            item = self._ready.get_nowait()
            if isinstance(item, str):
                spare.append(item)
        try:
            with connect(self._admin_dsn) as conn:
                for name in spare:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass  # the cluster is going away with them

    def _make_ahead(self) -> None:
        try:
            while not self._stopping.is_set():
                self._room.acquire()
                if self._stopping.is_set():
                    return
                self._ready.put(self._make_one())
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits for a copy
            if not self._stopping.is_set():
                self._ready.put(exc)

    def _make_one(self, patience: float = 90.0) -> str:
        """One copy. Some tests restart or crash the session's PostgreSQL: a copy cut off by that
        is made again, on a new connection, until `patience` runs out."""
        deadline = time.monotonic() + patience
        while True:
            name = self._new_name()
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self._admin_dsn, application_name="skiplock-test-spares")
                self._conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}" STRATEGY {COPY_STRATEGY}')
                return name
            except (psycopg.OperationalError, DatabaseError):  # cut off, or not accepting connections yet
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if time.monotonic() > deadline or self._stopping.is_set():
                    raise
                time.sleep(0.5)
