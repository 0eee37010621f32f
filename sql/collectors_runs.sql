-- What the collection runner reads and writes besides samples: the previous snapshot of each
-- collector's counters, and one row per cycle.

-- name: load_state
SELECT
    s.name,
    s.taken_at,
    s.state
FROM skiplock.collector_state AS s
ORDER BY s.name;

-- name: save_state
INSERT INTO skiplock.collector_state AS s (name, taken_at, state)
VALUES (%(name)s, %(taken_at)s, %(state)s)
ON CONFLICT (name) DO UPDATE
SET taken_at = excluded.taken_at,
    state = excluded.state;

-- name: save_states
-- Every collector's snapshot in one statement (one round trip per cycle).
INSERT INTO skiplock.collector_state AS s (name, taken_at, state)
SELECT n.name, %(taken_at)s, n.state
FROM unnest(%(names)s::text[], %(states)s::jsonb[]) AS n (name, state)
ORDER BY n.name
ON CONFLICT (name) DO UPDATE
SET taken_at = excluded.taken_at,
    state = excluded.state;

-- name: insert_run
INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms, collectors, leader, details)
VALUES (%(started_at)s, %(finished_at)s, %(duration_ms)s, %(collectors)s, %(leader)s, %(details)s)
RETURNING id;

-- name: latest_details
SELECT
    c.id,
    c.started_at,
    c.duration_ms,
    c.collectors,
    c.details
FROM skiplock.collection_runs AS c
ORDER BY c.started_at DESC
LIMIT 1;

-- name: db_now
SELECT now() AS now, clock_timestamp() AS clock;

-- name: state_of
SELECT s.state
FROM skiplock.collector_state AS s
WHERE s.name = %(name)s;

