"""Database-wide health: who holds the xmin horizon, lock waits and the blocking tree, LWLock
and SLRU waits, SLRU counters and MultiXact consumption, WAL rate and replica lag, connections
and the NOTIFY queue. Several small collectors, so one that fails leaves the others running.

The console's own sessions (application names in `Options.exclude_apps`, by default
skiplock-collector/-scheduler/-web/-console, and the collector's own pid) are left out;
workers (skiplock-worker*) are part of the queue and are reported.

Identities (pid, application name, state, query head) are not numbers, so they go in the
cycle's details (`skiplock.collection_runs.details`, read with
`console.collectors.latest_details()`), next to the samples: `xmin_holders`, `blocking_tree`,
`lock_waiters`, `wait_events`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from typing import Any

from psycopg import sql

from console.collectors.base import Context, rate
from console.samples import Sample
from console.sqlfiles import query

HOLDER_KINDS = ("transaction", "idle_in_transaction", "replication_slot", "prepared_transaction", "standby")
XID_RING = 400  # (time, next_xid) pairs kept to turn a slot's XID age into seconds
MEMBERS_PER_PAGE = 1636  # MultiXact members per 8 kB SLRU page (multixact.c); an estimate

# pg_stat_slru names: CamelCase on 13-16, snake_case on 17+. One vocabulary: 17's.
_SLRU_NAMES = {
    "committs": "commit_timestamp", "committimestamp": "commit_timestamp",
    "multixactmember": "multixact_member", "multixactoffset": "multixact_offset",
    "notify": "notify", "serial": "serializable", "serializable": "serializable",
    "subtrans": "subtransaction", "subtransaction": "subtransaction",
    "xact": "transaction", "transaction": "transaction", "other": "other",
}


def slru_name(name: str) -> str:
    key = re.sub(r"[^a-z]", "", name.lower())
    return _SLRU_NAMES.get(key, key)


def is_slru_wait(event: str) -> bool:
    """A wait on an SLRU, in any version's names: the LWLocks `<Name>SLRU` and `<Name>Buffer`,
    and the I/O events, `SLRURead`, `SLRUWrite`, ... on 13-16 and `SlruRead`, `SlruWrite`, ...
    on 17+ (the wait event names were regenerated in 17)."""
    return "slru" in event.lower() or event.endswith("Buffer")


def _apps(ctx: Context) -> dict[str, Any]:
    return {"exclude_apps": list(ctx.options.exclude_apps)}


# --- the xmin horizon -------------------------------------------------------------------

def _seconds_for_xid_age(ring: list[list[float]], next_xid: float, xid_age: float, now: float) -> float | None:
    """When did the XID counter pass the holder's XID? Interpolated from stored (time, next_xid)."""
    if not ring:
        return None
    position = next_xid - xid_age
    xids = [x for _, x in ring]
    index = bisect.bisect_left(xids, position)
    if index >= len(ring):
        return 0.0
    return max(now - ring[index][0], 0.0)


def collect_horizon(ctx: Context) -> Iterable[Sample]:
    holders = ctx.rows("collectors_database", "horizon_holders", _apps(ctx))
    position = ctx.rows("collectors_database", "xid_position")[0]
    now = ctx.now.timestamp()
    ring = [pair for pair in ctx.previous.get("xid_ring", []) if pair[1] <= position["next_xid"]]
    for h in holders:
        if h["age_s"] is None and h["xid_age"] is not None:
            h["age_s"] = _seconds_for_xid_age(ring, position["next_xid"], h["xid_age"], now)
            h["age_estimated"] = True
    ring = (ring + [[now, position["next_xid"]]])[-XID_RING:]
    previous_position = ctx.previous.get("position", {})
    ctx.remember({"xid_ring": ring, "position": position})
    ctx.detail("xmin_holders", [
        {k: h.get(k) for k in ("kind", "id", "pid", "application_name", "state", "detail", "xmin", "xid_age", "age_s", "age_estimated")}
        for h in holders
    ])

    out: list[Sample] = []
    for kind in (*HOLDER_KINDS, "any"):
        mine = [h for h in holders if kind == "any" or h["kind"] == kind]
        out.append(Sample("xmin_horizon_age_seconds", {"holder": kind}, max((h["age_s"] or 0.0 for h in mine), default=0.0)))
        out.append(Sample("xmin_horizon_age_xids", {"holder": kind}, max((h["xid_age"] or 0.0 for h in mine), default=0.0)))

    interval = ctx.interval
    out.append(Sample("database_xid_age", {}, position["db_xid_age"]))
    out.append(Sample("database_mxid_age", {}, position["db_mxid_age"]))
    out.append(Sample("xid_consumption_per_second", {}, rate(position["next_xid"], previous_position.get("next_xid"), interval)))
    mx_rate = None
    if interval and previous_position.get("next_mxid") is not None:
        mx_rate = ((position["next_mxid"] - previous_position["next_mxid"]) % 4294967296) / interval
    out.append(Sample("multixact_consumption_per_second", {}, mx_rate))
    return out


# --- lock waits and the blocking tree ------------------------------------------------------

def _relation_labels(ctx: Context, relids: set[int]) -> dict[int, str]:
    if not relids:
        return {}
    names = {r["relid"]: r["name"] for r in ctx.rows("collectors_database", "relation_names", {"relids": sorted(relids)})}
    labels: dict[int, str] = {}
    watched = {name: label for label, name in ctx.options.tables}
    for relid, name in names.items():
        labels[relid] = watched.get(name, name)
    # Leaf partitions of a watched table carry the watched table's label.
    leaves = ctx.rows("collectors_tables", "watched_relations",
                      {"labels": [lbl for lbl, _ in ctx.options.tables], "names": [n for _, n in ctx.options.tables]})
    for leaf in leaves:
        if leaf["relid"] in relids:
            labels[leaf["relid"]] = leaf["label"]
    return labels


def _tree(waiters: list[dict[str, Any]], sessions: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Roots (blockers that wait for nothing) with the sessions they block, depth-first."""
    blocked_by = {w["pid"]: list(w["blocked_by"] or []) for w in waiters}
    children: dict[int, list[int]] = {}
    for pid, blockers in blocked_by.items():
        for b in blockers:
            children.setdefault(b, []).append(pid)
    roots = sorted({b for bs in blocked_by.values() for b in bs if b not in blocked_by})
    if not roots and blocked_by:  # a cycle (a deadlock about to be detected): start anywhere
        roots = [min(blocked_by)]
    waiter_info = {w["pid"]: w for w in waiters}

    def node(pid: int, depth: int, path: tuple[int, ...]) -> dict[str, Any]:
        s = sessions.get(pid, {})
        w = waiter_info.get(pid, {})
        entry = {
            "pid": pid,
            "depth": depth,
            "prepared_transaction": pid == 0,
            "application_name": s.get("application_name"),
            "state": s.get("state"),
            "wait_event": s.get("wait_event"),
            "xact_age_s": s.get("xact_age_s"),
            "in_state_s": s.get("in_state_s"),
            "query": s.get("query"),
            "relation": w.get("relation"),
            "waiting_s": w.get("waiting_s"),
            "blocks": [],
        }
        for child in sorted(children.get(pid, [])):
            if child not in path:
                entry["blocks"].append(node(child, depth + 1, (*path, child)))
        return entry

    return [node(root, 0, (root,)) for root in roots]


def collect_locks(ctx: Context) -> Iterable[Sample]:
    text = sql.SQL(query("collectors_database", "lock_waiters")).format(
        waitstart=sql.SQL("(SELECT min(l.waitstart) FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted)")
        if ctx.server_version >= 140000 else sql.NULL
    )
    waiters = ctx.rows("collectors_database", "lock_waiters", _apps(ctx), text=text)
    labels = _relation_labels(ctx, {w["relid"] for w in waiters if w["relid"] is not None})
    for w in waiters:
        w["relation"] = labels.get(w["relid"], "other") if w["relid"] is not None else "other"
    pids = sorted({w["pid"] for w in waiters} | {b for w in waiters for b in (w["blocked_by"] or [])})
    sessions = {s["pid"]: s for s in ctx.rows("collectors_database", "sessions", {"pids": pids})} if pids else {}
    ctx.detail("lock_waiters", [{k: w[k] for k in ("pid", "application_name", "relation", "locktype", "mode", "waiting_s", "blocked_by", "query")} for w in waiters])
    ctx.detail("blocking_tree", _tree(waiters, sessions))

    counts: dict[str, float] = {label: 0.0 for label, _ in ctx.options.tables}
    for w in waiters:
        counts[w["relation"]] = counts.get(w["relation"], 0.0) + 1
    out = [Sample("lock_waits", {"relation": rel}, n) for rel, n in sorted(counts.items())]
    out.append(Sample("lock_waits", {"relation": "all"}, float(len(waiters))))
    out.append(Sample("lock_wait_max_seconds", {}, max((w["waiting_s"] or 0.0 for w in waiters), default=0.0)))
    return out


# --- LWLock/SLRU waits, SLRU counters ------------------------------------------------------

def collect_waits(ctx: Context) -> Iterable[Sample]:
    events = ctx.rows("collectors_database", "wait_events", _apps(ctx))
    ctx.detail("wait_events", events)
    out: list[Sample] = []
    multixact = slru = 0.0
    for e in events:
        if e["wait_event_type"] == "LWLock":
            out.append(Sample("lwlock_waits", {"event": e["wait_event"]}, e["sessions"]))
            if e["wait_event"].startswith("MultiXact"):
                multixact += e["sessions"]
        if is_slru_wait(e["wait_event"]):
            slru += e["sessions"]
    out.append(Sample("lwlock_waits", {"event": "multixact"}, multixact))
    out.append(Sample("lwlock_waits", {"event": "slru"}, slru))

    counters = {slru_name(r["name"]): r for r in ctx.rows("collectors_database", "slru")}
    old = ctx.previous.get("slru", {})
    interval = ctx.interval
    ctx.remember({"slru": {name: {k: r[k] for k in ("blks_zeroed", "blks_hit", "blks_read")} for name, r in counters.items()}})
    for name, r in sorted(counters.items()):
        before = old.get(name, {})
        out.append(Sample("slru_blocks_read_per_second", {"slru": name}, rate(r["blks_read"], before.get("blks_read"), interval)))
        out.append(Sample("slru_blocks_hit_per_second", {"slru": name}, rate(r["blks_hit"], before.get("blks_hit"), interval)))
        out.append(Sample("slru_blocks_zeroed_per_second", {"slru": name}, rate(r["blks_zeroed"], before.get("blks_zeroed"), interval)))
    member = counters.get("multixact_member")
    member_rate = rate(member["blks_zeroed"], old.get("multixact_member", {}).get("blks_zeroed"), interval) if member else None
    out.append(Sample("multixact_members_per_second", {}, None if member_rate is None else member_rate * MEMBERS_PER_PAGE))
    return out


# --- WAL and replication --------------------------------------------------------------------

def collect_wal(ctx: Context) -> Iterable[Sample]:
    """WAL rate and replica lag; and failovers: the primary's timeline, kept from cycle to cycle
    in the collector's state (which lives in the database, so a promoted standby's collector
    reads the old primary's last one), with when it was seen to change (`server` detail,
    `server_timeline` sample). The Database page says when this server took over."""
    wal = ctx.rows("collectors_database", "wal_position")[0]
    before = ctx.previous.get("lsn_bytes")
    timeline = wal["timeline"]
    known = ctx.previous.get("timeline")
    failovers = list(ctx.previous.get("failovers", []))
    if timeline is not None and known is not None and timeline > known:
        failovers = (failovers + [{"at": ctx.now.isoformat(), "from": known, "to": timeline}])[-10:]
    # A WAL position that went back is another server's (a promoted standby replays less): no rate.
    if before is not None and wal["lsn_bytes"] is not None and wal["lsn_bytes"] < before:
        before = None
    ctx.remember({"lsn_bytes": wal["lsn_bytes"], "timeline": timeline if timeline is not None else known,
                  "failovers": failovers})
    ctx.detail("server", {"in_recovery": wal["in_recovery"], "timeline": timeline, "failovers": failovers})
    out = [Sample("wal_bytes_per_second", {}, rate(wal["lsn_bytes"], before, ctx.interval))]
    if timeline is not None:
        out.append(Sample("server_timeline", {}, float(timeline)))
    if wal["in_recovery"]:
        out.append(Sample("replica_lag_seconds", {"standby": "self", "client": "local"}, wal["own_replay_lag_s"]))
        return out
    for labels, r in standby_labels(ctx.rows("collectors_database", "standbys")):
        out.append(Sample("replica_lag_seconds", labels, r["replay_lag_s"] or 0.0))
        out.append(Sample("replica_lag_bytes", labels, r["replay_lag_bytes"]))
    return out


def standby_labels(rows: list[dict[str, Any]]) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """{standby, client} for each pg_stat_replication row: the application name (a standby's
    cluster_name or primary_conninfo application_name; "walreceiver" when neither is set) and
    its address. Two standbys that share both (two unnamed standbys on one host) would be one
    series, so from the second on the walsender's pid is added to the name."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        key = (r["standby"], r["client"])
        name = r["standby"] if key not in seen else f"{r['standby']} (pid {r['pid']})"
        seen.add(key)
        out.append(({"standby": name, "client": r["client"]}, r))
    return out


# --- connections and NOTIFY ----------------------------------------------------------------

def collect_connections(ctx: Context) -> Iterable[Sample]:
    rows = ctx.rows("collectors_database", "connections", _apps(ctx))
    limits = ctx.rows("collectors_database", "server_limits")[0]
    by_state = {r["state"]: r["sessions"] for r in rows}
    out = [Sample("connections", {"state": state}, n) for state, n in sorted(by_state.items())]
    out.append(Sample("connections", {"state": "all"}, sum(by_state.values())))
    out.append(Sample("idle_in_transaction_sessions", {}, sum(n for s, n in by_state.items() if s.startswith("idle in transaction"))))
    out.append(Sample("max_connections", {}, limits["max_connections"]))
    out.append(Sample("notify_queue_usage", {}, limits["notify_queue_usage"]))
    return out
