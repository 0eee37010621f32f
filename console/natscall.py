"""The console's calls to NATS JetStream: one connection made within a deadline, a call run in a
thread of its own with its own event loop and a time limit, and the broker's addresses without
credentials for messages. The broker collector (console/collectors/broker.py) and the broker
dead letters (console/maintenance/brokerdlq.py) both go through here.

A thread of its own because the caller may be inside a running event loop (the scheduler's
thread, an xdist worker that ran a Playwright test), where asyncio.run refuses to start.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from console.queue import broker


class BrokerUnavailable(RuntimeError):
    """The broker could not be reached or did not answer within the time limit (the message
    says why)."""


def masked(nats_url: str) -> str:
    """The addresses without credentials (user:password@ or token@)."""
    out = []
    for server in broker.servers(nats_url):
        scheme, sep, rest = server.rpartition("://")
        out.append(f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}")
    return ",".join(out)


async def connect(nats_url: str, timeout: float, *, name: str = "skiplock-collector") -> Any:
    """A connection, or the first error met while making it: nats-py tries the servers again and
    again until it is cancelled, reporting each failure to `error_cb` only."""
    import nats

    errors: list[BaseException] = []
    failed = asyncio.Event()

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)
        failed.set()

    connecting = asyncio.ensure_future(nats.connect(servers=broker.servers(nats_url), name=name,
                                                    connect_timeout=timeout, allow_reconnect=False,
                                                    max_reconnect_attempts=0, error_cb=on_error))
    # Its outcome once given up on is not wanted (and must not be logged as never retrieved).
    connecting.add_done_callback(lambda task: task.cancelled() or task.exception())
    failure = asyncio.ensure_future(failed.wait())
    await asyncio.wait({connecting, failure}, return_when=asyncio.FIRST_COMPLETED)
    failure.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    raise errors[0]


def call(main: Callable[[], Awaitable[Any]], nats_url: str, limit: float, *, thread_name: str,
         join_slack: float = 1.0, passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """`main()` run to its end within `limit` seconds in a thread of its own: its value, or
    BrokerUnavailable naming the broker (without credentials) and what went wrong. Exceptions of
    the `passthrough` types are the caller's own (not the broker's failure) and raised as they are."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(asyncio.wait_for(main(), limit))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name=thread_name, daemon=True)
    thread.start()
    thread.join(limit + join_slack)
    if thread.is_alive():
        raise BrokerUnavailable(f"NATS did not answer within {limit:g} s")
    error = result.get("error")
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        raise BrokerUnavailable(f"NATS did not answer within {limit:g} s") from error
    if passthrough and isinstance(error, passthrough):
        raise error
    if error is not None:
        text = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise BrokerUnavailable(f"NATS at {masked(nats_url)}: {type(error).__name__}: {text}") from error
    return result["value"]
