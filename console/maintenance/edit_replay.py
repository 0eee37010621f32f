"""Fix and replay: change a dead letter's payload, priority, queue or run-at, then replay it.

    edit = parse_edit(fields, payload_is_text=True)          # InvalidEdit (a ValueError) names the field
    shown = preview(conn, job_id, edit, keys=keys)           # the diff, redacted, and the job's `version`
    done = apply(conn, job_id, edit, version=shown.version,  # one transaction: lock, check, update, audit
                 actor="alice", reason="customer id fixed upstream", keys=keys)

The faces (web page, API, CLI) call these three; they decide who may (admins only) and how to
ask. Only a failed job is edited (`EditConflict`, HTTP 409, names why: running, pending,
completed), and only the edit a preview showed, on the job as it was: the preview's `version`
is the job's version (a digest of its state and fields, sql/edit_replay.sql) followed by the
edit's digest (`edit_digest`), so a client cannot preview one change and apply another.
`apply` locks the row, checks its status, its version and the edit, and updates it in one
statement guarded by the job's version, with the audit row in the same transaction. The job keeps its id: nothing is copied, so nothing is lost
or run twice.

Secrets never travel through an edit. The values of the redacted keys (`keys`: the defaults
and web.redact_keys, at any depth) are shown as `[redacted]` in the editable payload
(`editable_payload`), in the diff and in the audit row; a `[redacted]` left at such a key in
the new payload keeps the stored value at that path (`InvalidEdit` when there is none). So an
admin can fix a customer id beside a card number without ever seeing the card number, and the
diff of a changed secret says only that it changed.

This module does not know about users, roles or HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit, jsonbounds
from console.actions import require_reason
from console.maintenance.actions import check_known_queue
from console.maintenance.errors import UnknownQueue
from console.redaction import REDACTED, redact_text
from console.sqlfiles import query
from console.timefmt import parse_instant

EDITABLE = ("payload", "priority", "queue", "run_at")
# Fields a caller may send that are never editable here (a form's own fields are ignored).
NOT_EDITABLE = ("kind", "max_attempts", "attempts", "status", "idempotency_key", "headers", "id", "errors",
                "last_error", "error_fingerprint", "locked_by", "created_at", "finished_at")
MAX_NAME = 200
MAX_PAYLOAD_BYTES = 256 * 1024  # console.browse.MAX_PAYLOAD_BYTES: what the console's enqueue accepts
MAX_CHANGES = 200  # diff entries kept (page, API, audit); the rest are counted
SHOWN = jsonbounds.Bounds(depth=jsonbounds.MAX_DEPTH, items=100, chars=2000)  # one value in the diff
HISTORY = 20


class InvalidEdit(ValueError):
    """A field that cannot be used, or an edit that changes nothing (HTTP 400; CLI exit 2)."""


class EditConflict(Exception):
    """The job is not a failed job of the previewed version (HTTP 409); the message says why."""


class JobNotFound(LookupError):
    """No job with that id in the jobs table (HTTP 404)."""


@dataclass(frozen=True)
class Edit:
    """The new values; None leaves a field as it is (`payload_set` says whether a payload was given)."""

    payload: Any = None
    payload_set: bool = False
    priority: int | None = None
    queue: str | None = None
    run_at: datetime | None = None

    def fields(self) -> list[str]:
        return [name for name, given in (("payload", self.payload_set), ("priority", self.priority is not None),
                                         ("queue", self.queue is not None), ("run_at", self.run_at is not None))
                if given]


@dataclass
class Preview:
    """What an edit would change: `changes` (field, path, change, old, new; redacted), the
    job's `version` the apply must send back, and the job as it is (`job`: id, queue, kind,
    status)."""

    job_id: int
    version: str
    changes: list[dict[str, Any]]
    more: int = 0  # changes left out past MAX_CHANGES
    job: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.job_id, "version": self.version, "changes": self.changes, "more_changes": self.more,
                "job": self.job, "confirm": {"version": self.version}}


# --- input --------------------------------------------------------------------------------------


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _payload(value: Any, *, payload_is_text: bool) -> Any:
    if payload_is_text:
        if not isinstance(value, str):
            raise InvalidEdit("payload: must be JSON text")
        try:
            value = jsonbounds.loads(value.strip(), "payload")
        except jsonbounds.TooDeep as exc:
            raise InvalidEdit(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise InvalidEdit(f"payload: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if jsonbounds.depth_of(value, stop_after=jsonbounds.MAX_DEPTH) > jsonbounds.MAX_DEPTH:
        raise InvalidEdit(f"payload: JSON nested deeper than {jsonbounds.MAX_DEPTH} levels "
                          "(arrays and objects count one level each)")
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise InvalidEdit("payload: NaN and Infinity are not JSON") from None
    if len(text) > MAX_PAYLOAD_BYTES:
        raise InvalidEdit(f"payload: larger than {MAX_PAYLOAD_BYTES // 1024} KiB")
    if "\\u0000" in text:
        raise InvalidEdit("payload: PostgreSQL's jsonb cannot hold the NUL character (\\u0000)")
    return value


def _priority(value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,6}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -32768 <= value <= 32767:
        raise InvalidEdit("priority: must be a whole number between -32768 and 32767")
    return value


def _queue(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidEdit("queue: must be a string")
    value = value.strip()
    if len(value) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidEdit(f"queue: at most {MAX_NAME} characters, without control characters")
    return value


def _run_at(value: Any) -> datetime:
    if not isinstance(value, str):
        raise InvalidEdit("run_at: must be an ISO 8601 date-time string")
    return parse_instant(value, "run_at", relative=False, error=InvalidEdit)


def parse_edit(fields: Mapping[str, Any], *, payload_is_text: bool = False, strict: bool = True) -> Edit:
    """The edit a request (or the CLI) asks for; InvalidEdit names the field.

    From a form every value is text and `payload` is JSON text; from a JSON body `payload` is
    the JSON value itself. An empty field leaves that field unchanged. `strict`: any key but the
    editable ones, `version` and `reason` is refused (a JSON body); a form's other fields
    (csrf_token, ...) are ignored. Fields that are never editable (kind, max_attempts, ...) are
    refused either way, by name. The payload is checked first (its depth, then its JSON)."""
    values: dict[str, Any] = {}
    if "payload" in fields and not (payload_is_text and _blank(fields.get("payload"))):
        if fields.get("payload") is None and not payload_is_text:
            raise InvalidEdit("payload: null is not a payload here (send {} for an empty one)")
        values["payload"] = _payload(fields["payload"], payload_is_text=payload_is_text)
    refused = [name for name in NOT_EDITABLE if name in fields]
    if refused:
        raise InvalidEdit(f"{refused[0]}: cannot be changed by fix and replay (it edits {', '.join(EDITABLE)})")
    if strict:
        unknown = sorted(set(fields) - set(EDITABLE) - {"version", "reason"})
        if unknown:
            raise InvalidEdit(f"{unknown[0]}: unknown field (fields: {', '.join(EDITABLE)}, version, reason)")
    if not _blank(fields.get("priority")):
        values["priority"] = _priority(fields["priority"])
    if not _blank(fields.get("queue")):
        values["queue"] = _queue(fields["queue"])
    if not _blank(fields.get("run_at")):
        values["run_at"] = _run_at(fields["run_at"])
    return Edit(payload=values.get("payload"), payload_set="payload" in values, priority=values.get("priority"),
                queue=values.get("queue"), run_at=values.get("run_at"))


# --- redaction, the placeholder, the diff -------------------------------------------------------


def masked(value: Any, keys: frozenset[str], bounds: jsonbounds.Bounds = jsonbounds.WHOLE) -> Any:
    """A value as an edit shows and records it: the redacted keys' values hidden at any depth,
    and the value written after such a key in text (`token=abc`) too."""
    return jsonbounds.bounded(value, bounds, hide_keys=keys, hidden=REDACTED, text=lambda s: redact_text(s, keys))


def editable_payload(payload: Any, keys: frozenset[str]) -> str:
    """The stored payload as the edit form shows it: pretty JSON with `[redacted]` at the
    redacted keys (kept as they are when sent back)."""
    shown = jsonbounds.bounded(payload, jsonbounds.WHOLE, hide_keys=keys, hidden=REDACTED)
    return json.dumps(shown, ensure_ascii=False, indent=2, sort_keys=False)


def payload_not_editable(payload: Any) -> str | None:
    """Why a stored payload cannot be edited in a form (too deep to read, or larger than an
    edit may be), or None. Its priority, queue and run-at still can."""
    if payload == jsonbounds.TOO_DEEP_TO_READ:
        return f"the stored payload is nested deeper than {jsonbounds.READ_DEPTH} levels"
    if len(json.dumps(payload)) > MAX_PAYLOAD_BYTES:
        return f"the stored payload is larger than {MAX_PAYLOAD_BYTES // 1024} KiB"
    return None


_MISSING = object()  # a key or index one side does not have


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


def keep_redacted(new: Any, old: Any, keys: frozenset[str]) -> Any:
    """`new` with each `[redacted]` at a redacted key replaced by the stored value at the same
    path of `old`; InvalidEdit when `old` has nothing there. Walked without recursion."""
    if not keys:
        return new
    stack: list[tuple[Any, Any, str]] = [(new, old, "$")]
    while stack:
        item, before, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                path = _path(where, key)
                there = before.get(key, _MISSING) if isinstance(before, dict) else _MISSING
                if str(key).lower() in keys and child == REDACTED:
                    if there is _MISSING:
                        raise InvalidEdit(f"payload: {path} is {REDACTED}, but the job has no value there to keep; "
                                          "write the new value instead")
                    item[key] = there
                elif isinstance(child, dict | list):
                    stack.append((child, there, path))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                if isinstance(child, dict | list):
                    there = before[index] if isinstance(before, list) and index < len(before) else _MISSING
                    stack.append((child, there, _path(where, index)))
    return new



def diff(old: Any, new: Any, keys: frozenset[str]) -> list[dict[str, Any]]:
    """The payload's changes by JSON path ($.customer.id, $.items[0]), in path order: added,
    removed or changed, with the old and new values masked (`masked`). Below a redacted key
    the values are not compared piece by piece: one entry says the secret changed, both sides
    `[redacted]`. Walked without recursion."""
    out: list[dict[str, Any]] = []

    def show(value: Any) -> Any:
        return masked(value, keys, SHOWN)

    stack: list[tuple[Any, Any, str, bool]] = [(old, new, "$", False)]
    while stack:
        a, b, where, secret = stack.pop()
        if secret:
            if a is _MISSING:
                out.append({"path": where, "change": "added", "old": None, "new": REDACTED})
            elif b is _MISSING:
                out.append({"path": where, "change": "removed", "old": REDACTED, "new": None})
            elif a != b or type(a) is not type(b):
                out.append({"path": where, "change": "changed", "old": REDACTED, "new": REDACTED})
            continue
        if a is _MISSING:
            out.append({"path": where, "change": "added", "old": None, "new": show(b)})
        elif b is _MISSING:
            out.append({"path": where, "change": "removed", "old": show(a), "new": None})
        elif isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str, reverse=True):
                stack.append((a.get(key, _MISSING), b.get(key, _MISSING), _path(where, key), str(key).lower() in keys))
        elif isinstance(a, list) and isinstance(b, list):
            for index in reversed(range(max(len(a), len(b)))):
                stack.append((a[index] if index < len(a) else _MISSING, b[index] if index < len(b) else _MISSING,
                              _path(where, index), False))
        elif a != b or type(a) is not type(b):
            out.append({"path": where, "change": "changed", "old": show(a), "new": show(b)})
    return out


# --- preview and apply --------------------------------------------------------------------------


def read_job(conn: psycopg.Connection, job_id: int, *, lock: bool = False) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("edit_replay", "lock_job_for_edit" if lock else "job_for_edit"), {"id": job_id}).fetchone()
    if row is None:
        raise JobNotFound(f"there is no job {job_id} in the jobs table (an archived job cannot be replayed)")
    return row


def edit_digest(edit: Edit) -> str:
    """32 hexadecimal digits that name the edit's values (its payload as sent, `[redacted]`
    placeholders included), the second half of a preview's `version`."""
    canonical = json.dumps({"payload": edit.payload if edit.payload_set else None, "payload_set": edit.payload_set,
                            "priority": edit.priority, "queue": edit.queue,
                            "run_at": edit.run_at.isoformat() if edit.run_at is not None else None},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.md5(canonical.encode(), usedforsecurity=False).hexdigest()


def check_state(job: Mapping[str, Any], version: str | None = None) -> None:
    """EditConflict unless the job is failed (and, with `version`, still the previewed one)."""
    status, job_id = job["status"], job["id"]
    if status == "running":
        raise EditConflict(f"job {job_id} is running (held by {job.get('locked_by') or 'a worker'}): fix and replay "
                           "applies only to a failed job; wait until it fails for good, or ask it to stop")
    if status == "pending":
        raise EditConflict(f"job {job_id} is pending: it will run again as it is; fix and replay applies only to a "
                           "failed job (cancel it first to edit it)")
    if status != "failed":
        raise EditConflict(f"job {job_id} is {status}: fix and replay applies only to a failed job")
    if version is not None and job["version"] != version:
        raise EditConflict(f"job {job_id} changed since the preview (replayed, edited, or failed again): "
                           "preview the edit again")


def _changes(job: Mapping[str, Any], edit: Edit, keys: frozenset[str]) -> tuple[list[dict[str, Any]], Any]:
    """(the changes, field by field, masked; the new payload with the kept secrets restored).
    The queue's existence is the callers' to check (`_check_queue`), outside any row lock."""
    changes: list[dict[str, Any]] = []
    payload = job["payload"]
    if edit.payload_set:
        if payload == jsonbounds.TOO_DEEP_TO_READ:
            raise InvalidEdit(f"payload: the stored payload is nested deeper than {jsonbounds.READ_DEPTH} levels "
                              "and cannot be edited here")
        payload = keep_redacted(json.loads(json.dumps(edit.payload)), job["payload"], keys)
        changes += [{"field": "payload", **c} for c in diff(job["payload"], payload, keys)]
    if edit.priority is not None and edit.priority != job["priority"]:
        changes.append({"field": "priority", "path": None, "change": "changed", "old": job["priority"],
                        "new": edit.priority})
    if edit.queue is not None and edit.queue != job["queue"]:
        changes.append({"field": "queue", "path": None, "change": "changed", "old": job["queue"], "new": edit.queue})
    if edit.run_at is not None and edit.run_at != job["run_at"]:
        changes.append({"field": "run_at", "path": None, "change": "changed", "old": job["run_at"].isoformat(),
                        "new": edit.run_at.isoformat()})
    if not changes:
        raise InvalidEdit("nothing to change: the values given are the job's own (to run it again as it is, "
                          "use Replay)")
    return changes, payload


def _check_queue(conn: psycopg.Connection, job: Mapping[str, Any], edit: Edit) -> None:
    """InvalidEdit naming the queue when the edit moves the job to a queue nobody knows."""
    if edit.queue is None or edit.queue == job["queue"]:
        return
    try:
        check_known_queue(conn, edit.queue, then="Fix and replay moves a job only to a queue that exists.")
    except UnknownQueue as exc:
        raise InvalidEdit(f"queue: {exc}") from None


def preview(conn: psycopg.Connection, job_id: int, edit: Edit, *, keys: frozenset[str]) -> Preview:
    """The edit's changes against the job as it is now (nothing is changed). JobNotFound,
    EditConflict (not a failed job), InvalidEdit (nothing changes, an unknown queue, ...)."""
    job = read_job(conn, job_id, lock=False)
    check_state(job)
    changes, _ = _changes(job, edit, keys)
    _check_queue(conn, job, edit)
    return Preview(job_id=job_id, version=job["version"] + edit_digest(edit), changes=changes[:MAX_CHANGES],
                   more=max(0, len(changes) - MAX_CHANGES),
                   job={"id": job["id"], "queue": job["queue"], "kind": job["kind"], "status": job["status"]})


def apply(conn: psycopg.Connection, job_id: int, edit: Edit, *, version: str, actor: str, reason: str | None,
          keys: frozenset[str], history: int = HISTORY) -> dict[str, Any]:
    """Edit the failed job and put it back to pending, audited (action `edit_replay`, with the
    old and new values masked), in one short transaction on an autocommit connection.

    Refused before anything changes: ReasonRequired (no reason), InvalidEdit, JobNotFound,
    EditConflict (not failed, not the previewed job's version, or not the previewed edit)."""
    reason = require_reason("edit_replay", reason)
    if not isinstance(version, str) or not re.fullmatch(r"[0-9a-f]{64}", version):
        raise InvalidEdit("version: required, as the preview gave it (64 hexadecimal digits)")
    version, previewed_edit = version[:32], version[32:]
    if edit.queue is not None:  # before the row lock: a bounded look at the indexes and samples
        _check_queue(conn, read_job(conn, job_id, lock=False), edit)
    with conn.transaction():
        job = read_job(conn, job_id, lock=True)
        check_state(job, version)
        changes, payload = _changes(job, edit, keys)
        if previewed_edit != edit_digest(edit):
            raise EditConflict(f"job {job_id}: these values are not the ones previewed: preview this edit, "
                               "then apply it")
        fields = [name for name in EDITABLE if any(c["field"] == name for c in changes)]
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(query("edit_replay", "edit_and_replay"), {
                "id": job_id, "version": version, "set_payload": edit.payload_set,
                "payload": Jsonb(payload) if edit.payload_set else None,
                "priority": edit.priority, "queue": edit.queue, "run_at": edit.run_at,
                "history": history, "fields": ", ".join(fields), "actor": actor, "reason": reason,
            }).fetchone()
        if row is None:  # the lock makes this unreachable; the guard stays in the statement anyway
            raise EditConflict(f"job {job_id} changed since the preview: preview the edit again")
        audit_id = audit.record(
            conn, actor=actor, action="edit_replay", target=f"job:{job_id}", selection={"ids": [job_id]},
            reason=reason, rows=1,
            detail={"queue": row["queue"], "kind": row["kind"], "fields": fields,
                    "old": _side(changes, "old", job["payload"], keys), "new": _side(changes, "new", payload, keys),
                    "changes": changes[:MAX_CHANGES], "more_changes": max(0, len(changes) - MAX_CHANGES),
                    "version": version})
    return {"id": job_id, "status": row["status"], "queue": row["queue"], "priority": row["priority"],
            "run_at": row["run_at"], "fields": fields, "changes": changes[:MAX_CHANGES], "audit_id": audit_id}


def _side(changes: list[dict[str, Any]], side: str, payload: Any, keys: frozenset[str]) -> dict[str, Any]:
    """The changed fields' old (or new) values for the audit row: the payload whole, masked
    (within SHOWN bounds), the other fields as they were (or are)."""
    out: dict[str, Any] = {}
    for change in changes:
        if change["field"] == "payload":
            out["payload"] = masked(payload, keys, SHOWN)
        else:
            out[change["field"]] = change[side]
    return out
