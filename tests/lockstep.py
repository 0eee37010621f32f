"""Races run in lockstep: pause a real caller inside its transaction at a chosen statement, start
a second one, and see it wait on a lock, so that a test of a lock fails on every run when the
lock is gone (docs/reliability.md, "Promises that rest on a lock").

- `pause_after(conn, sql_text)`: the next time `conn` runs `sql_text` (a named query's text,
  from `console.sqlfiles.query`), the calling thread stops right after the statement, inside
  its transaction, until `Pause.release()`. The product code runs unchanged: only the cursor
  class of that one connection is swapped (psycopg's `Connection.cursor_factory`).
- `Call`: a function run in a thread of its own, with its result or exception kept.
- `Lockstep`: keeps the pauses and calls of one test; `close()` releases every pause and
  joins every call, so a failed assertion never leaves a caller paused with its locks held (or
  a connection closed under a thread still inside a statement on it).
- `blocked_on(observer, pid)`: the lock a backend waits for and who holds it, read from
  pg_locks and pg_blocking_pids(); `wait_until_blocked` polls it with a deadline and fails at
  once when the call ends without ever waiting.

Nothing here sleeps to let a race happen: every step waits for an event or a lock, with a
deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

DEADLINE = 20.0  # seconds; a step that takes longer is a failure, never a hang


class Pause:
    """Where a paused caller stands: `reached` is set once it ran the statement; `release()`
    lets it go on."""

    def __init__(self, sql_text: str):
        self.sql_text = sql_text
        self.reached = threading.Event()
        self._go = threading.Event()
        self.used = False

    def wait_reached(self, timeout: float = DEADLINE) -> None:
        assert self.reached.wait(timeout), f"the caller never ran the statement to pause at: {self.sql_text[:80]!r}"

    def release(self) -> None:
        self._go.set()

    def _hold(self) -> None:
        self.used = True
        self.reached.set()
        if not self._go.wait(DEADLINE * 3):
            raise TimeoutError("a paused caller was never released")


def pause_after(conn: psycopg.Connection, sql_text: str) -> Pause:
    """Pause `conn`'s caller right after it first runs `sql_text` (exact text), inside its
    transaction. Later runs of the statement go on unpaused."""
    pause = Pause(sql_text)
    base = conn.cursor_factory

    class PausingCursor(base):  # type: ignore[misc, valid-type]
        def execute(self, query, params=None, **kwargs):
            result = super().execute(query, params, **kwargs)
            if not pause.used and query == pause.sql_text:
                pause._hold()
            return result

    conn.cursor_factory = PausingCursor
    return pause


class Call:
    """`fn()` in a thread of its own; `result()` joins with a deadline and re-raises."""

    def __init__(self, fn: Callable[[], Any], name: str = "call"):
        self._value: Any = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self, timeout: float = DEADLINE) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.thread.name} did not finish within {timeout:g} s"
        if self._error is not None:
            raise self._error
        return self._value


def blocked_on(observer: psycopg.Connection, pid: int) -> dict[str, Any] | None:
    """The lock backend `pid` waits for ({locktype, mode, blockers, query}), or None."""
    with observer.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT l.locktype, l.mode, pg_blocking_pids(l.pid) AS blockers,
                      (SELECT a.query FROM pg_stat_activity AS a WHERE a.pid = l.pid) AS query
               FROM pg_locks AS l
               WHERE l.pid = %s
                 AND NOT l.granted
               LIMIT 1""", (pid,)).fetchone()


def wait_until_blocked(observer: psycopg.Connection, pid: int, call: Call, timeout: float = DEADLINE) -> dict[str, Any]:
    """Poll until backend `pid` (the one `call` runs on) waits on a lock; fail at once if `call`
    ends first (it went through without waiting: the lock is gone) or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        wait = blocked_on(observer, pid)
        if wait is not None:
            return wait
        if call.done:
            try:
                value = call.result(0)
            except BaseException as exc:  # noqa: BLE001 - reported in the assertion
                value = f"raised {exc!r}"
            raise AssertionError(f"{call.thread.name} finished without waiting on any lock (got {value!r})")
        assert time.monotonic() < deadline, f"{call.thread.name} did not wait on a lock within {timeout:g} s"
        time.sleep(0.01)


class Lockstep:
    """The pauses and calls of one test, all let go by `close()` (the fixture's teardown)."""

    def __init__(self) -> None:
        self.pauses: list[Pause] = []
        self.calls: list[Call] = []

    def pause_after(self, conn: psycopg.Connection, sql_text: str) -> Pause:
        self.pauses.append(pause_after(conn, sql_text))
        return self.pauses[-1]

    def call(self, fn: Callable[[], Any], name: str = "call") -> Call:
        self.calls.append(Call(fn, name))
        return self.calls[-1]

    def close(self, connections: list[psycopg.Connection] = ()) -> None:
        """Release every pause, then end the transactions the test itself left open on
        `connections` (a call may be waiting on one of them), and join every call."""
        for pause in self.pauses:
            pause.release()
        for call in self.calls:
            call.thread.join(2.0)
        for conn in connections:
            if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                conn.rollback()  # psycopg serialises this with a call's use of the connection
        for call in self.calls:
            call.thread.join(DEADLINE)
