-- External queue sources (console.external): one statement shape for every system. The adapter
-- fills the {placeholders} with psycopg.sql pieces: {table} an Identifier, {queue}/{since}/
-- {stuck_since}/{failed_at} column expressions, {pending}/{due}/{running}/{stuck}/{failed} predicates (the
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
                count(*) AS failed,
                -- dead-letter growth: failed within the rate window and still failed (NULL
                -- when the library records no time of failure)
                count(*) FILTER (WHERE n.failed_at >= now() - %(window)s::interval) AS arrived,
                bool_or(n.failed_at IS NOT NULL) AS failed_at_known
            FROM (
                SELECT
                    ({queue})::text AS queue,
                    ({failed_at})::timestamptz AS failed_at
                FROM {table} AS j
                WHERE ({failed})
                LIMIT %(failed_cap)s
            ) AS n
            GROUP BY n.queue
        ) AS f
    ) AS failed;

-- name: completions
-- Finished jobs a library recorded in its append-only log (PGQueuer's pgqueuer_log,
-- Procrastinate's procrastinate_events) after the previous cycle's cursor %(after)s: at most
-- %(cap)s log rows in primary-key order, so the read is bounded however busy the log is; and
-- the log's newest id (one step down the primary key), the next cursor. {outcomes} and
-- {counts} are built from the adapter's outcome predicates over the log row e.
WITH slice AS (
    SELECT e.*
    FROM {log} AS e
    WHERE e.id > %(after)s::bigint
    ORDER BY e.id
    LIMIT %(cap)s
),
done AS (
    SELECT
        ({queue})::text AS queue,
        {outcomes}
    FROM slice AS e
    WHERE {any_outcome}
)
SELECT
    (SELECT max(e.id) FROM {log} AS e)::bigint AS head_id,
    (SELECT max(s.id) FROM slice AS s)::bigint AS last_id,
    (
        SELECT coalesce(jsonb_agg(q ORDER BY q.queue), '[]'::jsonb)
        FROM (
            SELECT
                d.queue,
                {counts}
            FROM done AS d
            GROUP BY d.queue
        ) AS q
    ) AS queues;

-- name: estimate_rows
-- The planner's estimate of rows matching a predicate (EXPLAIN plans, runs nothing).
EXPLAIN (FORMAT JSON)
SELECT 1
FROM {table} AS j
WHERE ({predicate});

-- name: count_capped
-- Rows matching a predicate, counted up to %(cap)s (the caller runs it only on a table the
-- planner puts under the cap, so the scan stays small).
SELECT count(*)::float8 AS n
FROM (
    SELECT 1
    FROM {table} AS j
    WHERE ({predicate})
    LIMIT %(cap)s
) AS c;

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
  AND s.query !~* '^\s*explain\M'
ORDER BY s.calls DESC, s.queryid
LIMIT 20;

-- name: advisor_claim_statements
-- The source's claim-like statements in pg_stat_statements: those LIKE its claim pattern, and
-- any SELECT ... FOR [NO KEY] UPDATE ... LIMIT that names its queue table; whether each skips
-- locked rows (or fails fast with NOWAIT).
SELECT
    s.queryid::text AS queryid,
    left(regexp_replace(min(s.query), '\s+', ' ', 'g'), 300) AS query,
    sum(s.calls)::float8 AS calls,
    (sum(s.total_exec_time) / nullif(sum(s.calls), 0))::float8 AS mean_ms,
    bool_or(s.query ~* '\mskip\s+locked\M' OR s.query ~* '\mnowait\M') AS skips_locked
FROM pg_stat_statements(true) AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND s.query !~* '^\s*explain\M'
  AND s.query NOT LIKE '%%pg_stat_statements%%'
  AND (
      (%(claim_pattern)s::text IS NOT NULL AND s.query LIKE %(claim_pattern)s)
      OR (s.query ~* ('\m' || %(table)s || '\M')
          AND s.query ~* '\mfor\s+(no\s+key\s+)?update\M'
          AND s.query ~* '\mlimit\M')
  )
GROUP BY s.queryid
ORDER BY sum(s.calls) DESC, s.queryid
LIMIT 20;

-- name: advisor_indexes
SELECT
    c.relname::text AS index,
    i.indpred IS NOT NULL AS is_partial,
    pg_get_indexdef(i.indexrelid) AS definition
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass(%(qualified)s)
ORDER BY c.relname;

-- name: advisor_claim_plan
-- How the planner reaches the pending rows (EXPLAIN plans, runs nothing).
EXPLAIN (FORMAT JSON)
SELECT 1
FROM {table} AS j
WHERE ({pending})
LIMIT 10;

-- name: advisor_table_transactions
-- Sessions with an open transaction that holds a lock on the queue table.
SELECT DISTINCT
    a.pid,
    a.usename::text AS usename,
    a.application_name,
    a.state,
    extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_s,
    extract(epoch FROM now() - a.state_change)::float8 AS state_age_s,
    left(a.query, 200) AS query
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.relation = to_regclass(%(qualified)s)
  AND a.pid <> pg_backend_pid()
  AND a.xact_start IS NOT NULL
ORDER BY xact_age_s DESC, a.pid
LIMIT 20;

-- name: advisor_foreign_keys
-- Foreign keys of other tables that point at the queue table.
SELECT
    c.conname::text AS name,
    c.conrelid::regclass::text AS referencing,
    pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint AS c
WHERE c.contype = 'f'
  AND c.confrelid = to_regclass(%(qualified)s)
ORDER BY c.conname;

-- name: advisor_relid
SELECT to_regclass(%(qualified)s)::oid AS relid;
