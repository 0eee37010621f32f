"""The example shop on FastAPI: an order and its receipt job commit in the request's transaction.

    DATABASE_URL=postgresql://app@localhost/app uvicorn examples.fastapi_shop.app:app
    DATABASE_URL=... skiplock worker --tasks examples.fastapi_shop.tasks

`transaction` is the dependency that provides the handle: an async SQLAlchemy session inside
`session.begin()`, so whatever the endpoint adds (the order) and enqueues (its job) commits
when the endpoint returns, and rolls back together when it raises. Skiplock's schema must exist
(`skiplock migrate`); the app creates its own table at start-up.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

import skiplock

from .models import Base, Order


def make_engine(database_url: str) -> AsyncEngine:
    """An async engine on psycopg 3, from a libpq address (a URL or key=value pairs, as
    `skiplock` takes it). `postgresql+asyncpg://` works the same for enqueue_async."""
    return create_async_engine("postgresql+psycopg://",
                               async_creator=lambda: psycopg.AsyncConnection.connect(database_url))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = make_engine(os.environ["DATABASE_URL"])
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await engine.dispose()


app = FastAPI(title="Skiplock example shop", lifespan=lifespan)


async def transaction() -> AsyncIterator[AsyncSession]:
    """The request's transaction: commits after the endpoint returns, rolls back if it raises."""
    async with app.state.sessions() as session, session.begin():
        yield session


Transaction = Annotated[AsyncSession, Depends(transaction)]


class NewOrder(BaseModel):
    total: int


@app.post("/orders", status_code=201)
async def create_order(new: NewOrder, session: Transaction) -> dict[str, int]:
    order = Order(total=new.total)
    session.add(order)
    await session.flush()  # the order's id, in this transaction
    job_id = await skiplock.enqueue_async(session, "shop.send_receipt", {"order": order.id}, queue="mail",
                                          idempotency_key=f"receipt-{order.id}")
    if new.total <= 0:  # a check that fails after the enqueue: the order and the job roll back
        raise HTTPException(status_code=400, detail="total: must be positive")
    return {"order": order.id, "job": job_id}


@app.get("/orders/{order_id}")
async def get_order(order_id: int, session: Transaction) -> dict[str, int | bool]:
    order = await session.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail=f"order {order_id}: not found")
    return {"order": order.id, "total": order.total, "receipt_sent": order.receipt_sent}
