"""The price of a horizon holder or a lock blocker, and the admin's action that ends it.

A session that holds back vacuum's xmin horizon (a long transaction, one idle in transaction, an
old snapshot, a replication slot) or sits at the root of a lock-wait chain costs the queue
something from the moment it started. `price(conn, since)` says how much, from what the
collectors already stored (console.samples, sql/holders.sql):

- how long it has held (`since`: the transaction's start for a backend, the estimated start for a
  slot or a standby, whose hold has no start time of its own);
- the dead tuples accumulated in the queue's tables since: the newest `table_dead_tuples`
  sample at or before `since` (no older than `LOOKBACK_S` before it) against the latest one, per
  table; vacuum cannot remove a row that died after the holder's snapshot, so this is the bloat it
  caused (or, for a lock blocker, that piled up while it blocked);
- throughput (completed + failed jobs per second, from the workers' counters) and claim latency
  (workers' p95, else pg_stat_statements' mean, else the probe claim) averaged over `WINDOW_S`
  before `since` and over the same span up to now (never before `since`), each over at least
  `MIN_CYCLES` collection cycles: a rate is never judged on one interval. Where the history does
  not reach back, the figure is None with a note that says so ("not enough samples ...").

`end_backend(conn, pid, backend_start, mode, ...)` cancels (pg_cancel_backend: the running
query) or terminates (pg_terminate_backend: the session) one client backend of this database,
bound to its identity: the pid AND its backend_start, so a pid the operating system reused for a
new backend is refused (`BackendChanged`, HTTP 409). It refuses the console's own sessions (the
application names the collectors leave out, `CONSOLE_APPS`, this connection, and the pids the
face names as its own), replication (walsender) and other non-client backends (`BackendRefused`,
403), and a backend that is gone or of another database (`BackendGone`, 404). The checks are
repeated in the statement that sends the signal, so nothing changes between them. Every signal
sent is in the audit log (`backend_cancel` / `backend_terminate`) with the reason, the backend's
identity and its price when it was ended.

This module reads statistics views and stored samples and sends signals; it renders nothing and
decides no levels (the Database page does, with console.signals' threshold).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit
from console.actions import require_reason
from console.collectors.base import CONSOLE_APPS
from console.db import time_limited
from console.sqlfiles import query

WINDOW_S = 300.0  # throughput and claim latency: the mean over 5 min before it started, and since
MIN_CYCLES = 2  # a mean over fewer collection cycles is "not enough samples"
LOOKBACK_S = 900.0  # dead tuples: the sample before it started may be at most this much older
TIMEOUT_MS = 2000
END_WAIT_S = 3.0  # how long end_backend waits to see the signal's effect

# mode -> (audit action, named query in sql/holders.sql)
MODES: dict[str, tuple[str, str]] = {
    "cancel": ("backend_cancel", "cancel_backend"),
    "terminate": ("backend_terminate", "terminate_backend"),
}

THROUGHPUT_SELECTORS = [{"outcome": "completed"}, {"outcome": "failed"}]
# Claim latency, best source first (the overview's claim figure reads the same order).
LATENCY_SOURCES: tuple[tuple[str, dict[str, str]], ...] = (
    ("workers p95", {"source": "workers", "quantile": "p95"}),
    ("pg_stat_statements mean", {"source": "pg_stat_statements"}),
    ("probe claim", {"source": "probe", "queue": "all"}),
)


class BackendRefused(Exception):
    """The console will not end this backend (its own, replication, not a client): HTTP 403."""

    status = 403


class BackendGone(LookupError):
    """No such backend in this database any more: HTTP 404."""

    status = 404


class BackendChanged(Exception):
    """The pid now names another backend (or changed between the check and the signal): HTTP 409."""

    status = 409


# --- the price --------------------------------------------------------------------------------


def _rows(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("holders", name), params).fetchall()


def _values_at(conn, metric: str, at: datetime, lookback_s: float) -> dict[str, dict[str, Any]]:
    rows = _rows(conn, "values_at", {"metric": metric, "at": at, "lookback": lookback_s})
    return {r["labels"].get("table", ""): r for r in rows if r["value"] is not None}


def dead_tuples(conn, since: datetime, now: datetime, *, lookback_s: float = LOOKBACK_S) -> dict[str, Any]:
    """Dead tuples added to each watched table between the sample just before `since` and the
    latest one: {total, tables: [{table, before, now, added, before_at, now_at}], note}."""
    before = _values_at(conn, "table_dead_tuples", since, lookback_s)
    latest = _values_at(conn, "table_dead_tuples", now, lookback_s)  # older than that: the collectors are down
    tables = []
    for table, then in sorted(before.items()):
        last = latest.get(table)
        if last is None or last["collected_at"] <= since:
            continue
        tables.append({"table": table, "before": then["value"], "now": last["value"],
                       "added": last["value"] - then["value"],
                       "before_at": then["collected_at"], "now_at": last["collected_at"]})
    note = None
    if not tables:
        if not before:
            note = (f"not enough samples: no table_dead_tuples sample within {_span(lookback_s)} before it started "
                    "(is `skiplock scheduler` running, and for how long?)")
        else:
            note = (f"not enough samples: no table_dead_tuples sample since it started (within the last "
                    f"{_span(lookback_s)})")
    return {"total": sum(t["added"] for t in tables) if tables else None, "tables": tables, "note": note}


def _mean(conn, metric: str, selectors: list[dict[str, str]], agg: str, start: datetime, end: datetime) -> dict[str, Any]:
    (row,) = _rows(conn, "window_mean", {"metric": metric, "selectors": [Jsonb(s) for s in selectors], "agg": agg,
                                         "start": start, "end": end})
    return row


def _change(metric: str, selectors: list[dict[str, str]], agg: str, conn, since: datetime, now: datetime,
            window_s: float) -> dict[str, Any]:
    before = _mean(conn, metric, selectors, agg, since - timedelta(seconds=window_s), since)
    after = _mean(conn, metric, selectors, agg, max(since, now - timedelta(seconds=window_s)), now)
    out: dict[str, Any] = {"before": None, "now": None, "change": None, "note": None,
                           "cycles_before": before["cycles"], "cycles_now": after["cycles"]}
    if before["cycles"] < MIN_CYCLES:
        out["note"] = (f"not enough samples: {before['cycles']} collection cycle{'s' if before['cycles'] != 1 else ''} "
                       f"in the {_span(window_s)} before it started (the history does not reach back)")
    elif after["cycles"] < MIN_CYCLES:
        out["note"] = (f"not enough samples: {after['cycles']} collection cycle{'s' if after['cycles'] != 1 else ''} "
                       "since it started")
    if out["note"] is None:
        out["before"], out["now"] = before["mean"], after["mean"]
        out["change"] = (after["mean"] / before["mean"] - 1.0) if before["mean"] else None
    return out


def throughput_change(conn, since: datetime, now: datetime, *, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Jobs finished (completed + failed) per second: the mean over `window_s` before `since`
    against the mean since (the last `window_s` of it). `kept_up` is True when the rate fell
    while no job was waiting since (the eligible backlog under one job on average): the workers
    finished what arrived, so the fall is the arrivals', not a cost of the holder (a burst that
    ended as a holder began read as "-50 %" in the demo)."""
    out = _change("throughput", THROUGHPUT_SELECTORS, "sum", conn, since, now, window_s)
    (backlog,) = _rows(conn, "window_backlog", {"start": max(since, now - timedelta(seconds=window_s)), "end": now})
    out["backlog_now"] = backlog["mean"] if backlog["cycles"] >= MIN_CYCLES else None
    out["kept_up"] = bool(out["change"] is not None and out["change"] < 0
                          and out["backlog_now"] is not None and out["backlog_now"] < 1.0)
    return out


def claim_latency_change(conn, since: datetime, now: datetime, *, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Claim latency in seconds, before and since, from the first source (LATENCY_SOURCES) that
    has samples on both sides; else the note of the source that came closest."""
    tried = []
    for label, selector in LATENCY_SOURCES:
        found = _change("claim_latency_seconds", [selector], "max", conn, since, now, window_s)
        found["source"] = label
        if found["note"] is None:
            return found
        tried.append(found)
    return max(tried, key=lambda f: (f["cycles_before"] > 0) + (f["cycles_now"] > 0))  # the first of the closest


def price(conn, since: datetime | None, *, now: datetime | None = None, estimated: bool = False,
          window_s: float = WINDOW_S, lookback_s: float = LOOKBACK_S) -> dict[str, Any] | None:
    """What a holder or blocker that started at `since` has cost so far (module docstring);
    None without a start time."""
    if since is None:
        return None
    now = now or _db_now(conn)
    return {
        "since": since,
        "held_s": max((now - since).total_seconds(), 0.0),
        "estimated": estimated,
        "dead_tuples": dead_tuples(conn, since, now, lookback_s=lookback_s),
        "throughput": throughput_change(conn, since, now, window_s=window_s),
        "claim_latency": claim_latency_change(conn, since, now, window_s=window_s),
    }


def _db_now(conn) -> datetime:
    return conn.execute("SELECT statement_timestamp()").fetchone()[0]


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def backends(conn, pids: list[int], *, own_pids: list[int] | tuple[int, ...] = ()) -> dict[int, dict[str, Any]]:
    """{pid: identity and state} of these backends (sql/holders.sql backends), each with
    `endable` (None, or why the console refuses to end it)."""
    if not pids:
        return {}
    rows = _rows(conn, "backends", {"pids": sorted(set(pids)), "console_apps": list(CONSOLE_APPS)})
    out = {}
    for r in rows:
        r["refused"] = refusal(r, own_pids)
        out[r["pid"]] = r
    return out


def refusal(backend: dict[str, Any], own_pids: list[int] | tuple[int, ...] = ()) -> str | None:
    """Why the console will not end this backend, or None."""
    pid = backend["pid"]
    if backend["backend_type"] == "walsender":
        return (f"pid {pid} is a replication (walsender) session: ending it breaks a standby or a logical "
                "consumer; a slot's hold is ended by dropping the slot")
    if backend["backend_type"] != "client backend":
        return f"pid {pid} is a {backend['backend_type'] or 'server'} process, not a client session"
    if backend["is_me"] or pid in own_pids or backend["console_app"]:
        return (f"pid {pid} is the console's own session (application_name {backend['application_name']!r}); "
                "restart that process instead")
    return None


# --- ending a backend -------------------------------------------------------------------------


def parse_backend_start(value: object) -> datetime:
    """The backend_start that binds an action, from ISO 8601 with an offset; ValueError otherwise."""
    if isinstance(value, datetime):
        parsed = value
    else:
        text = str(value or "").strip()
        if not text or len(text) > 40:
            raise ValueError("backend_start: required, the backend's start time as the page or the API shows it "
                             "(ISO 8601 with its offset, e.g. 2026-12-03T09:10:08.123456+00:00)")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"backend_start: {text!r} is not an ISO 8601 time with its offset") from None
    if parsed.tzinfo is None:
        raise ValueError("backend_start: give the offset (e.g. +00:00), as the page and the API show it")
    return parsed


def parse_pid(value: object) -> int:
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise ValueError(f"pid: {text[:20]!r} is not a backend's process id")
    return int(text)


def end_backend(conn: psycopg.Connection, pid: int, backend_start: datetime, mode: str, *, actor: str,
                reason: str | None, own_pids: list[int] | tuple[int, ...] = (),
                timeout_ms: int = TIMEOUT_MS, wait_s: float = END_WAIT_S) -> dict[str, Any]:
    """Cancel or terminate backend `pid` if it is still the one started at `backend_start`
    (module docstring); audited. Returns {pid, backend_start, mode, signalled, ended, state,
    holds_horizon, message, audit_id, price}."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    action, statement = MODES[mode]
    reason = require_reason(action, reason)
    if not 0 < pid < 2**31:  # no backend has it (and int4 would overflow in the query)
        raise BackendGone(f"no backend with pid {pid}")
    own = [int(p) for p in own_pids]
    with time_limited(conn, timeout_ms):
        found = backends(conn, [pid], own_pids=own).get(pid)
        database = conn.info.dbname
        if found is None or not found["this_database"]:
            raise BackendGone(f"no backend with pid {pid} in database {database!r}: it has ended (reload the page)")
        if found["backend_start"] != backend_start:
            raise BackendChanged(
                f"pid {pid} is now another backend (started {found['backend_start'].isoformat()}, not "
                f"{backend_start.isoformat()}): the one you saw has ended and its pid was reused; refused")
        if found["refused"]:
            raise BackendRefused(f"refused: {found['refused']}")
        since = found["xact_start"] or found["backend_start"]
        cost = price(conn, since)
    try:
        with time_limited(conn, timeout_ms):
            rows = _rows(conn, statement, {"pid": pid, "backend_start": backend_start,
                                           "console_apps": list(CONSOLE_APPS), "own_pids": own})
    except psycopg.errors.InsufficientPrivilege:
        raise BackendRefused(f"refused by PostgreSQL: the console's database role may not signal pid {pid} (a "
                             "superuser's session, or another role's without pg_signal_backend)") from None
    if not rows:
        raise BackendChanged(f"pid {pid} changed between the check and the signal (it ended or became another "
                             "backend); nothing was sent")
    signalled = bool(rows[0]["signalled"])
    after = _settle(conn, pid, backend_start, mode, wait_s, timeout_ms)
    message = _outcome(pid, mode, signalled, after)
    selection = {"pid": pid, "backend_start": backend_start.isoformat(), "application_name": found["application_name"],
                 "usename": found["usename"], "state": found["state"]}
    detail = {"query": found["query"], "message": message, "ended": after is None,
              "price": jsonable(cost)}
    with conn.transaction():
        audit_id = audit.record(conn, actor=actor, action=action, target=f"pid {pid}", selection=selection,
                                reason=reason, rows=1 if signalled else 0, outcome="ok" if signalled else "error",
                                detail=detail)
    return {"pid": pid, "backend_start": backend_start, "mode": mode, "signalled": signalled,
            "ended": after is None, "state": after["state"] if after else None,
            "holds_horizon": bool(after and after["holds_horizon"]), "message": message,
            "audit_id": audit_id, "price": cost}


def _settle(conn, pid: int, backend_start: datetime, mode: str, wait_s: float, timeout_ms: int) -> dict[str, Any] | None:
    """The backend after the signal (None once it has gone), waiting up to `wait_s` for a
    terminated one to go or a cancelled one to leave its query."""
    deadline = time.monotonic() + wait_s
    while True:
        with time_limited(conn, timeout_ms):
            now = backends(conn, [pid]).get(pid)
        if now is not None and now["backend_start"] != backend_start:
            now = None  # gone, and the pid already reused
        settled = now is None or (mode == "cancel" and now["state"] != "active")
        if settled or time.monotonic() >= deadline:
            return now
        time.sleep(0.05)


def _outcome(pid: int, mode: str, signalled: bool, after: dict[str, Any] | None) -> str:
    if not signalled:
        return f"pid {pid}: PostgreSQL did not send the signal (the backend may have just ended)"
    if after is None:
        return f"pid {pid} {'terminated' if mode == 'terminate' else 'ended after the cancel'}: it no longer exists"
    if mode == "terminate":
        return f"pid {pid} was sent the terminate signal but is still there ({after['state']}); look again in a moment"
    if after["holds_horizon"]:
        return (f"pid {pid}'s query was cancelled but it still holds its transaction ({after['state']}): a cancel ends "
                "only a running query; terminate it to end the transaction")
    return f"pid {pid}'s query was cancelled; it is {after['state']} and holds back nothing now"


def jsonable(value: Any) -> Any:
    """`value` with its datetimes as ISO 8601 in UTC (for the audit log's detail and --json)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value
