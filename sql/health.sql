-- The database health page's live detail lists. Each reads small catalog/statistics views
-- (never the jobs table), is bounded by LIMIT, and runs under the panel's statement timeout.

-- name: table_activity
-- Vacuum and analyze history of the skiplock tables (archive partitions summed under their parent).
SELECT
    coalesce(parent.relname, c.relname) AS table_name,
    sum(s.n_live_tup)::bigint AS live,
    sum(s.n_dead_tup)::bigint AS dead,
    max(s.last_autovacuum) AS last_autovacuum,
    max(s.last_vacuum) AS last_vacuum,
    max(s.last_autoanalyze) AS last_autoanalyze,
    sum(s.autovacuum_count)::bigint AS autovacuum_count,
    sum(s.vacuum_count)::bigint AS vacuum_count,
    sum(pg_total_relation_size(c.oid))::bigint AS total_bytes
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
LEFT JOIN pg_inherits AS i ON i.inhrelid = c.oid
LEFT JOIN pg_class AS parent ON parent.oid = i.inhparent
WHERE s.schemaname = 'skiplock'
  AND coalesce(parent.relname, c.relname) IN ('jobs', 'jobs_archive')
GROUP BY coalesce(parent.relname, c.relname)
ORDER BY table_name;

-- name: vacuum_progress
SELECT
    p.pid,
    c.relname AS table_name,
    p.phase,
    p.heap_blks_total,
    p.heap_blks_scanned,
    p.index_vacuum_count,
    to_jsonb(p) AS raw,  -- dead-tuple columns were renamed in PostgreSQL 17
    extract(epoch FROM now() - a.xact_start)::float8 AS running_s
FROM pg_stat_progress_vacuum AS p
JOIN pg_class AS c ON c.oid = p.relid
LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid
WHERE c.relnamespace = 'skiplock'::regnamespace
ORDER BY p.pid
LIMIT 20;

-- name: wraparound
-- How far the database and the jobs tables are from transaction-ID / MultiXact wraparound.
SELECT
    d.datname AS name,
    'database' AS kind,
    age(d.datfrozenxid)::bigint AS xid_age,
    mxid_age(d.datminmxid)::bigint AS mxid_age
FROM pg_database AS d
WHERE d.datname = current_database()
UNION ALL
SELECT
    c.relname,
    'table',
    greatest(age(c.relfrozenxid), coalesce(age(t.relfrozenxid), 0))::bigint,
    mxid_age(c.relminmxid)::bigint
FROM pg_class AS c
LEFT JOIN pg_class AS t ON t.oid = c.reltoastrelid
WHERE c.relnamespace = 'skiplock'::regnamespace
  AND c.relname IN ('jobs', 'queues', 'workers')
ORDER BY xid_age DESC;

-- name: freeze_settings
SELECT
    current_setting('autovacuum_freeze_max_age')::bigint AS freeze_max_age,
    current_setting('autovacuum_multixact_freeze_max_age')::bigint AS mxid_freeze_max_age,
    current_setting('autovacuum_vacuum_threshold')::bigint AS vacuum_threshold,
    current_setting('autovacuum_vacuum_scale_factor')::float8 AS vacuum_scale_factor,
    current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_timeout;

-- name: slru
-- Every SLRU (eight rows): the names are CamelCase on 13-16 and snake_case on 17+, so the page
-- picks and names them in Python (console.collectors.database.slru_name), not in a WHERE.
SELECT
    s.name,
    s.blks_read,
    s.blks_hit,
    s.blks_zeroed
FROM pg_stat_slru AS s
ORDER BY s.name;

-- name: lwlock_waiters
SELECT
    a.wait_event,
    count(*)::int AS sessions
FROM pg_stat_activity AS a
WHERE a.wait_event_type = 'LWLock'
GROUP BY a.wait_event
ORDER BY sessions DESC, a.wait_event
LIMIT 20;

-- name: replication
SELECT
    r.application_name AS name,
    coalesce(host(r.client_addr), 'local') AS client,
    r.state,
    r.sync_state,
    extract(epoch FROM r.replay_lag)::float8 AS replay_lag_s,
    pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn)::bigint AS lag_bytes
FROM pg_stat_replication AS r
ORDER BY r.application_name
LIMIT 50;

-- name: slots
SELECT
    s.slot_name AS name,
    s.slot_type AS type,
    s.active,
    pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS retained_bytes
FROM pg_replication_slots AS s
ORDER BY retained_bytes DESC NULLS LAST
LIMIT 50;

-- name: wal
SELECT
    w.wal_bytes::bigint AS wal_bytes,
    w.stats_reset,
    pg_is_in_recovery() AS in_recovery,
    current_setting('max_wal_size') AS max_wal_size
FROM pg_stat_wal AS w;
