"""Periodic (cron) jobs: schedules declared in the config file or in code, enqueued by the
scheduler leader exactly once per slot.

A schedule is an `Entry`: a unique name, the job it enqueues (kind, queue, payload) and either
a five-field cron expression evaluated in a timezone, or `every` N seconds. Entries come from
`[[periodic]]` tables in the config file (`entries_from_config`) and from `@console.schedule`
in a tasks module (`schedule`, kept in `CODE_ENTRIES` once the module is imported).
`load_entries(config)` validates both; a problem raises `ConfigError` naming the entry, which
stops the scheduler (and the web console) at start-up.

Slots. A cron slot is a wall-clock time in the entry's timezone that the expression matches.
APScheduler's `CronTrigger` parses and matches the fields, but it is asked about wall-clock
times only (as if they were UTC): APScheduler 3.11 with zoneinfo fires a nonexistent 02:30 on
the spring-forward day and loops or goes backwards in the repeated hour of the fall-back day.
Here a wall time that does not exist (the skipped hour) is skipped, and one that occurs twice
(the repeated hour) runs once, at its first occurrence. Cron's day-of-week numbers (0 and 7 =
Sunday) are translated to names, because APScheduler 3 counts 0 as Monday; an expression that
restricts both day-of-month and day-of-week is refused (cron ORs them, APScheduler ANDs them).
An `every` slot is a multiple of the interval since the Unix epoch, so every host computes the
same slots.

Exactly once. `enqueue_due(conn, entries)` runs on the leader: per entry, one transaction
locks the entry's row in `skiplock.periodic` (a second scheduler waits and then sees the
first's progress), inserts `(name, slot)` into `skiplock.periodic_runs` with ON CONFLICT DO
NOTHING and enqueues the job (idempotency key `periodic:<name>:<slot>`) only when that row was
new. The database, not timing, decides: clock skew, restarts, two leaders for a moment, or an
archived job cannot make a slot run twice. "Now" is the database's clock.

After downtime, `catch_up = false` enqueues only the newest missed slot and counts the others
as missed (a slot at most `scheduler.misfire_grace` old is late, not missed: it is enqueued);
`catch_up = true` enqueues every missed slot, at most `catch_up_limit`, newest kept.
While an entry is paused its slots are counted as missed and not enqueued. A schedule seen for
the first time starts with its next slot (nothing is enqueued for the past).

This module does not schedule itself (`console.scheduler` calls it) and imports no face.

Why one module of about 560 lines: parsing, slot arithmetic, the exactly-once enqueue and the
page's figures all read one `Entry` and the same two tables; split, each part would import the
others' private helpers.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from apscheduler.triggers.cron import CronTrigger
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit
from console.config import ConfigError, duration
from console.queue import producer
from console.queue.protocol import InvalidJob
from console.sqlfiles import query

KEY_PREFIX = "periodic"
CATCH_UP_LIMIT = 100
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_FIELDS = ("name", "kind", "queue", "payload", "cron", "every", "timezone", "catch_up")
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW_ALIASES = {name: i for i, name in enumerate(_DOW_NAMES)}
# How far back a cron schedule is walked after downtime; older slots are estimated.
_WALK_WINDOW = timedelta(days=2)
F = TypeVar("F", bound=Callable[..., Any])  # a handler, returned as it was given


class PeriodicError(LookupError):
    """No such (live) schedule: the web answers 404."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    queue: str = "default"
    payload: Any = field(default_factory=dict)
    cron: str | None = None
    every: int | None = None  # seconds
    timezone: str = "UTC"
    catch_up: bool = False
    source: str = "config"

    # --- slots ---------------------------------------------------------------------------

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after instant `t` (aware), as an aware UTC datetime."""
        t = t.astimezone(UTC)
        if self.every is not None:
            epoch = int(t.timestamp())
            return datetime.fromtimestamp((epoch // self.every + 1) * self.every, UTC)
        tz = self.tz
        wall = t.astimezone(tz).replace(tzinfo=None)
        assert self.cron is not None  # an entry has either `every` or `cron` (parse_entry)
        trigger = _trigger(self.cron)
        candidate = wall.replace(tzinfo=UTC)
        for _ in range(100_000):  # bounded: a valid expression matches within a few years
            candidate = trigger.get_next_fire_time(None, candidate + timedelta(microseconds=1))
            if candidate is None:
                break
            naive = candidate.replace(tzinfo=None)
            instant = naive.replace(tzinfo=tz)  # fold=0: a repeated wall time's first occurrence
            if instant.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != naive:
                continue  # the wall time does not exist (clocks sprang forward over it)
            instant = instant.astimezone(UTC)
            if instant > t:
                found: datetime = instant
                return found
        raise ValueError(f"periodic {self.name!r}: cron {self.cron!r} has no next slot")

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The newest slot <= t (None when there is none within the walk window)."""
        if self.every is not None:
            epoch = int(t.astimezone(UTC).timestamp())
            return datetime.fromtimestamp((epoch // self.every) * self.every, UTC)
        start = t - max(_WALK_WINDOW, timedelta(seconds=3 * self.interval_seconds()))
        slots, _ = self.due(start, t, keep=1)
        return slots[-1] if slots else None

    def due(self, after: datetime, until: datetime, *, keep: int) -> tuple[list[datetime], int]:
        """Slots in (after, until]: the newest `keep` of them, oldest first, and how many there are
        in all (walked for up to two days or three intervals; beyond that, estimated)."""
        if until <= after:
            return [], 0
        if self.every is not None:
            first = int(after.timestamp()) // self.every + 1
            last = int(until.timestamp()) // self.every
            total = max(0, last - first + 1)
            kept = range(max(first, last - keep + 1), last + 1)
            return [datetime.fromtimestamp(n * self.every, UTC) for n in kept], total
        window = max(_WALK_WINDOW, timedelta(seconds=3 * self.interval_seconds()))
        estimated = 0
        if until - after > window:
            walk_from = until - window
            estimated = int((walk_from - after).total_seconds() // self.interval_seconds())
            after = walk_from
        kept_slots: deque[datetime] = deque(maxlen=max(keep, 0))
        total = 0
        slot = self.next_after(after)
        while slot <= until:
            total += 1
            kept_slots.append(slot)
            slot = self.next_after(slot)
        return list(kept_slots), total + estimated

    def interval_seconds(self, around: datetime | None = None) -> float:
        """The longest gap between two slots (the next dozen from `around`): a run older than two
        of these is late. For `every` it is the interval itself."""
        if self.every is not None:
            return float(self.every)
        assert self.cron is not None
        return _cron_interval(self.cron, self.timezone, around)

    def idempotency_key(self, slot: datetime, *, manual: bool = False) -> str:
        stamp = slot.astimezone(UTC).isoformat()
        return f"{KEY_PREFIX}:{self.name}:{'manual:' if manual else ''}{stamp}"

    def describe(self) -> str:
        return describe(self.cron, self.every, self.timezone)


_TRIGGERS: dict[str, CronTrigger] = {}
_INTERVALS: dict[tuple[str, str], float] = {}


def _trigger(cron: str) -> CronTrigger:
    trigger = _TRIGGERS.get(cron)
    if trigger is None:
        minute, hour, dom, month, dow = cron.split()
        trigger = CronTrigger(minute=minute, hour=hour, day=dom, month=month,
                              day_of_week=_cron_dow(dow), timezone=UTC)
        _TRIGGERS[cron] = trigger
    return trigger


def _cron_interval(cron: str, timezone: str, around: datetime | None) -> float:
    key = (cron, timezone)
    if key not in _INTERVALS or around is not None:
        probe = Entry(name="probe", kind="probe", cron=cron, timezone=timezone)
        t = around or datetime(2025, 1, 1, tzinfo=UTC)  # fixed: the same answer on every host
        gaps = []
        slot = probe.next_after(t)
        for _ in range(12):
            following = probe.next_after(slot)
            gaps.append((following - slot).total_seconds())
            slot = following
        value = max(gaps)
        if around is not None:
            return value
        _INTERVALS[key] = value
    return _INTERVALS[key]


def _dow_value(token: str) -> int:
    token = token.strip().lower()
    if token in _DOW_ALIASES:
        return _DOW_ALIASES[token]
    if token.isdigit() and 0 <= int(token) <= 7:
        return int(token) % 7
    raise ValueError(f"day-of-week {token!r} is not 0-7 or sun-sat")


def _cron_dow(field_text: str) -> str:
    """Cron's day-of-week field (0 or 7 = Sunday, names, ranges, lists, steps) as the
    comma-separated day names APScheduler understands without renumbering."""
    if field_text == "*":
        return "*"
    days: set[int] = set()
    for part in field_text.split(","):
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(f"day-of-week step {step_text!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            low, high = 0, 6
        elif "-" in base:
            low_text, high_text = base.split("-", 1)
            low, high = _dow_value(low_text), _dow_value(high_text)
            if high_text.strip() == "7":
                high = 7
            if high < low:
                raise ValueError(f"day-of-week range {base!r} runs backwards")
        else:
            low = high = _dow_value(base)
            if step_text:
                high = 6
        days.update(d % 7 for d in range(low, high + 1, step))
    return ",".join(_DOW_NAMES[d] for d in sorted(days))


# --- validation --------------------------------------------------------------------------

def parse_entry(raw: Any, *, where: str, source: str = "config") -> Entry:
    """One entry from a mapping; ConfigError naming `where` and the entry otherwise."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table with name, kind and cron or every")
    name = raw.get("name")
    label = f"{where} ({name!r})" if isinstance(name, str) and name else where

    def bad(message: str) -> ConfigError:
        return ConfigError(f"{label}: {message}")

    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise bad(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(_FIELDS)})")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("name must be 1-100 letters, digits, '.', '_' or '-' (starting with a letter or digit)")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind.strip():
        raise bad("kind must be a non-empty string")
    queue = raw.get("queue", "default")
    if not isinstance(queue, str) or not queue.strip():
        raise bad("queue must be a non-empty string")
    payload = raw.get("payload", {})
    try:
        producer.check_payload(payload)
    except InvalidJob as exc:
        raise bad(str(exc)) from None
    catch_up = raw.get("catch_up", False)
    if not isinstance(catch_up, bool):
        raise bad("catch_up must be true or false")
    timezone = raw.get("timezone", "UTC")
    try:
        if not isinstance(timezone, str) or not timezone:
            raise ValueError
        ZoneInfo(timezone)
    except (ValueError, ZoneInfoNotFoundError):
        raise bad(f"unknown timezone {timezone!r} (use an IANA name such as Europe/Berlin or UTC)") from None
    cron, every = raw.get("cron"), raw.get("every")
    if cron is not None and every is not None:
        raise bad("give either cron or every, not both")
    if cron is None and every is None:
        raise bad("needs a schedule: cron = \"0 3 * * *\" or every = \"10m\"")
    every_seconds = None
    if every is not None:
        try:
            seconds = duration(every).total_seconds()
        except ValueError:
            raise bad(f"every {every!r} is not a duration (use e.g. 10s, 5m, 1h)") from None
        if seconds < 1 or not float(seconds).is_integer():
            raise bad(f"every {every!r} must be a whole number of seconds, at least 1s")
        every_seconds = int(seconds)
    if cron is not None:
        cron = _check_cron(cron, bad)
    entry = Entry(name=name, kind=kind, queue=queue, payload=payload, cron=cron, every=every_seconds,
                  timezone=timezone, catch_up=catch_up, source=source)
    if cron is not None:
        try:
            entry.interval_seconds()
        except ValueError:
            raise bad(f"cron {cron!r} never matches a date") from None
    return entry


def _check_cron(cron: Any, bad: Callable[[str], ConfigError]) -> str:
    if not isinstance(cron, str):
        raise bad("cron must be a string of five fields")
    fields = cron.split()
    if len(fields) != 5:
        raise bad(f"cron {cron!r} must have five fields (minute hour day-of-month month day-of-week)")
    text = " ".join(fields)
    if fields[2] not in ("*", "?") and fields[4] not in ("*", "?"):
        raise bad(f"cron {cron!r} restricts both day-of-month and day-of-week; cron would run on "
                  "either, which is rarely meant: use one of them")
    try:
        _trigger(text)
    except (ValueError, KeyError) as exc:
        _TRIGGERS.pop(text, None)
        raise bad(f"bad cron expression {cron!r}: {exc}") from None
    return text


def parse_entries(items: Iterable[tuple[str, Any, str]]) -> list[Entry]:
    """Entries from (where, raw, source) triples; a duplicate name is refused, naming both."""
    entries: list[Entry] = []
    seen: dict[str, str] = {}
    for where, raw, source in items:
        entry = parse_entry(raw, where=where, source=source)
        if entry.name in seen:
            raise ConfigError(f"{where}: periodic name {entry.name!r} is already used by {seen[entry.name]}")
        seen[entry.name] = where
        entries.append(entry)
    return entries


# --- code-defined schedules ---------------------------------------------------------------

CODE_ENTRIES: dict[str, tuple[str, dict[str, Any]]] = {}


def schedule(name: str, *, cron: str | None = None, every: str | int | None = None, kind: str | None = None,
             queue: str = "default", payload: Any = None, timezone: str = "UTC",
             catch_up: bool = False) -> Callable[[F], F]:
    """`@skiplock.schedule("nightly-report", cron="0 3 * * *", queue="reports")` on a handler:
    registers the handler as task `kind` (default: the name) and the schedule, and returns the
    handler unchanged. The scheduler sees it when `[scheduler] tasks` names the module.

    `cron`: five fields in `timezone` (a skipped wall time is skipped, a repeated one runs
    once), or `every`: seconds or a duration ("15m"). `catch_up`: after downtime, enqueue every
    missed slot (at most 100) instead of only the newest. A bad schedule raises ConfigError at
    import (docs/queue.md, "Periodic jobs")."""
    from console.queue.tasks import task

    def register(func: F) -> F:
        job_kind = kind or name
        raw = {"name": name, "kind": job_kind, "queue": queue, "payload": {} if payload is None else payload,
               "timezone": timezone, "catch_up": catch_up}
        if cron is not None:
            raw["cron"] = cron
        if every is not None:
            raw["every"] = every
        where = f"@console.schedule in {func.__module__}.{func.__qualname__}"
        parse_entry(raw, where=where, source="code")  # a bad schedule fails at import
        previous = CODE_ENTRIES.get(name)
        if previous is not None and previous[0] != where:
            raise ConfigError(f"{where}: periodic name {name!r} is already used by {previous[0]}")
        CODE_ENTRIES[name] = (where, raw)
        return task(job_kind)(func)

    return register


def load_entries(config: Any, *, import_tasks: bool = True) -> list[Entry]:
    """Every schedule this process knows: `[[periodic]]` in the config file, then the
    `@console.schedule`s of the modules named by `[scheduler] tasks`."""
    if import_tasks and getattr(config.scheduler, "tasks", None):
        from console.queue.tasks import load_modules

        try:
            load_modules(config.scheduler.tasks)
        except ImportError as exc:
            raise ConfigError(f"scheduler.tasks: cannot import {config.scheduler.tasks!r}: {exc}") from None
    raw_list = config.tables.get("periodic", [])
    if not isinstance(raw_list, list):
        raise ConfigError("[[periodic]] must be an array of tables")
    items = [(f"[[periodic]] #{i + 1}", raw, "config") for i, raw in enumerate(raw_list)]
    items += [(where, raw, "code") for where, raw in CODE_ENTRIES.values()] if import_tasks else []
    return parse_entries(items)


# --- the leader's work ----------------------------------------------------------------------

@dataclass
class DueReport:
    enqueued: dict[str, list[int]] = field(default_factory=dict)  # name -> job ids
    missed: dict[str, int] = field(default_factory=dict)


def sync(conn: psycopg.Connection, entries: list[Entry]) -> None:
    """Declare the entries in skiplock.periodic; schedules no longer declared are retired."""
    with conn.transaction():
        for e in entries:
            conn.execute(query("periodic", "sync"), {
                "name": e.name, "kind": e.kind, "queue": e.queue, "payload": Jsonb(e.payload),
                "cron": e.cron, "every_seconds": e.every, "timezone": e.timezone, "catch_up": e.catch_up,
                "interval_seconds": e.interval_seconds(), "source": e.source,
            })
        conn.execute(query("periodic", "retire_others"), {"names": [e.name for e in entries]})


def enqueue_due(conn: psycopg.Connection, entries: list[Entry], now: datetime | None = None, *,
                catch_up_limit: int = CATCH_UP_LIMIT, max_attempts: int | None = None,
                grace: timedelta = timedelta(0)) -> DueReport:
    """Enqueue every due slot of every entry (declared with `sync` first), one transaction per
    entry; `now` defaults to the database's clock.

    `grace` (the scheduler passes `scheduler.misfire_grace`): with `catch_up = false`, the due
    slots at most this old are late, not missed, and are all enqueued; older ones are missed
    (the newest is always enqueued). Without it a pass that woke a second late on a loaded
    machine found two slots of an `every = "1s"` schedule due and counted one missed, as if
    the scheduler had been down."""
    report = DueReport()
    for entry in entries:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(query("periodic", "lock_entry"), {"name": entry.name}).fetchone()
            if row is None:
                continue  # not declared (or retired): nothing to do
            at = now or row["now"]
            last = row["last_slot"]
            if last is None:  # first sight: start with the next slot
                last = entry.latest_at_or_before(at) or at
                slots: list[datetime] = []
                total = 0
            elif row["paused"]:
                _, total = entry.due(last, at, keep=0)
                slots = []
            else:
                keep = catch_up_limit if entry.catch_up or grace else 1
                slots, total = entry.due(last, at, keep=keep)
                if not entry.catch_up:
                    slots = [slot for slot in slots if slot >= at - grace] or slots[-1:]
            ids = []
            for slot in slots:
                job_id = _enqueue_slot(cur, entry, slot, manual=False, actor=None, max_attempts=max_attempts)
                if job_id is not None:
                    ids.append(job_id)
            missed = total - len(slots)
            newest = slots[-1] if slots else (entry.latest_at_or_before(at) if total else last)
            newest = max(newest or last, last)
            cur.execute(query("periodic", "advance"), {
                "name": entry.name, "last_slot": newest, "next_slot": entry.next_after(max(newest, at)),
                "missed": missed,
            })
            if ids:
                report.enqueued[entry.name] = ids
            if missed:
                report.missed[entry.name] = missed
    return report


def next_slot(entries: Iterable[Entry], after: datetime) -> datetime | None:
    """The earliest slot of any entry strictly after `after` (None without entries): when the
    scheduler's next pass has something to enqueue."""
    return min((entry.next_after(after) for entry in entries), default=None)


def _enqueue_slot(cur: psycopg.Cursor[Any], entry: Entry, slot: datetime, *, manual: bool, actor: str | None,
                  max_attempts: int | None) -> int | None:
    claimed = cur.execute(query("periodic", "claim_slot"),
                          {"name": entry.name, "slot": slot, "manual": manual, "actor": actor}).fetchone()
    if claimed is None:
        return None  # this slot already ran (another scheduler, or before a restart)
    job_id = producer.enqueue(cur.connection, entry.kind, entry.payload, queue=entry.queue,
                              idempotency_key=entry.idempotency_key(slot, manual=manual), max_attempts=max_attempts)
    cur.execute(query("periodic", "set_run_job"), {"name": entry.name, "slot": slot, "manual": manual, "job_id": job_id})
    return job_id


def settle(conn: psycopg.Connection, *, limit: int = 500) -> int:
    """Record the outcome of finished runs (and each schedule's last success); returns how many."""
    row = conn.execute(query("periodic", "settle"), {"limit": limit}).fetchone()
    return int(row[0]) if row else 0


def prune(conn: psycopg.Connection, *, keep_seconds: float, limit: int = 1000) -> int:
    """Delete one bounded batch of settled runs older than `keep_seconds`."""
    return conn.execute(query("periodic", "prune"), {"keep_seconds": keep_seconds, "limit": limit}).rowcount


# --- operator actions (web, API, CLI) ----------------------------------------------------

def _check_actor(name: str, actor: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("a periodic name is required")
    if not actor:
        raise ValueError("an actor is required")


def _missing(conn: psycopg.Connection, name: str) -> PeriodicError:
    """The error for a name no live schedule has, naming the nearest ones (a typo, most likely)."""
    import difflib

    names = [r["name"] for r in list_schedules(conn)]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = (f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else
            f"; schedules: {', '.join(names[:10])}" if names else "; no schedule is declared (docs/queue.md, periodic jobs)")
    return PeriodicError(f"there is no periodic schedule {name!r}{hint}")


def set_paused(conn: psycopg.Connection, name: str, paused: bool, *, actor: str, reason: str | None = None) -> None:
    """Pause (slots are counted as missed, not enqueued) or resume a schedule, audited."""
    _check_actor(name, actor)
    with conn.transaction():
        row = conn.execute(query("periodic", "set_paused"), {"name": name, "paused": paused, "actor": actor}).fetchone()
        if row is None:
            raise _missing(conn, name)
        audit.record(conn, actor=actor, action="periodic_pause" if paused else "periodic_resume",
                     target=f"periodic:{name}", selection={"periodic": name}, reason=reason, outcome="ok")


def run_now(conn: psycopg.Connection, name: str, *, actor: str, reason: str | None = None,
            max_attempts: int | None = None) -> int:
    """Enqueue the schedule's job at once (a manual run, its own slot), audited; the job id."""
    _check_actor(name, actor)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("periodic", "get"), {"name": name}).fetchone()
        if row is None:
            raise _missing(conn, name)
        entry = Entry(name=row["name"], kind=row["kind"], queue=row["queue"], payload=row["payload"], every=1)
        slot_row = cur.execute(query("periodic", "manual_slot"), {}).fetchone()
        assert slot_row is not None  # SELECT of now(): always one row
        slot = slot_row["slot"]
        job_id = _enqueue_slot(cur, entry, slot, manual=True, actor=actor, max_attempts=max_attempts)
        if job_id is None:
            raise ValueError(f"periodic {name!r} was just run by hand; try again")
        audit.record(conn, actor=actor, action="periodic_run_now", target=f"periodic:{name}",
                     selection={"periodic": name, "job_id": job_id}, reason=reason, rows=1, outcome="ok")
    return job_id


# --- reading (web, API, collector) -------------------------------------------------------

def list_schedules(conn: psycopg.Connection, name: str | None = None) -> list[dict[str, Any]]:
    """Every live schedule with its last run (and that run's job state), next slot, missed count,
    last success and the schedule in words."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("periodic", "list"), {"name": name}).fetchall()
    for row in rows:
        row["schedule"] = describe(row["cron"], row["every_seconds"], row["timezone"])
        row["expression"] = row["cron"] if row["cron"] else f"every {_span(row['every_seconds'])}"
        age = (row["now"] - row["last_success_at"]).total_seconds() if row["last_success_at"] else None
        row["last_success_age_seconds"] = age
        since = row["last_success_at"] or row["created_at"]
        overdue = (row["now"] - since).total_seconds() > 2 * row["interval_seconds"]
        row["late"] = bool(not row["paused"] and overdue)
    return rows


# --- the schedule in words ---------------------------------------------------------------

_WEEKDAYS = {"mon,tue,wed,thu,fri": "weekdays", "sun,sat": "weekends"}
_DAY_WORDS = {"sun": "Sundays", "mon": "Mondays", "tue": "Tuesdays", "wed": "Wednesdays", "thu": "Thursdays",
              "fri": "Fridays", "sat": "Saturdays"}


def _span(seconds: int | float | None) -> str:
    seconds = int(seconds or 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}" if unit != "d" else f"{n} day{'s' if n != 1 else ''}"
    return f"{seconds} s"


def describe(cron: str | None, every: int | float | None, timezone: str = "UTC") -> str:
    """A short English reading of the common forms; otherwise the cron text itself."""
    if cron is None:
        return f"every {_span(every)}"
    suffix = "" if timezone == "UTC" else f" ({timezone})"
    minute, hour, dom, month, dow = cron.split()
    if (dom, month, dow) == ("*", "*", "*"):
        if hour == "*" and minute == "*":
            return "every minute"
        if hour == "*" and re.fullmatch(r"\*/\d+", minute):
            return f"every {int(minute[2:])} min"
        if hour == "*" and minute.isdigit():
            return f"hourly at :{int(minute):02d}"
        if re.fullmatch(r"\*/\d+", hour) and minute.isdigit():
            return f"every {int(hour[2:])} h at :{int(minute):02d}{suffix}"
    if not (minute.isdigit() and hour.isdigit() and month == "*"):
        return cron + suffix
    at = f"{int(hour):02d}:{int(minute):02d}{suffix}"
    if dom == "*" and dow == "*":
        return f"daily at {at}"
    if dom == "*":
        try:
            days = _cron_dow(dow)
        except ValueError:
            return cron + suffix
        words = _WEEKDAYS.get(days) or ", ".join(_DAY_WORDS[d] for d in days.split(","))
        return f"{words} at {at}"
    if dom.isdigit():
        return f"monthly on day {int(dom)} at {at}"
    return cron + suffix
