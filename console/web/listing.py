"""Lists a producer can make as long as it likes (queues, alerts per queue, error groups, the
verdict's reasons), shown worst first and a page at a time, with the rest counted.

A producer that writes to 5,000 queues, 2,000 kinds or 1,000 error messages decides how long
these lists are, so a page that shows them whole is as large as the producer wants: with 5,000
queues the overview was 11 MB and the alerts page 17 MB (issue 26, class 9). Every such list
goes through `page_of`: the caller sorts it (worst first), the request's `q` keeps the rows whose
name contains it, and one page of `web.list_limit` rows (or `limit=`, at most MAX_LIMIT) is shown
with the count of the others, so nothing is dropped without saying so ("4,900 more queues: search
by name or see the next page").

    shown = page_of(rows, name=lambda r: r["queue"], default_limit=config.web.list_limit)
    shown.rows, shown.total, shown.more, shown.next_page

This module does not sort (each list knows what "worst" means for it) and reads no database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flask import abort, request

from console.web.api import INT, STR, Param, opt

MAX_LIMIT = 1000
MAX_QUERY = 200

# The query parameters and answer fields of every such list in the API (console.web.api).
LIST_PARAMS = [
    Param("q", max_length=MAX_QUERY, description="only the rows whose name contains this (case-insensitive)"),
    Param("page", type="integer", minimum=1, maximum=10**9, description="which page, from 1"),
    Param("limit", type="integer", minimum=1, maximum=MAX_LIMIT, description="rows per page (default web.list_limit)"),
]
LIST_FIELDS = {"total": INT, "shown": INT, "more": INT, "page": INT, "pages": INT, "limit": INT, "q": opt(STR),
               "next_page": opt(INT)}


@dataclass
class Page:
    rows: list[Any]
    total: int            # rows that match the search (all rows without one)
    page: int             # 1-based
    limit: int
    query: str | None = None
    overall: int = 0      # rows before the search
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.limit))

    @property
    def more(self) -> int:
        """Matching rows not on this page (before it and after it)."""
        return self.total - len(self.rows)

    @property
    def next_page(self) -> int | None:
        return self.page + 1 if self.offset + len(self.rows) < self.total else None

    @property
    def previous_page(self) -> int | None:
        return self.page - 1 if self.page > 1 else None

    def as_dict(self) -> dict[str, Any]:
        """What an API answer says beside the rows."""
        return {"total": self.total, "shown": len(self.rows), "more": self.more, "page": self.page,
                "pages": self.pages, "limit": self.limit, "q": self.query, "next_page": self.next_page}


def args(default_limit: int) -> tuple[str | None, int, int]:
    """(q, page, limit) from the request: 400 naming the parameter when one is not usable."""
    query = (request.args.get("q") or "").strip() or None
    if query is not None and len(query) > MAX_QUERY:
        abort(400, f"q: longer than {MAX_QUERY} characters")
    page = _whole("page", 1, 1, 10**9)
    limit = _whole("limit", min(default_limit, MAX_LIMIT), 1, MAX_LIMIT)
    return query, page, limit


def _whole(name: str, default: int, low: int, high: int) -> int:
    raw = (request.args.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
        abort(400, f"{name}: must be a whole number from {low} to {high:,} (got {raw[:40]!r})")
    return int(raw)


def page_of(rows: Sequence[Any], *, name: Callable[[Any], str], default_limit: int,
            query: str | None = None, page: int | None = None, limit: int | None = None,
            from_request: bool = True) -> Page:
    """One page of `rows` (already in the order to show) after the search. The request's
    `q`, `page` and `limit` apply unless given, or when `from_request` is false."""
    if from_request:
        q_arg, page_arg, limit_arg = args(default_limit)
        query = q_arg if query is None else query
        page = page_arg if page is None else page
        limit = limit_arg if limit is None else limit
    page = page or 1
    limit = min(limit or default_limit, MAX_LIMIT)
    matching = [r for r in rows if query.lower() in name(r).lower()] if query else list(rows)
    start = (page - 1) * limit
    return Page(rows=matching[start:start + limit], total=len(matching), page=page, limit=limit, query=query,
                overall=len(rows))


def top(rows: Sequence[Any], limit: int) -> Page:
    """The first `limit` rows and the count of the rest (no search, no paging: a summary that
    links to the page that has both)."""
    return Page(rows=list(rows[:limit]), total=len(rows), page=1, limit=limit, overall=len(rows))
