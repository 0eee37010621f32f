"""Dead letters: error groups, selections, previews.

A `Selection` says which dead letters an operator means: a list of ids, or a filter (queue,
kind, error fingerprint, failed-at range, payload containment `@>`), or explicitly all of them.
Whatever it says, only jobs with status 'failed' are ever matched: the filter is always ANDed
with `status = 'failed'` in SQL (sql/deadletters.sql, fragment `selection`).

A `Preview` is what the operator confirms: the exact count, a sample, and the snapshot a
start is bound to (`Previewed`: the count, the highest matching id, the preview's time and a
hash of the normalised selection). `bulk.start(..., preview=...)` refuses when the selection no
longer matches exactly that, and never touches a job with a higher id.

Reads walk the partial index `jobs_failed_idx`, so they cost what the dead-letter set costs,
and run under a statement timeout. This module changes nothing; bulk.py replays and purges.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from console import jsonbounds
from console.db import time_limited
from console.jsonbounds import MAX_DEPTH, depth_of
from console.maintenance.errors import InvalidSelection
from console.sqlfiles import query
from console.timefmt import bounded, parse_instant

FILTER_KEYS = ("ids", "queue", "kind", "fingerprint", "failed_since", "failed_before", "payload")
MAX_IDS = 100_000
GROUP_NAMES = 10  # queues and kinds named per error group; the rest are counted
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
                if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= 2**63 - 1:
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
            if depth_of(self.payload, stop_after=MAX_DEPTH) > MAX_DEPTH:
                raise InvalidSelection(f"payload: JSON nested deeper than {MAX_DEPTH} levels")
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
                values["payload"] = jsonbounds.loads(values["payload"], "payload")
            except jsonbounds.TooDeep as exc:
                raise InvalidSelection(str(exc)) from None
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


def selection_hash(selection: Selection | Mapping[str, Any]) -> str:
    """SHA-256 of the normalised selection (`to_dict()`, keys sorted): the same filter written
    two ways (ids in another order, a time with another offset) hashes the same."""
    canonical = json.dumps(as_selection(selection).to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


PREVIEW_FIELDS = ("expected", "max_id", "previewed_at", "selection_hash")


@dataclass(frozen=True)
class Previewed:
    """The preview a bulk start confirms: `total` jobs matched, none with an id above `max_id`,
    at `previewed_at` (database time), for the selection whose `selection_hash()` is given.

    The faces carry it as the form fields of PREVIEW_FIELDS (`expected` is the total)."""

    total: int
    max_id: int
    previewed_at: datetime
    selection_hash: str

    def as_fields(self) -> dict[str, Any]:
        return {"expected": self.total, "max_id": self.max_id, "previewed_at": self.previewed_at.isoformat(),
                "selection_hash": self.selection_hash}

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> Previewed | None:
        """From form or API fields: None when none is given; all four or InvalidSelection naming
        the missing or malformed ones."""
        given = {k: str(values.get(k) or "").strip() for k in PREVIEW_FIELDS}
        if not any(given.values()):
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise InvalidSelection(f"the preview being confirmed is incomplete: missing {', '.join(missing)} "
                                   "(send back every field of the preview's `confirm`)")
        for name in ("expected", "max_id"):
            if not given[name].isdigit():
                raise InvalidSelection(f"{name}: {given[name]!r} is not a whole number from the preview")
        at = _parse_time("previewed_at", given["previewed_at"])
        digest = given["selection_hash"].lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidSelection("selection_hash: not the preview's hash (64 hexadecimal digits)")
        return cls(total=int(given["expected"]), max_id=int(given["max_id"]), previewed_at=at, selection_hash=digest)


@dataclass
class Preview:
    """What a replay or purge would touch: exact count, a sample, the filter as understood, and
    the snapshot a start is bound to (`bound()`; None when nothing matches)."""

    total: int
    sample: list[dict[str, Any]]
    selection: dict[str, Any]
    description: str
    max_id: int | None = None
    previewed_at: datetime | None = None
    selection_hash: str | None = None

    def bound(self) -> Previewed | None:
        if not self.total or self.max_id is None or self.previewed_at is None or self.selection_hash is None:
            return None
        return Previewed(self.total, self.max_id, self.previewed_at, self.selection_hash)

    def as_dict(self) -> dict[str, Any]:
        bound = self.bound()
        return {"total": self.total, "sample": self.sample, "selection": self.selection, "description": self.description,
                "max_id": self.max_id, "previewed_at": self.previewed_at, "selection_hash": self.selection_hash,
                "confirm": bound.as_fields() if bound else None}


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


def last_attempt_logs(conn: psycopg.Connection, job_id: int, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> dict[str, Any] | None:
    """The log records of a dead letter's last attempt that logged (an `attempt_logs` entry,
    console.queue.joblogs), as stored, or None when it logged nothing or is no dead letter."""
    with time_limited(conn, timeout_ms) as cur:
        row = cur.execute(query("deadletters", "last_attempt_logs"), {"id": job_id}).fetchone()
    entry = row["entry"] if row else None
    return entry if isinstance(entry, dict) else None


def preview(
    conn: psycopg.Connection,
    selection: Selection | Mapping[str, Any],
    *,
    sample: int = 10,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> Preview:
    """Exact count, the newest `sample` rows, the selection as understood, and the snapshot a
    start will be bound to (highest matching id, time, selection hash). Changes nothing."""
    sel = as_selection(selection)
    with time_limited(conn, timeout_ms) as cur:
        snap = cur.execute(selection_query("preview_snapshot"), sel.params()).fetchone()
    total = snap["total"]
    rows = list_dead_letters(conn, sel, limit=max(1, min(sample, 1000)), timeout_ms=timeout_ms) if total and sample else []
    if snap["max_id"] is not None:  # the sample shows only jobs the bound lets through
        rows = [r for r in rows if r["id"] <= snap["max_id"] and r["finished_at"] <= snap["previewed_at"]]
    return Preview(total=total, sample=rows, selection=sel.to_dict(), description=sel.describe(),
                   max_id=snap["max_id"], previewed_at=snap["previewed_at"], selection_hash=selection_hash(sel))


def groups(
    conn: psycopg.Connection,
    *,
    queue: str | None = None,
    kind: str | None = None,
    limit: int = 50,
    offset: int = 0,
    names: int = GROUP_NAMES,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> list[dict[str, Any]]:
    """Error groups: {fingerprint, count, first_seen, last_seen, queues, kinds, queue_count,
    kind_count, total_groups, example}, largest first, `limit` of them from `offset`. `queues`
    and `kinds` name at most `names` of each (`queue_count`, `kind_count` count them all);
    `total_groups` counts every group. Replay or purge a group with `Selection(fingerprint=...)`."""
    if not 1 <= limit <= 1000:
        raise InvalidSelection("limit must be between 1 and 1000")
    if not 0 <= offset <= 10**9:
        raise InvalidSelection("offset must be between 0 and 1,000,000,000")
    with time_limited(conn, timeout_ms) as cur:
        return cur.execute(query("deadletters", "groups"), {"queue": queue, "kind": kind, "limit": limit,
                                                            "offset": offset, "names": names}).fetchall()


def nearest_groups(conn: psycopg.Connection, text: str, *, limit: int = 3,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[str]:
    """The error groups' fingerprints nearest to `text`, best first: what an operator most
    likely meant by a `--group` that matches nothing. Compared with each group's fingerprint and
    with its example message (the pages show the message, `KeyError: 'customer_id'`, while the
    group is `KeyError: <str>`), so a message copied from a page finds its group."""
    import difflib

    found = groups(conn, limit=1000, timeout_ms=timeout_ms)
    candidates: dict[str, str] = {}  # what to compare with -> the fingerprint it stands for
    for g in found:
        candidates.setdefault(g["fingerprint"], g["fingerprint"])
        if g.get("example"):
            candidates.setdefault(str(g["example"])[:500], g["fingerprint"])
    out: list[str] = []
    for match in difflib.get_close_matches(text, list(candidates), n=limit * 2, cutoff=0.6):
        if candidates[match] not in out:
            out.append(candidates[match])
    return out[:limit]


def group_hint(conn: psycopg.Connection, fingerprint: str | None) -> str:
    """"; did you mean --group '...'?" for a fingerprint no dead letter has, or ""."""
    if not fingerprint:
        return ""
    near = [g for g in nearest_groups(conn, fingerprint) if g != fingerprint]
    if not near:
        return "; no error group resembles it (`skiplock dead-letters` lists them)"
    return "; the nearest error group" + (" is " if len(near) == 1 else "s are ") + " or ".join(repr(g) for g in near)
