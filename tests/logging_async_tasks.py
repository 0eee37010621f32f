"""`async def` handlers that log, for tests/test_attempt_logs.py: concurrent tasks on the
worker's one event loop thread, each with its own records."""

from __future__ import annotations

import asyncio
import logging

import skiplock

log = logging.getLogger("shop.async")
# Two tasks that take turns on one loop: each logs, then awaits the other.
_turns = asyncio.Barrier(2)


@skiplock.task("a_log_turns")
async def a_log_turns(job: skiplock.Job) -> None:
    tag = job.payload["tag"]
    for i in range(5):
        log.info("%s record %d", tag, i)
        async with asyncio.timeout(20):
            await _turns.wait()
    if job.payload.get("fail"):
        log.error("%s gives up", tag)
        raise RuntimeError(f"{tag} failed")
