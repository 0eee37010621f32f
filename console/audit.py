"""The audit log: who did what, to which selection, why, with how many rows, and the outcome.

Every operator action goes through `record()` — from the web UI, the API, the CLI and the
scheduler alike. Rows are only ever inserted (the table refuses UPDATE and DELETE).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console.actions import clean_reason
from console.sqlfiles import query

OUTCOMES = ("ok", "error", "cancelled", "started")


def record(
    conn: psycopg.Connection,
    *,
    actor: str,
    action: str,
    target: str | None = None,
    selection: Any = None,
    reason: str | None = None,
    rows: int | None = None,
    outcome: str = "ok",
    detail: Any = None,
) -> int:
    """Append one audit row (in the caller's transaction, if any) and return its id.

    `reason` follows console.actions' rule, whoever calls (a face, a script, the scheduler):
    blank or invisible-only is no reason (None); one or two visible characters, a control
    character or more than 500 characters raise ValueError. So no row says "why" with nothing."""
    reason = clean_reason(reason)
    if not actor or not action:
        raise ValueError("an audit row needs an actor and an action")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
    row = conn.execute(
        query("audit", "record"),
        {
            "actor": actor,
            "action": action,
            "target": target,
            "selection": None if selection is None else Jsonb(selection),
            "reason": reason,
            "rows": rows,
            "outcome": outcome,
            "detail": None if detail is None else Jsonb(detail),
        },
    ).fetchone()
    return row[0]


def search(
    conn: psycopg.Connection,
    *,
    actor: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be between 1 and 1000")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            query("audit", "search"),
            {"actor": actor, "action": action, "since": since, "until": until, "before_id": before_id, "limit": limit},
        ).fetchall()


def selection_text(selection: Any) -> str:
    """A selection in words, one `name value` pair after another, strings as typed (no JSON
    escapes): "fingerprint KeyError: <str> · queue mail", "ids 41, 42"."""
    if not selection:
        return ""
    if not isinstance(selection, dict):
        return json.dumps(selection, ensure_ascii=False)
    parts = []
    for key, value in selection.items():
        if isinstance(value, list):
            shown = ", ".join(str(v) for v in value[:10]) + (f" and {len(value) - 10} more" if len(value) > 10 else "")
        elif isinstance(value, str):
            shown = value
        else:
            shown = json.dumps(value, ensure_ascii=False, sort_keys=True)
        parts.append(f"{key.replace('_', ' ')} {shown}")
    return " · ".join(parts)
