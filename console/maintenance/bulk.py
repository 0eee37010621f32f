"""Safe bulk operations on dead letters: replay and purge, previewed, batched, throttled,
observable, cancellable and resumable.

    op_id = start(conn, "replay", selection, actor="alice", reason="fixed the SMTP password")
    run(dsn, op_id)                 # in a thread, a process, or the scheduler
    progress(conn, op_id)           # from anywhere while it runs
    cancel(conn, op_id, actor="bob")

`start()` fixes the operation's snapshot (now), counts exactly what had failed by then, and
refuses a selection that matches nothing. Given the `preview=` the operator confirmed
(`deadletters.Previewed`), it takes the preview's time as the snapshot and its highest id as
a bound, and refuses (PreviewMismatch, nothing written) unless the selection still matches
exactly the previewed count both now and within that bound, in the transaction that creates
the operation. Every operation keeps an id bound (`max_id`: the preview's, else the highest id
matching at start) and `run()` never touches a job above it, resumed or not. `run()` works through the matching dead letters in
(finished_at, id) order, `batch_size` at a time, each batch one transaction that also advances
the operation's cursor, so a crash between batches loses nothing and a resume never touches a
row twice; a job that fails again after being replayed has failed after the snapshot and is
not picked up again. Between batches it honours the `rate` (rows/s) and a cancel request.
Only one runner works an operation at a time (a session advisory lock).

It does not choose what to replay (deadletters.Selection does) nor ask for confirmation (the
faces show `deadletters.preview()` first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit
from console.actions import clean_reason
from console.db import connect, time_limited
from console.maintenance._throttle import Throttle
from console.maintenance.archive import check_batching
from console.maintenance.deadletters import (
    Previewed,
    Selection,
    as_selection,
    group_hint,
    selection_hash,
    selection_query,
)
from console.maintenance.errors import (
    InvalidSettings,
    NothingMatches,
    OperationState,
    PreviewMismatch,
)
from console.sqlfiles import query

log = logging.getLogger("skiplock.maintenance.bulk")

ACTIONS = ("replay", "purge")
PURGE_MODES = ("delete", "archive")
STATES = ("queued", "running", "done", "cancelled", "failed")
LOCK_CLASS = 0x5C1B_B01  # advisory lock namespace of bulk operations (second key: the op id)


def _lock_params(op_id: int) -> dict[str, int]:
    return {"lock_class": LOCK_CLASS, "lock_id": op_id & 0x7FFF_FFFF}


def start(
    conn: psycopg.Connection,
    action: str,
    selection: Selection | Mapping[str, Any],
    *,
    actor: str,
    reason: str | None = None,
    rate: float | None = None,
    batch_size: int = 1000,
    purge_mode: str = "delete",
    timeout_ms: int = 10_000,
    preview: Previewed | None = None,
) -> int:
    """Record a replay or purge of the selected dead letters and return its id (state 'queued').

    With `preview` (what the operator confirmed), the operation is bound to it: only jobs that
    had failed by `preview.previewed_at` with ids up to `preview.max_id`, and only if the
    selection is the previewed one and matches exactly `preview.total` jobs both now and
    within that bound; otherwise PreviewMismatch. The check and the insert share one
    transaction.

    Raises (nothing written): InvalidSelection for a bad selection, NothingMatches when it
    matches no dead letter, PreviewMismatch (above), InvalidSettings for a bad action, mode,
    batch size or rate. The audit log gets a 'started' row with the exact count.
    """
    if action not in ACTIONS:
        raise InvalidSettings(f"action must be one of {', '.join(ACTIONS)} (got {action!r})")
    if action == "purge" and purge_mode not in PURGE_MODES:
        raise InvalidSettings(f"purge mode must be one of {', '.join(PURGE_MODES)} (got {purge_mode!r})")
    if not actor or not str(actor).strip():
        raise InvalidSettings("an operation needs an actor (who is doing this)")
    check_batching(batch_size, rate)
    reason = clean_reason(reason)  # console.actions' rule (ValueError when it says nothing)
    sel = as_selection(selection)
    if preview is not None and preview.selection_hash != selection_hash(sel):
        raise PreviewMismatch(f"the selection ({sel.describe()}) is not the one that was previewed "
                              "(its selection_hash differs): preview again")
    with conn.transaction():
        with time_limited(conn, timeout_ms) as cur:
            now = cur.execute("SELECT now() AS now").fetchone()["now"]
            snapshot_at = now if preview is None else preview.previewed_at
            if snapshot_at > now:
                raise PreviewMismatch(f"previewed_at {snapshot_at.isoformat()} is in the future: preview again")
            found = cur.execute(selection_query("count_matching_at"), {
                **sel.params(), "snapshot_at": snapshot_at, "max_id": None if preview is None else preview.max_id,
            }).fetchone()
            total = found["total"]
            if preview is not None:
                current = cur.execute(selection_query("count_matching"), sel.params()).fetchone()["total"]
                _check_preview(preview, total=total, current=current)
            if total == 0:
                raise NothingMatches(f"nothing to {action}: no job matches {sel.describe()}"
                                     + (group_hint(conn, sel.fingerprint) if sel.fingerprint else ""))
            op_id = cur.execute(query("deadletters", "op_insert"), {
                "action": action,
                "purge_mode": purge_mode if action == "purge" else None,
                "selection": Jsonb(sel.to_dict()),
                "actor": actor,
                "reason": reason,
                "snapshot_at": snapshot_at,
                "total": total,
                "batch_size": batch_size,
                "rate": float(rate) if rate else None,
                "max_id": found["max_id"],
                "previewed_at": None if preview is None else preview.previewed_at,
                "previewed_total": None if preview is None else preview.total,
            }).fetchone()["id"]
        audit.record(conn, actor=actor, action=action, target=f"operation:{op_id}", selection=sel.to_dict(),
                     reason=reason, rows=total, outcome="started",
                     detail={"purge_mode": purge_mode if action == "purge" else None, "batch_size": batch_size, "rate": rate,
                             "max_id": found["max_id"], "snapshot_at": snapshot_at.isoformat(), "previewed": preview is not None})
    return op_id


def _check_preview(preview: Previewed, *, total: int, current: int) -> None:
    """`current`: what the selection matches now; `total`: what it matches within the preview's
    bound (failed by previewed_at, id <= max_id). Both must be the previewed count: new
    failures, and jobs replayed or purged since, both mean the operator confirmed another set."""
    if current != preview.total:
        raise PreviewMismatch(f"the selection now matches {current:,} jobs, you previewed {preview.total:,}: preview again")
    if total != preview.total:
        raise PreviewMismatch(f"the selection matches {current:,} jobs as previewed, but {preview.total - total:,} of those "
                              "you previewed are gone and others took their place: preview again")


def progress(conn: psycopg.Connection, op_id: int) -> dict[str, Any]:
    """The operation as it stands: state, total, done, percent, rows/s, eta_s, cancel request..."""
    with conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("deadletters", "op_get"), {"id": op_id}).fetchone()
    if op is None:
        raise OperationState(f"there is no bulk operation {op_id}")
    return _describe(op)


def _describe(op: dict[str, Any]) -> dict[str, Any]:
    out = dict(op)
    total, done = op["total"] or 0, op["done"] or 0
    out["percent"] = 100.0 if total == 0 else min(100.0, round(100.0 * done / total, 1))
    out["active"] = op["state"] in ("queued", "running")
    rate = None
    if op["started_at"] and done:
        end = op["finished_at"] or op["heartbeat_at"]
        seconds = (end - op["started_at"]).total_seconds() if end else 0
        rate = round(done / seconds, 1) if seconds > 0 else None
    out["rows_per_s"] = rate
    out["eta_s"] = round(max(total - done, 0) / rate, 1) if rate and out["active"] else None
    return out


def cancel(conn: psycopg.Connection, op_id: int, *, actor: str, reason: str | None = None) -> dict[str, Any]:
    """Ask the operation to stop between two batches. One that no process is running (queued,
    or its runner died) is closed at once. Raises OperationState if it already ended."""
    if not actor:
        raise InvalidSettings("a cancel needs an actor")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("deadletters", "op_request_cancel"), {"id": op_id, "actor": actor}).fetchone()
        if op is None:
            existing = cur.execute(query("deadletters", "op_get"), {"id": op_id}).fetchone()
            if existing is None:
                raise OperationState(f"there is no bulk operation {op_id}")
            raise OperationState(f"operation {op_id} has already ended ({existing['state']})")
        unattended = cur.execute(query("deadletters", "op_try_xact_lock"), _lock_params(op_id)).fetchone()["locked"]
        if unattended:
            op = cur.execute(query("deadletters", "op_finish"),
                             {"id": op_id, "state": "cancelled", "error": None, "cancelled_by": actor}).fetchone()
        audit.record(conn, actor=actor, action="cancel", target=f"operation:{op_id}", selection=op["selection"],
                     reason=reason, rows=op["done"], outcome="ok", detail={"operation_action": op["action"]})
        if unattended:
            _audit_end(conn, op)
    return _describe(op)


def resume(conn: psycopg.Connection, op_id: int, *, actor: str, reason: str | None = None) -> dict[str, Any]:
    """Reopen a cancelled or failed operation so `run()` continues from its cursor, with its
    original snapshot: rows it already touched are not touched again. Audited."""
    if not actor:
        raise InvalidSettings("a resume needs an actor")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("deadletters", "op_reopen"), {"id": op_id}).fetchone()
        if op is None:
            existing = cur.execute(query("deadletters", "op_get"), {"id": op_id}).fetchone()
            if existing is None:
                raise OperationState(f"there is no bulk operation {op_id}")
            raise OperationState(f"operation {op_id} is {existing['state']}: only a cancelled or failed one can be resumed")
        audit.record(conn, actor=actor, action="resume_operation", target=f"operation:{op_id}",
                     selection=op["selection"], reason=reason, rows=op["total"] - op["done"], outcome="ok",
                     detail={"operation_action": op["action"]})
    return _describe(op)


def _audit_end(conn: psycopg.Connection, op: dict[str, Any]) -> None:
    outcome = {"done": "ok", "cancelled": "cancelled"}.get(op["state"], "error")
    try:  # the start's reason, checked when it was given; one stored before today's rule is left out
        reason = clean_reason(op["reason"])
    except ValueError:
        reason = None
    audit.record(conn, actor=op["actor"], action=op["action"], target=f"operation:{op['id']}",
                 selection=op["selection"], reason=reason, rows=op["done"], outcome=outcome,
                 detail={"total": op["total"], "batches": op["batches"], "purge_mode": op["purge_mode"],
                         "cancelled_by": op["cancelled_by"], "error": op["error"]})


def run(
    dsn: str,
    op_id: int,
    *,
    stop: threading.Event | None = None,
    history: int = 20,
    statement_timeout_ms: int = 30_000,
    on_batch: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Work the operation to its end (done, cancelled or failed) and return its progress.

    Opens its own connection. If another process is already running it, returns at once. If
    `stop` is set (the process is shutting down), it stops between batches and leaves the
    operation 'running' for `resume_abandoned()`. A database error marks it 'failed' (with the
    error) when that can still be written, and is re-raised. `on_batch(rows, ms)` is called
    after each committed batch (benchmarks time the batches with it).
    """
    with connect(dsn, application_name=f"skiplock-bulk-{op_id}") as conn:
        if not conn.execute(query("deadletters", "op_try_lock"), _lock_params(op_id)).fetchone()[0]:
            log.info("bulk operation %s is already being run by another process", op_id)
            return progress(conn, op_id)
        try:
            return _run_locked(conn, op_id, stop or threading.Event(), history, statement_timeout_ms, on_batch)
        finally:
            if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                conn.execute(query("deadletters", "op_unlock"), _lock_params(op_id))


def _run_locked(conn: psycopg.Connection, op_id: int, stop: threading.Event, history: int, timeout_ms: int,
                on_batch: Callable[[int, float], None] | None) -> dict[str, Any]:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("deadletters", "op_begin"), {"id": op_id}).fetchone()
    if op is None:
        return progress(conn, op_id)  # ended already (or raises OperationState if it never existed)
    sel = Selection.from_dict(op["selection"])
    batch_query = selection_query("replay_batch" if op["action"] == "replay" else "purge_batch")
    params = {
        **sel.params(),
        "snapshot_at": op["snapshot_at"],
        "max_id": op["max_id"],  # the preview's bound: nothing above it is touched, even on resume
        "batch_size": op["batch_size"],
        "actor": op["actor"],
        "reason": op["reason"],
        "operation": op_id,
        "history": history,
        "to_archive": op["purge_mode"] == "archive",
    }
    after = {"after_finished_at": op["cursor_finished_at"] or "-infinity", "after_id": op["cursor_id"] or 0}
    throttle = Throttle(op["rate"], stop=stop)
    log.info("bulk %s %s: %s rows to go", op["action"], op_id, op["total"] - op["done"])
    try:
        while True:
            t0 = time.perf_counter()
            with time_limited(conn, timeout_ms) as cur:
                current = cur.execute(query("deadletters", "op_lock"), {"id": op_id}).fetchone()
                if current["cancel_requested_at"] is not None:
                    ended = cur.execute(query("deadletters", "op_finish"),
                                        {"id": op_id, "state": "cancelled", "error": None, "cancelled_by": None}).fetchone()
                    break
                row = cur.execute(batch_query, {**params, **after}).fetchone()
                if row["last_id"] is None:
                    ended = cur.execute(query("deadletters", "op_finish"),
                                        {"id": op_id, "state": "done", "error": None, "cancelled_by": None}).fetchone()
                    break
                cur.execute(query("deadletters", "op_batch_done"), {
                    "id": op_id, "rows": row["rows"],
                    "cursor_finished_at": row["last_finished_at"], "cursor_id": row["last_id"]})
            after = {"after_finished_at": row["last_finished_at"], "after_id": row["last_id"]}
            if on_batch is not None:
                on_batch(row["rows"], (time.perf_counter() - t0) * 1000.0)
            if not throttle.wait(row["rows"], time.perf_counter() - t0, interrupted=lambda: _cancel_requested(conn, op_id)):
                log.info("bulk operation %s stopped between batches; resume_abandoned() will finish it", op_id)
                return progress(conn, op_id)
    except Exception as exc:
        try:
            with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                ended = cur.execute(query("deadletters", "op_finish"), {
                    "id": op_id, "state": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000], "cancelled_by": None,
                }).fetchone()
                _audit_end(conn, ended)
        except psycopg.Error:
            log.warning("bulk operation %s: could not record its failure; it stays resumable", op_id)
        raise
    with conn.transaction():
        _audit_end(conn, ended)
    log.info("bulk %s %s ended: %s, %s rows", ended["action"], op_id, ended["state"], ended["done"])
    return _describe(ended)


def _cancel_requested(conn: psycopg.Connection, op_id: int) -> bool:
    """Polled during a long throttle pause, so a cancel is not kept waiting for it."""
    with conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("deadletters", "op_get"), {"id": op_id}).fetchone()
    return op is None or op["cancel_requested_at"] is not None


def run_in_thread(dsn: str, op_id: int, **kwargs: Any) -> threading.Thread:
    """Start `run()` in a daemon thread (the web console's way); poll `progress()` meanwhile.
    Errors are recorded on the operation row, and logged."""

    def target() -> None:
        try:
            run(dsn, op_id, **kwargs)
        except Exception:
            log.exception("bulk operation %s failed", op_id)

    thread = threading.Thread(target=target, name=f"skiplock-bulk-{op_id}", daemon=True)
    thread.start()
    return thread


def resume_abandoned(
    dsn: str,
    *,
    min_age: timedelta = timedelta(seconds=30),
    stop: threading.Event | None = None,
    history: int = 20,
) -> list[int]:
    """Finish operations nobody is running: 'running' ones whose runner died, and 'queued' ones
    older than `min_age`. Runs them one after another in this thread; returns their ids.
    The scheduler calls this periodically."""
    with connect(dsn, application_name="skiplock-bulk-resume") as conn:
        ids = [r[0] for r in conn.execute(query("deadletters", "ops_active"), {"min_age": min_age}).fetchall()]
    resumed = []
    for op_id in ids:
        if stop is not None and stop.is_set():
            break
        before = None
        with connect(dsn, application_name="skiplock-bulk-resume") as conn:
            before = progress(conn, op_id)
        after = run(dsn, op_id, stop=stop, history=history)
        if after["batches"] != before["batches"] or after["state"] != before["state"]:
            resumed.append(op_id)
    return resumed


def recent(conn: psycopg.Connection, *, limit: int = 20) -> list[dict[str, Any]]:
    """Newest operations first, with progress figures."""
    if not 1 <= limit <= 500:
        raise InvalidSettings("limit must be between 1 and 500")
    with conn.cursor(row_factory=dict_row) as cur:
        return [_describe(op) for op in cur.execute(query("deadletters", "ops_recent"), {"limit": limit}).fetchall()]


def replay(dsn: str, selection: Selection | Mapping[str, Any], *, actor: str, reason: str | None = None,
           rate: float | None = None, batch_size: int = 1000, history: int = 20) -> dict[str, Any]:
    """start() + run() in one call: replay the selection now and return the final progress."""
    with connect(dsn, application_name="skiplock-bulk") as conn:
        op_id = start(conn, "replay", selection, actor=actor, reason=reason, rate=rate, batch_size=batch_size)
    return run(dsn, op_id, history=history)


def purge(dsn: str, selection: Selection | Mapping[str, Any], *, actor: str, reason: str | None = None,
          rate: float | None = None, batch_size: int = 1000, mode: str = "delete") -> dict[str, Any]:
    """start() + run() in one call: purge the selection now and return the final progress."""
    with connect(dsn, application_name="skiplock-bulk") as conn:
        op_id = start(conn, "purge", selection, actor=actor, reason=reason, rate=rate, batch_size=batch_size,
                      purge_mode=mode)
    return run(dsn, op_id)
