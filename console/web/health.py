"""Database health: is PostgreSQL keeping up with the queue's churn, and if not, who is in the
way? Dead tuples and autovacuum for the jobs tables, xmin horizon holders with what to do about
each, wraparound, lock waits as a tree, MultiXact/SLRU, WAL and replication.

GET /health                 the page; GET /health/_panels the polled fragment
GET /api/v1/health          the same as JSON
POST /health/backends/<pid>/end, POST /api/v1/health/backends/<pid>/end
                            an admin cancels or terminates a holder or a lock blocker
                            (console.holders.end_backend: bound to pid AND backend_start, audited)

Figures come from the latest stored samples (console.samples; names in console.catalog); the
detail lists (holders, the blocking tree, vacuum progress, standbys) are live queries on
PostgreSQL's statistics views — the collectors' own queries (sql/collectors_database.sql) for
the horizon holders and the blocking tree, sql/health.sql for the rest — each bounded and under
the panel's time limit,
so a slow one says "not available" alone. Every panel states good news plainly, and says what
red means and what to do.

The holders the panel reports as holding back vacuum, and the roots of the blocking tree, carry
their price (console.holders.price: how long, the dead tuples behind them, the throughput and
claim latency change since they started) and their identity (pid, backend_start), which the
admin's cancel/terminate form sends back so that the action ends that backend and no other.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Blueprint, abort, jsonify, render_template, request
from psycopg import sql
from psycopg.rows import dict_row

from console import holders as holders_mod
from console import samples, signals
from console.actions import MAX_REASON
from console.collectors import database as collectors_db
from console.collectors.base import CONSOLE_APPS
from console.sqlfiles import query
from console.web.actor import actor, reason_for
from console.web.api import BOOL, INT, OBJ, STR, TIME, Param, api_doc, obj, opt, panel
from console.web.auth import requires
from console.web.charts import format_value
from console.web.database import get_conn, home_conn, run_panel, timeout_ms
from console.web.overview import Judge, Latest, default_judge, load_judge

bp = Blueprint("health", __name__)

HOLDER_BAD_S = 3600.0  # a horizon held this long is red; amber from the rules' threshold (console.signals)
XID_RED = 1_000_000_000                            # half-way to the 2^31 shutdown point
LOCK_WARN_S, LOCK_BAD_S = 5.0, 60.0
LAG_WARN_S, LAG_BAD_S = 30.0, 300.0
RETAINED_WARN, RETAINED_BAD = 1 << 30, 10 << 30   # WAL kept by a slot: 1 GiB, 10 GiB
PANEL_MS = 2000
PRICED = 10  # holders (and blocking roots) priced per page: each price is a few indexed reads
BACKEND_KINDS = ("transaction", "idle_in_transaction")  # holders that are client backends


def _rows(conn, name: str, **params: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("health", name), params).fetchall()


def _worst(levels) -> str:
    order = ["good", "warn", "bad"]
    found = [lv for lv in levels if lv in order]
    return max(found, key=order.index) if found else "good"


# --- panels ---------------------------------------------------------------------------------

def tables_panel(conn, latest: Latest) -> dict[str, Any]:
    activity = {r["table_name"]: r for r in _rows(conn, "table_activity")}
    progress = _rows(conn, "vacuum_progress")
    settings = _rows(conn, "freeze_settings")[0]
    out = []
    for name in ("jobs", "jobs_archive"):
        act = activity.get(name)
        if act is None:
            continue
        live = latest.total("table_live_tuples", table=name)
        dead = latest.total("table_dead_tuples", table=name)
        live = act["live"] if live is None else live
        dead = act["dead"] if dead is None else dead
        threshold = latest.total("table_autovacuum_threshold", table=name)
        if threshold is None:
            threshold = settings["vacuum_threshold"] + settings["vacuum_scale_factor"] * (live or 0)
        behind = latest.total("table_autovacuum_behind", table=name)
        removed_nothing = latest.total("vacuum_removed_nothing", table=name)
        running = [p for p in progress if p["table_name"] == name or p["table_name"].startswith(name + "_")]
        ratio = (dead / (live + dead)) if (live or 0) + (dead or 0) else 0.0
        if removed_nothing:
            lv, advice = "bad", ("Vacuum ran but removed nothing: something holds the xmin horizon. "
                                 "See the horizon holders below and end the oldest one.")
        elif behind or (dead or 0) > 2 * threshold:
            lv, advice = "warn", ("Dead rows are above the autovacuum threshold and no vacuum is running: "
                                  "autovacuum may be busy elsewhere or throttled. Run VACUUM (VERBOSE) skiplock."
                                  f"{name}, and consider lowering autovacuum_vacuum_scale_factor for this table.")
        else:
            lv, advice = "good", None
        out.append({
            "table": name, "live": live, "dead": dead, "dead_ratio": ratio, "threshold": threshold,
            "threshold_used": min(1.0, (dead or 0) / threshold) if threshold else None,
            "last_autovacuum": act["last_autovacuum"], "last_vacuum": act["last_vacuum"],
            "last_autoanalyze": act["last_autoanalyze"], "autovacuum_count": act["autovacuum_count"],
            "total_bytes": act["total_bytes"], "level": lv, "advice": advice,
            "vacuum": [{
                "pid": p["pid"], "phase": p["phase"], "index_passes": p["index_vacuum_count"],
                "scanned": (p["heap_blks_scanned"] / p["heap_blks_total"]) if p["heap_blks_total"] else None,
                "running_s": p["running_s"],
            } for p in running],
        })
    external = external_tables(latest)
    return {"tables": out, "external": external, "level": _worst([t["level"] for t in out] + [t["level"] for t in external])}


def external_tables(latest: Latest) -> list[dict[str, Any]]:
    """The queue tables of [[external_queues]] sources, from the newest samples of the external
    collector (labels table = "<source>:<schema>.<table>" and system): the same judgement as
    Skiplock's own tables, without a live query of someone else's table."""
    system_of = {s.labels["table"]: s.labels["system"] for s in latest.rows
                 if s.metric == "table_live_tuples" and "table" in s.labels
                 and s.labels.get("system", "skiplock") != "skiplock"}
    out = []
    for label, system in sorted(system_of.items()):
        live, dead = latest.total("table_live_tuples", table=label), latest.total("table_dead_tuples", table=label)
        threshold = latest.total("table_autovacuum_threshold", table=label)
        behind = latest.total("table_autovacuum_behind", table=label)
        if latest.total("vacuum_removed_nothing", table=label):
            lv, advice = "bad", "Vacuum ran but removed nothing: something holds the xmin horizon (see the holders below)."
        elif behind or (threshold and (dead or 0) > 2 * threshold):
            lv, advice = "warn", ("Dead rows are above the autovacuum threshold and no vacuum is running: consider a lower "
                                  "autovacuum_vacuum_scale_factor for this queue table.")
        else:
            lv, advice = "good", None
        source, _, table = label.partition(":")
        out.append({"source": source, "table": table, "system": system, "live": live, "dead": dead,
                    "dead_ratio": (dead / (live + dead)) if (live or 0) + (dead or 0) else 0.0,
                    "threshold": threshold, "last_autovacuum_age_s": latest.most("table_last_autovacuum_age_seconds", table=label),
                    "level": lv, "advice": advice})
    return out


_HOLDER_ADVICE = {
    "idle_in_transaction": "A session opened a transaction and went quiet. Ask its owner, then "
                           "SELECT pg_terminate_backend({pid}); set idle_in_transaction_session_timeout so it cannot recur.",
    "transaction": "A long transaction or query. If it is not meant to run this long: SELECT pg_cancel_backend({pid}); "
                   "(pg_terminate_backend if that does not end it).",
    "replication_slot": "A replication slot pins old rows. If its consumer is gone for good: "
                        "SELECT pg_drop_replication_slot({id});",
    "prepared_transaction": "A forgotten two-phase transaction. Find its coordinator, or: ROLLBACK PREPARED {id};",
    "standby": "A standby with hot_standby_feedback runs a long query. End that query on the standby, "
               "or lower max_standby_streaming_delay.",
}


def _holder_advice(conn, row: dict[str, Any]) -> str:
    """The advice with the holder's id as a SQL string literal (a gid may hold quotes or
    backslashes: psycopg quotes it for this connection, so the command is valid and does only
    what it says)."""
    ident = sql.Literal(row["id"] or "").as_string(conn)
    return _HOLDER_ADVICE[row["kind"]].format(pid=int(row["pid"]) if row["pid"] is not None else "NULL", id=ident)


def _collected_holders(conn) -> list[dict[str, Any]]:
    from console.collectors import latest_details

    found = latest_details(conn) or {}
    return list((found.get("details") or {}).get("xmin_holders") or [])


def holders_panel(conn, latest: Latest | None = None, judge: Judge | None = None) -> dict[str, Any]:
    """The collectors' own query (sql/collectors_database.sql horizon_holders), run live.

    A holder "holds back vacuum" (amber, listed with what to do) from the age the rules in force
    say (console.signals.horizon_threshold: the vacuum_blocked rule, or your own over
    xmin_horizon_age_seconds), the same age at which the alert that links here fires; and the
    oldest holder does whatever its age while a jobs table's last vacuum removed nothing. Red
    from an hour, for an inactive replication slot, or past 100 million XIDs."""
    threshold = signals.horizon_threshold(judge.rules if judge else None)
    removed_nothing = bool(latest and (latest.jobs_table("vacuum_removed_nothing") or 0) > 0)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("collectors_database", "horizon_holders"), {"exclude_apps": list(CONSOLE_APPS)}).fetchall()
    # A slot's or a standby's hold has no start time; the horizon collector estimates its age
    # from its XID history (the age the alert judged). Use that estimate rather than none.
    estimated = {(h.get("kind"), h.get("id")): h.get("age_s") for h in _collected_holders(conn)
                 if h.get("age_estimated") and h.get("age_s") is not None}
    for r in rows:
        if r["age_s"] is None and (r["kind"], r["id"]) in estimated:
            r["age_s"], r["age_estimated"] = estimated[(r["kind"], r["id"])], True
    # the oldest by age, not the first row: rows are ordered by XID age, and the first is often a
    # standby's feedback, which has no age of its own
    oldest = max((r["age_s"] for r in rows if r["age_s"] is not None), default=None)
    out = []
    for r in rows[:20]:
        age = r["age_s"]
        holds = signals.holds_back_vacuum(age, threshold, vacuum_removed_nothing=removed_nothing,
                                          oldest=age is not None and age == oldest)
        lv = "bad" if (age or 0) >= max(HOLDER_BAD_S, threshold) else "warn" if holds else "good"
        if r["kind"] == "replication_slot" and r["state"] == "inactive":
            lv = "bad"
        if r["xid_age"] and r["xid_age"] >= 100_000_000:
            lv = "bad"
        out.append({**r, "application": r["application_name"], "level": lv,
                    "advice": _holder_advice(conn, r) if lv != "good" else None})
    _priced(conn, [h for h in out if h["level"] != "good"])
    return {"holders": out, "oldest_s": oldest, "threshold_s": threshold, "removed_nothing": removed_nothing,
            "level": _worst(h["level"] for h in out)}


def _own_pids() -> list[int]:
    """The pids of this request's own connections (the console refuses to end them)."""
    return sorted({get_conn().info.backend_pid, home_conn().info.backend_pid})


def _priced(conn, rows: list[dict[str, Any]]) -> None:
    """Add `price` (console.holders.price) and, for a client backend, `backend` (its identity
    and why the console refuses to end it, if it does) to the first PRICED rows, in place."""
    pids = [r["pid"] for r in rows[:PRICED] if r.get("pid") and r.get("kind", "lock") in (*BACKEND_KINDS, "lock")]
    found = holders_mod.backends(conn, pids, own_pids=_own_pids())
    now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
    for r in rows:
        r["backend"] = r["price"] = None
    for r in rows[:PRICED]:
        b = found.get(r.get("pid")) if r.get("kind", "lock") in (*BACKEND_KINDS, "lock") else None
        if b is not None:
            r["backend"] = {"pid": b["pid"], "backend_start": b["backend_start"], "backend_type": b["backend_type"],
                            "state": b["state"], "xact_start": b["xact_start"], "state_change": b["state_change"],
                            "idle_s": (now - b["state_change"]).total_seconds()
                            if b["state_change"] and (b["state"] or "").startswith("idle in transaction") else None,
                            "refused": b["refused"]}
        since = r.get("since")
        estimated = bool(r.get("age_estimated"))
        if since is None and b is not None:
            since = b["xact_start"] or b["backend_start"]
        if since is None and r.get("age_s") is not None:
            since, estimated = now - timedelta(seconds=r["age_s"]), True
        r["price"] = holders_mod.price(conn, since, now=now, estimated=estimated)


def lock_tree(waiters: list[dict[str, Any]], sessions: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocking roots with the sessions they block underneath (the collectors' tree builder)."""
    return collectors_db._tree(waiters, sessions)


def _judged(judge: Judge | None, latest: Latest | None, metric: str, label: str | None = None) -> list[str]:
    """The levels the rules in force give the newest samples of `metric` (per `label` value):
    a panel is amber or red where the alert over the same series would be."""
    if judge is None or latest is None:
        return []
    if label is None:
        value = latest.total(metric)
        return [judge.level(metric, value, {})] if value is not None else []
    return [judge.level(metric, v, {label: k}) for k, v in latest.by_label(metric, label).items() if v is not None]


def locks_panel(conn, latest: Latest | None = None, judge: Judge | None = None) -> dict[str, Any]:
    """The collectors' lock_waiters and sessions queries, run live, drawn as a tree. Amber where
    the rules in force would fire on the newest lock_waits samples (jobs_lock_waits: any session
    waiting on a jobs table) or a wait passes LOCK_WARN_S; red from LOCK_BAD_S."""
    text = sql.SQL(query("collectors_database", "lock_waiters")).format(
        waitstart=sql.SQL("(SELECT min(l.waitstart) FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted)")
        if conn.info.server_version >= 140000 else sql.NULL)
    with conn.cursor(row_factory=dict_row) as cur:
        waiters = cur.execute(text, {"exclude_apps": list(CONSOLE_APPS)}).fetchall()[:200]
        pids = sorted({w["pid"] for w in waiters} | {b for w in waiters for b in (w["blocked_by"] or [])})
        sessions = {r["pid"]: r for r in cur.execute(query("collectors_database", "sessions"), {"pids": pids})} if pids else {}
    tree = lock_tree(waiters, sessions)
    _priced(conn, [root for root in tree if root["pid"]])
    longest = max((w["waiting_s"] or 0 for w in waiters), default=0.0)
    lv = "good" if not waiters else "bad" if longest >= LOCK_BAD_S else "warn" if longest >= LOCK_WARN_S else "good"
    lv = _worst([lv, *_judged(judge, latest, "lock_waits", "relation")])
    return {"tree": tree, "waiting": len(waiters), "longest_wait_s": longest, "level": lv}


def wraparound_panel(conn) -> dict[str, Any]:
    rows = _rows(conn, "wraparound")
    settings = _rows(conn, "freeze_settings")[0]
    out = []
    for r in rows:
        xid_lv = "bad" if r["xid_age"] >= XID_RED else "warn" if r["xid_age"] >= settings["freeze_max_age"] else "good"
        mxid_lv = ("bad" if (r["mxid_age"] or 0) >= XID_RED else
                   "warn" if (r["mxid_age"] or 0) >= settings["mxid_freeze_max_age"] else "good")
        out.append({**r, "xid_percent": 100.0 * r["xid_age"] / 2**31, "level": _worst([xid_lv, mxid_lv])})
    return {"rows": out, "freeze_max_age": settings["freeze_max_age"], "level": _worst(r["level"] for r in out)}


# The SLRUs the panel lists, in this order, by their PostgreSQL 17+ names (the collectors' labels).
SLRU_SHOWN = ("multixact_member", "multixact_offset", "transaction", "subtransaction", "notify")


def slru_panel(conn, latest: Latest, judge: Judge | None = None) -> dict[str, Any]:
    waits = _rows(conn, "lwlock_waiters")
    named = {collectors_db.slru_name(r["name"]): r for r in _rows(conn, "slru")}
    slru = [{**named[name], "name": name} for name in SLRU_SHOWN if name in named]
    mx_waits = [w for w in waits if "MultiXact" in (w["wait_event"] or "") or collectors_db.is_slru_wait(w["wait_event"] or "")]
    consumption = latest.total("multixact_consumption_per_second")
    reads = latest.by_label("slru_blocks_read_per_second", "slru")
    lv = "bad" if sum(w["sessions"] for w in mx_waits) >= 5 else "warn" if mx_waits else "good"
    lv = _worst([lv, *_judged(judge, latest, "multixact_consumption_per_second")])  # multixact_spike
    return {"lwlock_waits": waits, "multixact_waits": mx_waits, "slru": slru,
            "multixact_per_s": consumption, "slru_reads_per_s": reads, "level": lv}


def wal_panel(conn, latest: Latest, judge: Judge | None = None) -> dict[str, Any]:
    """WAL rate, standbys and slots. A standby is amber where the replica_lag rule in force
    would fire (the judge), red from LAG_BAD_S; the constants only without any such rule."""
    standbys = _rows(conn, "replication")
    slots = _rows(conn, "slots")
    wal = _rows(conn, "wal")[0]
    levels = []
    for s in standbys:
        lag = s["replay_lag_s"] or 0
        judged = judge.level("replica_lag_seconds", lag, {"standby": s["name"] or ""}) if judge else "neutral"
        if judged == "neutral":
            s["level"] = "bad" if lag >= LAG_BAD_S else "warn" if lag >= LAG_WARN_S else "good"
        else:
            s["level"] = "bad" if lag >= LAG_BAD_S else judged
        levels.append(s["level"])
    for s in slots:
        kept = s["retained_bytes"] or 0
        s["level"] = "bad" if kept >= RETAINED_BAD or (not s["active"] and kept >= RETAINED_WARN) else \
            "warn" if kept >= RETAINED_WARN or not s["active"] else "good"
        levels.append(s["level"])
    levels += _judged(judge, latest, "wal_bytes_per_second")  # wal_rate
    return {"wal_bytes_per_s": latest.total("wal_bytes_per_second"), "wal": wal, "standbys": standbys,
            "slots": slots, "failovers": _failovers(conn), "level": _worst(levels)}


def _failovers(conn) -> list[dict[str, Any]]:
    """The timeline changes the WAL collector saw (console.collectors.database.collect_wal),
    newest first: when this server took over as primary."""
    from datetime import datetime

    from console.collectors import latest_details

    found = ((latest_details(conn) or {}).get("details") or {}).get("server") or {}
    return [{**f, "at": datetime.fromisoformat(f["at"])} for f in reversed(found.get("failovers") or [])]


def _latest(conn) -> Latest:
    return Latest(samples.latest(conn, within=timedelta(minutes=15)))


def health_data() -> dict[str, Any]:
    latest_p = run_panel(_latest)
    latest = latest_p.data if latest_p.ok else Latest([])
    judged = run_panel(load_judge)
    judge = judged.data if judged.ok else default_judge()
    return {
        "measured_at": latest.newest(),
        "tables": run_panel(tables_panel, latest, timeout=PANEL_MS),
        "holders": run_panel(holders_panel, latest, judge, timeout=PANEL_MS),
        "locks": run_panel(locks_panel, latest, judge, timeout=PANEL_MS),
        "wraparound": run_panel(wraparound_panel, timeout=PANEL_MS),
        "slru": run_panel(slru_panel, latest, judge, timeout=PANEL_MS),
        "wal": run_panel(wal_panel, latest, judge, timeout=PANEL_MS),
    }


PANELS = ("tables", "holders", "locks", "wraparound", "slru", "wal")


def tab_state(data: dict[str, Any]) -> str:
    bad = sum(1 for k in PANELS if data[k].ok and data[k].data["level"] == "bad")
    return f"{bad} red" if bad else ""


@bp.get("/health")
@requires("viewer")
def index():
    data = health_data()
    return render_template("health/index.html", tab_state=tab_state(data), fmt=format_value, **data)


@bp.get("/health/_panels")
@requires("viewer")
def panels_fragment():
    data = health_data()
    return render_template("health/_panels.html", tab_state=tab_state(data), fmt=format_value, **data)


@bp.get("/api/v1/health")
@requires("viewer")
@api_doc("Database health: jobs tables and autovacuum, xmin horizon holders (with advice), lock-wait tree, "
         "wraparound, MultiXact/SLRU, WAL and replication",
         description="Each panel has a `level` (good, warn, bad) or is {available: false, error} when its query timed out.",
         response=obj({"measured_at": opt(TIME), **{key: panel(obj({"level": STR})) for key in PANELS}}))
def api_index():
    data = health_data()
    out: dict[str, Any] = {"measured_at": data["measured_at"]}
    for key in PANELS:
        p = data[key]
        out[key] = p.data if p.ok else {"available": False, "error": p.error}
    return jsonify(out)


# --- ending a holder or a blocker (admin) --------------------------------------------------------

END_FIELDS = {"mode": {"enum": list(holders_mod.MODES)},
              "backend_start": {**STR, "format": "date-time", "description": "the backend's start, as listed"},
              "reason": {**STR, "maxLength": MAX_REASON}}


def _end_body() -> dict[str, Any]:
    body = request.get_json(silent=True) if request.is_json else None
    if isinstance(body, dict):
        return body
    return {k: v for k, v in request.form.items() if k != "csrf_token"}


def _end(pid: int) -> dict[str, Any]:
    """Cancel or terminate backend `pid` as the request asks: 400 bad input, 422 no reason,
    403 refused (the console's own session, replication, not a client, no privilege),
    404 gone, 409 the pid names another backend now."""
    body = _end_body()
    mode = body.get("mode")
    if not isinstance(mode, str) or mode not in holders_mod.MODES:
        raise ValueError(f"mode: must be one of {', '.join(holders_mod.MODES)} (got {str(mode)[:20]!r})")
    backend_start = holders_mod.parse_backend_start(body.get("backend_start"))
    reason = reason_for(holders_mod.MODES[mode][0], body)
    conn = get_conn()
    try:
        return holders_mod.end_backend(conn, pid, backend_start, mode, actor=actor(), reason=reason,
                                       own_pids=_own_pids(), timeout_ms=timeout_ms())
    except (holders_mod.BackendRefused, holders_mod.BackendGone, holders_mod.BackendChanged) as exc:
        abort(exc.status, str(exc))


@bp.post("/health/backends/<int:pid>/end")
@requires("admin")
def end_backend(pid: int):
    result = _end(pid)
    data = health_data()
    template = "health/_panels.html" if request.headers.get("HX-Request") else "health/index.html"
    return render_template(template, tab_state=tab_state(data), fmt=format_value, result=result, **data)


@bp.post("/api/v1/health/backends/<int:pid>/end")
@requires("admin")
@api_doc("Cancel (pg_cancel_backend) or terminate (pg_terminate_backend) a horizon holder or a lock blocker "
         "(audited as backend_cancel / backend_terminate)",
         description="Bound to the backend's identity: `backend_start` must be the one /api/v1/health lists for "
                     "the pid (holders[].backend, locks.tree[].backend), so a pid reused by a new backend is "
                     "refused (409). The console's own sessions, replication (walsender) and other non-client "
                     "backends are refused (403). Send JSON, or the same fields form-encoded.",
         body=obj(END_FIELDS),
         params=[Param("pid", where="path", type="integer"), Param("mode", where="form", required=True, enum=tuple(holders_mod.MODES)),
                 Param("backend_start", where="form", required=True, format="date-time",
                       description="the backend's start, as /api/v1/health lists it"),
                 Param("reason", where="form", required=True, max_length=MAX_REASON,
                       description="why (kept in the audit log)")],
         responses={"400": "bad mode or backend_start", "403": "refused (the console's own, replication, no privilege)",
                    "404": "no such backend any more", "409": "the pid names another backend now",
                    "422": "no reason"},
         response=obj({"pid": INT, "backend_start": TIME, "mode": STR, "signalled": BOOL, "ended": BOOL,
                       "state": opt(STR), "holds_horizon": BOOL, "message": STR, "audit_id": INT, "price": opt(OBJ)}))
def api_end_backend(pid: int):
    return jsonify(_end(pid))
