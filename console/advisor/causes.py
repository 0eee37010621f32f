"""Known causes: what, present at the same time as a rising figure, explains it better than
"the workload is outgrowing PostgreSQL" does, with its fix.

Three kinds, each read the same way by the checks (live) and by the verdict (over the history):

- **an xmin horizon holder** (a session idle in a transaction, a long transaction, a replication
  slot, a prepared transaction, a standby's feedback): vacuum cannot remove the dead rows the
  claims walk past. The checks read the advisor's `xmin_holders`; the verdict reads the horizon
  collector's details (`skiplock.collection_runs.details.xmin_holders`) and its
  `xmin_horizon_age_seconds` series. Both have the collector's vocabulary (kind, pid,
  application, age), and `holder_cause` words them, so the page names one holder one way.
- **held-back work**: a paused queue, or a queue or kind with a concurrency or rate limit, with
  jobs at the head of the claim index. The workers' claim leaves that work alone and walks past
  it (sql/queue.sql `claim`), so its backlog makes every claim dearer.
- **an operator's change** in the audit log shortly before (a pause, a limit, a bulk replay or
  purge, maintenance run by hand): `LOAD_CHANGES` lists the actions that change the queue's load.

A `Cause` says what it is (`text`) and what to do (`fix`); `sentence()` joins them. This module
only reads (bounded: the queues and limits tables, at most `HEAD` entries of the claim index,
at most `CHANGES_LIMIT` audit rows through audit_log_at_idx); it decides nothing about levels
(the checks and the verdict do) and renders nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from console.advisor.base import count, seconds
from console.sqlfiles import query

HOLDER_PRESENT_S = 60.0  # verdict: a sample counts as "a holder was there" from this age on
HOLDER_XID_STUCK = 1_000_000  # a slot's or standby's hold has no time: judged by transactions behind
BACKLOG_MIN = 100  # jobs of held-back work at the head of the claim index that count as a cause
HEAD = 5_000  # claim-index entries read to find them (the retry-caps check reads as many)
CHANGES_BEFORE = timedelta(minutes=30)  # "shortly before": as an alert's "what changed" (console.alerts.context)
CHANGES_LIMIT = 20

# Audit actions that change the queue's load: pausing and limiting claims, bulk changes of many
# rows (dead rows, WAL, a released backlog), maintenance run by hand, and ending a horizon holder
# or a lock blocker (vacuum catches up, waiting claims go through, a worker's session may die). Every action the code
# records is in one of these two lists (tests/test_advisor_causes.py reads the code for them),
# so a new action has to be placed.
LOAD_CHANGES = ("pause", "resume", "set limits", "clear limits", "replay", "edit_replay", "purge", "cancel",
                "resume_operation", "enqueue", "archive", "reap", "retention", "periodic_pause", "periodic_resume",
                "periodic_run_now", "backend_cancel", "backend_terminate",
                "set backend", "move queue")  # a queue's new jobs go to the broker, or come back (docs/exit-plan.md)
NO_LOAD_CHANGES = ("login", "user_add", "user_update", "user_disable", "user_enable", "sessions_revoke",
                   "token_create", "token_revoke", "alert_acknowledge", "alert_silence", "alert_unsilence",
                   "alert_rule_save", "alert_rule_delete", "alert_destination_save", "alert_destination_delete",
                   "error_group_ignore", "error_group_unignore")

HOLDER, HELD_BACK, CHANGE = "xmin-holder", "held-back-work", "operator-change"


@dataclass
class Cause:
    kind: str  # HOLDER / HELD_BACK / CHANGE
    subject: str  # who or what: "pid 4121", "queue mail", "audit row 17"
    text: str  # what it is, one clause
    fix: str  # what to do, one clause
    since: datetime | None = None  # when it began, when known
    data: dict[str, Any] = field(default_factory=dict)

    def sentence(self, then: str = "") -> str:
        """"<text>: <fix>" and, for a figure it drives, what follows ("claims recover once
        vacuum runs")."""
        return f"{self.text}: {self.fix}" + (f"; {then}" if then else "")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "text": self.text, "fix": self.fix,
                "since": self.since.isoformat() if self.since else None}


# --- xmin horizon holders ---------------------------------------------------------------------


def _quoted(value: Any) -> str:
    """A value as an SQL string literal in a sentence (a gid may hold quotes)."""
    return "'" + str(value).replace("'", "''") + "'"


def holder_cause(row: dict[str, Any], *, age_s: float | None = None) -> Cause:
    """One holder in words. `row` is a `xmin_holders` row of the advisor or a holder of the
    horizon collector's details (kind in the collector's vocabulary, as holder_kind or kind);
    `age_s` overrides the row's age (the collector's details are a cycle old)."""
    kind = row.get("holder_kind") or row["kind"]
    age = row.get("age_s") if age_s is None else age_s
    pid = row.get("pid")
    app = row.get("application_name") or "no application_name"
    held = f"for {seconds(age)}" if age is not None else f"{count(row.get('xid_age'))} transactions back"
    ident = row.get("id")
    if kind == "idle_in_transaction":
        text = f"an idle-in-transaction session (pid {pid}, app {app}) holds the xmin horizon {held}"
        fix = f"end it (pg_terminate_backend({pid}))"
    elif kind == "transaction":
        text = f"a transaction (pid {pid}, app {app}) holds the xmin horizon {held}"
        fix = f"end it if it is not meant to run this long (pg_cancel_backend({pid}), then pg_terminate_backend({pid}))"
    elif kind == "replication_slot":
        text = f"replication slot {ident} ({row.get('state') or 'state unknown'}) holds the xmin horizon {held}"
        fix = f"drop it if its consumer is gone for good (pg_drop_replication_slot({_quoted(ident)}))"
    elif kind == "prepared_transaction":
        text = f"prepared transaction {_quoted(ident)} holds the xmin horizon {held}"
        fix = f"finish it from its coordinator, or ROLLBACK PREPARED {_quoted(ident)}"
    else:  # standby feedback
        text = f"standby {app} (pid {pid}, hot_standby_feedback) holds the xmin horizon {held}"
        fix = "end the long query on the standby, or lower max_standby_streaming_delay there"
    subject = f"pid {pid}" if kind in ("idle_in_transaction", "transaction") else f"{kind.replace('_', ' ')} {ident}"
    return Cause(HOLDER, subject, text, fix, data={"holder_kind": kind, "id": ident, "pid": pid,
                                                     "application_name": row.get("application_name"),
                                                     "age_s": age, "xid_age": row.get("xid_age")})


def the_holder(rows: list[dict[str, Any]], min_age_s: float) -> dict[str, Any] | None:
    """The holder to name: among those held at least `min_age_s` (or, with no time of their own,
    a million transactions back), the one held longest; one with no time only when none has."""
    counted = [h for h in rows if (h.get("age_s") is not None and h["age_s"] >= min_age_s)
               or (h.get("age_s") is None and (h.get("xid_age") or 0) >= HOLDER_XID_STUCK)]
    if not counted:
        return None
    return max(counted, key=lambda h: (h.get("age_s") is not None, h.get("age_s") or 0.0, h.get("xid_age") or 0))


# --- held-back work: paused and limited queues, limited kinds --------------------------------


def held_back_work(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    """Paused queues, limited queues and limited kinds with their jobs at the head of the claim
    index (`waiting`, `eligible`, `oldest_eligible_s`), running jobs and tokens now. `cur` must
    return dict rows."""
    cur.execute(query("advisor", "held_back_work"), {"cap": HEAD})
    return cur.fetchall()


def _limits_text(row: dict[str, Any]) -> str:
    parts = []
    if row.get("concurrency"):
        parts.append(f"concurrency {row['concurrency']}, {row['running']} running")
    if row.get("rate_count"):
        parts.append(f"rate {row['rate_count']}/{'s' if row['rate_period'] == 1 else 'm'}, "
                     f"{(row.get('tokens') or 0):.1f} tokens left")
    return "; ".join(parts)


def at_limit(row: dict[str, Any]) -> bool:
    if row.get("concurrency") and (row.get("running") or 0) >= row["concurrency"]:
        return True
    return bool(row.get("rate_count")) and (row.get("tokens") or 0.0) < 1.0


def held_back_cause(row: dict[str, Any], now: datetime) -> Cause:
    waiting = f"{count(row['waiting'])}{'+' if row['waiting'] >= HEAD else ''} jobs"
    oldest = f", the oldest eligible for {seconds(row['oldest_eligible_s'])}" if row.get("oldest_eligible_s") is not None else ""
    where = f"{waiting} at the head of the claim index{oldest}, which every claim walks past"
    if row["unit"] == "queue" and row["paused"]:
        since = row.get("paused_at")
        by = f" by {row['paused_by']}" if row.get("paused_by") else ""
        ago = f" {seconds((now - since).total_seconds())} ago" if since else ""
        text = f"queue {row['name']} is paused ({'paused' + by + ago}) with {where}"
        fix = f"resume it once its incident allows (skiplock resume {row['name']}, or Resume on its queue page)"
    else:
        since = row.get("limited_since")
        state = "at its limit" if at_limit(row) else "limited"
        text = f"{row['unit']} {row['name']} is {state} ({_limits_text(row)}) with {where}"
        fix = (f"raise or clear the limit if it is no longer needed (skiplock queues set {row['name']} ...)"
               if row["unit"] == "queue" else
               f"raise the kind's concurrency in the code that declares it (@console.task({_quoted(row['name'])}, concurrency=N))")
    return Cause(HELD_BACK, f"{row['unit']} {row['name']}", text, fix, since,
                 data={"unit": row["unit"], "name": row["name"], "waiting": row["waiting"], "paused": row["paused"]})


def held_back_causes(rows: list[dict[str, Any]], now: datetime) -> list[Cause]:
    """The held-back work large enough to make claims dearer, largest first."""
    return [held_back_cause(r, now) for r in rows if (r.get("waiting") or 0) >= BACKLOG_MIN]


# --- operator changes -------------------------------------------------------------------------


_CHANGE_FIX = {
    "pause": "resume the queue once its incident allows: its backlog waits at the head of the claim index meanwhile",
    "set limits": "a limit holds its queue's jobs back at the head of the claim index: raise or clear it if it is not meant",
    "clear limits": "the queue's held-back jobs are claimed at once: the figure should settle when that backlog is gone",
    "resume": "the queue's backlog is claimed at once: the figure should settle when it is gone",
    "backend_cancel": ("a holder's or a blocker's query was cancelled: vacuum can remove the dead rows it held and "
                       "waiting claims go through; the figure should settle once autovacuum has run"),
    "backend_terminate": ("a holder's or a blocker's session was ended: vacuum can remove the dead rows it held and "
                          "waiting claims go through (a worker's session: its leases expire to the reaper); the figure "
                          "should settle once autovacuum has run"),
    "edit_replay": ("a dead letter was edited and replayed (perhaps into another queue or at another priority): "
                    "see whether it failed again, and whether its new queue keeps up"),
}
_BULK_FIX = ("a change of many rows leaves dead rows and WAL until vacuum catches up: see whether the figure settles "
             "once it has finished and vacuum has run; if it stays, it is the workload's")


def change_cause(row: dict[str, Any], onset: datetime | None = None) -> Cause:
    rows = f", {count(row['rows'])} rows" if row.get("rows") is not None else ""
    reason = f", reason: {' '.join(str(row['reason']).split())[:120]}" if row.get("reason") else ""
    when = f"{row['at']:%Y-%m-%d %H:%M} UTC"
    if onset is not None:
        delta = (onset - row["at"]).total_seconds()
        when += f", {seconds(abs(delta))} {'before' if delta >= 0 else 'after'} the rise began"
    text = (f"an operator's change shortly before: {row['actor']} ran {row['action']!r} on {row.get('target') or 'everything'}"
            f" ({when}{rows}{reason}; audit row {row['id']})")
    return Cause(CHANGE, f"audit row {row['id']}", text, _CHANGE_FIX.get(row["action"], _BULK_FIX), row["at"],
                 data={"audit_id": row["id"], "action": row["action"], "actor": row["actor"]})


def operator_changes(cur: psycopg.Cursor, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Load-changing audit rows in [since, until], newest first. `cur` must return dict rows."""
    cur.execute(query("advisor", "operator_changes"),
                {"since": since, "until": until, "actions": list(LOAD_CHANGES), "limit": CHANGES_LIMIT})
    return cur.fetchall()
