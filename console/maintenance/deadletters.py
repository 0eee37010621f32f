"""Dead letters: error groups, selections, previews.

A `Selection` says which dead letters an operator means: a list of ids, or a filter (queue,
kind, error fingerprint, failed-at range, payload containment `@>`), or explicitly all of them.
Whatever it says, only jobs with status 'failed' are ever matched: the filter is always ANDed
with `status = 'failed'` in SQL (sql/deadletters.sql, fragment `selection`).

Reads walk the partial index `jobs_failed_idx`, so they cost what the dead-letter set costs,
and run under a statement timeout. This module changes nothing; bulk.py replays and purges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from console.db import time_limited
from console.maintenance.errors import InvalidSelection
from console.sqlfiles import query
from console.timefmt import bounded, parse_instant

FILTER_KEYS = ("ids", "queue", "kind", "fingerprint", "failed_since", "failed_before", "payload")
MAX_IDS = 100_000
DEFAULT_TIMEOUT_MS = 5000


def _parse_time(name: str, value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return parse_instant(value, name, relative=False, error=InvalidSelection)
    if not isinstance(value, datetime):
        raise InvalidSelection(f"{name}: {value!r} is not a date-time")
    return bounded(value, name, error=InvalidSelection)  # a time without zone is read as UTC


def _text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidSelection(f"{name} must be a non-empty string (got {value!r})")
    return value.strip() if name != "fingerprint" else value


@dataclass(frozen=True)
class Selection:
    """Which dead letters. At least one filter, or `all=True` (and then no filter)."""

    ids: tuple[int, ...] | None = None
    queue: str | None = None
    kind: str | None = None
    fingerprint: str | None = None
    failed_since: datetime | None = None
    failed_before: datetime | None = None
    payload: dict[str, Any] | None = None
    all: bool = False

    def __post_init__(self) -> None:
        ids = self.ids
        if ids is not None:
            if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
                raise InvalidSelection(f"ids must be a list of job ids (got {ids!r})")
            ids = tuple(ids)
            if not ids:
                raise InvalidSelection("ids is an empty list: name at least one job id")
            for job_id in ids:
                if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
                    raise InvalidSelection(f"ids: {job_id!r} is not a job id (a positive whole number)")
            if len(ids) > MAX_IDS:
                raise InvalidSelection(f"ids: at most {MAX_IDS:,} ids at once; use a filter for more")
            object.__setattr__(self, "ids", tuple(sorted(set(ids))))
        for name in ("queue", "kind", "fingerprint"):
            object.__setattr__(self, name, _text(name, getattr(self, name)))
        since = _parse_time("failed_since", self.failed_since)
        before = _parse_time("failed_before", self.failed_before)
        if since is not None and before is not None and since >= before:
            raise InvalidSelection(
                f"impossible date range: failed_since ({since.isoformat()}) is not before failed_before ({before.isoformat()})")
        object.__setattr__(self, "failed_since", since)
        object.__setattr__(self, "failed_before", before)
        if self.payload is not None:
            if not isinstance(self.payload, dict):
                raise InvalidSelection(f"payload must be a JSON object to match with @> (got {self.payload!r})")
            try:
                json.dumps(self.payload, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidSelection(f"payload is not JSON: {exc}") from None
        if not isinstance(self.all, bool):
            raise InvalidSelection("all must be true or false")
        has_filter = any(getattr(self, k) is not None for k in FILTER_KEYS)
        if self.all and has_filter:
            raise InvalidSelection("`all` selects every dead letter; it cannot be combined with filters")
        if not self.all and not has_filter:
            raise InvalidSelection(
                "a selection needs at least one filter (ids, queue, kind, fingerprint, failed_since, "
                "failed_before, payload) or all=true")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Selection:
        """From JSON-ish input (the web form, the API, a stored operation); unknown keys refused."""
        if not isinstance(data, Mapping):
            raise InvalidSelection("a selection must be an object of filters")
        unknown = set(data) - set(FILTER_KEYS) - {"all"}
        if unknown:
            raise InvalidSelection(f"unknown filter(s): {', '.join(sorted(unknown))}; known: {', '.join(FILTER_KEYS)}, all")
        values = {k: v for k, v in data.items() if v is not None}
        if isinstance(values.get("payload"), str):
            try:
                values["payload"] = json.loads(values["payload"])
            except json.JSONDecodeError as exc:
                raise InvalidSelection(f"payload is not valid JSON: {exc}") from None
        if "all" in values and not isinstance(values["all"], bool):
            raise InvalidSelection("all must be true or false")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able and stable: what the audit log and the operation row store."""
        out: dict[str, Any] = {}
        if self.all:
            out["all"] = True
        if self.ids is not None:
            out["ids"] = list(self.ids)
        for name in ("queue", "kind", "fingerprint"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("failed_since", "failed_before"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).isoformat()
        if self.payload is not None:
            out["payload"] = self.payload
        return out

    def describe(self) -> str:
        """The filter as understood, in words."""
        if self.all:
            return "every dead letter (status = failed)"
        parts = []
        if self.ids is not None:
            shown = ", ".join(str(i) for i in self.ids[:10]) + (f" and {len(self.ids) - 10} more" if len(self.ids) > 10 else "")
            parts.append(f"id in ({shown})")
        for name in ("queue", "kind", "fingerprint"):
            if getattr(self, name) is not None:
                parts.append(f"{name} = {getattr(self, name)!r}")
        if self.failed_since is not None:
            parts.append(f"failed at or after {self.failed_since.isoformat()}")
        if self.failed_before is not None:
            parts.append(f"failed before {self.failed_before.isoformat()}")
        if self.payload is not None:
            parts.append(f"payload contains {json.dumps(self.payload, sort_keys=True)}")
        return "dead letters (status = failed) with " + " and ".join(parts)

    def params(self) -> dict[str, Any]:
        """Bound parameters for the `selection` SQL fragment."""
        return {
            "ids": list(self.ids) if self.ids is not None else None,
            "queue": self.queue,
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "failed_since": self.failed_since,
            "failed_before": self.failed_before,
            "payload": Jsonb(self.payload) if self.payload is not None else None,
        }


def as_selection(selection: Selection | Mapping[str, Any]) -> Selection:
    return selection if isinstance(selection, Selection) else Selection.from_dict(selection)


@cache
def selection_query(name: str) -> str:
    """A query of sql/deadletters.sql with the shared `selection` fragment put in place."""
    text = query("deadletters", name)
    marker = "-- :selection"
    if marker not in text:
        raise KeyError(f"query {name!r} has no selection")
    return text.replace(marker, query("deadletters", "selection"))


@dataclass
class Preview:
    """What a replay or purge would touch: exact count, a sample, the filter as understood."""

    total: int
    sample: list[dict[str, Any]]
    selection: dict[str, Any]
    description: str

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "sample": self.sample, "selection": self.selection, "description": self.description}


def count(conn: psycopg.Connection, selection: Selection | Mapping[str, Any], *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
    sel = as_selection(selection)
    with time_limited(conn, timeout_ms) as cur:
        return cur.execute(selection_query("count_matching"), sel.params()).fetchone()["total"]


def list_dead_letters(
    conn: psycopg.Connection,
    selection: Selection | Mapping[str, Any] | None = None,
    *,
    limit: int = 50,
    before: tuple[datetime, int] | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> list[dict[str, Any]]:
    """Dead letters matching the selection (all when None), newest failure first.

    Page on with `before=(finished_at, id)` of the last row shown.
    """
    if not 1 <= limit <= 1000:
        raise InvalidSelection("limit must be between 1 and 1000")
    sel = Selection(all=True) if selection is None else as_selection(selection)
    params = {**sel.params(), "limit": limit,
              "before_finished_at": before[0] if before else None, "before_id": before[1] if before else None}
    with time_limited(conn, timeout_ms) as cur:
        return cur.execute(selection_query("list_matching"), params).fetchall()


def preview(
    conn: psycopg.Connection,
    selection: Selection | Mapping[str, Any],
    *,
    sample: int = 10,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> Preview:
    """Exact count, the newest `sample` rows, and the selection as understood. Changes nothing."""
    sel = as_selection(selection)
    total = count(conn, sel, timeout_ms=timeout_ms)
    rows = list_dead_letters(conn, sel, limit=max(1, min(sample, 1000)), timeout_ms=timeout_ms) if total and sample else []
    return Preview(total=total, sample=rows, selection=sel.to_dict(), description=sel.describe())


def groups(
    conn: psycopg.Connection,
    *,
    queue: str | None = None,
    kind: str | None = None,
    limit: int = 50,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> list[dict[str, Any]]:
    """Error groups: {fingerprint, count, first_seen, last_seen, queues, kinds, example}, largest
    first. Replay or purge a group with `Selection(fingerprint=...)`."""
    if not 1 <= limit <= 1000:
        raise InvalidSelection("limit must be between 1 and 1000")
    with time_limited(conn, timeout_ms) as cur:
        return cur.execute(query("deadletters", "groups"), {"queue": queue, "kind": kind, "limit": limit}).fetchall()
