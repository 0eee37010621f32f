"""The generic plan of a statement with named parameters: the plan a worker's prepared statement
settles on after five runs, which is the one that matters on the hot path."""

from __future__ import annotations

import re

import psycopg
import psycopg.sql


def generic_plan(conn: psycopg.Connection, sql_text: str, params: dict, options: str = "ANALYZE, COSTS OFF, TIMING OFF") -> str:
    """EXPLAIN (`options`) of `sql_text`'s generic plan, run on `params` and rolled back."""
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql_text)))  # each parameter once, in order: $1, $2, ...
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m[1]) + 1}", sql_text)
    cur = psycopg.ClientCursor(conn)
    with conn.transaction(force_rollback=True):
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute(f"PREPARE generic AS {text}")
        try:
            args = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[k]) for k in order)
            rows = cur.execute(psycopg.sql.SQL(f"EXPLAIN ({options}) EXECUTE generic ({{}})").format(args)).fetchall()
        finally:
            cur.execute("DEALLOCATE generic")
    return "\n".join(row[0] for row in rows)
