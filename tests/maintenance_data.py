"""Rows for the maintenance tests, written straight into the jobs table (fast and exact):
completed jobs finished some time ago, dead letters with fingerprints and histories."""

from __future__ import annotations

from datetime import timedelta

import psycopg


def add_completed(conn: psycopg.Connection, n: int, *, age: timedelta = timedelta(hours=2),
                  queue: str = "default", kind: str = "done") -> list[int]:
    rows = conn.execute(
        """
        INSERT INTO skiplock.jobs (queue, kind, payload, status, attempts, finished_at, created_at)
        SELECT %s, %s, jsonb_build_object('n', g), 'completed', 1,
               now() - %s::interval + g * interval '1 millisecond', now() - %s::interval - interval '1 minute'
        FROM generate_series(1, %s) AS g
        RETURNING id
        """,
        (queue, kind, age, age, n),
    ).fetchall()
    return [r[0] for r in rows]


def add_failed(conn: psycopg.Connection, n: int, *, queue: str = "default", kind: str = "doomed",
               fingerprint: str = "RuntimeError: boom <n>", age: timedelta = timedelta(minutes=30),
               payload_key: str = "order") -> list[int]:
    rows = conn.execute(
        """
        INSERT INTO skiplock.jobs (queue, kind, payload, status, attempts, max_attempts, last_error,
                                   error_fingerprint, errors, finished_at)
        SELECT %(queue)s, %(kind)s, jsonb_build_object(%(key)s::text, g, 'tenant', g %% 3), 'failed', 5, 5,
               'RuntimeError: boom ' || g, %(fp)s,
               jsonb_build_array(jsonb_build_object('attempt', 5, 'error_class', 'RuntimeError', 'message', 'boom')),
               now() - %(age)s::interval + g * interval '1 millisecond'
        FROM generate_series(1, %(n)s) AS g
        RETURNING id
        """,
        {"queue": queue, "kind": kind, "fp": fingerprint, "age": age, "n": n, "key": payload_key},
    ).fetchall()
    return [r[0] for r in rows]


def live_and_archived_ids(conn: psycopg.Connection) -> tuple[list[int], list[int]]:
    live = [r[0] for r in conn.execute("SELECT id FROM skiplock.jobs ORDER BY id")]
    archived = [r[0] for r in conn.execute("SELECT id FROM skiplock.jobs_archive ORDER BY id")]
    return live, archived


def replay_entries(conn: psycopg.Connection, op_id: int | None = None) -> dict[int, int]:
    """{job id: number of 'replay' history entries (of this operation, when given)}."""
    rows = conn.execute(
        """
        SELECT j.id, count(e) FILTER (WHERE e->>'event' = 'replay'
                                      AND (%(op)s::bigint IS NULL OR (e->>'operation')::bigint = %(op)s::bigint))
        FROM skiplock.jobs AS j
        LEFT JOIN LATERAL jsonb_array_elements(j.errors) AS e ON true
        GROUP BY j.id
        """,
        {"op": op_id},
    ).fetchall()
    return {r[0]: r[1] for r in rows}
