"""Per-attempt logs: the `logging` records a handler emits while it runs, kept with the attempt.

Each thread that runs handlers (the handler threads, the main loop for inline handlers) and
each asyncio task of an `async def` handler has a `Slot` as the value of a context variable;
while it runs a job the slot is active. `JobLogHandler`, one handler on the root logger, files
each record that reaches it under the current slot's `Capture` (made at the first record), and
does nothing outside an active slot. A context variable, not a thread-local: each asyncio task
runs in its own copy of the context, so two jobs awaited on one loop never see each other's
records, and neither do two handler threads. A job that logs nothing costs two attribute
writes: no capture is made for it (the worker's no-op throughput is unchanged).

What is captured: the records that reach the root logger's handlers, as the application's
logging configuration lets them through (levels, `propagate`); the application's own handlers
still get every record as before: this handler adds to them, it changes no level, no filter
and no other handler. Records emitted by threads the handler starts itself are not captured
(they run outside the job's context), except through `asyncio.to_thread` and
`contextvars.copy_context()`, which carry it.

Each record is kept as {at, level, logger, message[, extra][, exc]}: the message formatted
with its arguments, `extra` the attributes the caller added with `extra=`, `exc` the traceback
of `exc_info`. Everything is redacted before it is stored, with the keys the worker hides in
error fingerprints (console.redaction: a key's value in text, the values of redacted keys in
`extra`), and bounded (`LogLimits`):
- a message (and a traceback, and each string of `extra`) is cut at `message_chars`, saying
  how many characters were left out;
- an attempt keeps at most `records` records and `attempt_chars` characters: the first half
  of the budget goes to the first records, the rest to the last ones (the ones just before a
  failure), and the records in between are dropped and counted (`dropped`, at position
  `dropped_after` in `records`).

`entry()` turns a capture into the attempt's entry (None when nothing was logged), which the
worker writes with the attempt's outcome (console.queue.protocol: fail, complete_logged).

This module does not touch the database and knows no users: the console redacts the stored
records again for viewers, with its own keys (console.web.redact).
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from console.jsonbounds import Bounds, bounded
from console.redaction import DEFAULT_KEYS, REDACTED, redact_text

DEFAULT_RECORDS = 100
DEFAULT_MESSAGE_CHARS = 2000
DEFAULT_ATTEMPT_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class LogLimits:
    """How much of an attempt's logging is kept; `records` 0 turns capture off."""

    records: int = DEFAULT_RECORDS
    message_chars: int = DEFAULT_MESSAGE_CHARS
    attempt_chars: int = DEFAULT_ATTEMPT_CHARS
    secret_keys: frozenset[str] = DEFAULT_KEYS

    @property
    def enabled(self) -> bool:
        return self.records > 0


# The attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
EXTRA_DEPTH, EXTRA_ITEMS = 5, 50  # how much of `extra` is kept: nesting levels, items per object or array


def cut(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    return f"{text[:chars]}… [{len(text) - chars:,} more characters]"


class Capture:
    """The records of one attempt, within its limits (see the module's docstring)."""

    __slots__ = ("limits", "head", "tail", "head_chars", "tail_chars", "seen", "head_open")

    def __init__(self, limits: LogLimits) -> None:
        self.limits = limits
        self.head: list[dict[str, Any]] = []
        self.tail: deque[tuple[dict[str, Any], int]] = deque()
        self.head_chars = 0
        self.tail_chars = 0
        self.seen = 0
        self.head_open = True

    def add(self, record: logging.LogRecord) -> None:
        self.seen += 1
        kept, size = self._keep(record)
        limits = self.limits
        head_records = (limits.records + 1) // 2
        if self.head_open:
            # The first records, up to half the count and half the characters (all of both when
            # the count leaves no room for a tail).
            whole = head_records == limits.records
            budget = limits.attempt_chars if whole else limits.attempt_chars // 2
            if len(self.head) < head_records and self.head_chars + size <= budget:
                self.head.append(kept)
                self.head_chars += size
                return
            self.head_open = False  # from here on, only the last records are kept
        tail_records = limits.records - head_records
        budget = limits.attempt_chars - self.head_chars
        if tail_records <= 0 or size > budget:
            return  # dropped (counted by `seen`)
        self.tail.append((kept, size))
        self.tail_chars += size
        while len(self.tail) > tail_records or self.tail_chars > budget:
            _, old = self.tail.popleft()
            self.tail_chars -= old

    def _keep(self, record: logging.LogRecord) -> tuple[dict[str, Any], int]:
        limits = self.limits
        keys = limits.secret_keys
        try:
            message = record.getMessage()
        except Exception as exc:  # a bad format string: keep what there is, say why
            message = f"{record.msg!r} (could not format its arguments: {type(exc).__name__})"
        message = cut(redact_text(message, keys), limits.message_chars)
        kept: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        size = len(message)
        fields = record.__dict__
        added = fields.keys() - _STANDARD  # one set difference in C: most records have none
        if added and (extra := {k: fields[k] for k in sorted(added) if not k.startswith("_")}):
            value = bounded(_json_safe(extra, limits.message_chars),
                            Bounds(depth=EXTRA_DEPTH, items=EXTRA_ITEMS, chars=limits.message_chars),
                            hide_keys=keys, hidden=REDACTED, text=lambda s: redact_text(s, keys))
            kept["extra"] = value
            size += len(json.dumps(value, default=str))
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(record.exc_info[1]))
            # the end of a traceback is where the error is
            if len(text) > limits.message_chars:
                text = f"[{len(text) - limits.message_chars:,} characters before this]…{text[-limits.message_chars:]}"
            kept["exc"] = redact_text(text, keys)
            size += len(kept["exc"])
        return kept, size

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.head + [kept for kept, _ in self.tail]

    @property
    def dropped(self) -> int:
        return self.seen - len(self.head) - len(self.tail)

    def entry(self, attempt: int, worker: str | None, outcome: str) -> dict[str, Any] | None:
        """The attempt's entry for `attempt_logs`, or None when it logged nothing."""
        if not self.seen:
            return None
        entry: dict[str, Any] = {
            "attempt": attempt,
            "worker": worker,
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "outcome": outcome,
            "records": self.records,
            "dropped": self.dropped,
        }
        if entry["dropped"]:
            entry["dropped_after"] = len(self.head)
        return entry


def _json_safe(value: dict[str, Any], chars: int) -> Any:
    """`extra` as JSON values: anything JSON cannot encode becomes its str(), at most `chars`."""
    try:
        return json.loads(json.dumps(value, default=lambda v: cut(str(v), chars)))
    except (ValueError, TypeError, RecursionError):
        return {str(k): cut(str(v), chars) for k, v in value.items()}


class Slot:
    """Where the records of the job running in this context go: `active` while it runs,
    `capture` made at its first record. One per handler thread (reused job after job) or
    per asyncio task."""

    __slots__ = ("limits", "capture", "active")

    def __init__(self, limits: LogLimits, *, active: bool = False) -> None:
        self.limits = limits
        self.capture: Capture | None = None
        self.active = active

    def take(self) -> Capture | None:
        """The capture of the run that just ended (None if it logged nothing); the slot is
        inactive and empty afterwards."""
        self.active = False
        capture, self.capture = self.capture, None
        return capture


current: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("skiplock_attempt_logs", default=None)


def slot_for(limits: LogLimits) -> Slot:
    """This context's slot for `limits` (made and set on first use in a thread)."""
    slot = current.get()
    if slot is None or slot.limits is not limits:
        slot = Slot(limits)
        current.set(slot)
    return slot


class JobLogHandler(logging.Handler):
    """Appends each record to the current job's capture; outside a job it does nothing. It
    never raises into the code that logged (a record it cannot keep is counted as dropped)."""

    def handle(self, record: logging.LogRecord) -> bool:
        slot = current.get()
        if len(_root.handlers) == 1:  # ours alone: keep logging's last resort as it was
            _last_resort(record)
        if slot is None or not slot.active:
            return False
        try:
            capture = slot.capture
            if capture is None:
                capture = slot.capture = Capture(slot.limits)
            capture.add(record)
        except Exception:  # the application's logging call must never fail because of us
            pass
        return True

    def emit(self, record: logging.LogRecord) -> None:  # handle() does the work, without the lock
        self.handle(record)


_root = logging.getLogger()


def _last_resort(record: logging.LogRecord) -> None:
    """What logging does with a record no handler takes (`logging.lastResort`: WARNING and
    above to stderr) stops once any handler is on the way, ours included. So when ours is the
    only handler the record meets, hand it to the last resort as logging would have."""
    last = logging.lastResort
    if last is None or record.levelno < last.level:
        return
    logger: logging.Logger | None = logging.getLogger(record.name) if record.name != "root" else _root
    while logger is not None:
        if any(h is not _handler for h in logger.handlers):
            return  # logging found a handler of the application's
        if not logger.propagate:
            break
        logger = logger.parent
    last.handle(record)


_handler = JobLogHandler()
_installed = 0
_install_lock = threading.Lock()


def install() -> None:
    """Add the capture handler to the root logger (once per process, however many workers)."""
    global _installed
    with _install_lock:
        if _installed == 0:
            logging.getLogger().addHandler(_handler)
        _installed += 1


def uninstall() -> None:
    global _installed
    with _install_lock:
        _installed = max(_installed - 1, 0)
        if _installed == 0:
            logging.getLogger().removeHandler(_handler)


__all__ = ["DEFAULT_ATTEMPT_CHARS", "DEFAULT_MESSAGE_CHARS", "DEFAULT_RECORDS", "Capture", "JobLogHandler", "LogLimits",
           "Slot", "current", "install", "slot_for", "uninstall"]
