"""The shop's handlers: `async def`, awaited on the worker's event loop, with their own async
SQLAlchemy engine (one per worker process, made on first use on the loop that awaits it).

    DATABASE_URL=... skiplock worker --tasks examples.fastapi_shop.tasks
"""

from __future__ import annotations

import os

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

import skiplock

from .app import make_engine
from .models import Order

_engine: AsyncEngine | None = None


def engine() -> AsyncEngine:
    global _engine
    if _engine is None:
        _engine = make_engine(os.environ["DATABASE_URL"])
    return _engine


@skiplock.task("shop.send_receipt", timeout=30)
async def send_receipt(job: skiplock.Job) -> None:
    # ... await the mail provider's API, with job.side_effect_key as its idempotency key ...
    async with engine().begin() as conn:
        await conn.execute(update(Order).where(Order.id == job.payload["order"]).values(receipt_sent=True))
