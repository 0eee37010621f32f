"""Reading the jobs table for people: the filtered, keyset-paginated jobs browser, capped
counts, bounded exports, one job with its timeline, per-queue figures with a drain estimate,
the worker list, and the single-job actions an operator may take (each audited).

Every read is shaped to use an index of migration 001, so it stays cheap on a table of ten
million rows:
- state=pending is ordered like the claim (priority DESC, run_at, id): `jobs_claim_idx`;
  `eligible` (due now) narrows that scan to run_at <= now(): oldest first within a priority,
  the order workers claim them;
- state=running by lease expiry: `jobs_lease_idx`; `lease=expired` makes it the index range
  lease_until < now() (the stuck leases the reaper has not rescued yet);
- state=failed by failure time, newest first: `jobs_failed_idx` (the time range is on
  finished_at, an index range);
- completed or any state by id, newest first: the primary key. A time range here is turned
  into an id range by a binary search over the primary key (ids grow with created_at), so
  it is an index range too.
Queue, kind, error group and payload containment are filters on those scans; the caller runs
everything under a statement timeout, so a filter that matches almost nothing far back in a
huge table times out with a message instead of scanning on.

This module does not know about HTTP; it raises `InvalidFilter` (a ValueError) for bad input
and `JobStateConflict` when an action does not fit the job's state.

Why one module of about 600 lines: its callers (console/web/jobs.py and console/web/queues.py)
are being changed by other work right now, and a split would move every name they import. The
seams are the section headers (filters and pages; one job; queues; workers); split along them
when those pages settle.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from console import audit, jsonbounds
from console.actions import clean_reason
from console.caps import Caps, check_enqueues
from console.histogram import quantile
from console.queue import STATUSES, request_cancel
from console.sqlfiles import query
from console.timefmt import duration, parse_instant

STATES = STATUSES
MAX_PAGE = 500


class InvalidFilter(ValueError):
    """A filter value that cannot be used; the message names the field."""


class JobStateConflict(ValueError):
    """The action does not apply to the job in its current state (HTTP 409)."""


class JobNotFound(LookupError):
    pass


# --- filters ----------------------------------------------------------------------------------

def parse_time(text: str, field: str, *, now: datetime | None = None) -> datetime:
    """ISO 8601 (a date, or date and time; UTC when no offset is given) or a span back from
    now: '15m', '6h', '7d'. Absurd values (too far back, out of range) raise InvalidFilter
    naming the field (console.timefmt.parse_instant)."""
    return parse_instant(text, field, now=now, error=InvalidFilter)


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    queue: str | None = None
    kind: str | None = None
    fingerprint: str | None = None
    id: int | None = None
    payload: dict[str, Any] | None = None
    since: datetime | None = None
    until: datetime | None = None
    eligible: bool | None = None  # pending and due now (run_at <= now()): what a worker claims next
    lease: str | None = None  # "expired": running past the lease, not yet rescued by the reaper
    retrying: bool | None = None  # pending after a failed attempt, waiting for the next one (a retry storm's jobs)
    archived: bool | None = None  # the archive (skiplock.jobs_archive) instead of the jobs table

    FIELDS = ("state", "queue", "kind", "fingerprint", "id", "payload", "since", "until", "eligible", "lease",
              "retrying", "archived")

    @property
    def plan(self) -> str | None:
        """Which listing plan (_PLANS) serves this filter: the archive's, or the state's."""
        return "archived" if self.archived else self.state

    @classmethod
    def parse(cls, args: Mapping[str, str]) -> JobFilter:
        """From query-string arguments; empty values mean "any". Raises InvalidFilter."""

        def text(name: str, limit: int = 200) -> str | None:
            value = (args.get(name) or "").strip()
            if len(value) > limit:
                raise InvalidFilter(f"{name}: longer than {limit} characters")
            return value or None

        state = text("state")
        if state is not None and state not in STATES:
            raise InvalidFilter(f"state: {state!r} is not one of {', '.join(STATES)}")
        job_id = text("id")
        if job_id is not None:
            if not job_id.isdigit() or int(job_id) > 2**63 - 1:
                raise InvalidFilter(f"id: {job_id!r} is not a job id (a positive whole number)")
            job_id = int(job_id)
        payload = text("payload", 2000)
        if payload is not None:
            try:
                payload = jsonbounds.loads(payload, "payload")
            except jsonbounds.TooDeep as exc:
                raise InvalidFilter(str(exc)) from None
            except json.JSONDecodeError as exc:
                raise InvalidFilter(f"payload: not valid JSON ({exc.msg} at character {exc.pos + 1})") from None
            if not isinstance(payload, dict):
                raise InvalidFilter('payload: give a JSON object, e.g. {"customer": 42}; jobs whose payload contains it match')
        since = parse_time(args["since"], "since") if (args.get("since") or "").strip() else None
        until = parse_time(args["until"], "until") if (args.get("until") or "").strip() else None
        if since and until and since >= until:
            raise InvalidFilter("since must be before until")
        # eligible and lease=expired narrow one state's index (jobs_claim_idx, jobs_lease_idx):
        # they imply that state and refuse another.
        eligible = _flag(text("eligible"), "eligible")
        if eligible and text("lease") is not None:
            raise InvalidFilter("eligible and lease cannot be combined: eligible jobs are pending, leases belong to running jobs")
        if eligible:
            if state not in (None, "pending"):
                raise InvalidFilter(f"eligible: only pending jobs can be eligible (state is {state!r}); "
                                    "use state=pending or leave state empty")
            state = "pending"
        lease = text("lease")
        if lease is not None:
            if lease != "expired":
                raise InvalidFilter(f"lease: {lease!r} is not a lease filter (use lease=expired)")
            if state not in (None, "running"):
                raise InvalidFilter(f"lease: only running jobs hold a lease (state is {state!r}); "
                                    "use state=running or leave state empty")
            state = "running"
        retrying = _flag(text("retrying"), "retrying")
        if retrying:
            if state not in (None, "pending"):
                raise InvalidFilter(f"retrying: only pending jobs wait for a retry (state is {state!r}); "
                                    "use state=pending or leave state empty")
            state = "pending"
        # The archive holds finished jobs only (completed, or dead letters purged into it), and
        # is read by finish time (jobs_archive_finished_idx), newest first.
        archived = _flag(text("archived"), "archived")
        if archived and (state in ("pending", "running") or eligible or lease or retrying):
            raise InvalidFilter("archived: the archive holds finished jobs only (completed or failed); "
                                "leave state empty or choose completed or failed")
        return cls(state, text("queue"), text("kind"), text("fingerprint"), job_id, payload, since, until,
                   eligible or None, lease, retrying or None, archived or None)

    def as_args(self) -> dict[str, str]:
        """Back to query-string arguments (for links that keep the filter)."""
        out: dict[str, str] = {}
        for name in self.FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "payload":
                out[name] = json.dumps(value, separators=(",", ":"))
            elif value is True:
                out[name] = "1"
            elif isinstance(value, datetime):
                out[name] = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            else:
                out[name] = str(value)
        return out

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _flag(value: str | None, field: str) -> bool:
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise InvalidFilter(f"{field}: {value!r} is not 1 or 0")


@dataclass(frozen=True)
class _Plan:
    """How one state is listed: its predicate, order, keyset and which time column applies."""

    state_sql: str
    order: str
    keyset: str
    cursor_fields: tuple[str, ...]
    time_column: str
    table: str = "skiplock.jobs"


_PLANS: dict[str | None, _Plan] = {
    "pending": _Plan("j.status = 'pending'", "j.priority DESC, j.run_at, j.id",
                     "(%(c0)s::int IS NULL OR j.priority < %(c0)s OR (j.priority = %(c0)s AND (j.run_at, j.id) > (%(c1)s::timestamptz, %(c2)s::bigint)))",
                     ("priority", "run_at", "id"), "j.created_at"),
    "running": _Plan("j.status = 'running'", "j.lease_until, j.id",
                     "(%(c0)s::timestamptz IS NULL OR (j.lease_until, j.id) > (%(c0)s, %(c1)s::bigint))",
                     ("lease_until", "id"), "j.created_at"),
    "failed": _Plan("j.status = 'failed'", "j.finished_at DESC, j.id DESC",
                    "(%(c0)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(c0)s, %(c1)s::bigint))",
                    ("finished_at", "id"), "j.finished_at"),
    "completed": _Plan("j.status = 'completed'", "j.id DESC",
                       "(%(c0)s::bigint IS NULL OR j.id < %(c0)s)", ("id",), "j.created_at"),
    # The archive by finish time (jobs_archive_finished_idx); a state is a row filter there.
    "archived": _Plan("(%(state)s::text IS NULL OR j.status = %(state)s)", "j.finished_at DESC, j.id DESC",
                      "(%(c0)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(c0)s, %(c1)s::bigint))",
                      ("finished_at", "id"), "j.finished_at", "skiplock.jobs_archive"),
    None: _Plan("true", "j.id DESC", "(%(c0)s::bigint IS NULL OR j.id < %(c0)s)", ("id",), "j.created_at"),
}


def _time_condition(column: str) -> str:
    return (f"(%(since)s::timestamptz IS NULL OR {column} >= %(since)s) "
            f"AND (%(until)s::timestamptz IS NULL OR {column} < %(until)s)")


def _compose(name: str, plan: _Plan, *, first_page: bool = False) -> sql.Composed:
    """A listing query: the state's index window (from the cursor unless first_page) and the
    filters on its rows. Every fragment is a constant of this module, never user input."""
    indexed_time = plan.time_column == "j.finished_at"  # failed: the time range is an index range
    window = sql.SQL(query("browse", "jobs_window")).format(
        table=sql.SQL(plan.table),
        state=sql.SQL(plan.state_sql),
        keyset=sql.SQL("true" if first_page else plan.keyset),
        order=sql.SQL(plan.order),
        index_time=sql.SQL(_time_condition(plan.time_column) if indexed_time else "true"),
    )
    filters = sql.SQL(query("browse", "jobs_filters")).format(
        outer_time=sql.SQL("true" if indexed_time else _time_condition(plan.time_column)),
    )
    return sql.SQL(query("browse", name)).format(window=window, filters=filters, order=sql.SQL(plan.order))


def encode_cursor(row: Mapping[str, Any], plan_state: str | None) -> str:
    fields = _PLANS[plan_state].cursor_fields
    values = [row[f].isoformat() if isinstance(row[f], datetime) else row[f] for f in fields]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, plan_state: str | None) -> dict[str, Any]:
    fields = _PLANS[plan_state].cursor_fields
    params = {f"c{i}": None for i in range(3)}
    if not cursor:
        return params
    try:
        # A cursor is a flat list: anything nested is not one of ours (and is not parsed).
        raw = jsonbounds.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)), "after", 1)
        if not isinstance(raw, list) or len(raw) != len(fields):
            raise ValueError
        for i, (field, value) in enumerate(zip(fields, raw, strict=True)):
            if field in ("id", "priority"):
                if not isinstance(value, int):
                    raise ValueError
            else:
                value = datetime.fromisoformat(value)
            params[f"c{i}"] = value
    except (ValueError, TypeError, json.JSONDecodeError):
        raise InvalidFilter("after: not a page cursor from this listing (start again from the first page)") from None
    return params


def _id_at(conn: psycopg.Connection, when: datetime, lo: int, hi: int) -> int:
    """The smallest id whose created_at >= when, assuming ids grow with created_at (about 25
    probes of the primary key for ten million rows). hi + 1 when every job is older."""
    answer = hi + 1
    with conn.cursor(row_factory=dict_row) as cur:
        while lo <= hi:
            mid = (lo + hi) // 2
            row = cur.execute(query("browse", "first_id_from"), {"id": mid}, prepare=False).fetchone()
            if row is None:
                hi = mid - 1
            elif row["created_at"] >= when:
                answer = row["id"]
                hi = mid - 1
            else:
                lo = row["id"] + 1
    return answer


def _params(conn: psycopg.Connection, f: JobFilter) -> dict[str, Any]:
    params: dict[str, Any] = {
        "state": f.state, "queue": f.queue, "kind": f.kind, "fingerprint": f.fingerprint, "id": f.id,
        "payload": Jsonb(f.payload) if f.payload is not None else None,
        "since": f.since, "until": f.until, "min_id": None, "max_id": None,
        "eligible": bool(f.eligible), "expired": f.lease == "expired", "retrying": bool(f.retrying),
    }
    if not f.archived and _PLANS[f.state].time_column == "j.created_at" and f.state in (None, "completed") \
            and (f.since or f.until) and f.id is None:
        with conn.cursor(row_factory=dict_row) as cur:
            bounds = cur.execute(query("browse", "id_range")).fetchone()
        if bounds["lo"] is not None:
            if f.since:
                params["min_id"] = _id_at(conn, f.since, bounds["lo"], bounds["hi"])
            if f.until:
                params["max_id"] = _id_at(conn, f.until, bounds["lo"], bounds["hi"])
    return params


DEFAULT_WINDOW = 50_000


def has_row_filters(f: JobFilter) -> bool:
    """Filters with no index of their own: they are applied to a bounded window of rows."""
    return any(v is not None for v in (f.queue, f.kind, f.fingerprint, f.payload)) or (
        (f.since or f.until) is not None and f.state in ("pending", "running")) or (f.archived and f.state is not None)


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None
    filter: JobFilter
    searched: int | None = None  # a full window was searched and the page came back short


def _window_end(conn: psycopg.Connection, plan: _Plan, params: dict[str, Any], first_page: bool) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(_compose("jobs_window_end", plan, first_page=first_page), params, prepare=False).fetchone()


def list_jobs(conn: psycopg.Connection, f: JobFilter, *, after: str | None = None, limit: int = 50,
              window: int = DEFAULT_WINDOW) -> Page:
    """One page in the state's index order. Filters without an index look at most `window`
    jobs past the cursor; when they find fewer than a page there, `searched` says how many were
    looked at and `next_cursor` continues after them ("search further")."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidFilter(f"limit: must be between 1 and {MAX_PAGE}")
    plan = _PLANS[f.plan]
    window = max(window, limit + 1)
    params = {**_params(conn, f), **decode_cursor(after, f.plan), "limit": limit + 1, "window": window}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_compose("jobs_page", plan, first_page=after is None), params, prepare=False).fetchall()
    if len(rows) > limit:
        rows = rows[:limit]
        return Page(rows, encode_cursor(rows[-1], f.plan), f)
    if has_row_filters(f):
        end = _window_end(conn, plan, params, after is None)
        if end is not None:
            return Page(rows, encode_cursor(end, f.plan), f, searched=window)
    return Page(rows, None, f)


@dataclass
class Count:
    n: int
    capped: bool
    window: int | None = None  # the count covers only the newest/first `window` jobs of the state

    def label(self) -> str:
        text = f"{self.n:,}+" if self.capped else f"{self.n:,}"
        return f"{text} in the first {self.window:,} looked at" if self.window and not self.capped else text


def count_jobs(conn: psycopg.Connection, f: JobFilter, *, cap: int = 10_000, window: int = DEFAULT_WINDOW) -> Count:
    """How many jobs match, counting at most cap + 1 rows ('10,000+' beyond), among at most
    `window` jobs of the state's index when a filter has no index."""
    plan = _PLANS[f.plan]
    window = max(window, cap + 1)
    params = {**_params(conn, f), **decode_cursor(None, f.plan), "cap": cap + 1, "window": window}
    with conn.cursor(row_factory=dict_row) as cur:
        n = cur.execute(_compose("jobs_count", plan, first_page=True), params, prepare=False).fetchone()["n"]
    partial = n <= cap and has_row_filters(f) and _window_end(conn, plan, params, True) is not None
    return Count(min(n, cap), n > cap, window if partial else None)


def export_jobs(conn_factory, f: JobFilter, *, limit: int, batch: int = 1000, window: int = DEFAULT_WINDOW,
                max_scanned: int = 2_000_000) -> Iterator[dict[str, Any]]:
    """Rows of the filtered set in listing order, at most `limit`, fetched in keyset batches
    (each its own short statement, so no transaction stays open while the client reads).
    With filters that have no index, each batch looks at a window of `window` jobs and the
    export stops after `max_scanned` jobs were looked at. `conn_factory()` returns a context
    manager giving a time-limited connection."""
    plan = _PLANS[f.plan]
    sent = 0
    scanned = 0
    cursor: dict[str, Any] = decode_cursor(None, f.plan)
    first = True
    base: dict[str, Any] | None = None
    row_filters = has_row_filters(f)
    window = max(window, batch + 1)
    while sent < limit:
        take = min(batch, limit - sent)
        with conn_factory() as conn:
            if base is None:
                base = _params(conn, f)
            params = {**base, **cursor, "limit": take, "window": window}
            with conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(_compose("jobs_export", plan, first_page=first), params, prepare=False).fetchall()
            end = None
            if len(rows) < take and row_filters:
                end = _window_end(conn, plan, params, first)
        yield from rows
        sent += len(rows)
        if len(rows) == take:
            last = rows[-1]
        elif end is not None and scanned + window < max_scanned:
            last = end
            scanned += window
        else:
            return
        first = False
        cursor = {f"c{i}": last[field] for i, field in enumerate(plan.cursor_fields)}
        cursor.update({f"c{i}": None for i in range(len(plan.cursor_fields), 3)})


# --- one job ----------------------------------------------------------------------------------

def get_job(conn: psycopg.Connection, job_id: int, *, archive: bool = True) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("browse", "get_job"), {"id": job_id}).fetchone()
    if row is None and archive:
        from console.maintenance import archived_job

        found = archived_job(conn, job_id)
        row = {**found, "archived": True} if found else None
    return row


SEARCH_WINDOW = 50_000  # newest jobs (and latest archived ones) a payload search looks at


def payload_values(text: str) -> list[Any]:
    """What a searched text may be in a payload: the string itself, and the number it spells."""
    values: list[Any] = [text]
    try:
        number = json.loads(text)
    except ValueError:
        return values
    if isinstance(number, int | float) and not isinstance(number, bool) and number == number:
        values.append(number)
    return values


def search_payload(conn: psycopg.Connection, text: str, *, window: int = SEARCH_WINDOW,
                   limit: int = 20) -> list[dict[str, Any]]:
    """Jobs (and archived jobs, `archived` true) whose payload holds `text` as a value at any
    depth, among the newest `window` of each (sql/browse.sql `search_payload`), newest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("browse", "search_payload"), {
            "values": Jsonb(payload_values(text)), "window": window, "limit": limit}).fetchall()


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality as jsonpath's `==` has it: 42 == 42.0, but "42" != 42 and true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def containing(payload: Any, values: list[Any]) -> Any:
    """The smallest JSON value that `payload` contains (`@>`) and that holds one of `values`: the
    path to the first match, as the jobs filter's `payload` takes it ({"customer": {"id": 4411}}).
    None when no value is there (a redacted payload no longer shows it)."""
    def walk(node: Any) -> tuple[bool, Any]:
        if isinstance(node, dict):
            for key, child in node.items():
                found, shape = walk(child)
                if found:
                    return True, {key: shape}
        elif isinstance(node, list):
            for child in node:
                found, shape = walk(child)
                if found:
                    return True, [shape]
        elif any(_same_json(node, v) for v in values):
            return True, node
        return False, None

    found, shape = walk(payload)
    return shape if found and isinstance(shape, dict) else None


def job_actions_audit(conn: psycopg.Connection, job_id: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("browse", "job_audit"), {"target": f"job:{job_id}", "id": job_id}).fetchall()


def parse_entry_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def timeline(job: Mapping[str, Any], actions: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Events of a job, oldest first: enqueued, each failed attempt, the current claim,
    operator actions (replay, cancel, ...), and how it finished."""
    events: list[dict[str, Any]] = [{"at": job["created_at"], "event": "enqueued", "detail": f"queue {job['queue']}", "tone": ""}]
    for entry in job.get("errors") or []:
        events.append({
            "at": parse_entry_time(entry.get("at")),
            "event": f"attempt {entry.get('attempt')} failed" if entry.get("error_class") != "Cancelled" else "cancelled",
            "detail": f"{entry.get('error_class')}: {entry.get('message')}" + (f" (worker {entry['worker']})" if entry.get("worker") else ""),
            "tone": "bad",
        })
    for action in actions:
        events.append({"at": action["at"], "event": action["action"], "detail": f"by {action['actor']}" + (f": {action['reason']}" if action.get("reason") else ""), "tone": ""})
    if job["status"] == "running" and job.get("locked_at"):
        events.append({"at": job["locked_at"], "event": f"claimed (attempt {job['attempts']})", "detail": f"by {job['locked_by']}, lease until {job['lease_until']:%H:%M:%S} UTC" if job.get("lease_until") else f"by {job['locked_by']}", "tone": ""})
    if job["status"] == "pending" and job["run_at"] and job["run_at"] > datetime.now(UTC):
        events.append({"at": job["run_at"], "event": "due", "detail": "waiting for its backoff or schedule", "tone": ""})
    if job["status"] == "completed" and job.get("finished_at"):
        events.append({"at": job["finished_at"], "event": "completed", "detail": f"after {job['attempts']} attempt(s)", "tone": "good"})
    if job["status"] == "failed" and job.get("finished_at"):
        events.append({"at": job["finished_at"], "event": "dead letter", "detail": f"after {job['attempts']} of {job['max_attempts']} attempts", "tone": "bad"})
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(events, key=lambda e: e["at"] or epoch)


ACTIONS = {
    # action: (states it applies to, what it does)
    "replay": (("failed",), "Back to pending with fresh attempts (error history kept)."),
    "run_now": (("pending",), "Make a job waiting for its backoff or schedule eligible now."),
    "cancel": (("pending",), "Move a pending job to the dead letters (it can be replayed)."),
    "request_cancel": (("running",), "Ask the worker to stop this run: the handler sees job.cancel_requested() "
                                     "at its next heartbeat; the job is not retried after it."),
    "purge": (("failed",), "Delete a dead letter for good (recorded in the audit log)."),
}


def cancel_requested(job: Mapping[str, Any]) -> bool:
    """Whether an operator asked the job's current run to stop (the worker's test, too)."""
    at, locked = job.get("cancel_requested_at"), job.get("locked_at")
    return job.get("status") == "running" and at is not None and locked is not None and at >= locked


def allowed_actions(job: Mapping[str, Any]) -> list[str]:
    if job.get("archived"):
        return []
    out = [name for name, (states, _) in ACTIONS.items() if job["status"] in states]
    if job["status"] == "pending" and not (job["run_at"] and job["run_at"] > datetime.now(UTC)):
        out.remove("run_now")
    if cancel_requested(job):
        out.remove("request_cancel")  # asked already: the page says since when
    return out


def act_on_job(conn: psycopg.Connection, job_id: int, action: str, *, actor: str, reason: str | None = None,
               dsn: str | None = None) -> dict[str, Any]:
    """Apply one action to one job, audited.

    replay and purge go through console.maintenance's bulk operation (the same function the
    dead-letters page, the CLI and the API use; it needs `dsn` for its own connection);
    run_now, cancel and request_cancel are single statements here, with the audit row in the
    same transaction.
    Raises JobNotFound, or JobStateConflict when the job's state does not allow the action
    (including when it changed since the page was drawn)."""
    if action not in ACTIONS:
        raise InvalidFilter(f"action: {action!r} is not one of {', '.join(ACTIONS)}")
    reason = clean_reason(reason)  # console.actions' rule, for callers from Python too
    if action in ("replay", "purge"):
        from console.maintenance import bulk
        from console.maintenance.errors import NothingMatches

        current = get_job(conn, job_id, archive=False)
        if current is None:
            raise JobNotFound(f"job {job_id} is not in the jobs table")
        if current["status"] != "failed":
            raise JobStateConflict(f"job {job_id} is {current['status']}: {action} applies only to failed jobs")
        try:
            run = bulk.replay if action == "replay" else bulk.purge
            result = run(dsn, {"ids": [job_id]}, actor=actor, reason=reason)
        except NothingMatches:
            raise JobStateConflict(f"job {job_id} is no longer a dead letter") from None
        if result.get("state") != "done" or not result.get("done"):
            raise JobStateConflict(f"{action} of job {job_id} did not complete ({result.get('state')}: {result.get('error') or 'no rows'})")
        return {"id": job_id, "queue": current["queue"], "operation": result.get("id")}
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if action == "cancel":
            message = f"cancelled by {actor}" + (f": {reason}" if reason else "")
            row = cur.execute(query("browse", "cancel_job"), {"id": job_id, "message": message}).fetchone()
        elif action == "request_cancel":
            row = request_cancel(conn, job_id)
        else:
            row = cur.execute(query("browse", "run_now"), {"id": job_id}).fetchone()
        if row is None:
            current = cur.execute(query("browse", "get_job"), {"id": job_id}).fetchone()
            if current is None:
                raise JobNotFound(f"job {job_id} is not in the jobs table")
            states = " or ".join(ACTIONS[action][0])
            raise JobStateConflict(f"job {job_id} is {current['status']}: {action} applies only to {states} jobs"
                                   + (" due later" if action == "run_now" else ""))
        detail = {"queue": row["queue"]}
        if action == "request_cancel":
            detail.update(worker=row["locked_by"], attempt=row["attempts"])
        audit.record(conn, actor=actor, action=action, target=f"job:{job_id}", reason=reason, rows=1,
                     selection={"ids": [job_id]}, detail=detail)
    return dict(row)


# --- enqueue from the console -----------------------------------------------------------------

ENQUEUE_FIELDS = ("kind", "queue", "payload", "priority", "run_at", "idempotency_key", "max_attempts",
                  "unique_for", "reason")
MAX_NAME = 200
MAX_KEY = 500
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_ATTEMPTS_LIMIT = 1000


def _text(fields: Mapping[str, Any], name: str, *, limit: int, required: bool = False) -> str | None:
    value = fields.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise InvalidFilter(f"{name}: is required")
        return None
    if not isinstance(value, str):
        raise InvalidFilter(f"{name}: must be a string")
    value = value.strip()
    if len(value) > limit:
        raise InvalidFilter(f"{name}: at most {limit} characters")
    return value


def _whole(fields: Mapping[str, Any], name: str, *, low: int, high: int) -> int | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFilter(f"{name}: must be a whole number between {low} and {high}")
    if not low <= value <= high:
        raise InvalidFilter(f"{name}: must be between {low} and {high}")
    return value


def _reason(value: Any) -> str:
    """The enqueue's reason, required, by console.actions' rule (InvalidFilter names it)."""
    if value is not None and not isinstance(value, str):
        raise InvalidFilter("reason: must be a string")
    try:
        reason = clean_reason(value)
    except ValueError as exc:
        raise InvalidFilter(str(exc)) from None
    if reason is None:
        raise InvalidFilter("reason: is required (it goes in the audit log); say why, e.g. 'INC-1042: re-send the invoice'")
    return reason


def parse_enqueue(fields: Mapping[str, Any], *, payload_is_text: bool = False) -> dict[str, Any]:
    """The console's enqueue fields, checked; InvalidFilter (a ValueError) names the field.

    From a form every value is text and `payload` is JSON text; from the JSON API `payload` is
    the JSON value itself (a string there is a string payload)."""
    unknown = sorted(set(fields) - set(ENQUEUE_FIELDS))
    if unknown:
        raise InvalidFilter(f"{unknown[0]}: unknown field (fields: {', '.join(ENQUEUE_FIELDS)})")
    payload = fields.get("payload")
    if payload_is_text:
        text = "" if payload is None else payload.strip() if isinstance(payload, str) else payload
        if not isinstance(text, str):
            raise InvalidFilter("payload: must be JSON text")
        try:
            payload = jsonbounds.loads(text, "payload") if text else {}
        except jsonbounds.TooDeep as exc:
            raise InvalidFilter(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise InvalidFilter(f"payload: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    elif payload is None:
        payload = {}
    if jsonbounds.depth_of(payload, stop_after=jsonbounds.MAX_DEPTH) > jsonbounds.MAX_DEPTH:
        raise InvalidFilter(f"payload: JSON nested deeper than {jsonbounds.MAX_DEPTH} levels "
                            "(arrays and objects count one level each)")
    try:
        text = json.dumps(payload, allow_nan=False)
    except ValueError:
        raise InvalidFilter("payload: NaN and Infinity are not JSON") from None
    size = len(text)
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidFilter(f"payload: larger than {MAX_PAYLOAD_BYTES // 1024} KiB")
    run_at = fields.get("run_at")
    if run_at is not None and run_at != "":
        if not isinstance(run_at, str):
            raise InvalidFilter("run_at: must be an ISO 8601 date-time string")
        run_at = parse_instant(run_at, "run_at", relative=False, error=InvalidFilter)
    else:
        run_at = None
    unique_for = _whole(fields, "unique_for", low=1, high=366 * 86400)
    out = {
        "kind": _text(fields, "kind", limit=MAX_NAME, required=True),
        "queue": _text(fields, "queue", limit=MAX_NAME) or "default",
        "payload": payload,
        "priority": _whole(fields, "priority", low=-32768, high=32767) or 0,
        "run_at": run_at,
        "idempotency_key": _text(fields, "idempotency_key", limit=MAX_KEY),
        "max_attempts": _whole(fields, "max_attempts", low=1, high=MAX_ATTEMPTS_LIMIT),
        "unique_for": unique_for,
        "reason": _reason(fields.get("reason")),
    }
    if unique_for is not None and out["idempotency_key"] is None:
        raise InvalidFilter("idempotency_key: is required with unique_for (the window is per kind and key)")
    return out


def enqueue_job(conn: psycopg.Connection, fields: Mapping[str, Any], *, actor: str, default_max_attempts: int,
                payload_is_text: bool = False, per_minute: int = Caps().enqueue_per_minute) -> dict[str, Any]:
    """Enqueue one job for an operator, audited in the same transaction (action `enqueue`, with
    the reason). Returns {id, created, queue, kind}: `created` is false when an idempotency key
    or a uniqueness window answered with an existing job (the audit row says so too).
    CapReached when `actor` enqueued `per_minute` jobs in the last minute (caps.enqueue_per_minute)."""
    from console import queue as q

    job = parse_enqueue(fields, payload_is_text=payload_is_text)
    reason = job.pop("reason")
    window = job.pop("unique_for")
    with conn.transaction():
        check_enqueues(conn, actor, per_minute)
        job_id = q.enqueue(conn, job["kind"], job["payload"], queue=job["queue"],
                           priority=job["priority"], run_at=job["run_at"], idempotency_key=job["idempotency_key"],
                           max_attempts=job["max_attempts"] or default_max_attempts,
                           unique_for=timedelta(seconds=window) if window else None)
        created = conn.execute(query("browse", "created_here"), {"id": job_id}).fetchone()[0]
        audit.record(conn, actor=actor, action="enqueue", target=f"job:{job_id}", reason=reason,
                     rows=1 if created else 0, selection={"ids": [job_id]},
                     detail={"queue": job["queue"], "kind": job["kind"], "priority": job["priority"],
                             "idempotency_key": job["idempotency_key"], "unique_for": window, "created": created})
    return {"id": job_id, "created": created, "queue": job["queue"], "kind": job["kind"]}


# --- queues -----------------------------------------------------------------------------------

# The queue figures walk the partial indexes (sql/browse.sql) and stop at these
# caps, so a ten-million-row table costs what a small one does; beyond a cap a figure is a
# lower bound and is flagged (shown as "100,000+").
PENDING_CAP = 50_000
FAILED_CAP = 10_000


def queue_figures(conn: psycopg.Connection, *, pending_cap: int = PENDING_CAP, failed_cap: int = FAILED_CAP) -> list[dict[str, Any]]:
    """Per queue: eligible, scheduled, running, stuck, failed, oldest eligible, paused, the
    backend that serves its new jobs, and which figures are lower bounds (`pending_capped`,
    `failed_capped`). PostgreSQL's figures only: a broker queue's come from the samples
    (console.collectors.broker.broker_figures)."""
    with conn.cursor(row_factory=dict_row) as cur:
        pending_rows = cur.execute(query("browse", "pending_by_queue"), {"cap": pending_cap}).fetchall()
        running = {r["queue"]: r for r in cur.execute(query("browse", "running_by_queue"), {"cap": pending_cap}).fetchall()}
        failed = {r["queue"]: r for r in cur.execute(query("browse", "failed_by_queue"), {"cap": failed_cap}).fetchall()}
        flags = {r["queue"]: r for r in cur.execute(query("browse", "queue_flags")).fetchall()}
    pending = {r["queue"]: r for r in pending_rows}
    pending_capped = sum(r["eligible"] + r["scheduled"] for r in pending_rows) >= pending_cap
    failed_capped = sum(r["failed"] for r in failed.values()) >= failed_cap
    now = datetime.now(UTC)
    out = []
    for name in sorted(set(pending) | set(running) | set(failed) | set(flags)):
        p, r, f, fl = pending.get(name, {}), running.get(name, {}), failed.get(name, {}), flags.get(name, {})
        age = p.get("oldest_eligible_s")
        out.append({
            "queue": name,
            "eligible": p.get("eligible", 0),
            "scheduled": p.get("scheduled", 0),
            "running": r.get("running", 0),
            "stuck": r.get("stuck", 0),
            "failed": f.get("failed", 0),
            "oldest_eligible": now - timedelta(seconds=age) if age is not None else None,
            "age_seconds": float(age) if age is not None else 0.0,
            "paused": bool(fl.get("paused")),
            "paused_at": fl.get("paused_at"),
            "paused_by": fl.get("paused_by"),
            "backend": fl.get("backend") or "postgres",
            "pending_capped": pending_capped,
            "failed_capped": failed_capped,
        })
    return out


def queue_names(conn: psycopg.Connection, *, pending_cap: int = PENDING_CAP, failed_cap: int = FAILED_CAP) -> set[str]:
    """The names of the queues queue_figures lists, read without their figures (search): the
    statement `skiplock pause` checks a name with, under the figures' own caps."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return {r[0] for r in cur.execute(query("maintenance", "known_queues"), {"cap": pending_cap, "failed_cap": failed_cap})}


@dataclass
class Drain:
    state: str            # empty | clearing | growing | steady | unknown
    text: str
    seconds: float | None = None
    net_per_second: float | None = None


def drain_estimate(points: list[tuple[datetime, float]], *, min_span: float = 60.0) -> Drain:
    """From (time, backlog) samples, oldest first: when the backlog clears at the current net
    rate, or that it is growing. Needs samples at least `min_span` seconds apart."""
    points = [(t, v) for t, v in points if v is not None]
    if not points:
        return Drain("unknown", "no samples yet (the collectors have not run)")
    last_t, last_v = points[-1]
    if last_v <= 0:
        return Drain("empty", "nothing waiting", 0.0, None)
    first_t, first_v = points[0]
    span = (last_t - first_t).total_seconds()
    if span < min_span:
        return Drain("unknown", "not enough samples yet for a trend")
    net = (last_v - first_v) / span
    if net < 0:
        seconds = last_v / -net
        return Drain("clearing", f"clears in about {duration(seconds)} at the current net rate", seconds, net)
    if net > 0:
        return Drain("growing", f"growing by {net * 60:,.1f} jobs/min", None, net)
    return Drain("steady", "not shrinking (no net progress)", None, 0.0)


# How long skiplock.samples_backlog (migration 035) keeps each queue's backlog: a window up to
# this long is read from it, a longer one from the samples.
BACKLOG_KEPT = timedelta(minutes=30)


def backlog_points(conn: psycopg.Connection, window: timedelta = timedelta(minutes=15), *,
                   queues: list[str] | None = None) -> dict[str, list[tuple[datetime, float]]]:
    """Eligible-backlog samples per queue (the collectors' queue_depth{state=eligible}), oldest
    first, in one query; a queue with jobs on both backends (a move's dual run) has their sum at
    each time, and a sample not measured (NULL) is no point. `queues`: only these (the rows a page
    shows; a queue with no samples in the window is absent). Read from the per-cycle backlog of
    each queue that migration 035 keeps, not from every queue's samples of the window (1.5
    million rows at 5,000 queues)."""
    since = datetime.now(UTC) - window
    if window <= BACKLOG_KEPT:
        with conn.cursor(row_factory=tuple_row) as cur:
            if queues is not None:
                rows = cur.execute(query("browse", "backlog_points_of"), {"queues": list(queues), "since": since}).fetchall()
            else:
                rows = cur.execute(query("browse", "backlog_points_all"), {"since": since}).fetchall()
        out: dict[str, list[tuple[datetime, float]]] = {}
        for queue, at, value in rows:
            out.setdefault(queue, []).append((at, value))
        return out
    from console import samples

    wanted = None if queues is None else set(queues)
    summed: dict[str, dict[datetime, float]] = {}
    for r in samples.series(conn, "queue_depth", since=since, labels={"state": "eligible"}):
        if "external" in r["labels"] or "queue" not in r["labels"]:
            continue  # an [[external_queues]] series, not one of Skiplock's queues
        if wanted is not None and r["labels"]["queue"] not in wanted:
            continue
        if r["value"] is not None:  # "not measured" is no point (drain_estimate skips them too)
            points = summed.setdefault(r["labels"]["queue"], {})
            points[r["at"]] = points.get(r["at"], 0.0) + r["value"]
    return {queue: sorted(points.items(), key=lambda p: p[0]) for queue, points in summed.items()}


# --- workers ----------------------------------------------------------------------------------

RECENT_SECONDS = 60.0  # "recent" throughput: over about the last minute
RECENT_MIN_SECONDS = 5.0  # a shorter window says too little (the collector ran only just now)


def recent_throughput(row: dict[str, Any], marks: list[list[float]] | None) -> tuple[float | None, float | None]:
    """(jobs finished per minute, over how many seconds) for one worker, from the live row's
    counters and the collector's marks of it: the newest mark at least a minute old, else the
    oldest one if it is at least RECENT_MIN_SECONDS old. (None, None) without such a mark."""
    now = float(row["now_epoch"])
    usable = [m for m in marks or [] if now - m[0] >= RECENT_MIN_SECONDS]
    if not usable:
        return None, None
    old_enough = [m for m in usable if now - m[0] >= RECENT_SECONDS]
    mark = old_enough[-1] if old_enough else usable[0]
    finished = row["completed"] + row["failed"]
    then = mark[1] + mark[2]
    delta = finished - then if finished >= then else finished  # counters went down: restarted under this id
    window = now - mark[0]
    return round(delta * 60.0 / window, 2), round(window, 1)


def workers(conn: psycopg.Connection, *, stale_after: float = 30.0) -> list[dict[str, Any]]:
    """Registered workers (live, and those stopped within the hour), newest first, with
    lost work (`lost_total`: lost claims plus jobs the reaper rescued from it), in-flight jobs
    only for a live worker (`reported_in_flight` is its last report), recent throughput (jobs finished per minute over about the last minute, from the workers
    collector's counter marks: `recent_per_minute`, None while there is no mark old enough),
    the lifetime average (`throughput`, jobs/s), claim latency quantiles and a stale flag."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("browse", "workers")).fetchall()
        found = cur.execute(query("browse", "worker_history")).fetchone()
    history = (found or {}).get("history") or {}
    for row in rows:
        uptime = max(float(row["uptime_seconds"] or 0), 1.0)
        row["throughput"] = (row["completed"] + row["failed"]) / uptime
        row["recent_per_minute"], row["recent_window_s"] = (
            (None, None) if row["stopped_at"] is not None else recent_throughput(row, history.get(row["id"])))
        row.pop("now_epoch", None)
        row["claim_p50"] = quantile(row["claim_histogram"] or [], 0.5)
        row["claim_p99"] = quantile(row["claim_histogram"] or [], 0.99)
        row["claim_mean"] = row["claim_seconds_sum"] / row["claim_calls"] if row["claim_calls"] else None
        row["stopped"] = row["stopped_at"] is not None
        row["stale"] = not row["stopped"] and float(row["seen_seconds_ago"]) > stale_after
        # Lost work: jobs whose claim it lost (counted by the worker) and jobs the reaper rescued
        # from it after its lease expired (a SIGKILLed worker cannot count those itself).
        row["lost_total"] = row["lost"] + row["reaped"]
        # In flight is what a live worker says it holds; a stale or stopped one holds nothing it
        # could finish: its last report would otherwise read "in flight 2" for an hour.
        row["reported_in_flight"] = row["in_flight"]
        if row["stale"] or row["stopped"]:
            row["in_flight"] = 0
        for key in ("claim_histogram", "pickup_histogram"):
            row.pop(key, None)
    return rows


# The running jobs a listing holds at most: a page that counts them knows the list is whole
# when it holds fewer.
RUNNING_SHOWN = 500


def running_jobs(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("browse", "running_jobs_of"), {"limit": RUNNING_SHOWN}).fetchall()


__all__ = [
    "ACTIONS", "Count", "Drain", "InvalidFilter", "JobFilter", "JobNotFound", "JobStateConflict", "Page",
    "RUNNING_SHOWN", "act_on_job", "allowed_actions", "backlog_points", "count_jobs", "drain_estimate", "export_jobs",
    "get_job", "job_actions_audit", "list_jobs", "queue_figures", "running_jobs", "timeline", "workers",
]
