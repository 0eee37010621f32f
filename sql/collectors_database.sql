-- Database-wide signals: the xmin horizon and who holds it, lock waits with the blocking tree,
-- LWLock waits, SLRU counters, MultiXact and WAL positions, replication, connections, NOTIFY.
-- Shared-memory reads only. Sessions of the console itself (application names matching
-- %(exclude_apps)s, and this connection) are left out of what is reported; workers are not.

-- name: horizon_holders
-- One row per thing holding back the xmin horizon of this database, oldest first. Backends and
-- prepared transactions of other databases do not hold back vacuum of our tables; replication
-- slots and standby feedback hold back every database.
SELECT
    h.kind,
    h.id,
    h.pid,
    h.application_name,
    h.state,
    h.detail,
    h.xmin::text AS xmin,
    age(h.xmin)::float8 AS xid_age,
    extract(epoch FROM now() - h.since)::float8 AS age_s,
    h.since
FROM (
    SELECT
        CASE WHEN a.state LIKE 'idle in transaction%%' THEN 'idle_in_transaction' ELSE 'transaction' END AS kind,
        a.pid::text AS id,
        a.pid,
        a.application_name,
        a.state,
        left(a.query, 200) AS detail,
        CASE WHEN a.backend_xmin IS NULL OR (a.backend_xid IS NOT NULL AND age(a.backend_xid) > age(a.backend_xmin))
             THEN a.backend_xid ELSE a.backend_xmin END AS xmin,
        coalesce(a.xact_start, a.backend_start) AS since
    FROM pg_stat_activity AS a
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.pid <> pg_backend_pid()
      AND a.datname = current_database()
      AND a.backend_type = 'client backend'
      AND NOT coalesce(a.application_name, '') LIKE ANY(%(exclude_apps)s::text[])
    UNION ALL
    SELECT 'replication_slot', s.slot_name::text, s.active_pid, NULL, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           s.slot_type, s.xmin, NULL
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'replication_slot', s.slot_name::text, s.active_pid, NULL, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           s.slot_type || ' (catalog)', s.catalog_xmin, NULL
    FROM pg_replication_slots AS s
    WHERE s.catalog_xmin IS NOT NULL
      AND s.database = current_database()
    UNION ALL
    SELECT 'prepared_transaction', p.gid, NULL, NULL, 'prepared', p.owner::text, p.transaction, p.prepared
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
    UNION ALL
    -- No start time: backend_start is when the standby connected, and its feedback moves on
    -- with every reply, so the age comes from the XID history, like a slot's.
    SELECT 'standby', r.pid::text, r.pid, r.application_name, r.state, coalesce(host(r.client_addr), 'local'),
           r.backend_xmin, NULL
    FROM pg_stat_replication AS r
    WHERE r.backend_xmin IS NOT NULL
) AS h
ORDER BY age(h.xmin) DESC NULLS LAST, h.since NULLS LAST
LIMIT 50;

-- name: xid_position
-- The next transaction ID and MultiXact ID without assigning either (pg_current_xact_id()
-- would burn an XID and fails on a standby). mxid_age(x) is next_multi - x, read live from
-- shared memory, so datminmxid + its age is the next MultiXact ID (modulo 2^32).
SELECT
    pg_snapshot_xmax(pg_current_snapshot())::text::float8 AS next_xid,
    ((d.datminmxid::text::bigint + mxid_age(d.datminmxid)) %% 4294967296)::float8 AS next_mxid,
    age(d.datfrozenxid)::float8 AS db_xid_age,
    mxid_age(d.datminmxid)::float8 AS db_mxid_age
FROM pg_database AS d
WHERE d.datname = current_database();

-- name: lock_waiters
-- Sessions waiting on a heavyweight lock, with the relation they wait for. A row-lock waiter
-- waits on the holder's transactionid (no relation) while holding the tuple lock of the row
-- it wants, so that granted tuple lock names the table. waitstart exists from PG 14.
SELECT
    a.pid,
    a.application_name,
    a.wait_event,
    coalesce(
        (SELECT l.relation FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted AND l.relation IS NOT NULL LIMIT 1),
        (SELECT l.relation FROM pg_locks AS l WHERE l.pid = a.pid AND l.granted AND l.locktype = 'tuple' LIMIT 1)
    ) AS relid,
    (SELECT l.locktype FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted LIMIT 1) AS locktype,
    (SELECT l.mode FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted LIMIT 1) AS mode,
    extract(epoch FROM now() - coalesce(
        {waitstart},
        a.query_start
    ))::float8 AS waiting_s,
    pg_blocking_pids(a.pid) AS blocked_by,
    left(a.query, 200) AS query
FROM pg_stat_activity AS a
WHERE a.wait_event_type = 'Lock'
  AND a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND NOT coalesce(a.application_name, '') LIKE ANY(%(exclude_apps)s::text[])
ORDER BY a.pid;

-- name: sessions
-- The sessions named in a blocking tree (holders may be idle in transaction, so not waiting).
SELECT
    a.pid,
    a.application_name,
    a.usename::text AS usename,
    a.state,
    a.wait_event_type,
    a.wait_event,
    extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_s,
    extract(epoch FROM now() - a.state_change)::float8 AS in_state_s,
    left(a.query, 200) AS query
FROM pg_stat_activity AS a
WHERE a.pid = ANY(%(pids)s::int[])
ORDER BY a.pid;

-- name: wait_events
-- LWLock and other non-Lock waits by event (a 1-in-a-cycle sample of pg_stat_activity).
SELECT
    a.wait_event_type,
    a.wait_event,
    count(*)::float8 AS sessions
FROM pg_stat_activity AS a
WHERE a.wait_event_type IN ('LWLock', 'IO', 'BufferPin')
  AND a.pid <> pg_backend_pid()
  AND NOT coalesce(a.application_name, '') LIKE ANY(%(exclude_apps)s::text[])
GROUP BY a.wait_event_type, a.wait_event
ORDER BY a.wait_event_type, a.wait_event;

-- name: slru
-- Cumulative SLRU counters (cluster-wide). Names are CamelCase on 13-16, snake_case on 17+:
-- the collector normalises them.
SELECT
    s.name,
    s.blks_zeroed::float8 AS blks_zeroed,
    s.blks_hit::float8 AS blks_hit,
    s.blks_read::float8 AS blks_read,
    s.blks_written::float8 AS blks_written,
    s.truncates::float8 AS truncates
FROM pg_stat_slru AS s
ORDER BY s.name;

-- name: wal_position
-- The timeline is the first eight hex digits of the current WAL file's name (pg_walfile_name is
-- open to every role; pg_control_checkpoint() is not): a promotion starts a new one, which is
-- how the collector sees a failover. NULL on a standby (its own timeline is its primary's).
-- The rate is of the insert position, the WAL generated: the write position waits for the WAL
-- writer after an asynchronous commit (synchronous_commit = off), so two reads 100 ms apart
-- could see a busy server write nothing.
SELECT
    pg_is_in_recovery() AS in_recovery,
    CASE WHEN pg_is_in_recovery() THEN NULL
         ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END AS timeline,
    CASE WHEN pg_is_in_recovery()
         THEN pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')
         ELSE pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') END::float8 AS lsn_bytes,
    CASE WHEN pg_is_in_recovery() AND pg_last_wal_receive_lsn() IS DISTINCT FROM pg_last_wal_replay_lsn()
         THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp())
         WHEN pg_is_in_recovery() THEN 0 END::float8 AS own_replay_lag_s;

-- name: standbys
-- replay_lag is measured by the primary from the standby's replies, so it keeps growing while
-- the standby's replay is paused or stuck; it is NULL once the standby has caught up and idles.
SELECT
    r.pid,
    coalesce(nullif(r.application_name, ''), host(r.client_addr), r.pid::text) AS standby,
    coalesce(host(r.client_addr), 'local') AS client,
    r.state,
    extract(epoch FROM r.replay_lag)::float8 AS replay_lag_s,
    pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn)::float8 AS replay_lag_bytes
FROM pg_stat_replication AS r
ORDER BY 2, 3, 1;

-- name: connections
-- Backends by state, all databases (max_connections is server-wide), the console excluded.
SELECT
    coalesce(a.state, 'unknown') AS state,
    count(*)::float8 AS sessions
FROM pg_stat_activity AS a
WHERE a.backend_type = 'client backend'
  AND a.pid <> pg_backend_pid()
  AND NOT coalesce(a.application_name, '') LIKE ANY(%(exclude_apps)s::text[])
GROUP BY 1
ORDER BY 1;

-- name: server_limits
SELECT
    current_setting('max_connections')::float8 AS max_connections,
    pg_notification_queue_usage()::float8 AS notify_queue_usage;

-- name: relation_names
SELECT
    c.oid AS relid,
    c.oid::regclass::text AS name
FROM pg_class AS c
WHERE c.oid = ANY(%(relids)s::oid[])
ORDER BY c.oid;
