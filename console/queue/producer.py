"""Enqueue: a job exists if and only if the caller's transaction commits.

`enqueue` and `enqueue_many` run in the caller's transaction, on the caller's psycopg
connection: the business change and its job commit or roll back together, and workers are woken
(NOTIFY, delivered by PostgreSQL at commit) only when it commits.

Uniqueness windows (`enqueue(..., unique_for=timedelta)`): the key (kind, idempotency_key) is
claimed in `skiplock.unique_keys` until the window ends, and a second enqueue inside it returns
the first job's id whatever became of that job (pending, running, completed, failed, archived,
even purged). Enqueues without `unique_for` never read that table.

This module claims nothing and never commits for the caller (except the COPY path on an
autocommit connection, whose three statements must commit together).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from console.jsonbounds import MAX_DEPTH as MAX_PAYLOAD_DEPTH
from console.jsonbounds import too_deep
from console.queue.protocol import DEFAULT_MAX_ATTEMPTS, InvalidJob
from console.sqlfiles import query


def _payload(payload: Any) -> Jsonb:
    _checked_text(payload, json.dumps, allow_nan=False)
    return Jsonb(payload)


def _checked_text(payload: Any, encode: Any, **options: Any) -> str:
    """The payload as JSON text; InvalidJob when it is not JSON or nests deeper than
    console.jsonbounds.MAX_DEPTH (deeper values break whoever reads them with Python's json:
    it recurses per level). The count of brackets answers at once for ordinary payloads."""
    try:
        text = encode(payload, **options)
    except RecursionError:
        raise InvalidJob(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} levels (arrays and objects count one level each)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    if too_deep(text, MAX_PAYLOAD_DEPTH):
        raise InvalidJob(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} levels (arrays and objects count one level each)")
    return text


def _check(kind: str, queue: str, priority: int, max_attempts: int | None) -> None:
    if not isinstance(kind, str) or not kind.strip():
        raise InvalidJob("kind must be a non-empty string")
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidJob("queue must be a non-empty string")
    if not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise InvalidJob("priority must be an integer between -32768 and 32767")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise InvalidJob("max_attempts must be a positive integer")


def _window_seconds(unique_for: Any, idempotency_key: str | None) -> float:
    if isinstance(unique_for, bool) or not isinstance(unique_for, timedelta | int | float):
        raise InvalidJob("unique_for must be a timedelta (or a number of seconds)")
    seconds = unique_for.total_seconds() if isinstance(unique_for, timedelta) else float(unique_for)
    if not 0 < seconds <= 366 * 86400:
        raise InvalidJob("unique_for must be more than 0 seconds and at most 366 days")
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise InvalidJob("unique_for needs an idempotency_key (the window is per kind and key)")
    return seconds


def enqueue(
    conn: psycopg.Connection,
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    unique_for: timedelta | float | None = None,
) -> int:
    """Insert a job in the caller's transaction and return its id.

    With an idempotency key that a job in the table already has, nothing is inserted and that
    job's id is returned. Workers are woken (NOTIFY) when the transaction commits.

    With `unique_for` (needs an idempotency key) the key is also held for that long per
    (kind, key), beyond the job's stay in the hot table: a second enqueue inside the window
    returns the first job's id even after it completed, failed, was archived or purged.
    docs/queue.md, "Uniqueness windows", has the semantics per state.
    """
    _check(kind, queue, priority, max_attempts)
    if unique_for is not None:
        return _enqueue_unique(conn, kind, payload, queue=queue, priority=priority, run_at=run_at,
                               idempotency_key=idempotency_key, max_attempts=max_attempts,
                               window=_window_seconds(unique_for, idempotency_key))
    params = {
        "queue": queue,
        "kind": kind,
        "payload": _payload({} if payload is None else payload),
        "priority": priority,
        "run_at": run_at,
        "max_attempts": max_attempts or DEFAULT_MAX_ATTEMPTS,
        "idempotency_key": idempotency_key,
    }
    with conn.cursor() as cur:
        row = cur.execute(query("queue", "enqueue"), params).fetchone()
        if row is not None:
            return row[0]
        found = cur.execute(query("queue", "ids_by_keys"), {"keys": [idempotency_key]}).fetchone()
        if found is None:  # the conflicting row left the table between the two statements
            return enqueue(conn, kind, payload, queue=queue, priority=priority, run_at=run_at,
                           idempotency_key=idempotency_key, max_attempts=max_attempts)
        return found[1]


def _enqueue_unique(conn: psycopg.Connection, kind: str, payload: Any, *, queue: str, priority: int,
                    run_at: datetime | None, idempotency_key: str, max_attempts: int | None, window: float,
                    _tries: int = 5) -> int:
    params = {
        "queue": queue,
        "kind": kind,
        "payload": _payload({} if payload is None else payload),
        "priority": priority,
        "run_at": run_at,
        "max_attempts": max_attempts or DEFAULT_MAX_ATTEMPTS,
        "idempotency_key": idempotency_key,
        "unique_for": window,
    }
    key = {"kind": kind, "idempotency_key": idempotency_key}
    with conn.cursor() as cur:
        claimed_id, inserted_id, _ = cur.execute(query("queue", "enqueue_unique"), params).fetchone()
        if inserted_id is not None:
            return inserted_id
        if claimed_id is not None:
            # The window is ours, but the hot table already holds a job with this key (enqueued
            # without a window, or its window expired): that job is the answer; point at it.
            job_id = enqueue(conn, kind, payload, queue=queue, priority=priority, run_at=run_at,
                             idempotency_key=idempotency_key, max_attempts=max_attempts)
            cur.execute(query("queue", "unique_point"), {**key, "job_id": job_id})
            return job_id
        holder = cur.execute(query("queue", "unique_holder"), key).fetchone()
        if holder is not None:
            return holder[0]
    # The window expired between the two statements (or was pruned): claim it again.
    if _tries <= 0:  # pragma: no cover - needs the window to expire at that instant repeatedly
        raise RuntimeError(f"could not claim the uniqueness window of ({kind!r}, {idempotency_key!r})")
    return _enqueue_unique(conn, kind, payload, queue=queue, priority=priority, run_at=run_at,
                           idempotency_key=idempotency_key, max_attempts=max_attempts, window=window,
                           _tries=_tries - 1)


@dataclass
class NewJob:
    """One job for `enqueue_many`."""

    kind: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None


COPY_THRESHOLD = 200  # a key-less batch at least this long goes through COPY (bench/enqueue.py)


def enqueue_many(conn: psycopg.Connection, jobs: Iterable[NewJob | dict[str, Any]]) -> list[int]:
    """Insert a batch in the caller's transaction; ids in the input's order.

    A batch without idempotency keys of COPY_THRESHOLD jobs or more is streamed with COPY (ids
    drawn from the sequence first, one NOTIFY per queue): several times the rate of the one
    multi-row INSERT that smaller or keyed batches use (docs/benchmarks.md, bench/enqueue.py).
    """
    items = [job if isinstance(job, NewJob) else NewJob(**job) for job in jobs]
    if not items:
        return []
    for item in items:
        _check(item.kind, item.queue, item.priority, item.max_attempts)
    keys = [item.idempotency_key for item in items]
    present_keys = [k for k in keys if k is not None]
    if len(present_keys) != len(set(present_keys)):
        raise InvalidJob("the same idempotency key appears twice in one batch")
    if not present_keys and len(items) >= COPY_THRESHOLD:
        return _enqueue_copy(conn, items)
    return _enqueue_insert(conn, items)


def _enqueue_insert(conn: psycopg.Connection, items: list[NewJob]) -> list[int]:
    """One INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING: the keyed (and small) path."""
    keys = [item.idempotency_key for item in items]
    present_keys = [k for k in keys if k is not None]
    params = {
        "queues": [i.queue for i in items],
        "kinds": [i.kind for i in items],
        "payloads": [_payload({} if i.payload is None else i.payload) for i in items],
        "priorities": [i.priority for i in items],
        "run_ats": [i.run_at for i in items],
        "max_attempts": [i.max_attempts or DEFAULT_MAX_ATTEMPTS for i in items],
        "keys": keys,
    }
    with conn.cursor() as cur:
        rows = cur.execute(query("queue", "enqueue_many"), params).fetchall()
        if not present_keys:
            return [row[0] for row in rows]
        by_key = {key: job_id for job_id, key, _ in rows if key is not None}
        missing = [k for k in present_keys if k not in by_key]
        if missing:
            by_key.update(dict(cur.execute(query("queue", "ids_by_keys"), {"keys": missing}).fetchall()))
        keyless = iter(job_id for job_id, key, _ in rows if key is None)
        return [by_key[k] if k is not None else next(keyless) for k in keys]


_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(value: str) -> str:
    """A value for COPY's text format: backslash, tab, newline and carriage return escaped."""
    return value.translate(_COPY_ESCAPES)


def _payload_text(payload: Any) -> str:
    return _checked_text({} if payload is None else payload, _JSON.encode)


def _enqueue_copy(conn: psycopg.Connection, items: list[NewJob]) -> list[int]:
    """Key-less batch by COPY, in the caller's transaction (on an autocommit connection, one
    transaction of its own, so the three statements commit together).

    The ids are drawn from the jobs' identity sequence first and written explicitly (COPY
    writes identity values it is given), so the caller gets them in input order without a
    RETURNING. A job without run_at gets the transaction's now(), as the INSERT's default does.
    The rows are formatted here as one block of COPY text (escaped), not row by row.
    """
    payloads = [_copy_field(_payload_text(i.payload)) for i in items]
    names: dict[str, str] = {}
    own = conn.transaction() if conn.autocommit else contextlib.nullcontext()
    with own, conn.cursor() as cur:
        ids, now = cur.execute(query("queue", "reserve_ids"), {"n": len(items)}).fetchone()
        ids.sort()
        default_run_at = now.isoformat()
        lines = []
        for job_id, item, payload in zip(ids, items, payloads, strict=True):
            queue = names.get(item.queue) or names.setdefault(item.queue, _copy_field(item.queue))
            kind = names.get(item.kind) or names.setdefault(item.kind, _copy_field(item.kind))
            run_at = default_run_at if item.run_at is None else item.run_at.isoformat()
            lines.append(f"{job_id}\t{queue}\t{kind}\t{payload}\t{item.priority}\t{run_at}\t"
                         f"{item.max_attempts or DEFAULT_MAX_ATTEMPTS}\n")
        with cur.copy(query("queue", "enqueue_copy")) as copy:
            copy.write("".join(lines))
        cur.execute(query("queue", "notify_queues"), {"queues": sorted({i.queue for i in items})})
    return ids

