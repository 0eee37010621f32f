"""The handler registry: `@console.task("send_email")` binds a job kind to a function.

A handler is called as `handler(job)` with a `console.queue.Job` (id, attempt, payload,
side_effect_key, ...). Returning normally completes the job; raising fails the attempt
(retried with backoff); raising `console.DoNotRetry` sends it straight to the dead letters.

`@console.task("kind", concurrency=N)` also caps how many jobs of that kind run at once across
the whole fleet (console.queue.limits; each worker writes its kinds' limits when it starts).

`@console.task("kind", inline=True)` runs the handler on the worker's claim thread instead of a
handler thread: no hand-off between threads, but while it runs the worker claims nothing, so
mark only handlers that finish in about a millisecond and never block (no network, no sleep).

An `async def` handler is awaited on the worker's event loop (console.queue.aio) instead of a
handler thread: hundreds of them wait on I/O at once in one process. Sync and async handlers
may share a tasks module; each job goes to the runtime its kind's handler was written for.

`@console.task("kind", batch=100)` registers a batch handler: it is called as `handler(jobs)`
with a list of up to 100 claimed jobs of that kind (sync, on a handler thread, or awaited when
it is an `async def`). Returning completes every job of the list (fenced per job, in the
worker's one completion statement); raising `console.BatchFailure({job.id: error})` fails the
jobs it names (each retried or dead-lettered on its own) and completes the others; raising
anything else fails every job of the list. A batch takes one handler thread (or one slot of
the event loop), its `timeout` bounds the whole call, its log records are kept with every job
of the list. `batch` cannot be combined with `inline` or `concurrency` (ValueError): see
docs/queue.md, "Batch handlers".

`@console.task("kind", timeout=30)` bounds one run: an async handler is cancelled at the
deadline (`asyncio.CancelledError` at the await it is in), a sync one is asked to stop
(`job.cancel_requested()` turns true, `job.cancel_event` is set: a thread cannot be stopped
from outside); either way what it raises then is recorded as `JobTimeout`, a failed attempt
that is retried with backoff like any other.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

Handler = Callable[[Any], Any]
F = TypeVar("F", bound=Callable[..., Any])  # the decorated handler, returned with its own type

_registry: dict[str, Handler] = {}
_concurrency: dict[str, int | None] = {}
_inline: set[str] = set()
_async: set[str] = set()
_timeouts: dict[str, float] = {}
_batches: dict[str, int] = {}

# The largest batch a kind may declare: the worker claims a batch kind's jobs up to this many
# per free handler slot in one statement, and one statement should not lock tens of thousands
# of rows at once (nor hand one call that many jobs to finish within one lease).
MAX_BATCH = 10_000


class UnknownTask(LookupError):
    """A job's kind has no handler in this worker."""


def task(kind: str, *, concurrency: int | None = None, inline: bool = False,
         timeout: float | None = None, batch: int | None = None) -> Callable[[F], F]:
    """Bind `kind` to the decorated function, returned unchanged; workers call it as `func(job)`
    with a `Job` (an `async def` function is awaited on the worker's event loop). Returning
    completes the job; raising fails the attempt (retried with backoff); raising `DoNotRetry`
    sends it straight to the dead letters.

    `concurrency` caps its running jobs fleet-wide; `inline` runs it on the worker's claim
    thread (short, non-blocking sync handlers only); `timeout` (seconds) bounds one run: an
    async handler is cancelled at the deadline, a sync one sees `job.cancel_requested()`, and
    the attempt fails with `JobTimeout` (retried). A kind registered twice to different
    functions raises ValueError.

    `batch=N` (1 to 10,000) makes it a batch handler, called as `func(jobs)` with a list of up
    to N claimed jobs of the kind: returning completes them all; raising `BatchFailure({job.id:
    error})` fails the named jobs (each retried or dead-lettered on its own) and completes the
    others; raising anything else fails every job of the list (`DoNotRetry`: all become dead
    letters). `timeout` then bounds the whole call. `batch` with `inline=True` or with
    `concurrency` raises ValueError (docs/queue.md, "Batch handlers").

    The `logging` records the function emits while it runs are kept with the attempt,
    redacted and bounded (`[worker] log_records`, `log_message_chars`, `log_attempt_chars`),
    and shown on the job's page: docs/queue.md, "Per-attempt logs"."""
    if not isinstance(kind, str) or not kind:
        raise ValueError("a task kind must be a non-empty string")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError(f"task {kind!r}: concurrency must be a positive whole number (got {concurrency!r})")
    if not isinstance(inline, bool):
        raise ValueError(f"task {kind!r}: inline must be True or False (got {inline!r})")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0):
        raise ValueError(f"task {kind!r}: timeout must be a positive number of seconds (got {timeout!r})")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"task {kind!r}: batch must be a positive whole number of jobs (got {batch!r})")
        if batch > MAX_BATCH:
            raise ValueError(f"task {kind!r}: batch must be at most {MAX_BATCH:,} jobs (got {batch:,})")
        if inline:
            raise ValueError(f"task {kind!r}: a batch handler cannot be inline (a batch runs on a handler thread "
                             "or the event loop, never on the claim thread)")
        if concurrency is not None:
            raise ValueError(f"task {kind!r}: batch and concurrency cannot be combined yet (the fleet-wide limit "
                             "claims a limited kind one free handler slot at a time, so its batches would not form); "
                             "limit the kind's queue or drop one of them")

    def register(func: F) -> F:
        existing = _registry.get(kind)
        if existing is not None and existing is not func and getattr(existing, "__qualname__", None) != func.__qualname__:
            raise ValueError(f"task kind {kind!r} is already registered to {existing.__module__}.{existing.__qualname__}")
        is_coroutine = inspect.iscoroutinefunction(func)
        if inline and is_coroutine:
            raise ValueError(f"task {kind!r}: an async handler cannot be inline (it runs on the worker's event loop)")
        _registry[kind] = func
        _concurrency[kind] = concurrency
        (_inline.add if inline else _inline.discard)(kind)
        (_async.add if is_coroutine else _async.discard)(kind)
        if timeout is None:
            _timeouts.pop(kind, None)
        else:
            _timeouts[kind] = float(timeout)
        if batch is None:
            _batches.pop(kind, None)
        else:
            _batches[kind] = batch
        return func

    return register


def handler_for(kind: str) -> Handler:
    try:
        return _registry[kind]
    except KeyError:
        raise UnknownTask(f"no handler registered for kind {kind!r} in this worker (known: {', '.join(sorted(_registry)) or 'none'})") from None


def is_inline(kind: str) -> bool:
    """True when the kind's handler was registered with inline=True."""
    return kind in _inline


def is_async(kind: str) -> bool:
    """True when the kind's handler is an `async def` function (run on the worker's loop)."""
    return kind in _async


def any_async() -> bool:
    """True when some registered handler is async: the worker then starts its event loop."""
    return bool(_async)


def timeout_for(kind: str) -> float | None:
    """The kind's declared timeout in seconds (None: none)."""
    return _timeouts.get(kind) if _timeouts else None


def batch_of(kind: str) -> int | None:
    """The kind's declared batch size (None: a single-job handler)."""
    return _batches.get(kind) if _batches else None


def batch_kinds() -> list[str]:
    """The kinds registered with `batch=`, sorted."""
    return sorted(_batches)


def registered() -> dict[str, Handler]:
    return dict(_registry)


def concurrency_limits() -> dict[str, int | None]:
    """Every registered kind with its declared concurrency (None: no limit)."""
    return {kind: _concurrency.get(kind) for kind in _registry}


def load_modules(names: str | list[str]) -> list[str]:
    """Import the user's task modules ("myapp.tasks,myapp.more") so their decorators run."""
    modules = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    for name in modules:
        importlib.import_module(name)
    return modules
