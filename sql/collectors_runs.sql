-- What the collection runner reads and writes besides samples: the previous snapshot of each
-- collector's counters, and one row per cycle.

-- name: load_state
-- Each collector's snapshot without the series it reported last cycle (45,000 at 5,000 queues,
-- megabytes of JSON to send and parse each cycle: the column `series`, migration 033, or
-- `_series` in a row an earlier release wrote), which only a failing collector needs
-- (series_of).
SELECT
    s.name,
    s.taken_at,
    s.state - '_series' AS state
FROM skiplock.collector_state AS s
ORDER BY s.name;

-- name: series_of
-- The series %(name)s reported in its last stored cycle: a collector that fails reports each
-- of them as not available.
SELECT coalesce(s.series, s.state -> '_series', '[]'::jsonb) AS series
FROM skiplock.collector_state AS s
WHERE s.name = %(name)s;

-- name: save_state
INSERT INTO skiplock.collector_state AS s (name, taken_at, state)
VALUES (%(name)s, %(taken_at)s, %(state)s)
ON CONFLICT (name) DO UPDATE
SET taken_at = excluded.taken_at,
    state = excluded.state;

-- name: save_states
-- Every collector's snapshot in one statement (one round trip per cycle); the states go in
-- binary (see samples.sql insert_samples). A series list that is JSON null keeps the stored
-- one: the collector reported the same series as the row holds (console/collectors), and an
-- unchanged column is not rewritten.
INSERT INTO skiplock.collector_state AS s (name, taken_at, state, series)
SELECT n.name, %(taken_at)s, n.state, CASE WHEN n.series = 'null'::jsonb THEN NULL ELSE n.series END
FROM unnest(%(names)s::text[], %(states)b::jsonb[], %(series)b::jsonb[]) AS n (name, state, series)
ORDER BY n.name
ON CONFLICT (name) DO UPDATE
SET taken_at = excluded.taken_at,
    state = excluded.state,
    series = coalesce(excluded.series, s.series);

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


-- name: recent_errors
-- Each collector and each [[external_queues]] source over the cycles of the last %(window)s
-- seconds (at most %(max_runs)s, newest first, by collection_runs_started_idx): cycles seen, cycles
-- with an error, the newest error and when, and whether the newest cycle failed. The Maintenance
-- page shows it, so the collector_errors / external_source_errors a cycle counts come with their
-- messages even after a later cycle went well.
WITH runs AS (
    SELECT
        c.started_at,
        c.collectors,
        c.details -> 'external_sources' AS sources
    FROM skiplock.collection_runs AS c
    WHERE c.started_at >= now() - make_interval(secs => %(window)s)
    ORDER BY c.started_at DESC
    LIMIT %(max_runs)s
),
parts AS (
    SELECT 'collector' AS kind, p.key AS name, r.started_at, p.value ->> 'error' AS error
    FROM runs AS r
    CROSS JOIN LATERAL jsonb_each(r.collectors) AS p
    UNION ALL
    SELECT 'external' AS kind, s.key AS name, r.started_at, s.value ->> 'error' AS error
    FROM runs AS r
    CROSS JOIN LATERAL jsonb_each(coalesce(r.sources, '{}'::jsonb)) AS s
)
SELECT
    p.kind,
    p.name,
    count(*) AS cycles,
    count(p.error) AS errors,
    (array_agg(p.error ORDER BY p.started_at DESC) FILTER (WHERE p.error IS NOT NULL))[1] AS last_error,
    max(p.started_at) FILTER (WHERE p.error IS NOT NULL) AS last_error_at,
    max(p.started_at) AS last_cycle_at,
    (array_agg(p.error ORDER BY p.started_at DESC))[1] IS NOT NULL AS failing_now
FROM parts AS p
GROUP BY p.kind, p.name
ORDER BY p.kind, p.name;
