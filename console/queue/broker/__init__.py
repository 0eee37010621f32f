"""Broker queues: a queue served by NATS JetStream instead of skiplock.jobs (issue 32, first
slice; docs/exit-plan.md).

A queue's backend is a column of its `skiplock.queues` row (migration 030): 'postgres' (the
default, and every queue without a row) or 'nats'. `enqueue(conn, ...)` is unchanged for the
application: for a nats queue the same statement writes the job to `skiplock.outbox` in the
caller's transaction (sql/queue.sql). Then:

- `relay` (`skiplock relay`): one leader per database publishes the outbox to JetStream, each
  message with `Nats-Msg-Id` = the row's msg_id, and marks rows sent after the broker's ack;
- `natsworker` (`skiplock worker --backend nats --queues ...`): runs the same `@task` handlers
  from a work-queue stream per queue through a durable pull consumer.

This module holds what both share: the names of streams, subjects and consumers, the check
of a broker queue's name, and switching a queue's backend. It imports no NATS client: the base
install (and `import skiplock`) never needs nats-py; `relay` and `natsworker` import it.

Moving a queue with its dual-run window and the advisor's verdict (`skiplock queues move`,
`skiplock exit-plan`) is console.exitplan's; it calls `set_backend(..., move=True)`. The console
shows broker queues through console/collectors/broker.py, and console.maintenance.brokerdlq replays
and purges their dead letters (the CLI's `skiplock replay/purge --queue`, the console's
/deadletters/broker/<queue>). Setting a queue's backend here only routes its NEW jobs: jobs already in
skiplock.jobs stay there for the PostgreSQL workers to finish.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from console import audit
from console.actions import clean_reason
from console.sqlfiles import query

BACKENDS = ("postgres", "nats")
# A broker queue's name is a token of a NATS subject and part of a stream's name: letters,
# digits, '_' and '-' (no '.', '*', '>', whitespace or path separators).
_QUEUE = re.compile(r"[A-Za-z0-9_-]{1,100}")
CONSUMER = "skiplock"  # the durable pull consumer every worker of a queue shares
MSG_ID = "Nats-Msg-Id"  # JetStream's de-duplication header
JOB_ID = "Skiplock-Job-Id"


class InvalidBrokerQueue(ValueError):
    """A queue name (or backend) a broker cannot serve; the message says why."""


def servers(nats_url: str) -> list[str]:
    """`[broker] nats_url` (comma-separated addresses) as the NATS client's server list."""
    return [part.strip() for part in nats_url.split(",") if part.strip()]


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not _QUEUE.fullmatch(queue):
        raise InvalidBrokerQueue(f"queue {queue!r} cannot be served by a broker: its name must be 1-100 letters, "
                                 "digits, '_' or '-' (it becomes a NATS subject token and part of a stream name)")
    return queue


def stream(queue: str) -> str:
    """The work-queue stream of `queue`'s jobs."""
    return f"skiplock_jobs_{check_queue(queue)}"


def subject(queue: str) -> str:
    return f"skiplock.jobs.{check_queue(queue)}"


def dead_stream(queue: str) -> str:
    """The stream of `queue`'s dead letters (kept by limits, not a work queue)."""
    return f"skiplock_dead_{check_queue(queue)}"


def dead_subject(queue: str) -> str:
    return f"skiplock.dead.{check_queue(queue)}"


def backend_of(conn: psycopg.Connection, queue: str) -> str:
    """'postgres' or 'nats': which backend serves `queue`'s new jobs."""
    return str(conn.execute(query("broker", "backend_of"), {"queue": queue}).fetchone()[0])


def check_backend(queue: str, backend: str) -> None:
    """InvalidBrokerQueue unless `queue` can be served by `backend` (before anything is read)."""
    if backend not in BACKENDS:
        raise InvalidBrokerQueue(f"backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if backend == "nats":
        check_queue(queue)
    elif not isinstance(queue, str) or not queue.strip():
        raise InvalidBrokerQueue("queue must be a non-empty string")


def set_backend(conn: psycopg.Connection, queue: str, backend: str, *, actor: str, reason: str,
                move: bool = False, left: dict[str, Any] | None = None) -> dict[str, Any]:
    """Route `queue`'s new jobs to `backend` ('postgres' or 'nats'), audited with `reason`
    (required); returns {"queue", "before", "after", "changed"}. Jobs already enqueued stay where
    they are: switching to 'nats' leaves skiplock.jobs' pending jobs to the PostgreSQL workers, and
    switching back leaves unsent outbox rows to the relay.

    `move` (`skiplock queues move`, console.exitplan): audited as 'move queue' with `left`, what
    the old side still held when it moved (the dual-run window); a queue that already has that
    backend is left alone, with no audit row (`changed` False). Without it ('set backend',
    `skiplock queues backend`) the switch is written and audited every time, as before."""
    check_backend(queue, backend)
    if not actor:
        raise ValueError("an action needs an actor")
    if clean_reason(reason) is None:
        raise ValueError("switching a queue's backend needs a reason for the audit log")
    with conn.transaction():
        before = backend_of(conn, queue)
        if move and before == backend:
            return {"queue": queue, "before": before, "after": backend, "changed": False}
        conn.execute(query("broker", "set_backend"), {"queue": queue, "backend": backend})
        detail: dict[str, Any] = {"before": before, "after": backend}
        if move and left is not None:
            detail["left"] = left
        audit.record(conn, actor=actor, action="move queue" if move else "set backend", target=f"queue:{queue}",
                     selection={"queue": queue}, reason=reason, rows=1, outcome="ok", detail=detail)
    return {"queue": queue, "before": before, "after": backend, "changed": before != backend}


def broker_queues(conn: psycopg.Connection, backend: str = "nats") -> list[str]:
    """The queues whose backend is `backend`."""
    return [r[0] for r in conn.execute(query("broker", "broker_queues"), {"backend": backend}).fetchall()]
