"""Operator actions on queues Skiplock did not create: replay and purge dead letters, cancel a
waiting job, pause and resume a queue, each the way the library itself does it (the adapters'
`offered`, sql/external_actions.sql), with the rails of Skiplock's own dead letters.

    adapter = source(config, "boss")                      # UnknownSource when not configured
    p = preview(src, adapter, Selection(queue="emails"))  # exact count, sample, digest
    op_id = start(console, src, adapter, "replay", selection, actor=..., reason=..., preview=p.bound())
    run(console_dsn, op_id, sources)                      # batches, throttled, cancellable
    cancel_jobs(console, src, adapter, ["42"], actor=..., reason=...)
    set_paused(console, src, adapter, "emails", True, actor=..., reason=...)

Nothing here writes to a source whose entry lacks `actions = true`: every function that would
checks `require_action` first and raises ActionsOff before it connects or reads (the faces
answer 403, or exit code 2). Reads (list, preview) run READ ONLY under a statement timeout.

Bound to the preview: a replay or purge works through exactly the jobs its preview counted.
`start()` reads their keys again in one REPEATABLE READ snapshot, refuses (PreviewMismatch,
nothing written) unless they are as many and the same (the MD5 of the keys in order) as
previewed, and keeps them as the operation's items. `run()` takes them `batch_size` at a time
from the operation's cursor: each batch locks those of its jobs that are still dead letters
(FOR UPDATE; the libraries' workers claim with SKIP LOCKED) and makes the library's change to
exactly those; a job that is no longer a dead letter (replayed by someone else, claimed, purged)
is skipped and counted as such, never touched. A job that fails again after its replay is not a
new item: nothing beyond the items is ever touched, resumed or not.

Transactions: when the source lives in the console's own database (no `dsn` of its own), a
batch's change and the operation's cursor are one transaction, so a crash loses nothing and a
resume never repeats a batch. With its own `dsn` they are two: the source's batch commits
first, then the cursor; a crash between them makes a resume offer that batch again, and the
library's change only applies to jobs still in the state it needs (a replayed job that failed
again meanwhile would be replayed again: say so when that matters).

Audit: each start, end, cancel and resume, and every cancel, pause and resume of one queue, is a
row with the actor and reason, its target `<system>:<source>/...` and `system`, `external` and
`queue` in its selection and detail. Reasons follow console.actions (the same table as
Skiplock's own queue: replay_one / replay_many / purge / cancel_job / pause / resume).

This module does not render, schedule or ask for confirmation (the faces show `preview()` first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit
from console.actions import clean_reason
from console.db import connect
from console.external import ACTION_NAMES, Adapter, adapters
from console.maintenance._throttle import Throttle
from console.maintenance.archive import check_batching
from console.maintenance.errors import (
    InvalidSelection,
    InvalidSettings,
    MaintenanceError,
    NothingMatches,
    OperationState,
    PreviewMismatch,
)
from console.sqlfiles import query
from console.timefmt import parse_instant

log = logging.getLogger("skiplock.external.actions")

BULK_ACTIONS = ("replay", "purge")
STATES = ("queued", "running", "done", "cancelled", "failed")
MAX_ITEMS = 100_000  # jobs one operation may name; a larger selection must be narrowed
MAX_KEYS = 10_000  # keys a selection may list
DEFAULT_TIMEOUT_MS = 5000
LOCK_CLASS = 0x5C1B_E07  # advisory lock namespace of external operations (second key: the op id)


class UnknownSource(MaintenanceError):
    """No [[external_queues]] entry of that name in this database (HTTP 404)."""


class ActionsOff(MaintenanceError):
    """The source's entry lacks `actions = true`, or its library does not offer the action (HTTP 403)."""


# --- which jobs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """Which dead letters of one source: its queue, and/or a list of job keys, or all of them."""

    queue: str | None = None
    keys: tuple[str, ...] | None = None
    all: bool = False

    def __post_init__(self) -> None:
        if self.queue is not None and (not isinstance(self.queue, str) or not self.queue.strip() or len(self.queue) > 500
                                       or "\x00" in self.queue):
            raise InvalidSelection(f"queue must be a non-empty name of at most 500 characters (got {self.queue!r:.80})")
        if self.queue is not None:
            object.__setattr__(self, "queue", self.queue.strip())
        if self.keys is not None:
            if isinstance(self.keys, str | bytes) or not hasattr(self.keys, "__iter__"):
                raise InvalidSelection(f"keys must be a list of job keys (got {self.keys!r})")
            keys = tuple(str(k).strip() for k in self.keys if str(k).strip())
            if not keys:
                raise InvalidSelection("keys is an empty list: name at least one job")
            if len(keys) > MAX_KEYS:
                raise InvalidSelection(f"keys: at most {MAX_KEYS:,} at once; use the queue for more")
            object.__setattr__(self, "keys", tuple(sorted(set(keys))))
        if not isinstance(self.all, bool):
            raise InvalidSelection("all must be true or false")
        given = self.queue is not None or self.keys is not None
        if self.all and given:
            raise InvalidSelection("`all` selects every dead letter of the source; it cannot be combined with queue or keys")
        if not self.all and not given:
            raise InvalidSelection("a selection needs a queue, job keys, or all=true")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Selection:
        if not isinstance(data, Mapping):
            raise InvalidSelection("a selection must be an object: {queue, keys, all}")
        unknown = set(data) - {"queue", "keys", "all"}
        if unknown:
            raise InvalidSelection(f"unknown filter(s): {', '.join(sorted(unknown))}; known: queue, keys, all")
        values = {k: v for k, v in data.items() if v is not None}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.all:
            out["all"] = True
        if self.queue is not None:
            out["queue"] = self.queue
        if self.keys is not None:
            out["keys"] = list(self.keys)
        return out

    def describe(self) -> str:
        if self.all:
            return "every dead letter of the source"
        parts = []
        if self.queue is not None:
            parts.append(f"queue = {self.queue!r}")
        if self.keys is not None:
            shown = ", ".join(self.keys[:10]) + (f" and {len(self.keys) - 10} more" if len(self.keys) > 10 else "")
            parts.append(f"job in ({shown})")
        return "dead letters with " + " and ".join(parts)

    def checked(self, adapter: Adapter) -> Selection:
        """The selection with its keys in the library's form; InvalidSelection for one that
        cannot name a job of this library."""
        if self.keys is None:
            return self
        try:
            return Selection(queue=self.queue, keys=tuple(adapter.check_key(k) for k in self.keys))
        except ValueError as exc:
            raise InvalidSelection(f"keys: {exc}") from None

    def params(self, adapter: Adapter) -> dict[str, Any]:
        keys = list(self.keys or ())
        return {"queue": self.queue, "all_keys": self.keys is None, **adapter.key_params(keys)}


def as_selection(selection: Selection | Mapping[str, Any]) -> Selection:
    return selection if isinstance(selection, Selection) else Selection.from_dict(selection)


def selection_hash(source: str, selection: Selection) -> str:
    canonical = json.dumps({"source": source, **selection.to_dict()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- sources ----------------------------------------------------------------------------------

def source(config: Any, name: str, database: str | None = None) -> Adapter:
    """The adapter of the [[external_queues]] entry `name` (of `database`, when given)."""
    for adapter in adapters(config, database):
        if adapter.name == name:
            return adapter
    raise UnknownSource(f"there is no external queue {name!r} in this database's [[external_queues]]")


def require_action(adapter: Adapter, action: str) -> None:
    """ActionsOff unless the console may `action` this source (before anything connects)."""
    if action not in ACTION_NAMES:
        raise InvalidSettings(f"action must be one of {', '.join(ACTION_NAMES)} (got {action!r})")
    if action not in adapter.offered:
        why = adapter.withheld.get(action) or adapter.no_actions
        raise ActionsOff(f"{adapter.system} source {adapter.name!r} offers no {action}: {why}")
    if not adapter.entry.actions:
        raise ActionsOff(f"actions are off for {adapter.name!r} ({adapter.system}): its [[external_queues]] entry has no "
                         "`actions = true`, so the console does not write to its tables")


def open_source(adapter: Adapter, console_dsn: str, *, application_name: str = "skiplock-external") -> psycopg.Connection:
    """A connection to the database the source lives in (its own `dsn`, else the console's)."""
    return connect(adapter.entry.dsn or console_dsn, application_name=application_name)


def _compose(adapter: Adapter, name: str, **extra: sql.Composable) -> sql.Composed:
    shape = adapter.shape()
    pieces = {"table": adapter.table_ident(), "key": shape.key, "key_match": shape.key_match, "queue": shape.queue,
              "failed": shape.failed, "pending": shape.pending, "failed_at": shape.failed_at, "error": shape.error,
              "attempts": shape.attempts, **adapter.statement_identifiers(), **extra}
    return sql.SQL(query("external_actions", name)).format(**pieces)


def _read_only(cur: psycopg.Cursor, timeout_ms: int) -> None:
    cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))


# --- reading ----------------------------------------------------------------------------------

def list_dead_letters(src: psycopg.Connection, adapter: Adapter, selection: Selection | Mapping[str, Any] | None = None,
                      *, limit: int = 50, before: tuple[datetime | None, str] | None = None,
                      timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[dict[str, Any]]:
    """The source's dead letters matching `selection` (all when None), newest failure first:
    key, queue, failed_at, error, attempts. Page on with `before=(failed_at, key)`. READ ONLY."""
    if not 1 <= limit <= 1000:
        raise InvalidSelection("limit must be between 1 and 1000")
    sel = (Selection(all=True) if selection is None else as_selection(selection)).checked(adapter)
    params = {**sel.params(adapter), "limit": limit, "before_at": before[0] if before else None,
              "before_key": before[1] if before else None}
    with src.transaction(), src.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TRANSACTION READ ONLY")
        _read_only(cur, timeout_ms)
        return cur.execute(_compose(adapter, "dead_letters_list"), params).fetchall()


@dataclass(frozen=True)
class Previewed:
    """The preview a start confirms: `total` dead letters whose keys in order hash to `digest`,
    at `previewed_at`, for the selection (and source) of `selection_hash`. Faces carry it as
    the form fields of PREVIEW_FIELDS (`expected` is the total)."""

    total: int
    digest: str
    previewed_at: datetime
    selection_hash: str

    def as_fields(self) -> dict[str, Any]:
        return {"expected": self.total, "digest": self.digest, "previewed_at": self.previewed_at.isoformat(),
                "selection_hash": self.selection_hash}

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> Previewed | None:
        given = {k: str(values.get(k) or "").strip() for k in PREVIEW_FIELDS}
        if not any(given.values()):
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise InvalidSelection(f"the preview being confirmed is incomplete: missing {', '.join(missing)} "
                                   "(send back every field of the preview's `confirm`)")
        if not given["expected"].isdigit():
            raise InvalidSelection(f"expected: {given['expected'][:40]!r} is not a whole number from the preview")
        for name, size in (("digest", 32), ("selection_hash", 64)):
            value = given[name].lower()
            if len(value) != size or any(c not in "0123456789abcdef" for c in value):
                raise InvalidSelection(f"{name}: not the preview's {name} ({size} hexadecimal digits)")
        at = parse_instant(given["previewed_at"], "previewed_at", relative=False, error=InvalidSelection)
        return cls(int(given["expected"]), given["digest"].lower(), at, given["selection_hash"].lower())


PREVIEW_FIELDS = ("expected", "digest", "previewed_at", "selection_hash")


@dataclass
class Preview:
    """What a replay or purge would touch: the exact count, a sample (newest failures), the
    selection as understood, and what a start is bound to (`bound()`; None when nothing matches
    or more than MAX_ITEMS do)."""

    source: str
    system: str
    total: int
    sample: list[dict[str, Any]]
    selection: dict[str, Any]
    description: str
    digest: str
    previewed_at: datetime
    selection_hash: str
    too_many: bool = False

    def bound(self) -> Previewed | None:
        if not self.total or self.too_many:
            return None
        return Previewed(self.total, self.digest, self.previewed_at, self.selection_hash)

    def as_dict(self) -> dict[str, Any]:
        bound = self.bound()
        return {"source": self.source, "system": self.system, "total": self.total, "too_many": self.too_many,
                "sample": self.sample, "selection": self.selection, "description": self.description,
                "previewed_at": self.previewed_at, "confirm": bound.as_fields() if bound else None}


def preview(src: psycopg.Connection, adapter: Adapter, selection: Selection | Mapping[str, Any], *, sample: int = 10,
            timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Preview:
    """The exact count (up to MAX_ITEMS; `too_many` beyond), a sample and the digest of the
    selected dead letters, in one READ ONLY snapshot. Changes nothing; any source may be
    previewed (the faces offer it only where actions are on)."""
    sel = as_selection(selection).checked(adapter)
    params = {**sel.params(adapter), "cap": MAX_ITEMS + 1}
    with src.transaction(), src.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        _read_only(cur, timeout_ms)
        found = cur.execute(_compose(adapter, "dead_letters_digest"), params).fetchone()
        rows = []
        if found["total"] and sample:
            rows = cur.execute(_compose(adapter, "dead_letters_list"), {
                **sel.params(adapter), "limit": max(1, min(sample, 1000)), "before_at": None, "before_key": None,
            }).fetchall()
    too_many = found["total"] > MAX_ITEMS
    return Preview(adapter.name, adapter.system, found["total"], rows,
                   sel.to_dict(), sel.describe(), found["digest"], found["previewed_at"],
                   selection_hash(adapter.name, sel), too_many)


# --- starting an operation -------------------------------------------------------------------

def _lock_params(op_id: int) -> dict[str, int]:
    return {"lock_class": LOCK_CLASS, "lock_id": op_id & 0x7FFF_FFFF}


def _target(adapter: Adapter, what: str) -> str:
    return f"{adapter.system}:{adapter.name}/{what}"


def _labels(adapter: Adapter, queue: str | None = None) -> dict[str, Any]:
    return {"system": adapter.system, "external": adapter.name, **({"queue": queue} if queue else {})}


def start(console: psycopg.Connection, src: psycopg.Connection, adapter: Adapter, action: str,
          selection: Selection | Mapping[str, Any], *, actor: str, reason: str | None = None, rate: float | None = None,
          batch_size: int = 500, preview: Previewed | None = None, database_name: str | None = None,
          timeout_ms: int = 10_000) -> int:
    """Record a replay or purge of the selected dead letters and return its id (state 'queued').

    Refuses, with nothing written: ActionsOff (actions off, or not offered), InvalidSelection,
    NothingMatches, InvalidSettings (action, batch size, rate; more than MAX_ITEMS jobs),
    PreviewMismatch (another selection than previewed, or other jobs match now than the
    preview counted). `src` and `console` may be one connection (a source in the console's
    database). The audit log gets a 'started' row with the exact count."""
    if action not in BULK_ACTIONS:
        raise InvalidSettings(f"action must be one of {', '.join(BULK_ACTIONS)} (got {action!r})")
    require_action(adapter, action)
    if not actor or not str(actor).strip():
        raise InvalidSettings("an operation needs an actor (who is doing this)")
    check_batching(batch_size, rate)
    reason = clean_reason(reason)
    sel = as_selection(selection).checked(adapter)
    digest_of_selection = selection_hash(adapter.name, sel)
    if preview is not None and preview.selection_hash != digest_of_selection:
        raise PreviewMismatch(f"the selection ({sel.describe()}) is not the one that was previewed: preview again")
    with src.transaction(), src.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        _read_only(cur, timeout_ms)
        params = {**sel.params(adapter), "cap": MAX_ITEMS + 1}
        found = cur.execute(_compose(adapter, "dead_letters_digest"), params).fetchone()
        if found["total"] > MAX_ITEMS:
            raise InvalidSettings(f"more than {MAX_ITEMS:,} dead letters match {sel.describe()}: narrow the selection "
                                  "(one queue, or a list of jobs)")
        keys = [r["key"] for r in cur.execute(_compose(adapter, "dead_letters_keys"), params).fetchall()]
    if not keys:
        raise NothingMatches(f"nothing to {action}: no dead letter of {adapter.name!r} matches {sel.describe()}")
    if preview is not None:
        if found["total"] != preview.total:
            raise PreviewMismatch(f"the selection now matches {found['total']:,} dead letters, you previewed "
                                  f"{preview.total:,}: preview again")
        if found["digest"] != preview.digest:
            raise PreviewMismatch(f"the selection matches {found['total']:,} dead letters as previewed, but not the same "
                                  "ones (some were replayed, purged or failed since): preview again")
    with console.transaction(), console.cursor(row_factory=dict_row) as cur:
        op_id = cur.execute(query("external_actions", "op_insert"), {
            "source": adapter.name, "system": adapter.system, "database_name": database_name, "action": action,
            "selection": Jsonb(sel.to_dict()), "actor": actor, "reason": reason, "total": len(keys),
            "batch_size": batch_size, "rate": float(rate) if rate else None,
            "previewed_at": None if preview is None else preview.previewed_at, "keys_digest": found["digest"],
        }).fetchone()["id"]
        cur.execute(query("external_actions", "op_items_insert"), {"id": op_id, "keys": keys})
        audit.record(console, actor=actor, action=action, target=_target(adapter, f"operation:{op_id}"),
                     selection={**sel.to_dict(), **_labels(adapter)}, reason=reason, rows=len(keys), outcome="started",
                     detail={**_labels(adapter, sel.queue), "batch_size": batch_size, "rate": rate,
                             "previewed": preview is not None, "how": adapter.offered[action]})
    return op_id


# --- progress, cancel, resume ------------------------------------------------------------------

def _describe(op: dict[str, Any]) -> dict[str, Any]:
    out = dict(op)
    total, worked = op["total"] or 0, (op["done"] or 0) + (op["skipped"] or 0)
    out["worked"] = worked
    out["percent"] = 100.0 if total == 0 else min(100.0, round(100.0 * worked / total, 1))
    out["active"] = op["state"] in ("queued", "running")
    rate = None
    if op["started_at"] and worked:
        end = op["finished_at"] or op["heartbeat_at"]
        seconds = (end - op["started_at"]).total_seconds() if end else 0
        rate = round(worked / seconds, 1) if seconds > 0 else None
    out["rows_per_s"] = rate
    out["eta_s"] = round(max(total - worked, 0) / rate, 1) if rate and out["active"] else None
    return out


def progress(console: psycopg.Connection, op_id: int) -> dict[str, Any]:
    """The operation as it stands: state, total, done (changed), skipped, percent, rows/s, ETA."""
    with console.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("external_actions", "op_get"), {"id": op_id}).fetchone()
    if op is None:
        raise OperationState(f"there is no external-queue operation {op_id}")
    return _describe(op)


def recent(console: psycopg.Connection, *, source: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    if not 1 <= limit <= 500:
        raise InvalidSettings("limit must be between 1 and 500")
    with console.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("external_actions", "ops_recent"), {"source": source, "limit": limit}).fetchall()
    return [_describe(op) for op in rows]


def _op_labels(op: dict[str, Any]) -> dict[str, Any]:
    return {"system": op["system"], "external": op["source"], **({"queue": op["selection"].get("queue")}
                                                                  if op["selection"].get("queue") else {})}


def _op_target(op: dict[str, Any]) -> str:
    return f"{op['system']}:{op['source']}/operation:{op['id']}"


def cancel(console: psycopg.Connection, op_id: int, *, actor: str, reason: str | None = None) -> dict[str, Any]:
    """Ask the operation to stop between two batches (one nobody runs is closed at once)."""
    if not actor:
        raise InvalidSettings("a cancel needs an actor")
    with console.transaction(), console.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("external_actions", "op_request_cancel"), {"id": op_id, "actor": actor}).fetchone()
        if op is None:
            existing = cur.execute(query("external_actions", "op_get"), {"id": op_id}).fetchone()
            if existing is None:
                raise OperationState(f"there is no external-queue operation {op_id}")
            raise OperationState(f"operation {op_id} has already ended ({existing['state']})")
        unattended = cur.execute(query("external_actions", "op_try_xact_lock"), _lock_params(op_id)).fetchone()["locked"]
        if unattended:
            op = cur.execute(query("external_actions", "op_finish"),
                             {"id": op_id, "state": "cancelled", "error": None, "cancelled_by": actor}).fetchone()
        audit.record(console, actor=actor, action="cancel", target=_op_target(op), selection=op["selection"],
                     reason=reason, rows=op["done"], outcome="ok",
                     detail={**_op_labels(op), "operation_action": op["action"]})
        if unattended:
            _audit_end(console, op)
    return _describe(op)


def resume(console: psycopg.Connection, op_id: int, *, actor: str, reason: str | None = None,
           adapter: Adapter | None = None) -> dict[str, Any]:
    """Reopen a cancelled or failed operation so `run()` goes on from its cursor (its items
    only). With `adapter`, refuses (ActionsOff) when its actions were switched off since."""
    if not actor:
        raise InvalidSettings("a resume needs an actor")
    with console.transaction(), console.cursor(row_factory=dict_row) as cur:
        existing = cur.execute(query("external_actions", "op_get"), {"id": op_id}).fetchone()
        if existing is None:
            raise OperationState(f"there is no external-queue operation {op_id}")
        if adapter is not None:
            require_action(adapter, existing["action"])
        op = cur.execute(query("external_actions", "op_reopen"), {"id": op_id}).fetchone()
        if op is None:
            raise OperationState(f"operation {op_id} is {existing['state']}: only a cancelled or failed one can be resumed")
        audit.record(console, actor=actor, action="resume_operation", target=_op_target(op), selection=op["selection"],
                     reason=reason, rows=op["total"] - op["done"] - op["skipped"], outcome="ok",
                     detail={**_op_labels(op), "operation_action": op["action"]})
    return _describe(op)


def _audit_end(console: psycopg.Connection, op: dict[str, Any]) -> None:
    outcome = {"done": "ok", "cancelled": "cancelled"}.get(op["state"], "error")
    try:
        reason = clean_reason(op["reason"])
    except ValueError:
        reason = None
    audit.record(console, actor=op["actor"], action=op["action"], target=_op_target(op), selection=op["selection"],
                 reason=reason, rows=op["done"], outcome=outcome,
                 detail={**_op_labels(op), "total": op["total"], "skipped": op["skipped"], "batches": op["batches"],
                         "cancelled_by": op["cancelled_by"], "error": op["error"]})


# --- running an operation ---------------------------------------------------------------------

def _act_batch(cur: psycopg.Cursor, adapter: Adapter, action: str, keys: list[str], note: str | None) -> int:
    """In the caller's transaction on the source: lock the batch's jobs that are still dead
    letters (or still wait, for cancel) and make the library's change to exactly those."""
    if adapter.needs_search_path:
        schema, _ = adapter.queue_table
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
    params = {**adapter.key_params(keys), "note": note}
    locked = cur.execute(_compose(adapter, "lock_waiting" if action == "cancel" else "lock_dead_letters"), params).fetchall()
    if not locked:
        return 0
    still = [r["key"] for r in locked]
    row = cur.execute(_compose(adapter, f"{adapter.statement_prefix}_{action}"), {**adapter.key_params(still), "note": note}).fetchone()
    return int(row["n"] or 0)


def run(console_dsn: str, op_id: int, sources: Mapping[str, Adapter], *, stop: threading.Event | None = None,
        statement_timeout_ms: int = 30_000, on_batch: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Work the operation to its end (done, cancelled or failed) and return its progress.
    `sources`: the adapters by entry name (the config's). Opens its own connections; if
    another process runs the operation, returns at once. A source whose actions were switched
    off since the start fails the operation with that message (nothing written to it)."""
    with connect(console_dsn, application_name=f"skiplock-external-{op_id}") as console:
        if not console.execute(query("external_actions", "op_try_lock"), _lock_params(op_id)).fetchone()[0]:
            log.info("external operation %s is already being run by another process", op_id)
            return progress(console, op_id)
        try:
            return _run_locked(console, console_dsn, op_id, sources, stop or threading.Event(), statement_timeout_ms,
                               on_batch)
        finally:
            if not console.closed and console.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                console.execute(query("external_actions", "op_unlock"), _lock_params(op_id))


def _finish(console: psycopg.Connection, op_id: int, state: str, error: str | None = None) -> dict[str, Any]:
    with console.transaction(), console.cursor(row_factory=dict_row) as cur:
        ended = cur.execute(query("external_actions", "op_finish"),
                            {"id": op_id, "state": state, "error": error, "cancelled_by": None}).fetchone()
        _audit_end(console, ended)
    return _describe(ended)


def _run_locked(console: psycopg.Connection, console_dsn: str, op_id: int, sources: Mapping[str, Adapter],
                stop: threading.Event, timeout_ms: int, on_batch: Callable[[int, float], None] | None) -> dict[str, Any]:
    with console.transaction(), console.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("external_actions", "op_begin"), {"id": op_id}).fetchone()
    if op is None:
        return progress(console, op_id)
    adapter = sources.get(op["source"])
    try:
        if adapter is None:
            raise ActionsOff(f"the source {op['source']!r} is no longer in [[external_queues]]")
        require_action(adapter, op["action"])
    except MaintenanceError as exc:
        return _finish(console, op_id, "failed", str(exc))
    same_database = not adapter.entry.dsn
    src = console if same_database else open_source(adapter, console_dsn, application_name=f"skiplock-external-{op_id}")
    throttle = Throttle(op["rate"], stop=stop)
    cursor = op["cursor"]
    log.info("external %s %s on %s: %s jobs to go", op["action"], op_id, op["source"], op["total"] - cursor)
    try:
        while True:
            t0 = time.perf_counter()
            with console.transaction(), console.cursor(row_factory=dict_row) as cur:
                cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
                current = cur.execute(query("external_actions", "op_lock"), {"id": op_id}).fetchone()
                if current["cancel_requested_at"] is not None:
                    state = "cancelled"
                    break
                items = cur.execute(query("external_actions", "op_items_next"),
                                    {"id": op_id, "cursor": cursor, "batch_size": op["batch_size"]}).fetchall()
                if not items:
                    state = "done"
                    break
                keys = [i["key"] for i in items]
                if same_database:  # the change and the cursor commit together
                    with console.transaction(), console.cursor(row_factory=dict_row) as src_cur:
                        cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
                        changed = _act_batch(src_cur, adapter, op["action"], keys, None)
                else:
                    with src.transaction(), src.cursor(row_factory=dict_row) as src_cur:
                        src_cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
                        src_cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
                        changed = _act_batch(src_cur, adapter, op["action"], keys, None)
                cursor = items[-1]["ord"]
                cur.execute(query("external_actions", "op_batch_done"), {
                    "id": op_id, "rows": changed, "skipped": len(keys) - changed, "cursor": cursor})
            if on_batch is not None:
                on_batch(changed, (time.perf_counter() - t0) * 1000.0)
            if not throttle.wait(len(keys), time.perf_counter() - t0,
                                 interrupted=lambda: _cancel_requested(console, op_id)):
                log.info("external operation %s stopped between batches; resume_abandoned() will finish it", op_id)
                return progress(console, op_id)
    except Exception as exc:
        try:
            if console.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                console.rollback()
            _finish(console, op_id, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        except psycopg.Error:
            log.warning("external operation %s: could not record its failure; it stays resumable", op_id)
        raise
    finally:
        if not same_database:
            src.close()
    ended = _finish(console, op_id, state)
    log.info("external %s %s ended: %s, %s changed, %s skipped", op["action"], op_id, ended["state"], ended["done"],
             ended["skipped"])
    return ended


def _cancel_requested(console: psycopg.Connection, op_id: int) -> bool:
    with console.cursor(row_factory=dict_row) as cur:
        op = cur.execute(query("external_actions", "op_get"), {"id": op_id}).fetchone()
    return op is None or op["cancel_requested_at"] is not None


def run_in_thread(console_dsn: str, op_id: int, sources: Mapping[str, Adapter], **kwargs: Any) -> threading.Thread:
    """`run()` in a daemon thread (the web console's way); errors are on the operation row."""

    def target() -> None:
        try:
            run(console_dsn, op_id, sources, **kwargs)
        except Exception:
            log.exception("external operation %s failed", op_id)

    thread = threading.Thread(target=target, name=f"skiplock-external-{op_id}", daemon=True)
    thread.start()
    return thread


def resume_abandoned(console_dsn: str, sources: Mapping[str, Adapter], *, min_age: timedelta = timedelta(seconds=30),
                     stop: threading.Event | None = None) -> list[int]:
    """Finish operations nobody runs (their runner died, or a queued one was never started)."""
    with connect(console_dsn, application_name="skiplock-external-resume") as console:
        ids = [r[0] for r in console.execute(query("external_actions", "ops_active"), {"min_age": min_age}).fetchall()]
    resumed = []
    for op_id in ids:
        if stop is not None and stop.is_set():
            break
        with connect(console_dsn, application_name="skiplock-external-resume") as console:
            before = progress(console, op_id)
        after = run(console_dsn, op_id, sources, stop=stop)
        if after["batches"] != before["batches"] or after["state"] != before["state"]:
            resumed.append(op_id)
    return resumed


def sources_of(config: Any, database: str | None = None) -> dict[str, Adapter]:
    return {a.name: a for a in adapters(config, database)}


# --- one job, one queue --------------------------------------------------------------------------

@dataclass
class Outcome:
    """What a cancel, pause or resume did: `changed` jobs or queues, `asked` for."""

    action: str
    changed: int
    asked: int
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "changed": self.changed, "asked": self.asked, **self.detail}


def _in_source(console: psycopg.Connection, src: psycopg.Connection, adapter: Adapter, timeout_ms: int,
               work: Callable[[psycopg.Cursor], int], record: Callable[[int], None]) -> int:
    """Run `work` in one transaction on the source, then `record` the audit row: in the same
    transaction when the source is in the console's database, else right after it commits."""
    if src is console or not adapter.entry.dsn:
        with console.transaction(), console.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
            changed = work(cur)
            record(changed)
        return changed
    with src.transaction(), src.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))
        changed = work(cur)
    with console.transaction():
        record(changed)
    return changed


def cancel_jobs(console: psycopg.Connection, src: psycopg.Connection, adapter: Adapter, keys: list[str], *, actor: str,
                reason: str | None = None, timeout_ms: int = 10_000) -> Outcome:
    """Cancel waiting jobs by key the library's way (adapter.offered['cancel']); a job that no
    longer waits is left alone (`changed` < `asked`). Audited as `cancel`."""
    require_action(adapter, "cancel")
    reason = clean_reason(reason)
    sel = Selection(keys=tuple(keys)).checked(adapter)
    note = f"cancelled from Skiplock by {actor}" + (f": {reason}" if reason else "")

    def record(changed: int) -> None:
        audit.record(console, actor=actor, action="cancel", target=_target(adapter, "jobs"),
                     selection={**sel.to_dict(), **_labels(adapter)}, reason=reason, rows=changed, outcome="ok",
                     detail={**_labels(adapter), "asked": len(sel.keys or ()), "how": adapter.offered["cancel"]})

    changed = _in_source(console, src, adapter, timeout_ms,
                         lambda cur: _act_batch(cur, adapter, "cancel", list(sel.keys or ()), note), record)
    return Outcome("cancel", changed, len(sel.keys or ()))


def set_paused(console: psycopg.Connection, src: psycopg.Connection, adapter: Adapter, queue: str, paused: bool, *,
               actor: str, reason: str | None = None, timeout_ms: int = 10_000) -> Outcome:
    """Pause or resume one of the source's queues through the library (BullMQ's pause())."""
    action = "pause" if paused else "resume"
    require_action(adapter, action)
    reason = clean_reason(reason)
    if not isinstance(queue, str) or not queue.strip() or len(queue) > 500 or "\x00" in queue:
        raise InvalidSelection("queue: name one queue (at most 500 characters)")

    def work(cur: psycopg.Cursor) -> int:
        cur.execute(_compose(adapter, f"{adapter.statement_prefix}_{action}"), {"queue": queue})
        return 1

    def record(changed: int) -> None:
        audit.record(console, actor=actor, action=action, target=_target(adapter, f"queue:{queue}"),
                     selection=_labels(adapter, queue), reason=reason, rows=changed, outcome="ok",
                     detail={**_labels(adapter, queue), "how": adapter.offered[action]})

    return Outcome(action, _in_source(console, src, adapter, timeout_ms, work, record), 1, {"queue": queue})


def paused_queues(src: psycopg.Connection, adapter: Adapter, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> set[str] | None:
    """The source's paused queues (None when the library has no pause). READ ONLY."""
    if "pause" not in adapter.offered:
        return None
    with src.transaction(), src.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TRANSACTION READ ONLY")
        _read_only(cur, timeout_ms)
        return adapter.paused_queues(cur)


__all__ = ["ActionsOff", "BULK_ACTIONS", "MAX_ITEMS", "Outcome", "PREVIEW_FIELDS", "Preview", "Previewed", "Selection",
           "UnknownSource", "cancel", "cancel_jobs", "list_dead_letters", "open_source", "paused_queues", "preview",
           "progress", "recent", "require_action", "resume", "resume_abandoned", "run", "run_in_thread", "selection_hash",
           "set_paused", "source", "sources_of", "start"]
