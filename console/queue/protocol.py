"""The queue protocol: claim, heartbeat, complete, fail, release, pause, reap.

Every function takes a psycopg connection and runs one statement from `sql/queue.sql`. They are
meant for autocommit connections (the worker's): each is its own short transaction, and no
transaction is ever held across a job's work. The producer's side, which joins the caller's
transaction instead, is `console.queue.producer`.

Completion, failure, heartbeat and release are fenced by the claim's token (`locked_by` and
`attempts`): after the reaper rescued a job, the old owner's calls match nothing and return
False/empty, so a rescued job is never overwritten.

Cancel requests: an operator may ask a running job to stop (`request_cancel`); the worker learns
it with its heartbeat and the handler sees `job.cancel_requested()`. A handler that stops raises
`Cancelled`: the job becomes a dead letter with error class Cancelled (replayable).

This module does not loop, sleep or spawn threads; `console.queue.worker` does.

Why one module of about 450 lines: it is the protocol, one function per statement of
sql/queue.sql, and the fencing rules above apply to all of them; reading it whole is how the
contract (docs/architecture.md) is checked.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import threading
import traceback as traceback_module
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_loads

from console.fingerprint import fingerprint as make_fingerprint
from console.redaction import DEFAULT_KEYS
from console.sqlfiles import query

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_LEASE = 60.0
DEFAULT_BACKOFF_BASE = 2.0
DEFAULT_BACKOFF_CAP = 3600.0
DEFAULT_HISTORY = 20
TRACEBACK_HEAD = 4000  # characters of traceback kept per error entry
STATUSES = ("pending", "running", "completed", "failed")
NOTIFY_CHANNEL = "skiplock_jobs"
CONTROL_CHANNEL = "skiplock_control"


class InvalidJob(ValueError):
    """The job cannot be enqueued as given (the message says which argument and why)."""


class DoNotRetry(Exception):
    """Raise from a handler to send the job straight to the dead letters, whatever attempts remain."""


class Cancelled(DoNotRetry):
    """Raise from a handler that saw `job.cancel_requested()`: the job becomes a dead letter with
    error class `Cancelled` (no retry; an operator may replay it)."""


class BatchFailure(Exception):
    """Raise from a batch handler (`@task("kind", batch=N)`) to fail some jobs of its batch and
    complete the others: `raise BatchFailure({job.id: error, ...})`.

    Each job named fails with its own exception, exactly as if a single-job handler had raised
    it (retried with backoff while attempts remain; a `DoNotRetry` makes it a dead letter); every
    job of the batch not named completes. The keys are job ids (`job.id`, ints), the values
    exceptions; a key that is not the id of a job of this batch fails the whole batch (a bug in
    the handler must not complete jobs by accident). Raising any other exception from a batch
    handler fails every job of the batch with it."""

    def __init__(self, errors: Mapping[int, BaseException], message: str | None = None) -> None:
        if not isinstance(errors, Mapping):
            raise TypeError(f"BatchFailure takes a mapping of job id to exception (got {type(errors).__name__})")
        checked: dict[int, BaseException] = {}
        for job_id, error in errors.items():
            if isinstance(job_id, bool) or not isinstance(job_id, int):
                raise TypeError(f"BatchFailure: keys are job ids (job.id), got {job_id!r}")
            if not isinstance(error, BaseException):
                raise TypeError(f"BatchFailure: job {job_id}'s value must be an exception, got {error!r}")
            checked[job_id] = error
        self.errors = checked
        super().__init__(message or f"{len(checked)} job(s) of the batch failed")


class JobTimeout(TimeoutError):
    """What a run that outlived its task's `timeout` is recorded as: a failed attempt, retried
    with backoff like any other (`@task("kind", timeout=...)`). The handler's own exception,
    if it raised one, is its `__cause__`."""


@dataclass
class Job:
    """A claimed job, as a handler receives it: `handler(job)`.

    `payload` is the JSON value it was enqueued with; `attempts` counts this run (1 for the
    first); `locked_by` and `attempts` are the claim's fencing token; `lease_until` is pushed out
    by the worker's heartbeat while the handler runs. Make side effects idempotent with
    `side_effect_key`, which is the same on every attempt. `headers` travel with the job from
    its enqueue (the producer's trace context when OpenTelemetry is configured), or None."""

    id: int
    queue: str
    kind: str
    payload: Any
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    locked_by: str
    locked_at: datetime
    lease_until: datetime
    created_at: datetime
    headers: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cancel_event(self) -> threading.Event:
        """Set by the worker's heartbeat when an operator asked this claim to stop. Kept in
        `extra` (not a dataclass field), so Job(**fields) keeps working as before."""
        event: threading.Event = self.extra.setdefault("cancel_event", threading.Event())  # atomic on a dict
        return event

    def cancel_requested(self) -> bool:
        """True once an operator asked this run to stop (console "Request cancel"), or once a
        sync handler outlived its task's `timeout` (an async one is cancelled instead).

        Cheap: it reads a flag the worker's heartbeat sets (no query). The heartbeat runs every
        lease/3 seconds for jobs running longer than that, so a request is seen within about
        two thirds of the lease. Stop by raising `Cancelled`; a handler may also wait on
        `job.cancel_event` instead of sleeping."""
        return self.cancel_event.is_set()

    @property
    def attempt(self) -> int:
        """This claim's attempt number (1 for the first run): with locked_by, the fencing token."""
        return self.attempts

    @property
    def side_effect_key(self) -> str:
        """A key that stays the same across attempts, for the handler's own side effects."""
        return self.idempotency_key or f"skiplock-job-{self.id}"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        return cls(**{name: row[name] for name in _JOB_COLUMNS})


_JOB_COLUMNS = tuple(name for name in Job.__dataclass_fields__ if name != "extra")


def unique_window(conn: psycopg.Connection, job: dict[str, Any]) -> dict[str, Any] | None:
    """The uniqueness window `job` holds ({kind, idempotency_key, created_at, expires_at, active}),
    or None."""
    if not job.get("idempotency_key"):
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("queue", "unique_window_of"),
                           {"kind": job["kind"], "idempotency_key": job["idempotency_key"], "job_id": job["id"]}).fetchone()


def prune_unique_keys(conn: psycopg.Connection, *, batch_size: int = 1000) -> int:
    """Delete up to `batch_size` expired uniqueness windows (one statement); returns how many.
    Archive retention calls it in a bounded loop, each batch its own short transaction."""
    return conn.execute(query("queue", "prune_unique_keys"), {"batch_size": batch_size}).rowcount


def request_cancel(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    """Ask a running job to stop (the caller audits). None when the job is not running."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("queue", "request_cancel"), {"id": job_id}).fetchone()


def _own_transaction(conn: psycopg.Connection, what: str) -> contextlib.AbstractContextManager[Any]:
    """A transaction that commits when the block ends. Refuses to nest inside the caller's open
    transaction: a claim must commit at once, and a savepoint around FOR UPDATE creates
    MultiXacts (the advisor flags exactly that)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError(f"{what} must run outside an open transaction (use an autocommit connection)")
    return _one_statement(conn)


def _one_statement(conn: psycopg.Connection) -> contextlib.AbstractContextManager[Any]:
    """Where one statement must commit on its own. On an autocommit connection it already does:
    wrapping it in BEGIN/COMMIT would cost two more round trips per call (a third of a no-op
    job's claim cycle). Otherwise a transaction (or a savepoint inside the caller's)."""
    return contextlib.nullcontext() if conn.autocommit else conn.transaction()


def claim(
    conn: psycopg.Connection,
    worker: str,
    *,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease: float = DEFAULT_LEASE,
) -> list[Job]:
    """Claim up to `limit` eligible jobs for `worker` and commit at once."""
    params = {"worker": worker, "queues": list(queues) if queues else None, "limit": limit, "lease": float(lease)}
    with _own_transaction(conn, "claim"), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("queue", "claim"), params, prepare=True).fetchall()
    return [Job.from_row(row) for row in rows]


_raw_decode = json.JSONDecoder().raw_decode


def _jsonb_loads(data: str | bytes) -> Any:
    """json.loads for a jsonb value the server sent: PostgreSQL writes it without surrounding
    whitespace, so the C scanner can start at once (json.loads first guesses the bytes'
    encoding and matches whitespace around the value: 2.5 -> 0.7-0.9 us for a small payload).
    Anything unexpected goes to json.loads itself, so the values are always json.loads's."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        value, end = _raw_decode(text)
    except ValueError:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def claim_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor of `conn` for complete_and_claim(cursor=...), kept by the worker across calls.

    Binary results: a claimed row carries four timestamps, which the server formats and the
    client parses as text otherwise (the same values, in the session's time zone). Payloads
    decode with _jsonb_loads (on this cursor only)."""
    cur = conn.cursor(binary=True)
    set_json_loads(_jsonb_loads, cur)
    return cur


def complete_and_claim(
    conn: psycopg.Connection,
    worker: str,
    done: Sequence[Job],
    *,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease: float = DEFAULT_LEASE,
    cursor: psycopg.Cursor | None = None,
    kinds: Sequence[str] | None = None,
    skip_kinds: Sequence[str] | None = None,
    after: tuple[int, datetime, int] | None = None,
) -> tuple[list[int], list[Job]]:
    """Complete `done` (fenced) and claim up to `limit` more, in one statement and one commit.

    Returns (ids actually completed, newly claimed jobs). An id missing from the first list
    lost its claim (the reaper rescued it) and was left alone.

    `cursor`: a cursor of `conn` (tuple rows) to run it on, kept by the caller from call to
    call: the worker's hot path. A new cursor per call sets up its adapters again, which cost
    several microseconds per job of a no-op drain (docs/benchmarks.md, "Worker CPU per job").

    `kinds` / `skip_kinds`: claim only jobs of these kinds / of other kinds (a worker with both
    sync and async handlers fills each runtime's free slots apart).

    `after`: a claim index key (priority, run_at, id): claim only jobs of that priority after
    it, the index scanned from the key instead of the head (console/queue/resume_point.py says when
    and why the worker does).
    """
    params: dict[str, Any] = {
        "worker": worker,
        "ids": _int_array([j.id for j in done]),
        "attempts": _int_array([j.attempts for j in done]),
        "queues": list(queues) if queues else None,
        "limit": limit,
        "lease": float(lease),
        "kinds": list(kinds) if kinds is not None else None,
        "skip_kinds": list(skip_kinds) if skip_kinds is not None else None,
    }
    if after is None:
        sql_text = query("queue", "complete_and_claim")
    else:
        sql_text = _claim_after()
        params["after_priority"], params["after_run_at"], params["after_id"] = after
    with _own_transaction(conn, "complete_and_claim"), (conn.cursor() if cursor is None else contextlib.nullcontext(cursor)) as cur:
        rows = cur.execute(sql_text, params, prepare=True).fetchall()
        if sql_text not in _checked_statements:
            _check_job_columns(cur, sql_text, skip=1)
    completed = list(rows[0][0]) if rows else []
    # Tuple rows, the job's columns in Job's field order (checked above): the worker's hot path.
    claimed = [Job(*row[1:]) for row in rows if row[1] is not None]
    return completed, claimed


# The claim after a key: complete_and_claim with one more condition on the claim index's own
# columns, which the index takes as where its scan starts (an equality on its first column, a
# row comparison on the next two). A statement of its own, not a NULL-able parameter of the
# first: a prepared (generic) plan cannot start an index scan at `$1 IS NULL OR ...`.
_HEAD = "    WHERE j.status = 'pending'\n"
_AFTER = ("      AND j.priority = %(after_priority)s::smallint\n"
          "      AND (j.run_at, j.id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint)\n")


@functools.cache
def _claim_after() -> str:
    text = query("queue", "complete_and_claim")
    if text.count(_HEAD) != 1:
        raise RuntimeError("complete_and_claim: the candidates' WHERE clause is not where _claim_after expects it")
    return text.replace(_HEAD, _HEAD + _AFTER)


def _int_array(values: list[int]) -> str:
    """An array literal ('{1,2,3}') for a `%(x)s::bigint[]` parameter. psycopg dumps a list by
    looking at its elements on every call (about 1 us per job of a batch, twice per claim);
    a literal of ints needs none of that, and the statement's cast parses it on the server."""
    return "{" + ",".join(map(str, values)) + "}"


_checked_statements: set[str] = set()


def _check_job_columns(cur: psycopg.Cursor, sql_text: str, *, skip: int) -> None:
    """Refuse a statement whose columns after the first `skip` are not Job's fields in order
    (so a positional Job(*row) cannot silently swap two of them). Checked once per statement
    text, which names its columns: building `cur.description` on every call cost more than
    building the jobs."""
    names = tuple(c.name for c in cur.description or ())
    if names[skip:] != _JOB_COLUMNS:
        raise RuntimeError(f"complete_and_claim returns {names[skip:]}, expected Job's fields {_JOB_COLUMNS}")
    _checked_statements.add(sql_text)


def complete_many(conn: psycopg.Connection, jobs: Sequence[Job], *, into_archive: bool = False) -> list[int]:
    """Mark jobs completed if each is still held by its claim; return the ids completed. With
    `into_archive` the completed jobs move to skiplock.jobs_archive in the same statement."""
    if not jobs:
        return []
    owners = {j.locked_by for j in jobs}
    completed: list[int] = []
    statement = query("queue", "complete_many_archive" if into_archive else "complete_many")
    with (_one_statement(conn) if len(owners) == 1 else conn.transaction()), conn.cursor() as cur:
        for owner in owners:
            mine = [j for j in jobs if j.locked_by == owner]
            rows = cur.execute(
                statement,
                {"worker": owner, "ids": [j.id for j in mine], "attempts": [j.attempts for j in mine]},
            ).fetchall()
            completed += [r[0] for r in rows]
    return completed


def complete_logged(conn: psycopg.Connection, jobs: Sequence[Job], logs: Sequence[dict[str, Any]], *,
                    history: int = DEFAULT_HISTORY, into_archive: bool = False) -> list[int]:
    """Complete `jobs` (one worker's, fenced like complete_many) and append each one's entry of
    `logs` (the attempt's log records, console.queue.joblogs) to its `attempt_logs`, in one
    statement. Returns the ids completed. The worker completes only the jobs whose handler
    logged something this way; the others keep the one-statement complete-and-claim. With
    `into_archive` they move to skiplock.jobs_archive in the same statement."""
    if not jobs:
        return []
    with _one_statement(conn), conn.cursor() as cur:
        rows = cur.execute(
            query("queue", "complete_logged_archive" if into_archive else "complete_logged"),
            {"worker": jobs[0].locked_by, "history": history,
             "done": Jsonb([{"id": j.id, "attempt": j.attempts, "entry": entry} for j, entry in zip(jobs, logs, strict=True)])},
            prepare=True,  # a worker whose handlers log runs it every round
        ).fetchall()
    return [r[0] for r in rows]


def complete(conn: psycopg.Connection, job: Job) -> bool:
    """Mark one job completed; False when the claim was lost (the job is not touched)."""
    return bool(complete_many(conn, [job]))


def backoff_delay(attempt: int, base: float = DEFAULT_BACKOFF_BASE, cap: float = DEFAULT_BACKOFF_CAP) -> float:
    """Exponential backoff with jitter: base·2^(attempt-1), capped, then scaled by 0.5-1.0."""
    raw = min(cap, base * float(2 ** max(attempt - 1, 0)))
    return raw * (0.5 + random.random() / 2)


def error_entry(job: Job, error: BaseException | str, *, error_class: str | None = None) -> dict[str, Any]:
    if isinstance(error, BaseException):
        error_class = error_class or type(error).__name__
        message = str(error)
        tb = "".join(traceback_module.format_exception(error))[-TRACEBACK_HEAD:]
    else:
        error_class = error_class or "Error"
        message = str(error)
        tb = None
    return {
        "attempt": job.attempts,
        "at": datetime.now().astimezone().isoformat(),
        "worker": job.locked_by,
        "error_class": error_class,
        "message": message[:2000],
        "traceback": tb,
    }


def fail(
    conn: psycopg.Connection,
    job: Job,
    error: BaseException | str,
    *,
    retry: bool | None = None,
    backoff_base: float = DEFAULT_BACKOFF_BASE,
    backoff_cap: float = DEFAULT_BACKOFF_CAP,
    history: int = DEFAULT_HISTORY,
    error_class: str | None = None,
    secret_keys: Iterable[str] = DEFAULT_KEYS,
    logs: dict[str, Any] | None = None,
) -> str | None:
    """Record a failed attempt. Returns the job's new status ('pending' for a retry, 'failed' for
    a dead letter), or None when the claim was lost and nothing was written.

    The error's fingerprint is made from the message with the values of `secret_keys` hidden
    (console.fingerprint); `last_error` and the history keep the message as raised. `logs`: the
    attempt's log records (console.queue.joblogs), appended to `attempt_logs` by the same
    statement."""
    if retry is None:
        retry = not isinstance(error, DoNotRetry)
    entry = error_entry(job, error, error_class=error_class)
    params = {
        "id": job.id,
        "attempt": job.attempts,
        "worker": job.locked_by,
        "retry": retry,
        "delay": backoff_delay(job.attempts, backoff_base, backoff_cap),
        "last_error": f"{entry['error_class']}: {entry['message']}"[:2000],
        "fingerprint": make_fingerprint(entry["error_class"], entry["message"], secret_keys),
        "entry": Jsonb(entry),
        "history": history,
        "logs": None if logs is None else Jsonb(logs),
    }
    with _one_statement(conn), conn.cursor() as cur:
        row = cur.execute(query("queue", "fail"), params).fetchone()
    return row[0] if row else None


def heartbeat(conn: psycopg.Connection, job: Job | Sequence[Job], lease: float = DEFAULT_LEASE) -> bool | list[int]:
    """Extend the lease of a job (or several of one worker) still held by its claim.

    For one job returns True/False; for a sequence, the ids whose lease was extended. The job
    objects' `lease_until` is updated in place, and `cancel_event` set for a job an operator
    asked to stop.
    """
    many = not isinstance(job, Job)
    jobs: list[Job] = [job] if isinstance(job, Job) else list(job)
    if not jobs:
        return []
    with _one_statement(conn), conn.cursor() as cur:
        rows = cur.execute(
            query("queue", "heartbeat"),
            {"worker": jobs[0].locked_by, "ids": [j.id for j in jobs], "attempts": [j.attempts for j in jobs], "lease": float(lease)},
        ).fetchall()
    extended = {r[0]: r[1] for r in rows}
    for j in jobs:
        if j.id in extended:
            j.lease_until = extended[j.id]
    for job_id, _, cancel in rows:
        if cancel:
            next(j for j in jobs if j.id == job_id).cancel_event.set()
    return list(extended) if many else bool(extended)


def release(conn: psycopg.Connection, jobs: Sequence[Job]) -> list[int]:
    """Return held jobs to pending without counting the attempt (graceful shutdown)."""
    if not jobs:
        return []
    with _one_statement(conn), conn.cursor() as cur:
        rows = cur.execute(
            query("queue", "release"),
            {"worker": jobs[0].locked_by, "ids": [j.id for j in jobs], "attempts": [j.attempts for j in jobs]},
        ).fetchall()
    return [r[0] for r in rows]


def reap(
    conn: psycopg.Connection,
    *,
    batch_size: int = 1000,
    max_batches: int | None = None,
    backoff_base: float = DEFAULT_BACKOFF_BASE,
    backoff_cap: float = DEFAULT_BACKOFF_CAP,
    history: int = DEFAULT_HISTORY,
) -> dict[str, int]:
    """Rescue expired leases in batches of at most `batch_size`, each its own transaction.

    Returns {"pending": n, "failed": m, "batches": b}.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    totals = {"pending": 0, "failed": 0, "batches": 0}
    params = {"batch_size": batch_size, "backoff_base": backoff_base, "backoff_cap": backoff_cap, "history": history}
    while max_batches is None or totals["batches"] < max_batches:
        with _one_statement(conn), conn.cursor() as cur:
            rows = cur.execute(query("queue", "reap"), params).fetchall()
        if not rows:
            break
        totals["batches"] += 1
        for _, status in rows:
            totals[status] += 1
        if len(rows) < batch_size:
            break
    return totals


def set_paused(conn: psycopg.Connection, queue_name: str, paused: bool, *, actor: str | None = None) -> None:
    if not queue_name or not queue_name.strip():
        raise InvalidJob("queue must be a non-empty string")
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(query("queue", "set_paused"), {"queue": queue_name, "paused": paused, "actor": actor})
        cur.execute(query("queue", "notify_control"), {"message": json.dumps({"queue": queue_name, "paused": paused})})


def pause(conn: psycopg.Connection, queue_name: str, *, actor: str | None = None) -> None:
    """Stop claims from `queue_name`; its jobs stay pending and in-flight jobs finish."""
    set_paused(conn, queue_name, True, actor=actor)


def resume(conn: psycopg.Connection, queue_name: str, *, actor: str | None = None) -> None:
    set_paused(conn, queue_name, False, actor=actor)


def paused_queues(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(query("queue", "paused_queues")).fetchall()]


def get_job(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("queue", "get_job"), {"id": job_id}).fetchone()
