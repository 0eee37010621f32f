"""The incident timeline of one database: what happened between two times, on one axis, and
the Markdown postmortem draft built from it.

    tl = build(conn, since, until, timeout_ms=2000, alert=alert_row)
    tl.events   -> [Event(at, kind="alert", data={...}, path="/alerts/7"), ...]  oldest first
    tl.more     -> {"action": 12}: events of a kind left out past the cap
    tl.unavailable -> {"xmin_holder": "the query took longer than 2000 ms"}
    markdown(tl) -> the postmortem draft (title, window, summary, the timeline, empty sections)

Kinds, each read from what the console already stores (sql/timeline.sql):

  alert         an alert fired or resolved (skiplock.alert_events), with its rule and value
  action        an operator action (the audit log; sign-ins left out)
  scheduler     a scheduler process started (and which dead one it replaced), stopped, went
                silent (dead), or became leader (skiplock.scheduler_nodes)
  deploy        a worker started running another version or release than the worker that
                started before it on an overlapping set of queues (workers.version and
                .release, migration 024; workers that report neither, as 0.1.0's, are left out)
  worker        a worker process started, exited, or went silent without exiting (lost), from
                the workers registry (rows live [worker] registry_grace after the worker ends)
  autovacuum    autovacuum ran on one of the queue's tables (table_vacuum_count went up
                between two samples)
  xmin_holder   a session or slot started holding the xmin horizon (a collection cycle lists a
                holder the one before did not)
  lock_wait     sessions began waiting on locks (a cycle lists waiters, the one before none)
  replica_lag   a replica's replay lag went above the threshold, or back below it
  error_group   an error group became new or regressed (skiplock.error_groups)

Not here, because nothing stores it: leadership a scheduler held and then gave up (its row
forgets it; the next leader's start is shown), and a deploy among workers that do not report
their version (an earlier release's: it shows only as workers exiting and starting).

Bounded: every query reads its window on an index; each kind returns at most `cap` events
and says how many more the window holds; each kind runs in its own short transaction under
`timeout_ms`, so a slow one is `unavailable` and the others still show.

This module reads; it knows nothing of HTTP or of who reads (the faces redact `data` before
`summary_of` and `markdown` put it in words).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast
from urllib.parse import quote, urlencode

import psycopg

from console.audit import selection_text
from console.db import time_limited
from console.sqlfiles import query
from console.timefmt import duration

log = logging.getLogger(__name__)

KINDS = ("alert", "action", "scheduler", "deploy", "worker", "autovacuum", "xmin_holder", "lock_wait", "replica_lag",
         "error_group")
LABELS = {"alert": "Alert", "action": "Operator action", "scheduler": "Scheduler", "deploy": "Deploy", "worker": "Worker",
          "autovacuum": "Autovacuum", "xmin_holder": "xmin holder", "lock_wait": "Lock waits",
          "replica_lag": "Replica lag", "error_group": "Error group"}
CAP = 200               # events per kind shown
COUNT_CAP = 10_000      # events per kind counted for "N more"
LOOKBACK = timedelta(minutes=10)  # samples and cycles read before the window, to compare the first with
MAX_SPAN = timedelta(days=2)      # the longest window (the alert page's chart shows as long)
BEFORE_ALERT = timedelta(minutes=30)  # an alert's timeline starts this long before it fired
DEFAULT_SPAN = timedelta(hours=1)     # no window asked: the last hour


class WindowError(ValueError):
    """A window that cannot be read (the message names the problem)."""


@dataclass
class Event:
    at: datetime
    kind: str
    data: dict[str, Any]
    path: str | None = None  # the console page of the thing (within the console)

    @property
    def summary(self) -> str:
        return summary_of(self.kind, self.data)

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "kind": self.kind, "summary": self.summary, "path": self.path,
                "data": _jsonable(self.data)}


@dataclass
class Timeline:
    since: datetime
    until: datetime
    database: str = "default"
    alert: dict[str, Any] | None = None  # the alert the window is around, if asked by alert
    events: list[Event] = field(default_factory=list)
    more: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for e in self.events:
            out[e.kind] += 1
        return {k: n + self.more.get(k, 0) for k, n in out.items()}

    def as_dict(self) -> dict[str, Any]:
        return {"database": self.database, "since": self.since.isoformat(), "until": self.until.isoformat(),
                "alert": _jsonable(self.alert) if self.alert else None,
                "events": [e.as_dict() for e in self.events], "more": self.more, "unavailable": self.unavailable,
                "counts": self.counts()}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))


# --- the window ------------------------------------------------------------------------------

def window(since: datetime | None, until: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    """[since, until] checked: until defaults to now, since to an hour before until; since must
    come before until, and the span be at most MAX_SPAN."""
    until = until or now
    since = since or until - DEFAULT_SPAN
    if since >= until:
        raise WindowError(f"from ({since.isoformat()}) must be before to ({until.isoformat()})")
    if until - since > MAX_SPAN:
        raise WindowError(f"the window is {duration((until - since).total_seconds())} long; at most "
                          f"{duration(MAX_SPAN.total_seconds())} (narrow from or to)")
    return since, until


def alert_window(alert: Mapping[str, Any], now: datetime) -> tuple[datetime, datetime]:
    """Around an alert: from BEFORE_ALERT before it fired to its resolution (or now), the last
    MAX_SPAN of it when it lasted longer."""
    fired = alert.get("fired_at") or alert["state_since"]
    resolved = alert.get("resolved_at")
    until = resolved if alert.get("state") == "ok" and resolved and resolved >= fired else now
    until = max(until, fired + timedelta(seconds=1))
    return max(fired - BEFORE_ALERT, until - MAX_SPAN), until


# --- reading ---------------------------------------------------------------------------------

def _q(value: str) -> str:
    return quote(value, safe="")


def _alert_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "alert", {k: r[k] for k in ("kind", "value", "alert_id", "rule", "labels")},
                 f"/alerts/{r['alert_id']}")


def _action_event(r: dict[str, Any]) -> Event:
    # The audit page lists rows older than `before`: this entry comes first.
    return Event(r["at"], "action", {k: r[k] for k in ("id", "actor", "action", "target", "selection", "reason",
                                                        "rows", "outcome")},
                 "/audit?" + urlencode({"before": r["id"] + 1}))


def _scheduler_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "scheduler", {k: r[k] for k in ("what", "id", "host", "pid", "replaced", "replaced_last_seen")},
                 "/maintenance#scheduler")


def _worker_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "worker", {k: r[k] for k in ("what", "id", "host", "pid", "queues", "concurrency",
                                                        "completed", "failed", "lost", "version", "release")},
                 "/workers#worker-" + _q(r["id"]))


def _deploy_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "deploy", {k: r[k] for k in ("id", "host", "pid", "queues", "version", "release", "previous_id",
                                                        "previous_version", "previous_release",
                                                        "previous_started_at")},
                 "/workers#worker-" + _q(r["id"]))


def _autovacuum_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "autovacuum", {"table": r["tbl"], "runs": r["runs"], "seen_at": r["seen_at"]},
                 "/health#panel-tables")


def _holder_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "xmin_holder", {k: r[k] for k in ("holder_kind", "holder_id", "application_name", "state",
                                                             "age_s", "xid_age")},
                 "/health#panel-holders")


def _lock_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "lock_wait", {k: r[k] for k in ("sessions", "relations", "longest_s")}, "/health#panel-locks")


def _lag_event(r: dict[str, Any], threshold: float) -> Event:
    return Event(r["at"], "replica_lag", {"labels": r["labels"], "value": r["value"], "before": r["before"],
                                          "direction": r["direction"], "threshold": threshold}, "/health#panel-wal")


def _group_event(r: dict[str, Any]) -> Event:
    return Event(r["at"], "error_group", {k: r[k] for k in ("fingerprint", "change", "previous_seen", "kinds", "queues",
                                                             "ignored_at")},
                 "/deadletters/jobs?" + urlencode({"fingerprint": r["fingerprint"]}))


def build(conn: psycopg.Connection, since: datetime, until: datetime, *, timeout_ms: int, database: str = "default",
          alert: dict[str, Any] | None = None, cap: int = CAP, live_within: float = 30.0,
          replica_lag_threshold: float = 60.0, kinds: tuple[str, ...] = KINDS) -> Timeline:
    """Every kind's events in [since, until], oldest first. `live_within`: seconds of silence
    after which a worker that never said it stopped is lost (console.signals.live_worker_within);
    `replica_lag_threshold`: the lag, in seconds, whose crossing is an event (the replica_lag
    rule's threshold in force). A kind whose query fails or times out is `unavailable`; a lost
    connection raises."""
    tl = Timeline(since=since, until=until, database=database, alert=alert)
    params = {"since": since, "until": until, "cap": cap, "count_cap": COUNT_CAP,
              "lookback": LOOKBACK.total_seconds(), "live_within": float(live_within),
              "threshold": float(replica_lag_threshold)}
    makers: dict[str, Callable[[dict[str, Any]], Event]] = {
        "alert": _alert_event, "action": _action_event, "scheduler": _scheduler_event, "deploy": _deploy_event,
        "worker": _worker_event,
        "autovacuum": _autovacuum_event, "xmin_holder": _holder_event, "lock_wait": _lock_event,
        "replica_lag": lambda r: _lag_event(r, float(replica_lag_threshold)), "error_group": _group_event,
    }
    names = {"alert": "alerts", "action": "actions", "scheduler": "scheduler", "deploy": "deploys", "worker": "workers",
             "autovacuum": "autovacuum", "xmin_holder": "xmin_holders", "lock_wait": "lock_waits",
             "replica_lag": "replica_lag", "error_group": "error_groups"}
    for kind in kinds:
        try:
            with time_limited(conn, timeout_ms) as cur:
                rows = cast(list[dict[str, Any]], cur.execute(query("timeline", names[kind]), params).fetchall())
        except psycopg.errors.QueryCanceled:
            tl.unavailable[kind] = f"the query took longer than {timeout_ms} ms"
            continue
        except psycopg.errors.LockNotAvailable:
            tl.unavailable[kind] = "waited too long for a lock"
            continue
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            log.warning("timeline: %s not read: %s (%s)", kind, exc.__class__.__name__, exc.sqlstate)
            tl.unavailable[kind] = f"not read ({exc.__class__.__name__})"
            continue
        tl.events += [makers[kind](r) for r in rows]
        total = rows[0]["total"] if rows else 0
        if total > len(rows):
            tl.more[kind] = total - len(rows)
    order = {k: i for i, k in enumerate(KINDS)}
    tl.events.sort(key=lambda e: (e.at, order[e.kind]))
    return tl


# --- in words --------------------------------------------------------------------------------

def _num(value: Any) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    return f"{value:,.0f}" if value.is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def _labels(labels: Mapping[str, Any] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))


def _secs(value: Any) -> str:
    return "n/a" if value is None else duration(float(value))


def summary_of(kind: str, d: Mapping[str, Any]) -> str:
    """One line for an event, from its (already redacted) data."""
    if kind == "alert":
        labels = _labels(d.get("labels"))
        verb = "fired" if d["kind"] == "firing" else "resolved"
        return f"Alert {d['alert_id']} {d['rule']}{' ' + labels if labels else ''} {verb} (value {_num(d.get('value'))})"
    if kind == "action":
        parts = [f"{d['actor']}: {d['action']}"]
        if d.get("target"):
            parts.append(f"on {d['target']}")
        selection = selection_text(d.get("selection"))
        if selection:
            parts.append(f"[{selection}]")
        if d.get("rows") is not None:
            parts.append(f"({d['rows']} row{'' if d['rows'] == 1 else 's'})")
        if d.get("outcome") not in (None, "ok"):
            parts.append(f"— {d['outcome']}")
        if d.get("reason"):
            parts.append(f"— why: {d['reason']}")
        return " ".join(parts)
    if kind == "scheduler":
        who = f"scheduler {d['id']} ({d['host']}, pid {d['pid']})"
        if d["what"] == "start":
            if d.get("replaced"):
                return f"{who} started, replacing {d['replaced']}, silent since {_time(d.get('replaced_last_seen'))} (a restart)"
            return f"{who} started"
        if d["what"] == "stop":
            return f"{who} stopped"
        if d["what"] == "lost":
            return f"{who} went silent without stopping (crashed or killed)"
        return f"{who} became the leader"
    if kind == "deploy":
        changes = []
        if d.get("release") != d.get("previous_release"):
            changes.append(f"release {d.get('previous_release') or '(none)'} → {d.get('release') or '(none)'}")
        if d.get("version") != d.get("previous_version"):
            changes.append(f"skiplock {d.get('previous_version')} → {d.get('version')}")
        queues = ",".join(d.get("queues") or []) or "every queue"
        return f"deploy: {', '.join(changes) or 'release changed'} (worker {d['id']} on {queues})"
    if kind == "worker":
        who = f"worker {d['id']} ({d['host']}, pid {d['pid']})"
        queues = ", ".join(d.get("queues") or []) or "every queue"
        if d["what"] == "start":
            release = f", release {d['release']}" if d.get("release") else ""
            return f"{who} started on {queues}, {d['concurrency']} slots{release}"
        done = f"{d['completed']} completed, {d['failed']} failed, {d['lost']} lost"
        if d["what"] == "stop":
            return f"{who} exited ({done})"
        return f"{who} stopped reporting without exiting: lost ({done})"
    if kind == "autovacuum":
        runs = f"{d['runs']} runs" if d.get("runs", 1) > 1 else "ran"
        return f"autovacuum {runs} on {d['table']}"
    if kind == "xmin_holder":
        app = f" ({d['application_name']})" if d.get("application_name") else ""
        return (f"new xmin horizon holder: {d['holder_kind']} {d['holder_id']}{app}, holding for "
                f"{_secs(d.get('age_s'))}")
    if kind == "lock_wait":
        on = ", ".join(d.get("relations") or []) or "?"
        return f"{d['sessions']} session(s) began waiting on locks ({on}), longest {_secs(d.get('longest_s'))}"
    if kind == "replica_lag":
        where = _labels(d.get("labels"))
        if d["direction"] == "above":
            return f"replica lag above {_num(d['threshold'])} s: {_num(d['value'])} s ({where})"
        return f"replica lag back under {_num(d['threshold'])} s: {_num(d['value'])} s ({where})"
    if kind == "error_group":
        what = "new error group" if d["change"] == "new" else "error group came back (regressed)"
        where = ", ".join(d.get("queues") or [])
        ignored = " (ignored)" if d.get("ignored_at") else ""
        return f"{what}: {d['fingerprint']}{' in ' + where if where else ''}{ignored}"
    return kind


def _time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value) if value is not None else "n/a"


# --- the postmortem draft --------------------------------------------------------------------

def _inline(text: Any) -> str:
    """Text on one Markdown line: whitespace folded, HTML brackets as entities (a reason or an
    error quoted in the draft never becomes markup where it is pasted)."""
    s = " ".join(str(text if text is not None else "").split())
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: Any) -> str:
    """A Markdown table cell: one line, backslashes, pipes and backquotes escaped."""
    return _inline(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")


def alert_spans(tl: Timeline) -> list[dict[str, Any]]:
    """Each alert that fired in the window: its rule, labels, when it fired and resolved (or
    that it still fires at the window's end), and how long."""
    spans: dict[int, dict[str, Any]] = {}
    for e in tl.events:
        if e.kind != "alert":
            continue
        d = e.data
        if d["kind"] == "firing":
            spans[d["alert_id"]] = {"alert_id": d["alert_id"], "rule": d["rule"], "labels": d.get("labels") or {},
                                    "fired": e.at, "resolved": None, "value": d.get("value")}
        elif d["alert_id"] in spans and spans[d["alert_id"]]["resolved"] is None:
            spans[d["alert_id"]]["resolved"] = e.at
    out = list(spans.values())
    for s in out:
        s["lasted"] = duration(((s["resolved"] or tl.until) - s["fired"]).total_seconds())
    return out


def title_of(tl: Timeline) -> str:
    if tl.alert:
        labels = _labels({k: v for k, v in (tl.alert.get("labels") or {}).items() if k != "database"})
        return f"Incident: alert {tl.alert['id']} {tl.alert['rule']}{' ' + labels if labels else ''} ({tl.database})"
    return f"Incident on {tl.database}, {_time(tl.since)} to {_time(tl.until)}"


def markdown(tl: Timeline, *, base_url: str = "") -> str:
    """The postmortem draft: title, window, summary (the alerts that fired and how long, the
    operator actions, the deploys, the other events by kind), the timeline as a table (links absolute when
    `base_url` is given), and the sections a human writes. Built from the events as given: the
    caller redacts them first."""
    lines = [f"# {_inline(title_of(tl))}", "",
             f"- Database: {tl.database}",
             f"- Window: {_time(tl.since)} to {_time(tl.until)} ({duration((tl.until - tl.since).total_seconds())})"]
    if tl.alert:
        lines.append(f"- Alert: [{tl.alert['id']} {tl.alert['rule']}]({base_url}/alerts/{tl.alert['id']}), "
                     f"state {tl.alert.get('state')}")
    lines += ["", "## Summary", ""]
    spans = alert_spans(tl)
    if spans:
        for s in spans:
            labels = _labels(s["labels"])
            end = f"resolved {_time(s['resolved'])}" if s["resolved"] else "still firing at the window's end"
            lines.append(_inline(f"- Alert {s['alert_id']} {s['rule']}{' ' + labels if labels else ''} fired "
                                 f"{_time(s['fired'])}, {end}: {s['lasted']}."))
    else:
        lines.append("- No alert fired in the window.")
    actions = [e for e in tl.events if e.kind == "action"]
    if actions:
        lines.append(f"- Actions taken ({len(actions) + tl.more.get('action', 0)}):")
        lines += [f"  - {_time(e.at)} {_inline(e.summary)}" for e in actions]
    else:
        lines.append("- No operator action in the audit log in the window.")
    deploys = [e for e in tl.events if e.kind == "deploy"]
    if deploys:  # a suspect as often as an operator action: each one named
        lines.append(f"- Deploys ({len(deploys) + tl.more.get('deploy', 0)}):")
        lines += [f"  - {_time(e.at)} {_inline(e.summary)}" for e in deploys]
    counts = tl.counts()
    others = [f"{LABELS[k].lower()} {counts[k]}" for k in KINDS if k not in ("alert", "action", "deploy") and counts[k]]
    if others:
        lines.append(f"- Other events: {', '.join(others)}.")
    for kind, error in tl.unavailable.items():
        lines.append(f"- {LABELS[kind]} events not available: {error}.")
    lines += ["", "## Timeline", "", "| Time (UTC) | Kind | What happened | Link |", "|---|---|---|---|"]
    for e in tl.events:
        link = f"[open]({base_url}{e.path})" if e.path else ""
        lines.append(f"| {e.at.strftime('%Y-%m-%d %H:%M:%S')} | {_cell(LABELS[e.kind])} | {_cell(e.summary)} | {link} |")
    if not tl.events:
        lines.append("| | | nothing recorded in the window | |")
    for kind, n in tl.more.items():
        lines.append(f"\n{n} more {LABELS[kind].lower()} event(s) in the window are not listed (at most {CAP} per kind).")
    lines += ["", "## Impact", "", "_Who or what was affected, for how long._", "",
              "## Root cause", "", "_What caused it._", "",
              "## Follow-ups", "", "- [ ] ", ""]
    return "\n".join(lines)


__all__ = ["CAP", "KINDS", "LABELS", "Event", "Timeline", "WindowError", "alert_spans", "alert_window", "build",
           "markdown", "summary_of", "title_of", "window"]
