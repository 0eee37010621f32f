"""Enqueue: a job exists if and only if the caller's transaction commits.

One API for every handle an application holds (console.queue.handles lists them):

    job_id = enqueue(handle, "send_email", {"order": 42}, queue="mail")          # sync handles
    job_id = await enqueue_async(handle, "send_email", {"order": 42})           # async handles
    ids = enqueue_many(handle, [NewJob("a"), {"kind": "b", "priority": 5}])     # and _async

The job is written in the handle's transaction (a psycopg or asyncpg transaction, a SQLAlchemy
session or connection, Django's `atomic()` block, a savepoint inside any of them): it commits
or rolls back with the business change, and the workers' doorbell (NOTIFY, sent by the same
statement) is delivered by PostgreSQL only when it commits. On a handle in autocommit the job
commits at once.

How: each call is a generator of `Step`s (a named query of sql/queue.sql and its parameters)
that `handles.run` or `handles.run_async` drives on the handle's adapter, so the sync and async
calls, and every handle, share this module's logic and the SQL file. The options and the
payload are checked before any statement runs, with the same `InvalidJob` message whatever the
handle.

Broker queues (docs/exit-plan.md): a queue whose backend is 'nats' (`skiplock.queues.backend`,
console.queue.broker) gets its jobs in `skiplock.outbox` instead, written by the same statements
in the same transaction (they read the queue's row by its key), and the relay publishes them.
The caller sees no difference: the same call, the same id (drawn from the jobs' sequence), the
same idempotency keys, held across both tables.

Uniqueness windows (`unique_for=timedelta`): the key (kind, idempotency_key) is claimed in
`skiplock.unique_keys` until the window ends, and a second enqueue inside it returns the first
job's id whatever became of that job (pending, running, completed, failed, archived, even
purged). Enqueues without `unique_for` never read that table.

This module claims nothing and never commits for the caller (except the COPY path on an
autocommit connection, whose three statements must commit together).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from console.jsonbounds import MAX_DEPTH as MAX_PAYLOAD_DEPTH
from console.jsonbounds import too_deep
from console.queue import handles, telemetry
from console.queue.handles import AsyncHandle, CopyStep, JsonText, Step, Steps, SyncHandle
from console.queue.protocol import DEFAULT_MAX_ATTEMPTS, InvalidJob

COPY_THRESHOLD = 200  # a key-less batch at least this long goes through COPY (bench/enqueue.py)
UNIQUE_TRIES = 5  # a window that expires between two statements is claimed again, this often
MAX_GROUP_LENGTH = 200  # a group key (tenant, customer, integration) is at most this many characters


@dataclass
class NewJob:
    """One job for `enqueue_many`: the same options as `enqueue` (without `unique_for`)."""

    kind: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    group: str | None = None


_NEW_JOB_FIELDS = frozenset(f.name for f in fields(NewJob))


# --- checks (before any statement, the same for every handle) -------------------------------

_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def check_payload(payload: Any) -> JsonText:
    """The payload as JSON text (None becomes `{}`); InvalidJob when it is not JSON or nests
    deeper than console.jsonbounds.MAX_DEPTH (deeper values break whoever reads them with
    Python's json: it recurses per level). The count of brackets answers at once for ordinary
    payloads."""
    try:
        text = _JSON.encode({} if payload is None else payload)
    except RecursionError:
        raise InvalidJob(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} levels (arrays and objects count one level each)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    if too_deep(text, MAX_PAYLOAD_DEPTH):
        raise InvalidJob(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} levels (arrays and objects count one level each)")
    return JsonText(text)


def check_group(group: Any) -> str | None:
    """A job's group key (fair queues, docs/queue.md): None, or a non-empty string of at most
    MAX_GROUP_LENGTH characters."""
    if group is None:
        return None
    if not isinstance(group, str):
        raise InvalidJob(f"group must be a string (a tenant, customer or integration) or None, not {type(group).__name__}")
    if not group.strip():
        raise InvalidJob("group must not be empty (leave it out, None, for the queue's shared group)")
    if len(group) > MAX_GROUP_LENGTH:
        raise InvalidJob(f"group is {len(group)} characters long; at most {MAX_GROUP_LENGTH}")
    if "\x00" in group:
        raise InvalidJob("group must not contain a NUL character")
    return group


def _check(kind: Any, queue: Any, priority: Any, max_attempts: Any, run_at: Any = None,
           idempotency_key: Any = None, group: Any = None) -> None:
    if not isinstance(kind, str) or not kind.strip():
        raise InvalidJob("kind must be a non-empty string")
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidJob("queue must be a non-empty string")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise InvalidJob("priority must be an integer between -32768 and 32767")
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                     or not 1 <= max_attempts <= 2**31 - 1):
        raise InvalidJob("max_attempts must be a positive integer")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJob("run_at must be a datetime (or None for now)")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            # psycopg sends a naive time for the server to read in its session's time zone,
            # asyncpg reads it as the client's local time: two instants for one value.
            raise InvalidJob("run_at must be timezone-aware (for example datetime.now(UTC) + timedelta(minutes=5))")
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        raise InvalidJob("idempotency_key must be a string (or None)")
    check_group(group)


def _window_seconds(unique_for: Any, idempotency_key: str | None) -> float:
    if isinstance(unique_for, bool) or not isinstance(unique_for, timedelta | int | float):
        raise InvalidJob("unique_for must be a timedelta (or a number of seconds)")
    seconds = unique_for.total_seconds() if isinstance(unique_for, timedelta) else float(unique_for)
    if not 0 < seconds <= 366 * 86400:
        raise InvalidJob("unique_for must be more than 0 seconds and at most 366 days")
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise InvalidJob("unique_for needs an idempotency_key (the window is per kind and key)")
    return seconds


def _batch(jobs: Iterable[NewJob | Mapping[str, Any]]) -> list[NewJob]:
    """The batch as NewJobs, every one checked; InvalidJob names the first bad one."""
    if isinstance(jobs, NewJob | Mapping | str | bytes):
        raise InvalidJob("enqueue_many takes an iterable of jobs (NewJob or dicts), not one job")
    items: list[NewJob] = []
    for number, job in enumerate(jobs, start=1):
        if isinstance(job, NewJob):
            item = job
        elif isinstance(job, Mapping):
            unknown = sorted(str(k) for k in job if k not in _NEW_JOB_FIELDS)
            if unknown:
                raise InvalidJob(f"job {number}: unknown option(s) {', '.join(unknown)} "
                                 f"(a job has {', '.join(f.name for f in fields(NewJob))})")
            if "kind" not in job:
                raise InvalidJob(f"job {number}: kind must be a non-empty string")
            item = NewJob(**job)
        else:
            raise InvalidJob(f"job {number}: a job is a NewJob or a dict, not {type(job).__name__}")
        try:
            _check(item.kind, item.queue, item.priority, item.max_attempts, item.run_at, item.idempotency_key, item.group)
        except InvalidJob as exc:
            raise InvalidJob(f"job {number}: {exc}") from None
        items.append(item)
    present_keys = [item.idempotency_key for item in items if item.idempotency_key is not None]
    if len(present_keys) != len(set(present_keys)):
        raise InvalidJob("the same idempotency key appears twice in one batch")
    return items


# --- the steps ------------------------------------------------------------------------------


def _enqueue_steps(kind: Any, payload: Any, queue: Any, priority: Any, run_at: Any, idempotency_key: Any,
                   max_attempts: Any, unique_for: Any, headers: JsonText | None = None, group: Any = None) -> Steps[int]:
    _check(kind, queue, priority, max_attempts, run_at, idempotency_key, group)
    window = None if unique_for is None else _window_seconds(unique_for, idempotency_key)
    params = {
        "queue": queue,
        "kind": kind,
        "payload": check_payload(payload),
        "priority": priority,
        "run_at": run_at,
        "max_attempts": max_attempts or DEFAULT_MAX_ATTEMPTS,
        "idempotency_key": idempotency_key,
        "headers": headers,
        "group_key": group,
    }
    if window is None:
        return (yield from _insert_one(params))
    return (yield from _insert_unique(params, window))


def _insert_one(params: dict[str, Any]) -> Steps[int]:
    """One INSERT; with an idempotency key a job in the table already has, that job's id."""
    while True:
        rows = yield Step("enqueue", params)
        if rows:
            return int(rows[0][0])
        found = yield Step("ids_by_keys", {"keys": [params["idempotency_key"]]})
        if found:
            return int(found[0][1])
        # The conflicting row left the table between the two statements: insert again.


def _insert_unique(params: dict[str, Any], window: float) -> Steps[int]:
    key = {"kind": params["kind"], "idempotency_key": params["idempotency_key"]}
    for _ in range(UNIQUE_TRIES + 1):
        ((claimed_id, inserted_id, *_),) = yield Step("enqueue_unique", {**params, "unique_for": window})
        if inserted_id is not None:
            return int(inserted_id)
        if claimed_id is not None:
            # The window is ours, but the hot table already holds a job with this key (enqueued
            # without a window, or its window expired): that job is the answer; point at it.
            job_id = yield from _insert_one(params)
            yield Step("unique_point", {**key, "job_id": job_id})
            return job_id
        holder = yield Step("unique_holder", key)
        if holder:
            return int(holder[0][0])
        # The window expired between the two statements (or was pruned): claim it again.
    raise RuntimeError(f"could not claim the uniqueness window of ({params['kind']!r}, {params['idempotency_key']!r})")  # pragma: no cover


def _insert_steps(items: list[NewJob], headers: JsonText | None = None) -> Steps[list[int]]:
    """One INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING: the keyed (and small)
    path, and every handle's path when the handle cannot COPY."""
    keys = [item.idempotency_key for item in items]
    present_keys = [k for k in keys if k is not None]
    params = {
        "queues": [i.queue for i in items],
        "kinds": [i.kind for i in items],
        "payloads": [check_payload(i.payload) for i in items],
        "priorities": [i.priority for i in items],
        "run_ats": [i.run_at for i in items],
        "max_attempts": [i.max_attempts or DEFAULT_MAX_ATTEMPTS for i in items],
        "keys": keys,
        "groups": [i.group for i in items],
        "headers": headers,
    }
    rows = yield Step("enqueue_many", params)
    if not present_keys:
        return [int(row[0]) for row in rows]
    by_key = {key: int(job_id) for job_id, key, _ in rows if key is not None}
    missing = [k for k in present_keys if k not in by_key]
    if missing:
        by_key.update((key, int(job_id)) for key, job_id in (yield Step("ids_by_keys", {"keys": missing})))
    keyless = iter(int(job_id) for job_id, key, _ in rows if key is None)
    return [by_key[k] if k is not None else next(keyless) for k in keys]


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(value: str) -> str:
    """A value for COPY's text format: backslash, tab, newline and carriage return escaped."""
    return value.translate(_COPY_ESCAPES)


def _copy_steps(items: list[NewJob], headers: JsonText | None = None) -> Steps[list[int]]:
    """Key-less batch by COPY, in the caller's transaction (the adapter's `atomic()` gives an
    autocommit connection a transaction of its own, so the three statements commit together).

    The ids are drawn from the jobs' identity sequence first and written explicitly (COPY
    writes identity values it is given), so the caller gets them in input order without a
    RETURNING. A job without run_at gets the transaction's now(), as the INSERT's default does.
    The rows are formatted here as one block of COPY text (escaped), not row by row.
    """
    payloads = [_copy_field(check_payload(i.payload)) for i in items]
    names: dict[str, str] = {}
    ((ids, now, brokered),) = yield Step("reserve_ids", {"n": len(items), "queues": sorted({i.queue for i in items})})
    if brokered:  # a queue of the batch is served by a broker: COPY cannot route, the INSERT does
        return (yield from _insert_steps(items, headers))
    ids = sorted(ids)
    default_run_at = now.isoformat()
    header_field = "\\N" if headers is None else _copy_field(headers)
    lines = []
    for job_id, item, payload in zip(ids, items, payloads, strict=True):
        queue = names.get(item.queue) or names.setdefault(item.queue, _copy_field(item.queue))
        kind = names.get(item.kind) or names.setdefault(item.kind, _copy_field(item.kind))
        run_at = default_run_at if item.run_at is None else item.run_at.isoformat()
        group = "\\N" if item.group is None else _copy_field(item.group)
        lines.append(f"{job_id}\t{queue}\t{kind}\t{payload}\t{item.priority}\t{run_at}\t"
                     f"{item.max_attempts or DEFAULT_MAX_ATTEMPTS}\t{header_field}\t{group}\n")
    yield CopyStep("enqueue_copy", "".join(lines))
    yield Step("notify_queues", {"queues": sorted({i.queue for i in items})})
    return [int(i) for i in ids]


def _by_copy(adapter: handles.SyncAdapter | handles.AsyncAdapter, items: list[NewJob]) -> bool:
    return adapter.copies and len(items) >= COPY_THRESHOLD and all(i.idempotency_key is None for i in items)


def _producing_batch(items: list[NewJob]) -> Any:
    """One producer span for an enqueue_many call (telemetry.producing): its queue and kind when
    the batch has one of each."""
    queues = {i.queue for i in items}
    kinds = {i.kind for i in items}
    return telemetry.producing(next(iter(queues)) if len(queues) == 1 else None,
                               next(iter(kinds)) if len(kinds) == 1 else None, len(items))


# --- the API --------------------------------------------------------------------------------


def enqueue(
    handle: SyncHandle,
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    unique_for: timedelta | float | None = None,
    group: str | None = None,
) -> int:
    """Insert a job in the handle's transaction and return its id.

    `handle`: a psycopg `Connection`, a SQLAlchemy `Session` or `Connection` (postgresql+psycopg),
    or Django's `connection` (inside `transaction.atomic()` the job joins the block). The job
    exists if and only if that transaction commits; workers are woken (NOTIFY) when it does.

    `payload`: any JSON value (None is `{}`), at most 100 levels deep. `queue`: the queue's name.
    `priority`: -32768..32767, higher runs first. `run_at`: a timezone-aware time before which
    the job does not run (None: now). `max_attempts`: how many runs before it becomes a dead
    letter (default 5). `group`: the job's group key (a tenant, customer or integration; at most
    200 characters): a fair queue runs at most its `group_concurrency` jobs of one group at once
    and interleaves the groups (docs/queue.md, "Fair queues"); None is the queue's shared group.

    `idempotency_key`: when a job in the table already has it, nothing is inserted and that
    job's id is returned. With `unique_for` (a timedelta or seconds; needs the key) the key is
    also held for that long per (kind, key), beyond the job's stay in the hot table: a second
    enqueue inside the window returns the first job's id even after it completed, failed, was
    archived or purged (docs/queue.md, "Uniqueness windows").

    Raises `InvalidJob` (a ValueError naming the option) before any statement runs, and
    `TypeError` for a handle it cannot use (an async one: use `enqueue_async`).
    """
    adapter = handles.sync_adapter(handle, "enqueue")
    with telemetry.producing(queue, kind) as sending:
        job_id = handles.run(adapter, _enqueue_steps(kind, payload, queue, priority, run_at, idempotency_key,
                                                     max_attempts, unique_for, sending.headers, group))
        sending.sent([job_id])
    return job_id


async def enqueue_async(
    handle: AsyncHandle,
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    unique_for: timedelta | float | None = None,
    group: str | None = None,
) -> int:
    """`enqueue` for an asynchronous handle, with the same options, checks and errors.

    `handle`: a psycopg `AsyncConnection`, an asyncpg connection (inside
    `async with conn.transaction()`; a pool's connection too), or a SQLAlchemy `AsyncSession` or
    `AsyncConnection` (postgresql+psycopg or postgresql+asyncpg). The job exists if and only if
    that transaction commits.
    """
    adapter = handles.async_adapter(handle, "enqueue_async")
    with telemetry.producing(queue, kind) as sending:
        job_id = await handles.run_async(adapter, _enqueue_steps(kind, payload, queue, priority, run_at,
                                                                 idempotency_key, max_attempts, unique_for,
                                                                 sending.headers, group))
        sending.sent([job_id])
    return job_id


def enqueue_many(handle: SyncHandle, jobs: Iterable[NewJob | Mapping[str, Any]]) -> list[int]:
    """Insert a batch in the handle's transaction; the ids in the input's order.

    `jobs`: `NewJob`s or dicts of their fields (kind, payload, queue, priority, run_at,
    idempotency_key, max_attempts, group). Every job is checked before anything is written; an
    idempotency key a job in the table already has gives that job's id, and a key may appear
    once per batch.

    On a psycopg connection a batch without idempotency keys of COPY_THRESHOLD jobs or more is
    streamed with COPY (ids drawn from the sequence first, one NOTIFY per queue): several times
    the rate of the one multi-row INSERT that smaller or keyed batches, and other handles, use
    (docs/benchmarks.md, bench/enqueue.py).
    """
    adapter = handles.sync_adapter(handle, "enqueue_many")
    items = _batch(jobs)
    if not items:
        return []
    with _producing_batch(items) as sending:
        if _by_copy(adapter, items):
            with adapter.atomic():
                ids = handles.run(adapter, _copy_steps(items, sending.headers))
        else:
            ids = handles.run(adapter, _insert_steps(items, sending.headers))
        sending.sent(ids)
    return ids


async def enqueue_many_async(handle: AsyncHandle, jobs: Iterable[NewJob | Mapping[str, Any]]) -> list[int]:
    """`enqueue_many` for an asynchronous handle (COPY on a psycopg `AsyncConnection`)."""
    adapter = handles.async_adapter(handle, "enqueue_many_async")
    items = _batch(jobs)
    if not items:
        return []
    with _producing_batch(items) as sending:
        if _by_copy(adapter, items):
            async with adapter.atomic():
                ids = await handles.run_async(adapter, _copy_steps(items, sending.headers))
        else:
            ids = await handles.run_async(adapter, _insert_steps(items, sending.headers))
        sending.sent(ids)
    return ids
