"""Operator actions on the queue that are not bulk operations: reap now, pause, resume.

Each is audited (who, what, why, rows, outcome). The scheduler's periodic reaping goes through
`reap()` with actor "scheduler" and is recorded as a maintenance run but not audited.

Pausing a name no queue has would create a queue row nobody asked for (a typo at 3 a.m. answers
"paused" and pauses nothing that exists): the faces pass `create=False`, and `pause_queue` then
refuses a queue that is not known (`known_queues`: one that has jobs, samples, limits, or was
paused before), naming the nearest known names. Python callers keep `create=True` by default.
"""

from __future__ import annotations

import difflib
import time

import psycopg

from console import audit
from console import queue as q
from console.maintenance import runs
from console.maintenance.archive import RunResult, _close, check_batching
from console.maintenance.errors import InvalidSettings, UnknownQueue
from console.sqlfiles import query


def reap(
    conn: psycopg.Connection,
    *,
    actor: str = "scheduler",
    reason: str | None = None,
    batch_size: int = 1000,
    max_batches: int | None = None,
    backoff_base: float = q.DEFAULT_BACKOFF_BASE,
    backoff_cap: float = q.DEFAULT_BACKOFF_CAP,
    history: int = q.DEFAULT_HISTORY,
) -> RunResult:
    """Rescue expired leases now (console.queue.reap in batches), recorded as a maintenance run
    with `detail = {"pending": n, "failed": m}`; audited unless the actor is "scheduler"."""
    check_batching(batch_size, None)
    settings = {"batch_size": batch_size}
    run_id = runs.start(conn, "reap", actor, settings)
    result = RunResult(run_id=run_id, task="reap", outcome="ok", detail={"pending": 0, "failed": 0})
    started = time.perf_counter()
    try:
        while max_batches is None or result.batches < max_batches:
            t0 = time.perf_counter()
            totals = q.reap(conn, batch_size=batch_size, max_batches=1, backoff_base=backoff_base,
                            backoff_cap=backoff_cap, history=history)
            ms = (time.perf_counter() - t0) * 1000.0
            rows = totals["pending"] + totals["failed"]
            if not rows:
                break
            runs.batch(conn, run_id, rows, ms)
            result.batches += 1
            result.rows += rows
            result.batch_ms.append(ms)
            result.detail["pending"] += totals["pending"]
            result.detail["failed"] += totals["failed"]
            if rows < batch_size:
                break
    except Exception as exc:
        result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}".strip()
        raise
    finally:
        result.seconds = time.perf_counter() - started
        _close(conn, result, actor, reason, settings)
    return result


def _check(queue_name: str, actor: str) -> None:
    if not isinstance(queue_name, str) or not queue_name.strip():
        raise InvalidSettings("a queue name is needed (a non-empty string)")
    if not actor:
        raise InvalidSettings("an action needs an actor")


KNOWN_CAP = 50_000  # claim- and lease-index entries looked at (console.browse.PENDING_CAP)
KNOWN_FAILED_CAP = 10_000  # newest dead letters looked at (console.browse.FAILED_CAP)


def known_queues(conn: psycopg.Connection) -> set[str]:
    """Every queue name the console knows: with jobs (bounded windows of the pending, running and
    failed indexes, as the queue figures read them), in the collectors' samples of the last 24 h,
    or with a row of its own (paused before, or limits). Never a scan of the jobs table."""
    from console import samples

    rows = conn.execute(query("maintenance", "known_queues"), {"cap": KNOWN_CAP, "failed_cap": KNOWN_FAILED_CAP})
    return {r[0] for r in rows.fetchall()} | set(samples.queue_activity(conn))


CREATE_HINT = "To pause it before its first job, pass --create."


def check_known_queue(conn: psycopg.Connection, queue_name: str, *, then: str = CREATE_HINT) -> None:
    """UnknownQueue, naming the nearest known names, unless `queue_name` is a known queue."""
    known = known_queues(conn)
    if queue_name in known:
        return
    near = difflib.get_close_matches(queue_name, sorted(known), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else (
        f"; known queues: {', '.join(sorted(known)[:10])}." if known else "; no queue is known yet.")
    raise UnknownQueue(f"there is no queue {queue_name!r} (no jobs, samples or limits, and never paused){hint} {then}")


def pause_queue(conn: psycopg.Connection, queue_name: str, *, actor: str, reason: str | None = None,
                create: bool = True) -> None:
    """Stop claims from the queue (its jobs stay pending; in-flight jobs finish), audited.
    `create=False` refuses a queue no one knows (UnknownQueue) instead of creating it."""
    _check(queue_name, actor)
    if not create:
        check_known_queue(conn, queue_name)
    with conn.transaction():
        q.pause(conn, queue_name, actor=actor)
        audit.record(conn, actor=actor, action="pause", target=f"queue:{queue_name}",
                     selection={"queue": queue_name}, reason=reason, rows=1, outcome="ok")


def resume_queue(conn: psycopg.Connection, queue_name: str, *, actor: str, reason: str | None = None,
                 create: bool = True) -> None:
    """Let workers claim from the queue again, audited. `create=False` refuses an unknown queue."""
    _check(queue_name, actor)
    if not create:
        check_known_queue(conn, queue_name, then="Nothing is paused under that name.")
    with conn.transaction():
        q.resume(conn, queue_name, actor=actor)
        audit.record(conn, actor=actor, action="resume", target=f"queue:{queue_name}",
                     selection={"queue": queue_name}, reason=reason, rows=1, outcome="ok")
