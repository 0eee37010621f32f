"""What the console remembers of each error group, and an operator's ignore / unignore.

    state_of(group, now, new_for)  -> "new", "regressed", "ignored" or None (nothing changed)
    ignore(conn, "KeyError: <str>", actor="alice", reason="INC-7: known, fixed in 4.2")
    unignore(conn, "KeyError: <str>", actor="alice", reason="4.2 is out: tell us again")

The memory (skiplock.error_groups) is written by the errorgroups collector
(console/collectors/errorgroups.py, which says when a group is new or regressed); this module
reads it for the faces and changes only who ignores a group. An ignored group never alerts: the
collector leaves it out of the `error_group_new` series, so a firing alert of it resolves at the
next cycle. Both actions are audited (`error_group_ignore`, `error_group_unignore`) with the
fingerprint as the selection, in the transaction of the change.

The faces require the reason (console.actions.ACTIONS); this module records what it is given.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import audit
from console.sqlfiles import query

MAX_FINGERPRINT = 1000  # a fingerprint is at most ~350 characters (console.fingerprint); more is a mistake


class GroupError(ValueError):
    """An ignore or unignore that cannot be done as asked (the message says why)."""


class GroupNotFound(GroupError):
    pass


class GroupState(GroupError):
    """Already ignored (ignore), or not ignored (unignore)."""


def _rows(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("error_groups", name), params)
        return cur.fetchall() if cur.description else []


def get(conn: psycopg.Connection, fingerprint: str) -> dict[str, Any] | None:
    """The remembered group (first and last seen, kinds, queues, example, change, ignore), or None."""
    found = _rows(conn, "get", {"fingerprint": fingerprint})
    return found[0] if found else None


def remembered(conn: psycopg.Connection, fingerprints: list[str]) -> dict[str, dict[str, Any]]:
    """{fingerprint: remembered group} for the ones the console has a row for."""
    if not fingerprints:
        return {}
    return {r["fingerprint"]: r for r in _rows(conn, "get_many", {"fingerprints": list(fingerprints)})}


def state_of(group: dict[str, Any] | None, now: datetime, new_for: timedelta) -> str | None:
    """"ignored" (an operator ignores it), "new" or "regressed" (its change began within
    `new_for` before `now`: it is what the new_error_group alert is about), else None."""
    if not group:
        return None
    if group.get("ignored_at"):
        return "ignored"
    if group.get("change") and group.get("change_at") and group["change_at"] > now - new_for:
        return group["change"]
    return None


def recent_changes(conn: psycopg.Connection, since: datetime, until: datetime, *, limit: int = 100) -> list[dict[str, Any]]:
    """Groups that became new or regressed in [since, until], newest first (the timeline)."""
    return _rows(conn, "recent_changes", {"since": since, "until": until, "limit": limit})


def _check(fingerprint: Any, actor: str) -> str:
    if not isinstance(fingerprint, str) or not fingerprint.strip():
        raise GroupError("fingerprint: required (the error group, as the dead-letters page lists it)")
    if len(fingerprint) > MAX_FINGERPRINT:
        raise GroupError(f"fingerprint: at most {MAX_FINGERPRINT} characters (got {len(fingerprint)})")
    if not actor:
        raise GroupError("an ignore needs the name of who does it")
    return fingerprint


def ignore(conn: psycopg.Connection, fingerprint: str, *, actor: str, reason: str | None) -> dict[str, Any]:
    """Ignore the group: it never alerts until unignored. A group the console has no row for
    yet (it failed before the collector watched) is remembered from its dead letters; one with
    neither is GroupNotFound, one already ignored GroupState."""
    fingerprint = _check(fingerprint, actor)
    with conn.transaction():
        group = get(conn, fingerprint)
        if group is None:
            span = _rows(conn, "dead_letter_span", {"fingerprint": fingerprint})[0]
            if span["first_seen"] is None:
                raise GroupNotFound(f"no error group {fingerprint!r}: no dead letter has that fingerprint "
                                    "(the dead-letters page lists them)")
        elif group["ignored_at"] is not None:
            raise GroupState(f"error group {fingerprint!r} is already ignored (by {group['ignored_by']})")
        else:
            span = {k: group[k] for k in ("first_seen", "last_seen", "kinds", "queues", "example", "example_job")}
        row = _rows(conn, "ignore", {**span, "fingerprint": fingerprint, "actor": actor, "reason": reason})
        if not row:  # ignored by someone else between the read and the write
            raise GroupState(f"error group {fingerprint!r} is already ignored")
        audit.record(conn, actor=actor, action="error_group_ignore", target=f"error_group:{fingerprint}"[:300],
                     selection={"fingerprint": fingerprint}, reason=reason, rows=1)
    return row[0]


def unignore(conn: psycopg.Connection, fingerprint: str, *, actor: str, reason: str | None) -> dict[str, Any]:
    """Let the group alert again (the next time it is new or regressed)."""
    fingerprint = _check(fingerprint, actor)
    with conn.transaction():
        row = _rows(conn, "unignore", {"fingerprint": fingerprint})
        if not row:
            if get(conn, fingerprint) is None:
                raise GroupNotFound(f"no error group {fingerprint!r} is ignored (the console has no such group)")
            raise GroupState(f"error group {fingerprint!r} is not ignored")
        audit.record(conn, actor=actor, action="error_group_unignore", target=f"error_group:{fingerprint}"[:300],
                     selection={"fingerprint": fingerprint}, reason=reason, rows=1)
    return row[0]


__all__ = ["GroupError", "GroupNotFound", "GroupState", "get", "ignore", "recent_changes", "remembered", "state_of",
           "unignore"]
