"""SQLAlchemy 2 and Skiplock: the job joins the session's transaction (sync and async).

    DATABASE_URL=postgresql://app@localhost/app python examples/sqlalchemy_recipe.py

Runs the recipe against that database (it needs `skiplock migrate` first, and creates its own
table): an order placed with its job, one refused (both roll back), and a savepoint rolled back
inside a transaction that commits (its job goes with it). Prints what is in the tables.
"""

from __future__ import annotations

import asyncio
import os
import sys

import psycopg
from sqlalchemy import BigInteger, Integer, create_engine, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import skiplock


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "recipe_invoices"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    total: Mapped[int] = mapped_column(Integer)


# An engine from a libpq address (URL or key=value): SQLAlchemy's own URL form works as well,
# e.g. create_engine("postgresql+psycopg://app@localhost/app").
def engines(database_url: str):
    sync = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(database_url))
    async_ = create_async_engine("postgresql+psycopg://",
                                 async_creator=lambda: psycopg.AsyncConnection.connect(database_url))
    return sync, async_


def place(session: Session, total: int) -> int:
    """One invoice and its job, in the caller's transaction."""
    invoice = Invoice(total=total)
    session.add(invoice)
    session.flush()  # the id, inside the transaction
    skiplock.enqueue(session, "invoice.send", {"invoice": invoice.id}, idempotency_key=f"invoice-{invoice.id}")
    if total <= 0:
        raise ValueError("total must be positive")
    return invoice.id


async def place_async(session: AsyncSession, total: int) -> int:
    invoice = Invoice(total=total)
    session.add(invoice)
    await session.flush()
    await skiplock.enqueue_async(session, "invoice.send", {"invoice": invoice.id}, idempotency_key=f"invoice-{invoice.id}")
    return invoice.id


def main(database_url: str) -> dict[str, list]:
    sync_engine, async_engine = engines(database_url)
    Base.metadata.create_all(sync_engine)

    # 1. commit: the invoice and its job together
    with Session(sync_engine) as session, session.begin():
        place(session, 10)

    # 2. an exception inside begin(): both roll back
    try:
        with Session(sync_engine) as session, session.begin():
            place(session, 0)
    except ValueError:
        pass

    # 3. a savepoint rolled back inside a transaction that commits: its job goes with it
    with Session(sync_engine) as session, session.begin():
        place(session, 20)
        try:
            with session.begin_nested():
                place(session, -1)
        except ValueError:
            pass

    # 4. the same with an AsyncSession (postgresql+asyncpg:// works too)
    async def placed_async() -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            await place_async(session, 30)
        await async_engine.dispose()

    asyncio.run(placed_async())

    with Session(sync_engine) as session:
        totals = list(session.scalars(select(Invoice.total).order_by(Invoice.id)))
    with psycopg.connect(database_url) as conn:
        keys = [row[0] for row in conn.execute(
            "SELECT idempotency_key FROM skiplock.jobs WHERE kind = 'invoice.send' ORDER BY id")]
    sync_engine.dispose()
    return {"invoices": totals, "jobs": keys}


if __name__ == "__main__":
    result = main(os.environ["DATABASE_URL"])
    print(f"invoices (totals): {result['invoices']}")
    print(f"jobs (keys):       {result['jobs']}")
    sys.exit(0)
