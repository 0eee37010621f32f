"""Application code as `mypy --strict` sees it: tests/test_typing.py checks this file.

Not a test module (pytest does not collect it) and never run: it is read by the type checker.
The misuses at the end carry `type: ignore[...]` comments; --strict reports an ignore that is
not needed, so if the public API lost its types (became Any), this file would fail the check.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import skiplock


@skiplock.task("send_email", concurrency=2)
def send_email(job: skiplock.Job) -> None:
    order: int = job.payload["order"]
    key: str = job.side_effect_key
    attempt: int = job.attempt
    if job.cancel_requested():
        raise skiplock.Cancelled(f"order {order}, {key}, attempt {attempt}")


@skiplock.schedule("nightly-report", cron="0 3 * * *", timezone="Europe/Berlin")
def nightly_report(job: skiplock.Job) -> str:
    return f"report {job.id}"


# The decorators hand the handler back with its own type.
report: Callable[[skiplock.Job], str] = nightly_report


def place_order(conn: psycopg.Connection[Any]) -> list[int]:
    with conn.transaction():
        one: int = skiplock.enqueue(conn, "send_email", {"order": 42}, queue="mail", priority=1,
                                    run_at=datetime.now(UTC) + timedelta(minutes=5), idempotency_key="receipt-42",
                                    max_attempts=3, unique_for=timedelta(hours=1))
        many: list[int] = skiplock.enqueue_many(conn, [skiplock.NewJob("send_email", {"order": 43}),
                                                       {"kind": "send_email", "priority": 5}])
    return [one, *many]


def place_order_orm(session: Session) -> int:
    return skiplock.enqueue(session, "send_email", {"order": 44})


async def place_order_async(conn: psycopg.AsyncConnection[Any], session: AsyncSession) -> list[int]:
    first = await skiplock.enqueue_async(conn, "send_email", {"order": 45})
    rest = await skiplock.enqueue_many_async(session, [{"kind": "send_email"}])
    return [first, *rest]


def misuse(conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], session: AsyncSession) -> None:
    skiplock.enqueue(conn, 42)  # type: ignore[arg-type]
    skiplock.enqueue(conn, "k", priority="high")  # type: ignore[arg-type]
    skiplock.enqueue(conn, "k", run_at="tomorrow")  # type: ignore[arg-type]
    skiplock.enqueue(aconn, "k")  # type: ignore[arg-type]
    skiplock.enqueue(session, "k")  # type: ignore[arg-type]
    skiplock.enqueue_async(conn, "k")  # type: ignore[arg-type,unused-coroutine]
    text: str = skiplock.enqueue(conn, "k")  # type: ignore[assignment]
    skiplock.enqueue_many(conn, ["send_email"])  # type: ignore[list-item]
    del text
