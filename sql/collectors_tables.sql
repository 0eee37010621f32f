-- The jobs tables (hot table and archive): statistics, the table's own autovacuum threshold,
-- sizes, vacuum progress and wraparound age. Catalog and statistics reads only; no table scan.
-- A partitioned table (the archive may be one) is read through its leaf partitions.

-- name: watched_relations
-- The leaf tables behind each watched name: the table itself when it is not partitioned
-- (pg_partition_tree returns nothing for a plain table), its leaf partitions when it is.
SELECT
    w.label,
    c.oid AS relid,
    c.relkind
FROM unnest(%(labels)s::text[], %(names)s::text[]) AS w (label, name)
JOIN pg_class AS c
  ON c.oid = to_regclass(w.name)
  OR c.oid IN (SELECT t.relid FROM pg_partition_tree(to_regclass(w.name)) AS t WHERE t.isleaf)
WHERE c.relkind IN ('r', 'm')
ORDER BY w.label, c.oid;

-- name: table_stats
-- Per leaf: tuples, vacuum history, and the effective autovacuum thresholds from the table's
-- reloptions falling back to the server settings (autovacuum.c relation_needs_vacanalyze).
SELECT
    c.oid AS relid,
    t.n_live_tup::float8 AS n_live_tup,
    t.n_dead_tup::float8 AS n_dead_tup,
    t.n_ins_since_vacuum::float8 AS n_ins_since_vacuum,
    t.n_mod_since_analyze::float8 AS n_mod_since_analyze,
    greatest(c.reltuples, 0)::float8 AS reltuples,
    t.last_vacuum,
    t.last_autovacuum,
    t.last_analyze,
    t.last_autoanalyze,
    t.vacuum_count::float8 AS vacuum_count,
    t.autovacuum_count::float8 AS autovacuum_count,
    t.analyze_count::float8 AS analyze_count,
    t.autoanalyze_count::float8 AS autoanalyze_count,
    extract(epoch FROM now() - greatest(t.last_vacuum, t.last_autovacuum))::float8 AS vacuum_age_s,
    extract(epoch FROM now() - greatest(t.last_analyze, t.last_autoanalyze))::float8 AS analyze_age_s,
    coalesce(o.enabled, current_setting('autovacuum')::bool) AS autovacuum_enabled,
    (coalesce(o.vt, current_setting('autovacuum_vacuum_threshold')::float8)
     + coalesce(o.vsf, current_setting('autovacuum_vacuum_scale_factor')::float8) * greatest(c.reltuples, 0))::float8 AS vacuum_threshold,
    (coalesce(o.vit, current_setting('autovacuum_vacuum_insert_threshold')::float8)
     + coalesce(o.visf, current_setting('autovacuum_vacuum_insert_scale_factor')::float8) * greatest(c.reltuples, 0))::float8 AS insert_threshold,
    (coalesce(o.at, current_setting('autovacuum_analyze_threshold')::float8)
     + coalesce(o.asf, current_setting('autovacuum_analyze_scale_factor')::float8) * greatest(c.reltuples, 0))::float8 AS analyze_threshold,
    CASE WHEN c.relfrozenxid <> '0' THEN age(c.relfrozenxid) END::float8 AS xid_age,
    CASE WHEN tc.relfrozenxid <> '0' THEN age(tc.relfrozenxid) END::float8 AS toast_xid_age,
    greatest(
        CASE WHEN c.relminmxid <> '0' THEN mxid_age(c.relminmxid) END,
        CASE WHEN tc.relminmxid <> '0' THEN mxid_age(tc.relminmxid) END
    )::float8 AS mxid_age,
    current_setting('autovacuum_freeze_max_age')::float8 AS freeze_max_age,
    current_setting('autovacuum_multixact_freeze_max_age')::float8 AS mxid_freeze_max_age
FROM pg_class AS c
JOIN pg_stat_all_tables AS t ON t.relid = c.oid
LEFT JOIN pg_class AS tc ON tc.oid = c.reltoastrelid
LEFT JOIN LATERAL (
    SELECT
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_enabled')::bool AS enabled,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_vacuum_threshold')::float8 AS vt,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_vacuum_scale_factor')::float8 AS vsf,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_vacuum_insert_threshold')::float8 AS vit,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_vacuum_insert_scale_factor')::float8 AS visf,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_analyze_threshold')::float8 AS at,
        max(r.option_value) FILTER (WHERE r.option_name = 'autovacuum_analyze_scale_factor')::float8 AS asf
    FROM pg_options_to_table(c.reloptions) AS r
) AS o ON true
WHERE c.oid = ANY(%(relids)s::oid[])
ORDER BY c.oid;

-- name: table_sizes
-- Sizes stat() the files and take AccessShareLock, so relations someone holds in
-- AccessExclusiveLock (VACUUM FULL, TRUNCATE, most ALTER TABLE) are skipped rather than waited on.
SELECT
    c.oid AS relid,
    pg_relation_size(c.oid)::float8 AS heap,
    pg_indexes_size(c.oid)::float8 AS indexes,
    coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)::float8 AS toast
FROM pg_class AS c
WHERE c.oid = ANY(%(relids)s::oid[])
  AND NOT EXISTS (
      SELECT 1
      FROM pg_locks AS l
      WHERE l.relation = c.oid
        AND l.mode = 'AccessExclusiveLock'
        AND l.granted
  )
ORDER BY c.oid;

-- name: vacuum_progress
-- Every column this server's view has (they differ between 13-16 and 17), picked in Python.
SELECT
    to_jsonb(p) AS progress,
    p.relid,
    a.query LIKE 'autovacuum:%%' AS is_auto,
    a.query LIKE '%%(to prevent wraparound)%%' AS anti_wraparound,
    extract(epoch FROM now() - a.xact_start)::float8 AS running_s,
    a.wait_event_type,
    a.wait_event
FROM pg_stat_progress_vacuum AS p
JOIN pg_stat_activity AS a ON a.pid = p.pid
WHERE p.datname = current_database()
  AND p.relid = ANY(%(relids)s::oid[])
ORDER BY p.pid;
