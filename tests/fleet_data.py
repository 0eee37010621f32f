"""A wide fleet, as a careless producer makes one: thousands of queues, kinds and error groups.

`seed_fleet` writes jobs with SQL (no Python loop per job), then `collect_once` stores the
samples the collectors would store for them, so pages, the API and `/metrics` read what they
would read in production. Used by tests/test_security_size.py (issue 26, class 9) and
bench/size_attack.py.

Per queue `fleet-NNNNN`: one eligible job whose age grows with the queue's number (the
highest number is the oldest: the worst queue), two dead letters (one in the group shared by
every queue, `TimeoutError: upstream`, one in one of `groups` groups), and on every tenth queue
a running job whose lease expired (a stuck lease). Kinds cycle through `kinds` names.
"""

from __future__ import annotations

import psycopg

SHARED_GROUP = "TimeoutError: upstream"

SEED_SQL = """
INSERT INTO skiplock.jobs (queue, kind, payload, status, run_at, attempts, max_attempts, last_error,
                           error_fingerprint, created_at, finished_at, locked_by, locked_at, lease_until)
SELECT
    format('fleet-%%s', lpad(q::text, 5, '0')),
    format('kind-%%s', lpad(((q * 7 + j) %% %(kinds)s)::text, 4, '0')),
    jsonb_build_object('tenant', format('tenant-%%s', q %% 700), 'n', q),
    s.status,
    now() - make_interval(secs => q),
    CASE WHEN s.status = 'failed' THEN 5 ELSE 1 END,
    5,
    s.error,
    s.error,
    now() - make_interval(secs => q + 60),
    CASE WHEN s.status = 'failed' THEN now() - make_interval(secs => j + 1) END,
    CASE WHEN s.status = 'running' THEN 'fleet-worker' END,
    CASE WHEN s.status = 'running' THEN now() - interval '10 minutes' END,
    CASE WHEN s.status = 'running' THEN now() - interval '5 minutes' END
FROM generate_series(1, %(queues)s) AS q
CROSS JOIN generate_series(0, 3) AS j
CROSS JOIN LATERAL (
    SELECT CASE j
        WHEN 0 THEN 'pending'
        WHEN 1 THEN 'failed'
        WHEN 2 THEN 'failed'
        ELSE CASE WHEN q %% 10 = 0 THEN 'running' END
    END AS status,
    CASE j
        WHEN 1 THEN %(shared)s
        WHEN 2 THEN format('ValueError: failure %%s', lpad((q %% %(groups)s)::text, 4, '0'))
    END AS error
) AS s
WHERE s.status IS NOT NULL
"""


def seed_fleet(conn: psycopg.Connection, *, queues: int = 5000, kinds: int = 2000, groups: int = 1000) -> dict[str, int]:
    """Jobs for `queues` queues, `kinds` kinds and `groups` + 1 error groups; returns the counts."""
    conn.execute(SEED_SQL, {"queues": queues, "kinds": kinds, "groups": groups, "shared": SHARED_GROUP})
    conn.execute("ANALYZE skiplock.jobs")
    row = conn.execute("SELECT count(DISTINCT queue), count(DISTINCT kind), count(DISTINCT error_fingerprint) "
                       "FROM skiplock.jobs").fetchone()
    return {"queues": row[0], "kinds": row[1], "groups": row[2]}


def worst_queue(queues: int = 5000) -> str:
    return f"fleet-{queues:05d}"
