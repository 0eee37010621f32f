"""Concurrency and rate limits per queue, and concurrency per job kind, enforced fleet-wide.

A queue may have a concurrency limit (at no instant do more than N of its jobs run, across all
workers) and a rate limit (N/s or N/m, a token bucket of `burst = max(1, N per second)` tokens
kept in its `skiplock.queues` row). A job kind may have a concurrency limit declared in code:
`@console.task("kind", concurrency=N)`; each worker writes its kinds' limits at start-up.

How it is enforced: the workers' fast claim (sql/queue.sql) leaves limited queues and limited
kinds alone, in the database, so a stale worker can never claim them that way. They are claimed
here, one short transaction per queue (or kind): a transaction-level advisory lock serializes
that queue's claimers across the fleet, then one statement counts its running jobs, refills
the bucket, claims at most what both allow and spends the tokens (sql/limits.sql); it finds
the unit's jobs through an index per kind and per queue, so it reads only its own unit's jobs,
never the other queues' backlog. Those indexes exist only while something is limited
(`keep_claim_indexes`, run by the scheduler's leader): a team without limits pays nothing. A killed worker's jobs stay `running` (and
keep their slots) until the reaper rescues their leases.

Semantics worth knowing (docs/queue.md, "Concurrency and rate limits"):
- the rate bounds claims, not completions: over any window of W seconds a queue's claims stay
  within rate × W + burst; a retried job is claimed (and counted) again;
- a limited kind's jobs in a limited queue obey both limits (the kind's lock is taken first,
  then the queue's);
- a freed slot is taken at once by the worker that freed it, by others within their poll
  interval.

This module does not loop or sleep; `console.queue.worker` calls `LimitedClaimer.claim` each round.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from console import audit
from console.queue import protocol as q
from console.sqlfiles import query

LIMITS_CHANNEL = "skiplock_limits"
MAX_CONCURRENCY = 1_000_000
MAX_RATE = 1_000_000

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|sec|second|m|min|minute)\s*$", re.IGNORECASE)


class InvalidLimit(ValueError):
    """A limit cannot be set as given (the message names the field and why)."""


@dataclass(frozen=True)
class Rate:
    count: int
    period: int  # seconds: 1 or 60

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def burst(self) -> float:
        """The bucket's size: a second's worth of jobs, and at least one."""
        return max(1.0, self.per_second)

    def __str__(self) -> str:
        return f"{self.count}/{'s' if self.period == 1 else 'm'}"


def parse_rate(text: str | None) -> Rate | None:
    """'10/s' or '30/m' (N a positive whole number); None or '' means no rate."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InvalidLimit("rate: must be a string like 10/s or 30/m")
    match = _RATE.match(text)
    if not match:
        raise InvalidLimit(f"rate: {text.strip()[:40]!r} is not a rate; write N/s or N/m with N a positive whole number (10/s, 30/m)")
    count = int(match.group(1))
    if count < 1:
        raise InvalidLimit("rate: must be at least 1 job per second or minute (to stop a queue, pause it)")
    if count > MAX_RATE:
        raise InvalidLimit(f"rate: at most {MAX_RATE:,} per second or minute")
    return Rate(count, 1 if match.group(2).lower().startswith("s") else 60)


def parse_concurrency(value: Any, *, name: str = "concurrency") -> int | None:
    """A positive whole number of running jobs; None or '' means no concurrency limit."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise InvalidLimit(f"{name}: must be a whole number")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise InvalidLimit(f"{name}: {value.strip()[:40]!r} is not a whole number") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise InvalidLimit(f"{name}: must be a whole number")
    if value < 1:
        raise InvalidLimit(f"{name}: must be at least 1 (got {value}); to stop a queue, pause it; to lift the limit, clear it")
    if value > MAX_CONCURRENCY:
        raise InvalidLimit(f"{name}: at most {MAX_CONCURRENCY:,}")
    return value


def parse_group_concurrency(value: Any) -> int | None:
    """At most this many running jobs per group (fair queues); None or '' means none."""
    return parse_concurrency(value, name="group_concurrency")


MAX_WEIGHT = 100
MAX_WEIGHTS_AT_ONCE = 1000  # groups weighted by one change


def parse_group_weights(value: Any) -> dict[str, int]:
    """{group: weight} for a fair queue's weighted round-robin: a group of weight w gets w turns
    for every turn of a weight-1 group when they compete (docs/queue.md, "Fair queues"). A weight
    is a whole number from 1 to MAX_WEIGHT; 1 is the default (its row is removed). None or {}
    means no change."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidLimit('group_weights: must be an object of group to weight, like {"tenant-42": 3}')
    if len(value) > MAX_WEIGHTS_AT_ONCE:
        raise InvalidLimit(f"group_weights: at most {MAX_WEIGHTS_AT_ONCE:,} groups in one change")
    out: dict[str, int] = {}
    for group, weight in value.items():
        if not isinstance(group, str) or not group.strip():
            raise InvalidLimit("group_weights: a group name must not be empty")
        if len(group) > 200:
            raise InvalidLimit(f"group_weights: group {group[:40]!r}...: a group key is at most 200 characters")
        what = f"group_weights: {group[:40]!r}"
        if isinstance(weight, bool):
            raise InvalidLimit(f"{what}: the weight must be a whole number from 1 to {MAX_WEIGHT}")
        if isinstance(weight, str):
            try:
                weight = int(weight.strip())
            except ValueError:
                raise InvalidLimit(f"{what}: {weight.strip()[:40]!r} is not a whole number (a weight is 1 to {MAX_WEIGHT})") from None
        if isinstance(weight, float) and weight.is_integer():
            weight = int(weight)
        if not isinstance(weight, int):
            raise InvalidLimit(f"{what}: the weight must be a whole number from 1 to {MAX_WEIGHT} (got {weight!r})")
        if not 1 <= weight <= MAX_WEIGHT:
            raise InvalidLimit(f"{what}: the weight must be from 1 to {MAX_WEIGHT} (got {weight}); 1 is the default "
                               "(to hold a group back, a weight cannot: give the others more)")
        out[group] = weight
    return out


def parse_group_weight_args(items: Sequence[str]) -> dict[str, int]:
    """The CLI's repeated `--group-weight GROUP=W`, checked as `parse_group_weights` does."""
    pairs: dict[str, str] = {}
    for item in items:
        group, sep, weight = item.rpartition("=")
        if not sep:
            raise InvalidLimit(f"group_weights: {item[:40]!r} is not GROUP=WEIGHT (like tenant-42=3)")
        pairs[group] = weight
    return parse_group_weights(pairs)


def weights_of(conn: psycopg.Connection, queue_name: str) -> dict[str, int]:
    """A queue's weighted groups {group: weight} (a group not listed has weight 1)."""
    return dict(conn.execute(query("limits", "group_weights"), {"queue": queue_name}).fetchall())


def _check_queue(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidLimit("queue: a queue name is needed (a non-empty string)")
    if len(name) > 200:
        raise InvalidLimit("queue: a queue name is at most 200 characters")
    return name


def limits_of(conn: psycopg.Connection, queue_name: str) -> dict[str, Any]:
    """{"concurrency": n|None, "rate": "10/s"|None, "burst": x|None, "group_concurrency": n|None}
    of one queue."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("limits", "get_limits"), {"queue": queue_name}).fetchone()
    return _shape(row)


def _shape(row: Mapping[str, Any] | None) -> dict[str, Any]:
    if row is None or (row["concurrency"] is None and row["rate_count"] is None and row["group_concurrency"] is None):
        return {"concurrency": None, "rate": None, "burst": None, "group_concurrency": None}
    rate = str(Rate(row["rate_count"], row["rate_period"])) if row["rate_count"] is not None else None
    return {"concurrency": row["concurrency"], "rate": rate, "burst": row["burst"],
            "group_concurrency": row["group_concurrency"]}


def set_limits(
    conn: psycopg.Connection,
    queue_name: str,
    *,
    concurrency: Any = None,
    rate: Any = None,
    group_concurrency: Any = None,
    group_weights: Any = None,
    clear: bool = False,
    actor: str,
    reason: str | None = None,
) -> dict[str, Any]:
    """Change a queue's limits, audited; returns {"queue", "before", "after"}.

    A limit not given keeps its value; `clear` removes every limit first (then the ones given
    are set): `clear=True` alone lifts every limit. `group_concurrency` makes the queue fair: at
    most that many of its jobs of one group (`enqueue(..., group=...)`) run at once, fleet-wide,
    and the groups are claimed round-robin (docs/queue.md, "Fair queues"). `group_weights`
    ({group: 1..100}) weights that round-robin: a group of weight w gets w turns for every turn
    of a weight-1 group, within the same group_concurrency; a group not named keeps its weight,
    weight 1 removes a group's row; `clear` removes the queue's weights too. When weights are
    given or the queue had some, the result has `group_weights: {"before", "after"}` (also in
    the audit row). Workers hear of it at once (NOTIFY skiplock_limits) and re-read the limits
    every few seconds anyway.
    """
    queue_name = _check_queue(queue_name)
    if not actor:
        raise InvalidLimit("an action needs an actor")
    new_concurrency = parse_concurrency(concurrency)
    new_rate = parse_rate(rate)
    new_group = parse_group_concurrency(group_concurrency)
    new_weights = parse_group_weights(group_weights)
    if not clear and new_concurrency is None and new_rate is None and new_group is None and not new_weights:
        raise InvalidLimit("nothing to set: give a concurrency, a rate, a group_concurrency, group_weights, or clear")
    with conn.transaction():
        before = limits_of(conn, queue_name)
        weights_before = weights_of(conn, queue_name)
        if not clear:
            if new_concurrency is None:
                new_concurrency = before["concurrency"]
            if new_rate is None and before["rate"] is not None:
                new_rate = parse_rate(before["rate"])
            if new_group is None:
                new_group = before["group_concurrency"]
        params = {
            "queue": queue_name,
            "concurrency": new_concurrency,
            "rate_count": new_rate.count if new_rate else None,
            "rate_period": new_rate.period if new_rate else None,
            "burst": new_rate.burst if new_rate else None,
            "group_concurrency": new_group,
            "actor": actor,
        }
        if new_weights and new_group is None:
            # Weights of a queue that is not fair would do nothing, silently.
            raise InvalidLimit(f"group_weights: queue {queue_name!r} is not fair; give it a group_concurrency too")
        conn.execute(query("limits", "set_limits"), params)
        if clear:
            conn.execute(query("limits", "clear_group_weights"), {"queue": queue_name})
        for group, weight in sorted(new_weights.items()):
            conn.execute(query("limits", "set_group_weight"),
                         {"queue": queue_name, "group": group, "weight": weight, "actor": actor})
        after = limits_of(conn, queue_name)
        weights_after = weights_of(conn, queue_name)
        conn.execute(query("limits", "notify_limits"), {"queue": queue_name})
        result: dict[str, Any] = {"queue": queue_name, "before": before, "after": after}
        detail: dict[str, Any] = {"before": before, "after": after}
        if new_weights or weights_before:
            result["group_weights"] = detail["group_weights"] = {"before": weights_before, "after": weights_after}
        audit.record(conn, actor=actor, action="set limits" if (after["concurrency"] or after["rate"] or after["group_concurrency"]) else "clear limits",
                     target=f"queue:{queue_name}", selection={"queue": queue_name}, reason=reason, rows=1, outcome="ok",
                     detail=detail)
    return result


def queue_limits(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every limited queue with its usage: running jobs, and tokens in its bucket now."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("limits", "queue_limits")).fetchall()
    out = []
    for row in rows:
        shaped = _shape(row)
        shaped.update(queue=row["queue"], running=row["running"], paused=row["paused"], group_weights=row["group_weights"],
                      tokens=None if row["tokens"] is None else round(float(row["tokens"]), 2),
                      set_at=row["limits_set_at"], set_by=row["limits_set_by"])
        out.append(shaped)
    return out


def kind_limits(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every limited kind with its running jobs (fleet-wide)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("limits", "kind_limits")).fetchall()


def declare_kinds(conn: psycopg.Connection, limits: Mapping[str, int | None], *, worker: str) -> None:
    """Write the kinds' limits a worker's code declares; kinds it registers without a limit
    lose one an older deployment declared."""
    with conn.transaction():
        for kind, n in sorted(limits.items()):
            if n is not None:
                conn.execute(query("limits", "declare_kind"), {"kind": kind, "concurrency": n, "worker": worker})
        unlimited = sorted(k for k, n in limits.items() if n is None)
        removed = conn.execute(query("limits", "undeclare_kinds"), {"kinds": unlimited}).fetchall() if unlimited else []
        if any(n is not None for n in limits.values()) or removed:
            conn.execute(query("limits", "notify_limits"), {"queue": ""})


@dataclass
class Limited:
    """What the limited path claims: limited queues and limited kinds."""

    queues: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.queues or self.kinds)


def limited(conn: psycopg.Connection, serving: Sequence[str] | None = None) -> Limited:
    """The limited queues (among `serving`, when given) and the limited kinds."""
    out = Limited()
    for unit, name in conn.execute(query("limits", "limited")).fetchall():
        if unit == "kind":
            out.kinds.append(name)
        elif serving is None or name in serving:
            out.queues.append(name)
    return out


def _transaction(conn: psycopg.Connection, what: str):
    """The limited claim's own short transaction (lock, then claim; commit releases the lock)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError(f"{what} must run outside an open transaction (use an autocommit connection)")
    return conn.transaction()


def _jobs(rows: list[dict[str, Any]]) -> list[q.Job]:
    return [q.Job.from_row(row) for row in rows]


def claim_from_queue(conn: psycopg.Connection, queue_name: str, worker: str, *, limit: int,
                     lease: float = q.DEFAULT_LEASE) -> list[q.Job]:
    """Claim up to `limit` jobs of unlimited kinds from one limited queue, within its limits."""
    if limit < 1:
        return []
    with _transaction(conn, "claim_from_queue"), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("limits", "lock_queue"), {"queue": queue_name})
        rows = cur.execute(query("limits", "claim_queue"), {"queue": queue_name, "kind": None, "limit": limit,
                                                            "worker": worker, "lease": float(lease)}).fetchall()
    return _jobs(rows)


def claim_kind(conn: psycopg.Connection, kind: str, worker: str, *, limit: int, queues: Sequence[str] | None = None,
               limited_queues: Sequence[str] = (), lease: float = q.DEFAULT_LEASE) -> list[q.Job]:
    """Claim up to `limit` jobs of one limited kind within its fleet-wide concurrency: from
    queues without limits first, then from each of `limited_queues` under that queue's lock too."""
    if limit < 1:
        return []
    claimed: list[q.Job] = []
    with _transaction(conn, "claim_kind"), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("limits", "lock_kind"), {"kind": kind})
        row = cur.execute(query("limits", "kind_room"), {"kind": kind}).fetchone()
        room = min(limit, row["room"]) if row else 0
        if room > 0:
            claimed += _jobs(cur.execute(query("limits", "claim_kind"), {
                "kind": kind, "limit": room, "queues": list(queues) if queues else None,
                "worker": worker, "lease": float(lease)}).fetchall())
        for queue_name in sorted(limited_queues):
            left = room - len(claimed)
            if left <= 0:
                break
            cur.execute(query("limits", "lock_queue"), {"queue": queue_name})
            claimed += _jobs(cur.execute(query("limits", "claim_queue"), {
                "queue": queue_name, "kind": kind, "limit": left, "worker": worker, "lease": float(lease)}).fetchall())
    return claimed


# The limited path's indexes (sql/limits.sql), what each serves, and the statement that builds it.
CLAIM_INDEXES = {"jobs_kind_claim_idx": ("kind", "create_kind_claim_index"),
                 "jobs_queue_claim_idx": ("queue", "create_queue_claim_index"),
                 "jobs_group_claim_idx": ("fair", "create_group_claim_index")}
# A build reads the whole jobs table; past this it gives up and is tried again next run.
INDEX_BUILD_TIMEOUT = "15min"


def keep_claim_indexes(conn: psycopg.Connection) -> dict[str, str]:
    """Build the limited path's index of a unit kind (kind, queue) while some unit of that kind
    is limited, and drop it once none is: {index name: "built" | "dropped" | "rebuilt"} for what
    changed. CONCURRENTLY, so enqueues and claims never wait; needs an autocommit connection
    (the scheduler's). Until the index exists the limited path still works, reading the backlog
    as it goes (sql/limits.sql says what the indexes cost and spare)."""
    if not conn.autocommit:
        raise ValueError("keep_claim_indexes needs an autocommit connection (CREATE INDEX CONCURRENTLY)")
    with conn.cursor(row_factory=dict_row) as cur:
        wanted = cur.execute(query("limits", "claim_indexes_wanted")).fetchone()
        present = {r["name"]: r["valid"] for r in
                   cur.execute(query("limits", "claim_indexes_present"), {"names": list(CLAIM_INDEXES)}).fetchall()}
    steps: list[tuple[str, str, str | None]] = []  # (index, what changes, the create statement's name)
    for name, (unit, create) in CLAIM_INDEXES.items():
        if not wanted[unit]:
            if name in present:
                steps.append((name, "dropped", None))
        elif present.get(name) is not True:  # missing, or left invalid by a failed build
            steps.append((name, "rebuilt" if name in present else "built", create))
    if not steps:  # the usual run, every 30 s: two reads, no settings touched
        return {}
    with _session_limits(conn, statement_timeout=INDEX_BUILD_TIMEOUT,
                         lock_timeout="5s"):  # a VACUUM of jobs holds the lock a build needs: next run
        for name, what, create in steps:
            if what != "built":  # dropped, or an invalid one that costs and serves nothing
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier("skiplock", name)))
            if create is not None:
                conn.execute(query("limits", create))
    return {name: what for name, what, _ in steps}


@contextlib.contextmanager
def _session_limits(conn: psycopg.Connection, **settings: str):
    """Session settings for a block on an autocommit connection (SET LOCAL needs a transaction,
    which CREATE INDEX CONCURRENTLY refuses), put back to the caller's values afterwards."""
    before = {name: conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] for name in settings}
    for name, value in settings.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    try:
        yield
    finally:
        for name, value in before.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))


class LimitedClaimer:
    """The worker's limited path: each round, tries every limited unit it serves, starting
    one further along each time so that no queue or kind is always served last.

    A unit that had nothing to give (full, out of tokens, or empty) rests until the next poll
    (`rest` seconds) unless `poke`d: a NOTIFY of new jobs in its queue, or one of its jobs
    finishing here. So a limited queue costs the fleet's other queues at most one try per poll
    interval while it is full or idle, not one per claim round; and a try is a probe of the
    unit's own index (`keep_claim_indexes`: a few buffers), not a walk of the others' backlog. The rest
    does not grow: with the try that cheap, a longer one would only delay the unit's new jobs
    (a limited kind's jobs in an unlimited queue ring no doorbell of the limited path)."""

    def __init__(self, worker: str, queues: Sequence[str] | None, lease: float, *, rest: float = 1.0):
        self.worker = worker
        self.queues = list(queues) if queues else None
        self.lease = lease
        self.rest = rest
        self.units = Limited()
        self._turn = 0
        self._resting: dict[tuple[str, str], float] = {}

    def refresh(self, conn: psycopg.Connection) -> Limited:
        self.units = limited(conn, self.queues)
        return self.units

    def poke(self, *, queue: str | None = None, kind: str | None = None) -> None:
        """A job of this queue (or kind) finished here: its slot is free, try it next round.
        Only those units: a finished job of an unlimited queue wakes nothing."""
        if queue is not None:
            self._resting.pop(("queue", queue), None)
        if kind is not None:
            self._resting.pop(("kind", kind), None)

    def poke_new_jobs(self, queue: str) -> None:
        """New jobs arrived in a limited queue (NOTIFY): try it, and the limited kinds, whose
        jobs may be among them."""
        self._resting.pop(("queue", queue), None)
        for name in self.units.kinds:
            self._resting.pop(("kind", name), None)

    def resting(self, now: float) -> set[tuple[str, str]]:
        """The units that will be skipped if a round starts at `now`."""
        return {unit for unit, until in self._resting.items() if until > now}

    def poke_all(self) -> None:
        self._resting.clear()

    def due(self, now: float) -> bool:
        """Whether a round starting at `now` would try any unit. When none is due the worker
        skips the limited path's preparations too (completing its finished jobs apart from the
        fast claim, one more statement and commit per round)."""
        return any(self._resting.get(unit, 0.0) <= now
                   for unit in [("queue", n) for n in self.units.queues] + [("kind", n) for n in self.units.kinds])

    def claim(self, conn: psycopg.Connection, limit: int, *, now: float) -> list[q.Job]:
        units = [("queue", n) for n in self.units.queues] + [("kind", n) for n in self.units.kinds]
        if not units or limit < 1:
            return []
        self._turn = (self._turn + 1) % len(units)
        claimed: list[q.Job] = []
        for unit in units[self._turn:] + units[:self._turn]:
            left = limit - len(claimed)
            if left <= 0:
                break
            if self._resting.get(unit, 0.0) > now:
                continue
            kind, name = unit
            if kind == "queue":
                got = claim_from_queue(conn, name, self.worker, limit=left, lease=self.lease)
            else:
                got = claim_kind(conn, name, self.worker, limit=left, queues=self.queues,
                                 limited_queues=self.units.queues, lease=self.lease)
            if len(got) < left:
                self._resting[unit] = now + self.rest
            claimed += got
        return claimed


# --- a fair queue's groups (the queue page, the API) -------------------------------------------

GROUPS_SCANNED = 1000  # groups with pending jobs read per look (in key order)
GROUP_COUNT_CAP = 10_000  # eligible jobs counted per group; more shows as "10,000+"
STARVING_FACTOR = 5  # a group whose oldest eligible job waits this many times the median group's...
STARVING_FLOOR = 60.0  # ...and at least this many seconds, with nothing running, is flagged
FAILED_WINDOW = 900.0  # seconds of dead letters counted per group: [scheduler] rate_window's default
FAILED_CAP = 5000  # newest dead letters read for that count: [scheduler] failed_queue_limit's default


def fair_queues(conn: psycopg.Connection) -> list[str]:
    """The names of the fair queues (group_concurrency set), in name order."""
    return [row[0] for row in conn.execute(query("limits", "fair_queues")).fetchall()]


def group_rows(conn: psycopg.Connection, queues: Sequence[str], *, window: float = FAILED_WINDOW,
               failed_cap: int = FAILED_CAP) -> dict[str, dict[str, Any]]:
    """{queue: its groups} for each of the fair `queues`, in one statement (sql/limits.sql
    `fair_groups`): every group the bounded walk finds, those with pending jobs
    (GROUPS_SCANNED a queue at most), running jobs, or dead letters within `window` seconds (of
    the newest `failed_cap` dead letters, read once for all the queues), each {group, eligible,
    capped, age_seconds, running, failed, starving}, unsorted; with the median waiting group's
    wait and whether the walk stopped at GROUPS_SCANNED. The queue page's Groups panel
    (`fair_groups`) and the groups collector (console/collectors/groups.py) both read this, so
    the page and the samples agree. Starving: oldest eligible job waiting more than
    STARVING_FACTOR times the median waiting group's wait (and at least STARVING_FLOOR seconds)
    with no job of the group running. The NULL group is `group: None`."""
    names = list(dict.fromkeys(queues))
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("limits", "fair_groups"),
                           {"queues": names, "groups": GROUPS_SCANNED, "cap": GROUP_COUNT_CAP,
                            "window": float(window), "failed_cap": int(failed_cap)}).fetchall()
    by_queue: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in rows:
        by_queue[r["queue"]].append(r)
    return {name: _groups_of(found) for name, found in by_queue.items()}


def _groups_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One queue's rows of `fair_groups`, shaped, with starvation judged against its median."""
    waiting = [r for r in rows if r["eligible"]]
    ages = sorted(r["age_seconds"] for r in waiting)
    median = ages[len(ages) // 2] if ages else None
    out = []
    for r in rows:
        starving = bool(r["eligible"] and median is not None and r["running"] == 0 and len(waiting) > 1
                        and r["age_seconds"] > max(STARVING_FLOOR, STARVING_FACTOR * median))
        out.append({"group": r["k"] or None, "eligible": r["eligible"], "capped": r["eligible"] >= GROUP_COUNT_CAP,
                    "age_seconds": None if r["age_seconds"] is None else round(r["age_seconds"], 1),
                    "running": r["running"], "failed": r["failed"], "starving": starving})
    return {"groups": out, "median_age_seconds": median,
            "truncated": sum(1 for r in rows if r["waiting"]) >= GROUPS_SCANNED}


def fair_groups(conn: psycopg.Connection, queue_name: str, *, top: int = 10, window: float = FAILED_WINDOW,
                failed_cap: int = FAILED_CAP) -> dict[str, Any]:
    """The top `top` groups of a fair queue by backlog (`group_rows`), with each one's oldest
    eligible age, running jobs and dead letters within `window` seconds, and the groups flagged
    as starving. Bounded: GROUPS_SCANNED groups, GROUP_COUNT_CAP jobs counted per group
    (`capped` says a count or age is a lower bound). Each group has its `weight` (1 unless set)."""
    found = group_rows(conn, [queue_name], window=window, failed_cap=failed_cap)[queue_name]
    out = found["groups"]
    weights = weights_of(conn, queue_name)
    for g in out:  # the NULL group has no row: weight 1
        g["weight"] = weights.get(g["group"], 1) if g["group"] is not None else 1
    median = found["median_age_seconds"]
    out.sort(key=lambda g: (-g["eligible"], -(g["age_seconds"] or 0), -g["failed"], g["group"] or ""))
    return {"groups": out[:top], "groups_seen": len(out), "groups_truncated": found["truncated"],
            "median_age_seconds": None if median is None else round(median, 1), "window_seconds": float(window),
            "starving": [g for g in sorted(out, key=lambda g: -(g["age_seconds"] or 0)) if g["starving"]][:top]}
