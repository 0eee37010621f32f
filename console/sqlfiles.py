"""Named queries loaded from `sql/<concern>.sql`.

A file holds queries separated by header comments:

    -- name: claim
    -- Claims up to %(limit)s eligible jobs ...
    WITH candidates AS (...)

Parameters use psycopg's `%(name)s` style, so every value is bound, never interpolated.
Identifiers that vary are composed with `psycopg.sql` by the caller, never here.
"""

from __future__ import annotations

import re
from functools import cache

from console.resources import resource_dir

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a SQL file's text into {name: statement}; a name may appear only once."""
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        if not body:
            raise ValueError(f"query {name!r} has no statement")
        queries[name] = body
    return queries


@cache
def queries(concern: str) -> dict[str, str]:
    """The named queries of `sql/<concern>.sql`, parsed once per process."""
    path = resource_dir("sql") / f"{concern}.sql"
    return parse_queries(path.read_text(encoding="utf-8"))


def query(concern: str, name: str) -> str:
    try:
        return queries(concern)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in sql/{concern}.sql") from None
