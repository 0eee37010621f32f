"""The I/O-bound handlers bench/async_io.py's Skiplock workers run: a 50 ms wait each.

`io` is awaited on the worker's event loop (`--tasks io_tasks`); `io_sync` sleeps in a handler
thread (`--tasks io_sync_tasks`, its own module so that worker has no event loop at all).
"""

import asyncio

import skiplock

WAIT = 0.05


@skiplock.task("io")
async def io(job: skiplock.Job) -> None:
    await asyncio.sleep(WAIT)
