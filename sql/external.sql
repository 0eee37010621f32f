-- External queue sources (console.external): one statement shape for every system. The adapter
-- fills the {placeholders} with psycopg.sql pieces: {table} an Identifier, {queue}/{since}/
-- {stuck_since} column expressions, {pending}/{due}/{running}/{stuck}/{failed} predicates (the
-- library adapters' own text, or a `table` entry's predicates from the config file). Values are
-- bound (%(cap)s ...). Each part reads at most %(cap)s (or %(failed_cap)s) rows and stops, so
-- a large queue table costs the same as a small one; beyond the cap the adapter scales to the
-- planner's estimate (estimate_rows).

-- name: snapshot
SELECT
    (
        SELECT coalesce(jsonb_agg(p ORDER BY p.queue), '[]'::jsonb)
        FROM (
            SELECT
                h.queue,
                count(*) FILTER (WHERE h.due) AS eligible,
                count(*) FILTER (WHERE NOT h.due) AS scheduled,
                extract(epoch FROM now() - min(h.since) FILTER (WHERE h.due))::float8 AS oldest_eligible_s
            FROM (
                SELECT
                    ({queue})::text AS queue,
                    coalesce(({due}), true) AS due,
                    ({since})::timestamptz AS since
                FROM {table} AS j
                WHERE ({pending})
                LIMIT %(cap)s
            ) AS h
            GROUP BY h.queue
        ) AS p
    ) AS pending,
    (
        SELECT coalesce(jsonb_agg(r ORDER BY r.queue), '[]'::jsonb)
        FROM (
            SELECT
                l.queue,
                count(*) AS running,
                count(*) FILTER (WHERE l.stuck) AS stuck,
                extract(epoch FROM now() - min(l.stuck_since) FILTER (WHERE l.stuck))::float8 AS oldest_stuck_s
            FROM (
                SELECT
                    ({queue})::text AS queue,
                    coalesce(({stuck}), false) AS stuck,
                    ({stuck_since})::timestamptz AS stuck_since
                FROM {table} AS j
                WHERE ({running})
                LIMIT %(cap)s
            ) AS l
            GROUP BY l.queue
        ) AS r
    ) AS running,
    (
        SELECT coalesce(jsonb_agg(f ORDER BY f.queue), '[]'::jsonb)
        FROM (
            SELECT
                n.queue,
                count(*) AS failed
            FROM (
                SELECT ({queue})::text AS queue
                FROM {table} AS j
                WHERE ({failed})
                LIMIT %(failed_cap)s
            ) AS n
            GROUP BY n.queue
        ) AS f
    ) AS failed;

-- name: estimate_rows
-- The planner's estimate of rows matching a predicate (EXPLAIN plans, runs nothing).
EXPLAIN (FORMAT JSON)
SELECT 1
FROM {table} AS j
WHERE ({predicate});

-- name: table_exists
SELECT
    to_regclass(%(qualified)s) IS NOT NULL AS found,
    coalesce((
        SELECT array_agg(a.attname::text ORDER BY a.attnum)
        FROM pg_attribute AS a
        WHERE a.attrelid = to_regclass(%(qualified)s)
          AND a.attnum > 0
          AND NOT a.attisdropped
    ), ARRAY[]::text[]) AS columns;

-- name: enum_labels
SELECT coalesce(array_agg(e.enumlabel::text ORDER BY e.enumsortorder), ARRAY[]::text[]) AS labels
FROM pg_enum AS e
JOIN pg_type AS t ON t.oid = e.enumtypid
JOIN pg_namespace AS n ON n.oid = t.typnamespace
WHERE n.nspname = %(schema)s
  AND t.typname = %(type)s;

-- name: function_source
-- The bodies of functions whose name matches %(pattern)s in %(schema)s (a library's claim function).
SELECT
    p.proname::text AS name,
    p.prosrc AS source
FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = %(schema)s
  AND p.proname LIKE %(pattern)s
ORDER BY p.proname;

-- name: claim_statements
-- The source's claim statements in pg_stat_statements: text LIKE the adapter's pattern.
SELECT
    s.queryid::text AS queryid,
    s.query,
    s.calls::float8 AS calls,
    s.mean_exec_time::float8 AS mean_ms
FROM pg_stat_statements AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND s.query LIKE %(pattern)s
  AND s.query NOT LIKE '%%pg_stat_statements%%'
ORDER BY s.calls DESC, s.queryid
LIMIT 20;
