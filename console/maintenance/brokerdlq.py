"""Replay and purge of a broker queue's dead letters: the messages of the JetStream stream
`skiplock_dead_<queue>` (issue 32; docs/exit-plan.md, "Dead letters of a broker queue").

The same semantics as PostgreSQL's dead letters (console.maintenance.deadletters and bulk):

- a **selection** is a `Selection` that names the queue (`queue` is required: one stream per
  queue) and may narrow it by `ids` (job ids), `kind`, `failed_since` and `failed_before`;
  `fingerprint` and `payload` are refused (no error groups or payload index in a stream);
- a **preview** counts the matching messages exactly and shows a sample; it reads at most
  `scan` messages of the stream in sequence order (oldest first) and says so (`more`) when the
  stream holds more: an operation never touches more than one preview's worth, and an operator
  runs it again for the rest (bounded, like the PostgreSQL operations' batches);
- a **start bound to the preview** (`BrokerPreviewed`: the count, the highest sequence number
  scanned and the selection's hash) is refused with PreviewMismatch when the selection no
  longer matches exactly the previewed count within that bound (someone else replayed or
  purged some meanwhile); messages dead-lettered after the preview (higher sequence numbers)
  are never touched;
- **reasons** follow console.actions: a purge, and a replay of more than one job, need one;
- **audit rows**: `replay`/`purge` with target `queue:<queue>`, a `started` row (with the exact
  count) before anything changes and a final row (`ok`, or `error` with how many were done)
  after, detail `backend: nats`, the stream and the sequence bound.

**Replay** republishes each dead letter's job to the queue's job subject as the relay would
(the job as enqueued: attempts, last error and failure time dropped, `run_at` now), so the broker
worker counts its attempts afresh from 1 (the delivery count of a new message), like
PostgreSQL's `attempts = 0`. The publish carries `Nats-Msg-Id` = `<job id>:replay:<dead-letter
sequence>` and must be acknowledged (stored) by JetStream **before** the dead letter is deleted.
So a crash (or a lost answer) between the two leaves the job in both streams, never in neither:
running the replay again publishes it once more with the same id, which JetStream drops as a
duplicate within the stream's duplicate window (`[broker] duplicate_window`), then deletes the
dead letter. Past that window a second run duplicates the job (at least once, never lost).
Two operators replaying the same dead letter at once publish the same id: stored once.

**Purge** deletes the selected dead letters from the stream (JetStream's message delete, which
erases the message). Both work in batches of `batch_size` messages (each batch: read its
messages again by sequence number, skipping those gone since, act, wait for every answer),
with an optional rate (messages per second).

No PostgreSQL transaction is open while NATS is called (the audit rows are two short writes on
an autocommit connection). Each NATS call has a time limit; a broker that does not answer raises
BrokerUnavailable (CLI exit 1, HTTP 503) after writing the final audit row with what was done.

Not done here: a background operation with progress, cancel and resume (skiplock.bulk_operations
is PostgreSQL's); a run is synchronous and bounded by `scan`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from console import audit, natscall
from console.actions import clean_reason
from console.maintenance.deadletters import Selection, as_selection
from console.maintenance.errors import (
    InvalidSelection,
    InvalidSettings,
    NothingMatches,
    PreviewMismatch,
)
from console.natscall import BrokerUnavailable
from console.queue import broker

BACKEND = "nats"
ACTIONS = ("replay", "purge")
SCAN = 10_000  # messages a preview (and so an operation) reads at most, oldest first
# Fields the broker worker adds when it dead-letters a job; a replay drops them.
DEAD_FIELDS = ("attempts", "last_error", "error", "failed_at")


def broker_selection(selection: Selection | Mapping[str, Any]) -> Selection:
    """The selection, checked for a broker queue's dead letters (InvalidSelection otherwise)."""
    sel = as_selection(selection)
    if sel.queue is None:
        raise InvalidSelection("a broker queue's dead letters are selected by queue: name it (--queue)")
    broker.check_queue(sel.queue)
    refused = [name for name in ("fingerprint", "payload") if getattr(sel, name) is not None]
    if refused:
        raise InvalidSelection(f"{' and '.join(refused)}: not available for a broker queue's dead letters (queue "
                               f"{sel.queue!r} is served by NATS); select by id, kind, failed_since or failed_before")
    return sel


def describe(sel: Selection) -> str:
    parts = []
    if sel.ids is not None:
        shown = ", ".join(str(i) for i in sel.ids[:10]) + (f" and {len(sel.ids) - 10} more" if len(sel.ids) > 10 else "")
        parts.append(f"job id in ({shown})")
    if sel.kind is not None:
        parts.append(f"kind = {sel.kind!r}")
    if sel.failed_since is not None:
        parts.append(f"failed at or after {sel.failed_since.isoformat()}")
    if sel.failed_before is not None:
        parts.append(f"failed before {sel.failed_before.isoformat()}")
    where = f" with {' and '.join(parts)}" if parts else ""
    return f"dead letters of broker queue {sel.queue!r} (stream {broker.dead_stream(sel.queue)}){where}"


def selection_hash(sel: Selection) -> str:
    return hashlib.sha256(json.dumps({"backend": BACKEND, **sel.to_dict()}, sort_keys=True).encode()).hexdigest()


def _failed_at(body: dict[str, Any], stored: datetime | None) -> datetime | None:
    raw = body.get("failed_at")
    if isinstance(raw, str):
        try:
            found = datetime.fromisoformat(raw)
            return found if found.tzinfo else found.replace(tzinfo=UTC)
        except ValueError:
            pass
    return stored


def row_of(msg: Any) -> dict[str, Any]:
    """A dead-letter message as the pages and the CLI show it (the body's fields, its sequence
    number and when it failed). An unreadable body is shown as such, with no job id."""
    try:
        body = json.loads(msg.data or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    job_id = body.get("id")
    return {
        "seq": msg.seq, "id": job_id if isinstance(job_id, int) else None, "queue": body.get("queue"),
        "kind": body.get("kind"), "attempts": body.get("attempts"), "max_attempts": body.get("max_attempts"),
        "last_error": body.get("last_error"), "error_class": error.get("error_class"),
        "failed_at": _failed_at(body, msg.time), "payload": body.get("payload"), "readable": bool(body),
    }


def matches(sel: Selection, row: dict[str, Any]) -> bool:
    if sel.ids is not None and row["id"] not in sel.ids:
        return False
    if sel.kind is not None and row["kind"] != sel.kind:
        return False
    if sel.failed_since is not None and (row["failed_at"] is None or row["failed_at"] < sel.failed_since):
        return False
    return not (sel.failed_before is not None and (row["failed_at"] is None or row["failed_at"] >= sel.failed_before))


def replay_body(data: bytes, *, now: datetime) -> bytes:
    """The job as the relay publishes it, from its dead letter: due now, the failure fields gone."""
    body = json.loads(data)
    for name in DEAD_FIELDS:
        body.pop(name, None)
    body["run_at"] = now.isoformat()
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def replay_msg_id(job_id: Any, seq: int) -> str:
    """The replay's Nats-Msg-Id: the same for every replay of one dead letter (de-duplicated)."""
    return f"{job_id}:replay:{seq}"


# --- talking to NATS (console/natscall.py: a thread with its own event loop and a deadline) --------

def _in_thread(coro_fn, nats_url: str, timeout: float, limit: float) -> Any:
    """Run `coro_fn(js)` on a connection of its own within `limit` seconds."""

    async def main() -> Any:
        nc = await natscall.connect(nats_url, timeout)
        try:
            return await coro_fn(nc.jetstream(timeout=timeout))
        finally:
            await nc.close()

    # A ValueError is ours (a mismatch), not the broker's failure.
    return natscall.call(main, nats_url, limit, thread_name="skiplock-broker-deadletters", join_slack=2.0,
                         passthrough=(ValueError,))


async def _scan(js: Any, sel: Selection, *, scan: int, upto: int | None, sample: int,
                after: int = 0) -> dict[str, Any]:
    """Read the dead-letter stream in sequence order from `after`+1, at most `scan` messages and
    none above `upto`: {stream_total, total, seqs, sample, max_seq, more}."""
    from nats.js.errors import NotFoundError

    stream, subject = broker.dead_stream(sel.queue), broker.dead_subject(sel.queue)
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return {"stream_total": 0, "total": 0, "seqs": [], "sample": [], "max_seq": 0, "more": False, "exists": False}
    last = info.state.last_seq if upto is None else min(upto, info.state.last_seq)
    seq = max(after + 1, info.state.first_seq or 1)
    seqs: list[int] = []
    shown: list[dict[str, Any]] = []
    read, max_seq, more = 0, after, False
    while seq <= last:
        if read >= scan:
            more = True
            break
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            break
        if msg.seq is None or msg.seq > last:
            break
        read += 1
        max_seq = msg.seq
        row = row_of(msg)
        if matches(sel, row):
            seqs.append(msg.seq)
            if len(shown) < sample:
                shown.append(row)
        seq = msg.seq + 1
    return {"stream_total": info.state.messages, "total": len(seqs), "seqs": seqs, "sample": shown,
            "max_seq": max_seq, "more": more, "exists": True}


# --- reading ----------------------------------------------------------------------------------

def list_dead_letters(nats_url: str, queue: str, *, limit: int = 50, after: int = 0,
                      timeout: float = 5.0) -> dict[str, Any]:
    """One page of `queue`'s dead letters, oldest first from sequence `after`+1: {stream_total,
    rows (at most `limit`), next (the cursor of the page after, or None), exists}."""
    sel = broker_selection({"queue": queue})

    async def read(js: Any) -> dict[str, Any]:
        return await _scan(js, sel, scan=limit, upto=None, sample=limit, after=after)

    found = _in_thread(read, nats_url, timeout, timeout * 3)
    return {"stream_total": found["stream_total"], "rows": found["sample"], "exists": found["exists"],
            "next": found["max_seq"] if found["more"] else None}


@dataclass(frozen=True)
class BrokerPreviewed:
    """What the operator confirmed: the count, the highest sequence number the preview read, the
    selection's hash. A start bound to it touches no message above `max_seq`."""

    total: int
    max_seq: int
    selection_hash: str

    def as_fields(self) -> dict[str, Any]:
        return {"expected": self.total, "max_seq": self.max_seq, "selection_hash": self.selection_hash}

    @classmethod
    def from_fields(cls, form: Mapping[str, Any]) -> BrokerPreviewed | None:
        names = ("expected", "max_seq", "selection_hash")
        given = {n: str(form.get(n) or "").strip() for n in names}
        if not any(given.values()):
            return None
        if not all(given.values()):
            raise InvalidSelection(f"the preview's fields go together: {', '.join(names)} (missing: "
                                   f"{', '.join(n for n in names if not given[n])})")
        try:
            total, max_seq = int(given["expected"]), int(given["max_seq"])
        except ValueError:
            raise InvalidSelection("expected and max_seq must be whole numbers (the preview's)") from None
        if total < 0 or max_seq < 0:
            raise InvalidSelection("expected and max_seq must not be negative")
        return cls(total, max_seq, given["selection_hash"][:100])


@dataclass
class BrokerPreview:
    queue: str
    stream: str
    total: int
    sample: list[dict[str, Any]]
    description: str
    selection: dict[str, Any]
    max_seq: int
    more: bool  # the stream holds messages past the scan: a later run does them
    stream_total: int
    selection_hash: str

    def bound(self) -> BrokerPreviewed:
        return BrokerPreviewed(self.total, self.max_seq, self.selection_hash)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": BACKEND, "queue": self.queue, "stream": self.stream, "total": self.total,
                "sample": self.sample, "description": self.description, "selection": self.selection,
                "max_seq": self.max_seq, "more": self.more, "stream_total": self.stream_total,
                "selection_hash": self.selection_hash, "confirm": self.bound().as_fields()}


def preview(nats_url: str, selection: Selection | Mapping[str, Any], *, sample: int = 10, scan: int = SCAN,
            timeout: float = 5.0) -> BrokerPreview:
    """The exact count of the selected dead letters among the first `scan` of the stream, a
    sample, and the bound to confirm. Changes nothing."""
    sel = broker_selection(selection)
    if scan < 1:
        raise InvalidSettings("scan must be at least 1 message")

    async def read(js: Any) -> dict[str, Any]:
        return await _scan(js, sel, scan=scan, upto=None, sample=sample)

    found = _in_thread(read, nats_url, timeout, _limit(scan, timeout))
    return BrokerPreview(queue=sel.queue, stream=broker.dead_stream(sel.queue), total=found["total"],
                         sample=found["sample"], description=describe(sel), selection=sel.to_dict(),
                         max_seq=found["max_seq"], more=found["more"], stream_total=found["stream_total"],
                         selection_hash=selection_hash(sel))


def _limit(messages: int, timeout: float) -> float:
    """A whole run's time limit: the per-call timeout, plus room for `messages` round trips."""
    return timeout * 3 + messages * 0.01


# --- acting -----------------------------------------------------------------------------------

@dataclass
class BrokerResult:
    action: str
    queue: str
    total: int  # what the run set out to do
    done: int = 0  # replayed (published and deleted) or purged
    gone: int = 0  # selected, but no longer in the stream when its batch came (another operator)
    batches: int = 0
    seconds: float = 0.0
    more: bool = False
    audit_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": BACKEND, "action": self.action, "queue": self.queue, "total": self.total,
                "done": self.done, "gone": self.gone, "batches": self.batches, "seconds": round(self.seconds, 3),
                "more": self.more, "audit_ids": self.audit_ids}


async def _act_batch(js: Any, queue: str, action: str, seqs: list[int], now: datetime) -> tuple[int, int]:
    """One batch: read each message again (skip the gone), replay = publish and wait for every
    ack, THEN delete the acknowledged ones; purge = delete. Returns (done, gone). A publish or
    delete that fails raises (after the batch's other answers came): nothing of it is lost."""
    from nats.js.errors import NotFoundError

    stream = broker.dead_stream(queue)

    async def get(seq: int) -> Any:
        try:
            return await js.get_msg(stream, seq=seq)
        except NotFoundError:
            return None

    msgs = [m for m in await asyncio.gather(*(get(s) for s in seqs)) if m is not None]
    gone = len(seqs) - len(msgs)
    if action == "replay":
        results = await asyncio.gather(*(
            js.publish(broker.subject(queue), replay_body(m.data, now=now),
                       headers={broker.MSG_ID: replay_msg_id(row_of(m)["id"], m.seq),
                                broker.JOB_ID: str(row_of(m)["id"])})
            for m in msgs), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        msgs = [m for m, r in zip(msgs, results, strict=True) if not isinstance(r, BaseException)]
    else:
        failed = []

    async def delete(seq: int) -> bool:
        try:
            return await js.delete_msg(stream, seq)
        except NotFoundError:
            return False  # purged or replayed by someone else since it was read

    deleted = await asyncio.gather(*(delete(m.seq) for m in msgs), return_exceptions=True)
    failed += [r for r in deleted if isinstance(r, BaseException)]
    done = sum(1 for r in deleted if r is True)
    gone += sum(1 for r in deleted if r is False)
    if failed:
        raise _Partial(done, gone, failed[0])
    return done, gone


class _Partial(Exception):
    def __init__(self, done: int, gone: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.done, self.gone, self.cause = done, gone, cause


def run(conn: psycopg.Connection, nats_url: str, action: str, selection: Selection | Mapping[str, Any], *,
        actor: str, reason: str | None, preview: BrokerPreviewed | None = None, batch_size: int = 100,
        rate: float | None = None, scan: int = SCAN, timeout: float = 5.0) -> BrokerResult:
    """Replay or purge the selected dead letters of a broker queue, bound to `preview` when given
    (PreviewMismatch unless exactly its count still matches within its sequence bound), in
    batches; audited ('started', then 'ok' or 'error'). `conn` must be autocommit (or at least
    not inside a transaction): the audit rows are written before and after the NATS calls.

    Raises (nothing changed, no audit row): InvalidSelection, InvalidSettings, NothingMatches,
    PreviewMismatch, BrokerUnavailable (before the start). After the start, a broker failure
    writes the 'error' audit row with what was done, then raises BrokerUnavailable."""
    if action not in ACTIONS:
        raise InvalidSettings(f"action must be one of {', '.join(ACTIONS)} (got {action!r})")
    if not actor or not str(actor).strip():
        raise InvalidSettings("an action needs an actor (who is doing this)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise InvalidSettings(f"batch size must be 1 to 10000 messages (got {batch_size!r})")
    if rate is not None and not rate > 0:
        raise InvalidSettings(f"rate must be greater than 0 messages per second (got {rate!r})")
    reason = clean_reason(reason)
    sel = broker_selection(selection)
    if preview is not None and preview.selection_hash != selection_hash(sel):
        raise PreviewMismatch(f"the selection ({describe(sel)}) is not the one that was previewed: preview again")

    async def read(js: Any) -> dict[str, Any]:
        return await _scan(js, sel, scan=scan, upto=None if preview is None else preview.max_seq, sample=0)

    found = _in_thread(read, nats_url, timeout, _limit(scan, timeout))
    if preview is not None and found["total"] != preview.total:
        raise PreviewMismatch(f"the selection now matches {found['total']:,} dead letters of the ones you previewed "
                              f"(up to sequence {preview.max_seq}), you previewed {preview.total:,}: preview again")
    if found["total"] == 0:
        raise NothingMatches(f"nothing to {action}: no message matches {describe(sel)}")
    seqs: list[int] = found["seqs"]
    stream = broker.dead_stream(sel.queue)
    result = BrokerResult(action=action, queue=sel.queue, total=len(seqs), more=found["more"])
    detail = {"backend": BACKEND, "stream": stream, "first_seq": seqs[0], "max_seq": found["max_seq"],
              "batch_size": batch_size, "rate": rate, "previewed": preview is not None}
    result.audit_ids.append(audit.record(conn, actor=actor, action=action, target=f"queue:{sel.queue}",
                                         selection=sel.to_dict(), reason=reason, rows=len(seqs), outcome="started",
                                         detail=detail))
    started = time.monotonic()
    error: BaseException | None = None

    async def act(js: Any) -> None:
        now = datetime.now(UTC)
        for i in range(0, len(seqs), batch_size):
            try:
                done, gone = await _act_batch(js, sel.queue, action, seqs[i:i + batch_size], now)
            except _Partial as exc:
                result.done += exc.done
                result.gone += exc.gone
                result.batches += 1
                raise exc.cause from None
            result.done += done
            result.gone += gone
            result.batches += 1
            if rate:
                ahead = (result.done + result.gone) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    try:
        _in_thread(act, nats_url, timeout, _limit(len(seqs), timeout) * 3 + (len(seqs) / rate if rate else 0))
    except BaseException as exc:  # noqa: BLE001 - recorded, then raised
        error = exc
    result.seconds = time.monotonic() - started
    end = {**detail, "total": result.total, "gone": result.gone, "batches": result.batches,
           "error": None if error is None else str(error)[:500]}
    result.audit_ids.append(audit.record(conn, actor=actor, action=action, target=f"queue:{sel.queue}",
                                         selection=sel.to_dict(), reason=reason, rows=result.done,
                                         outcome="ok" if error is None else "error", detail=end))
    if error is not None:
        if isinstance(error, BrokerUnavailable):
            raise error
        raise BrokerUnavailable(f"{action} of {describe(sel)} stopped after {result.done} of {result.total}: "
                                f"{type(error).__name__}: {error}") from error
    return result
