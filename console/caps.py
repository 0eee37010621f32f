"""Caps on what one signed-in user, or a leaked token, can make the console hold or create.

An operator who starts thirty throttled replays used to get thirty threads and thirty idle
PostgreSQL connections; nothing refused a thirty-first, so one person (or one script with a
token) could take the connections every other part of the console needs. Every resource an
authenticated request can make the console keep (a running operation, a session, a token, a
silence, a saved rule) is therefore counted, and one more than its cap is refused.

    caps = Caps.from_config(config)             # the faces; the domain takes `caps=` arguments
    with conn.transaction():
        serialise(conn, "silences")             # parallel requests queue here
        within(count_now, caps.silences, what=..., setting="caps.silences")
        ... insert ...

A count is checked in the transaction that would go past it, after a transaction-scoped
advisory lock on the cap (`serialise`), so N parallel requests cannot all see "one left": the
lock queues them and each counts what the previous one committed. A refusal is `CapReached`
(nothing written): the web answers 429 with the message, the CLI exits 2 with it. Every message
names the setting that sets the cap, the count, and what to do.

The table of every resource and its cap is in docs/security.md ("Caps per operator and per
database"). This module reads no configuration itself (`from_config` is given one) and holds no
state; caps that guard a web process's own threads (concurrent exports and webhook tests) are
per process, in `console.web.throttle`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import psycopg

from console.sqlfiles import query

LOCK_CLASS = 0x5C1B_CA95  # advisory lock namespace of caps (second key: hashtext of the cap's name)


@dataclass(frozen=True)
class Caps:
    """The `[caps]` settings (docs/configuration.md); the defaults are the settings' defaults."""

    bulk_running: int = 4          # bulk replays/purges queued or running in one database
    bulk_per_actor: int = 2        # ... of which one operator (or token owner) may hold
    sessions_per_user: int = 10    # live sign-ins of one user; one more ends the oldest
    tokens_per_user: int = 10      # live API tokens of one user
    silences: int = 100            # active silences in one database
    alert_rules: int = 200         # alert rules saved from the console in one database
    destinations: int = 50         # webhook destinations saved from the console in one database
    enqueue_per_minute: int = 60   # jobs one operator enqueues from the console per minute
    paused_queues: int = 500       # queues paused at once in one database
    exports_per_user: int = 2      # exports of one user streaming at once, per web process
    tests_per_user: int = 1        # webhook "send test" of one user at once, per web process

    @classmethod
    def from_config(cls, config: Any) -> Caps:
        section = getattr(config, "caps", None)
        if section is None:
            return cls()
        return cls(**{f.name: getattr(section, f.name) for f in fields(cls)})


class CapReached(Exception):
    """One more would go past a cap: nothing was written. HTTP 429, CLI exit 2.

    Not a ValueError: the request is well-formed, the state of the database refuses it."""

    def __init__(self, message: str, *, setting: str, limit: int, count: int):
        super().__init__(message)
        self.setting, self.limit, self.count = setting, limit, count


def serialise(conn: psycopg.Connection, cap: str) -> None:
    """Queue parallel checks of `cap` in this database until the caller's transaction ends."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("serialise() needs an open transaction: the lock is held until it ends")
    conn.execute("SELECT pg_advisory_xact_lock(%s::integer, hashtext(%s))", (_signed(LOCK_CLASS), cap))


def within(count: int, limit: int, *, what: str, setting: str, advice: str) -> None:
    """Raise CapReached when `count` things already held leave no room for one more."""
    if count >= limit:
        raise CapReached(f"{what}: {count:,} already, the cap is {limit:,} ({setting}); {advice}",
                         setting=setting, limit=limit, count=count)


def check_enqueues(conn: psycopg.Connection, actor: str, limit: int) -> None:
    """In the caller's transaction, before it enqueues: CapReached when `actor` enqueued `limit`
    jobs from the console within the last minute (caps.enqueue_per_minute), counted from the audit
    rows every console enqueue writes with its job."""
    serialise(conn, f"enqueue:{actor}")
    held = conn.execute(query("audit", "caps_enqueues"), {"actor": actor}).fetchone()[0]
    within(held, limit, what=f"jobs enqueued by {actor!r} from the console in the last minute",
           setting="caps.enqueue_per_minute", advice="wait a minute, or enqueue in bulk from your application")


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value
