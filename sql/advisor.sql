-- The advisor's live checks. Every query reads catalogs, statistics views or a bounded slice of
-- the jobs table through one of its partial indexes (claim, lease, failed) or a page sample;
-- none scans the whole jobs table. Each runs inside `db.time_limited`.
--
-- "The jobs tables" below means skiplock.jobs plus skiplock.jobs_archive and its partitions
-- (pg_partition_tree returns the table itself when it is not partitioned).

-- name: jobs_indexes
-- Every index on the hot table, with its use count since the statistics were reset.
SELECT
    c.relname AS index,
    pg_get_indexdef(i.indexrelid) AS definition,
    i.indisunique AS is_unique,
    i.indisprimary AS is_primary,
    i.indpred IS NOT NULL AS is_partial,
    s.idx_scan,
    pg_relation_size(i.indexrelid) AS bytes
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
LEFT JOIN pg_stat_user_indexes AS s ON s.indexrelid = i.indexrelid
WHERE i.indrelid = 'skiplock.jobs'::regclass
ORDER BY c.relname;

-- name: jobs_table_stats
-- The hot table's statistics and its effective autovacuum thresholds: per-table reloptions
-- first, the server settings otherwise (the rule of relation_needs_vacanalyze in autovacuum.c).
SELECT
    t.n_live_tup,
    t.n_dead_tup,
    t.n_tup_ins,
    t.n_tup_upd,
    t.n_tup_del,
    t.n_tup_hot_upd,
    t.n_mod_since_analyze,
    greatest(c.reltuples, 0) AS reltuples,
    pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
    t.last_autovacuum,
    t.last_vacuum,
    t.autovacuum_count,
    t.vacuum_count,
    extract(epoch FROM now() - greatest(t.last_autovacuum, t.last_vacuum)) AS last_vacuum_age_s,
    extract(epoch FROM now() - coalesce(d.stats_reset, pg_postmaster_start_time())) AS stats_age_s,
    coalesce(o.enabled, current_setting('autovacuum')::boolean) AS autovacuum_enabled,
    coalesce(o.vt, current_setting('autovacuum_vacuum_threshold')::float8) AS vacuum_threshold,
    coalesce(o.vsf, current_setting('autovacuum_vacuum_scale_factor')::float8) AS vacuum_scale_factor,
    coalesce(o.cd, nullif(current_setting('autovacuum_vacuum_cost_delay')::float8, -1),
             current_setting('vacuum_cost_delay')::float8) AS cost_delay_ms,
    coalesce(o.vt, current_setting('autovacuum_vacuum_threshold')::float8)
      + coalesce(o.vsf, current_setting('autovacuum_vacuum_scale_factor')::float8) * greatest(c.reltuples, 0)
      AS vacuum_trigger,
    o.raw AS reloptions,
    mxid_age(c.relminmxid) AS mxid_age,
    age(c.relfrozenxid) AS xid_age,
    current_setting('autovacuum_multixact_freeze_max_age')::bigint AS mxid_freeze_max_age,
    EXISTS (
        SELECT 1
        FROM pg_stat_progress_vacuum AS p
        WHERE p.relid = c.oid
    ) AS vacuum_running
FROM pg_class AS c
JOIN pg_stat_user_tables AS t ON t.relid = c.oid
LEFT JOIN pg_stat_database AS d ON d.datname = current_database()
LEFT JOIN LATERAL (
    SELECT
        max(option_value) FILTER (WHERE option_name = 'autovacuum_enabled')::boolean AS enabled,
        max(option_value) FILTER (WHERE option_name = 'autovacuum_vacuum_threshold')::float8 AS vt,
        max(option_value) FILTER (WHERE option_name = 'autovacuum_vacuum_scale_factor')::float8 AS vsf,
        max(option_value) FILTER (WHERE option_name = 'autovacuum_vacuum_cost_delay')::float8 AS cd,
        array_agg(option_name || '=' || option_value ORDER BY option_name) AS raw
    FROM pg_options_to_table(c.reloptions)
) AS o ON true
WHERE c.oid = 'skiplock.jobs'::regclass;

-- name: claim_statements
-- The claim statements (claim and complete_and_claim) as pg_stat_statements counts them in
-- this database: the claim is the statement that walks `run_at <= now()` with SKIP LOCKED.
SELECT
    count(*) AS statements,
    coalesce(sum(s.calls), 0)::float8 AS calls,
    coalesce(sum(s.rows), 0)::float8 AS rows,
    coalesce(sum(s.shared_blks_hit + s.shared_blks_read), 0)::float8 AS buffers,
    coalesce(sum(s.total_exec_time), 0)::float8 AS exec_ms
FROM pg_stat_statements AS s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.query ILIKE '%%skip locked%%'
  AND s.query ILIKE '%%run_at <= now()%%'
  AND s.query ILIKE '%%update skiplock.jobs%%'
  AND s.query NOT ILIKE 'explain%%';

-- name: savepoint_statements
-- SAVEPOINT / RELEASE / ROLLBACK TO statements run in this database (pg_stat_statements
-- tracks utility statements by default): each claim inside a savepoint creates MultiXacts.
SELECT
    coalesce(sum(s.calls) FILTER (WHERE s.query ILIKE 'savepoint%%'), 0)::float8 AS savepoints,
    coalesce(sum(s.calls) FILTER (WHERE s.query ILIKE 'release%%'), 0)::float8 AS releases,
    coalesce(sum(s.calls) FILTER (WHERE s.query ILIKE 'rollback to%%'), 0)::float8 AS rollbacks_to,
    current_setting('pg_stat_statements.track_utility', true) AS track_utility
FROM pg_stat_statements AS s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (s.query ILIKE 'savepoint%%' OR s.query ILIKE 'release%%' OR s.query ILIKE 'rollback to%%');

-- name: lock_waiters
-- Sessions of this database waiting on a heavyweight lock while they hold a lock on one of the
-- jobs tables (a FOR UPDATE claimer waiting behind another's row lock holds RowShareLock on
-- jobs and waits on the other's transaction id).
WITH jobs_tables AS (
    SELECT 'skiplock.jobs'::regclass AS relid
    UNION ALL
    SELECT p.relid FROM pg_partition_tree('skiplock.jobs_archive') AS p
)
SELECT
    a.pid,
    a.application_name,
    a.usename::text AS usename,
    a.state,
    a.wait_event_type,
    a.wait_event,
    extract(epoch FROM now() - coalesce(w.waitstart, a.query_start)) AS waiting_s,
    left(a.query, 400) AS query,
    pg_blocking_pids(a.pid) AS blocked_by
FROM pg_stat_activity AS a
LEFT JOIN LATERAL (
    SELECT min((to_jsonb(l) ->> 'waitstart')::timestamptz) AS waitstart
    FROM pg_locks AS l
    WHERE l.pid = a.pid
      AND NOT l.granted
) AS w ON true
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.wait_event_type = 'Lock'
  AND EXISTS (
      SELECT 1
      FROM pg_locks AS l
      WHERE l.pid = a.pid
        AND l.relation IN (SELECT relid FROM jobs_tables)
  )
ORDER BY waiting_s DESC NULLS LAST, a.pid;

-- name: sessions
-- Who a set of pids are (the blockers of lock waiters).
SELECT
    a.pid,
    a.application_name,
    a.usename::text AS usename,
    host(a.client_addr) AS client,
    a.state,
    extract(epoch FROM now() - a.xact_start) AS xact_s,
    extract(epoch FROM now() - a.state_change) AS state_s,
    left(a.query, 400) AS query
FROM pg_stat_activity AS a
WHERE a.pid = ANY(%(pids)s::int[])
ORDER BY a.pid;

-- name: long_transactions
-- Client sessions of this database whose transaction is idle or old, with whether they hold a
-- lock on one of the jobs tables (read, row lock or write: all last until the transaction ends).
WITH jobs_tables AS (
    SELECT 'skiplock.jobs'::regclass AS relid
    UNION ALL
    SELECT p.relid FROM pg_partition_tree('skiplock.jobs_archive') AS p
)
SELECT
    a.pid,
    a.application_name,
    a.usename::text AS usename,
    host(a.client_addr) AS client,
    a.state,
    extract(epoch FROM now() - a.xact_start) AS xact_s,
    extract(epoch FROM now() - a.state_change) AS state_s,
    left(a.query, 400) AS query,
    (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL) AS holds_horizon,
    EXISTS (
        SELECT 1
        FROM pg_locks AS l
        WHERE l.pid = a.pid
          AND l.granted
          AND l.relation IN (SELECT relid FROM jobs_tables)
    ) AS touches_jobs
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend'
  AND a.xact_start IS NOT NULL
  AND (
      (a.state LIKE 'idle in transaction%%' AND a.state_change < now() - make_interval(secs => %(idle_s)s))
      OR a.xact_start < now() - make_interval(secs => %(xact_s)s)
  )
ORDER BY a.xact_start, a.pid;

-- name: xmin_holders
-- What holds back the xmin horizon for this database's tables: its own sessions, replication
-- slots, prepared transactions and standbys with hot_standby_feedback. Oldest first.
-- holder_kind, pid, application_name and state are the horizon collector's vocabulary
-- (sql/collectors_database.sql horizon_holders), so a holder named by a check and one named by
-- the verdict from the collector's details read the same (console.advisor.causes).
SELECT
    h.kind,
    h.holder_kind,
    h.id,
    h.pid,
    h.application_name,
    h.state,
    h.who,
    h.detail,
    age(h.xmin) AS xid_age,
    extract(epoch FROM now() - h.since) AS age_s
FROM (
    SELECT
        'session' AS kind,
        CASE WHEN a.state LIKE 'idle in transaction%%' THEN 'idle_in_transaction' ELSE 'transaction' END AS holder_kind,
        a.pid::text AS id,
        a.pid,
        a.application_name,
        a.state,
        coalesce(nullif(a.application_name, ''), a.backend_type) || ' (' || coalesce(a.usename::text, '?') || ')' AS who,
        a.state || ': ' || left(a.query, 200) AS detail,
        CASE WHEN a.backend_xid IS NOT NULL AND (a.backend_xmin IS NULL OR age(a.backend_xid) > age(a.backend_xmin))
             THEN a.backend_xid ELSE a.backend_xmin END AS xmin,
        coalesce(a.xact_start, a.backend_start) AS since
    FROM pg_stat_activity AS a
    WHERE a.datname = current_database()
      AND a.pid <> pg_backend_pid()
      AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.backend_type <> 'autovacuum worker'
    UNION ALL
    SELECT 'replication slot', 'replication_slot', s.slot_name::text, s.active_pid, NULL,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, s.slot_type, 'active=' || s.active, s.xmin, NULL
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', 'prepared_transaction', p.gid, NULL, NULL, 'prepared', p.owner::text, 'prepared',
           p.transaction, p.prepared
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
    UNION ALL
    -- no start time: backend_start is when the standby connected, not when its xmin was taken
    SELECT 'standby feedback', 'standby', r.pid::text, r.pid, r.application_name, r.state, r.application_name, r.state,
           r.backend_xmin, NULL
    FROM pg_stat_replication AS r
    WHERE r.backend_xmin IS NOT NULL
) AS h
ORDER BY age(h.xmin) DESC, h.since NULLS LAST
LIMIT 10;

-- name: held_back_work
-- Paused queues, limited queues and limited kinds, with their jobs among the first %(cap)s
-- entries of the claim index (its own order, like the claim): the workers' claim leaves that
-- work alone and walks past it, so a backlog there makes every claim dearer. The head is
-- walked only when something is paused or limited (a one-time filter); `running` counts through
-- jobs_lease_idx (running rows are few) and `tokens` is the rate bucket as of now, as
-- sql/limits.sql queue_limits computes it.
WITH held AS (
    SELECT
        'queue' AS unit,
        q.name,
        q.paused,
        q.paused_at,
        q.paused_by,
        q.limited OR q.fair AS limited,
        q.concurrency,
        q.rate_count,
        q.rate_period,
        CASE WHEN q.rate_count IS NOT NULL THEN
            least(q.burst, coalesce(q.tokens, q.burst)
                  + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(q.refilled_at, clock_timestamp())))
                    * q.rate_count::double precision / q.rate_period)
        END AS tokens,
        q.limits_set_at AS limited_since,
        q.limits_set_by AS limited_by
    FROM skiplock.queues AS q
    WHERE q.paused OR q.limited OR q.fair
    UNION ALL
    SELECT 'kind', k.kind, false, NULL, NULL, true, k.concurrency, NULL, NULL, NULL, k.updated_at, k.declared_by
    FROM skiplock.kind_limits AS k
),
head AS (
    SELECT j.queue, j.kind, j.run_at
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND EXISTS (SELECT 1 FROM held)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(cap)s
)
SELECT
    h.unit,
    h.name,
    h.paused,
    h.paused_at,
    h.paused_by,
    h.limited,
    h.concurrency,
    h.rate_count,
    h.rate_period,
    h.tokens::float8 AS tokens,
    h.limited_since,
    h.limited_by,
    w.waiting,
    w.eligible,
    w.oldest_eligible_s,
    (SELECT count(*)
     FROM skiplock.jobs AS r
     WHERE r.status = 'running'
       AND CASE WHEN h.unit = 'queue' THEN r.queue = h.name ELSE r.kind = h.name END) AS running
FROM held AS h
CROSS JOIN LATERAL (
    SELECT
        count(*) AS waiting,
        count(*) FILTER (WHERE x.run_at <= now()) AS eligible,
        extract(epoch FROM now() - min(x.run_at) FILTER (WHERE x.run_at <= now()))::float8 AS oldest_eligible_s
    FROM head AS x
    WHERE CASE WHEN h.unit = 'queue' THEN x.queue = h.name ELSE x.kind = h.name END
) AS w
ORDER BY w.waiting DESC, h.unit DESC, h.name;

-- name: operator_changes
-- What operators did between %(since)s and %(until)s that changes the queue's load (the actions
-- in %(actions)s: pauses, limits, bulk replays and purges, maintenance run by hand), newest
-- first, through audit_log_at_idx; sign-ins, users, tokens and alert settings are left out.
SELECT
    a.id,
    a.at,
    a.actor,
    a.action,
    a.target,
    a.reason,
    a.rows,
    a.outcome
FROM skiplock.audit_log AS a
WHERE a.at >= %(since)s
  AND a.at <= %(until)s
  AND a.action = ANY(%(actions)s::text[])
ORDER BY a.at DESC, a.id DESC
LIMIT %(limit)s;

-- name: stuck_leases
-- Running jobs whose lease has expired, oldest expiry first (walks jobs_lease_idx).
SELECT
    j.id,
    j.queue,
    j.kind,
    j.locked_by,
    j.attempts,
    extract(epoch FROM now() - j.lease_until) AS overdue_s,
    extract(epoch FROM now() - j.locked_at) AS running_s
FROM skiplock.jobs AS j
WHERE j.status = 'running'
  AND j.lease_until < now()
ORDER BY j.lease_until
LIMIT %(limit)s;

-- name: running_counts
-- Running jobs (capped) and how many of them have an expired lease (capped).
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j WHERE j.status = 'running' LIMIT %(cap)s
    ) AS r) AS running,
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j WHERE j.status = 'running' AND j.lease_until < now() LIMIT %(cap)s
    ) AS e) AS expired;

-- name: worker_runtimes
-- Workers seen recently, with their cumulative job-runtime histograms.
SELECT
    w.id,
    w.runtime_histogram,
    w.completed + w.failed + w.retried AS finished,
    w.stopped_at IS NULL AND w.last_seen > now() - interval '1 minute' AS live
FROM skiplock.workers AS w
WHERE w.last_seen > now() - make_interval(secs => %(window_s)s)
ORDER BY w.id;

-- name: attempt_caps
-- Among the next %(scan)s jobs to run (the head of the claim index) and the running ones (the
-- lease index), those allowed more than %(threshold)s attempts, by kind.
SELECT
    n.kind,
    n.queue,
    count(*) AS jobs,
    max(n.max_attempts) AS max_attempts,
    min(n.id) AS example_id
FROM (
    (SELECT j.id, j.kind, j.queue, j.max_attempts
     FROM skiplock.jobs AS j
     WHERE j.status = 'pending'
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT %(scan)s)
    UNION ALL
    (SELECT j.id, j.kind, j.queue, j.max_attempts
     FROM skiplock.jobs AS j
     WHERE j.status = 'running'
     ORDER BY j.lease_until
     LIMIT %(scan)s)
) AS n
WHERE n.max_attempts > %(threshold)s
GROUP BY n.kind, n.queue
ORDER BY max(n.max_attempts) DESC, n.kind
LIMIT 20;

-- name: hot_loops
-- Jobs whose recorded attempts came less than %(gap_s)s seconds apart, at least %(min_quick)s
-- times: the newest dead letters (jobs_failed_idx) and the retries among the next jobs to run.
WITH recent AS (
    (SELECT j.id, j.kind, j.queue, j.status, j.attempts, j.max_attempts, j.errors
     FROM skiplock.jobs AS j
     WHERE j.status = 'failed'
     ORDER BY j.finished_at DESC, j.id DESC
     LIMIT %(scan)s)
    UNION ALL
    (SELECT h.id, h.kind, h.queue, h.status, h.attempts, h.max_attempts, h.errors
     FROM (
         SELECT j.id, j.kind, j.queue, j.status, j.attempts, j.max_attempts, j.errors
         FROM skiplock.jobs AS j
         WHERE j.status = 'pending'
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT %(scan)s
     ) AS h
     WHERE h.attempts > 1)
)
SELECT
    r.id,
    r.kind,
    r.queue,
    r.status,
    r.attempts,
    r.max_attempts,
    g.quick,
    g.min_gap_s
FROM recent AS r
CROSS JOIN LATERAL (
    SELECT
        count(*) FILTER (WHERE gaps.gap < %(gap_s)s) AS quick,
        min(gaps.gap) AS min_gap_s
    FROM (
        SELECT extract(epoch FROM (e.value ->> 'at')::timestamptz
                       - lag((e.value ->> 'at')::timestamptz) OVER (ORDER BY e.n)) AS gap
        FROM jsonb_array_elements(r.errors) WITH ORDINALITY AS e (value, n)
    ) AS gaps
) AS g
WHERE g.quick >= %(min_quick)s
ORDER BY g.quick DESC, r.id
LIMIT 20;

-- name: dead_letters
-- Dead-letter counts (capped) and age, all through jobs_failed_idx.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j WHERE j.status = 'failed' LIMIT %(cap)s
    ) AS a) AS total,
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j
        WHERE j.status = 'failed' AND j.finished_at > now() - interval '1 day'
        LIMIT %(cap)s
    ) AS d) AS last_day,
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j
        WHERE j.status = 'failed' AND j.finished_at > now() - interval '1 hour'
        LIMIT %(cap)s
    ) AS h) AS last_hour,
    (SELECT extract(epoch FROM now() - min(j.finished_at))
     FROM skiplock.jobs AS j
     WHERE j.status = 'failed') AS oldest_s;

-- name: completed_sample
-- A page sample of the hot table (TABLESAMPLE SYSTEM reads about %(percent)s%% of its pages):
-- how many rows are completed, and how many finished longer ago than the archival age.
SELECT
    count(*) AS sampled,
    count(*) FILTER (WHERE j.status = 'completed') AS completed,
    count(*) FILTER (WHERE j.status = 'completed'
                       AND j.finished_at < now() - make_interval(secs => %(age_s)s)) AS old_completed,
    extract(epoch FROM now() - min(j.finished_at) FILTER (WHERE j.status = 'completed')) AS oldest_completed_s
FROM skiplock.jobs AS j TABLESAMPLE SYSTEM (%(percent)s);

-- name: fk_into_jobs
-- Foreign keys whose referenced table is one of the jobs tables.
SELECT
    con.conname AS constraint_name,
    con.conrelid::regclass::text AS child_table,
    con.confrelid::regclass::text AS parent_table,
    pg_get_constraintdef(con.oid) AS definition,
    coalesce(t.n_tup_ins, 0) + coalesce(t.n_tup_upd, 0) AS child_writes
FROM pg_constraint AS con
LEFT JOIN pg_stat_all_tables AS t ON t.relid = con.conrelid
WHERE con.contype = 'f'
  AND con.confrelid IN ('skiplock.jobs'::regclass, 'skiplock.jobs_archive'::regclass)
ORDER BY con.conname;

-- name: row_lockers
-- Sessions in an open transaction that hold a row-level lock mode on the hot table (FOR SHARE,
-- FOR KEY SHARE and FOR UPDATE all take RowShareLock; foreign-key checks from child tables too).
SELECT
    a.pid,
    a.application_name,
    a.state,
    extract(epoch FROM now() - a.xact_start) AS xact_s,
    left(a.query, 400) AS query
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.relation = 'skiplock.jobs'::regclass
  AND l.mode = 'RowShareLock'
  AND l.granted
  AND a.pid <> pg_backend_pid()
ORDER BY a.xact_start, a.pid;

-- name: multixact_state
-- The live MultiXact counter (mxid_age of the first id is next id - 1), the server's freeze
-- setting, and sessions waiting on MultiXact or subtransaction SLRUs right now.
SELECT
    mxid_age('1'::xid)::bigint AS next_mxid,
    current_setting('autovacuum_multixact_freeze_max_age')::bigint AS mxid_freeze_max_age,
    (SELECT max(mxid_age(d.datminmxid)) FROM pg_database AS d WHERE d.datallowconn) AS oldest_db_mxid_age,
    (SELECT count(*) FROM pg_stat_activity AS a
     WHERE a.wait_event LIKE 'MultiXact%%') AS multixact_waiters,
    (SELECT count(*) FROM pg_stat_activity AS a
     WHERE a.wait_event LIKE 'Subtrans%%') AS subtrans_waiters,
    (SELECT count(*) FROM pg_stat_activity AS a
     -- SLRURead, SLRUWrite, ... on 13-16; SlruRead, SlruWrite, ... on 17+
     WHERE a.wait_event_type = 'IO' AND a.wait_event ILIKE 'slru%%') AS slru_io_waiters;

-- name: slru_stats
SELECT
    s.name,
    s.blks_zeroed,
    s.blks_hit,
    s.blks_read,
    s.blks_written
FROM pg_stat_slru AS s
ORDER BY s.name;

-- name: multixact_offsets
-- Only readable with the right privileges (pg_control_checkpoint); updated at checkpoints.
SELECT
    c.next_multixact_id::text::bigint AS next_multixact_id,
    c.next_multi_offset::text::bigint AS next_multi_offset,
    c.checkpoint_time
FROM pg_control_checkpoint() AS c;

-- name: notify_usage
SELECT pg_notification_queue_usage() AS usage;

-- name: connections
SELECT
    (SELECT count(*) FROM pg_stat_activity AS a WHERE a.backend_type = 'client backend') AS clients,
    current_setting('max_connections')::int AS max_connections,
    current_setting('superuser_reserved_connections')::int AS reserved,
    (SELECT coalesce(jsonb_agg(x ORDER BY x.sessions DESC), '[]'::jsonb) FROM (
        SELECT coalesce(nullif(a.application_name, ''), '(unnamed)') AS application, count(*) AS sessions
        FROM pg_stat_activity AS a
        WHERE a.backend_type = 'client backend'
        GROUP BY 1
        ORDER BY 2 DESC
        LIMIT 5
    ) AS x) AS top_applications;

-- name: replication
-- Standbys of this server with their lag, and slots with the WAL they retain.
SELECT
    'standby' AS kind,
    coalesce(nullif(r.application_name, ''), r.client_addr::text, r.pid::text) AS name,
    r.state AS detail,
    extract(epoch FROM r.replay_lag) AS lag_s,
    CASE WHEN pg_is_in_recovery() THEN NULL
         ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn) END AS lag_bytes
FROM pg_stat_replication AS r
UNION ALL
SELECT
    'slot',
    s.slot_name::text,
    'active=' || s.active,
    NULL,
    CASE WHEN pg_is_in_recovery() THEN NULL
         ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn) END
FROM pg_replication_slots AS s
ORDER BY 1, 2;

-- name: wal_position
-- The WAL written so far (a primary's insert position; a standby's replay position).
SELECT
    pg_is_in_recovery() AS in_recovery,
    pg_wal_lsn_diff(
        CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END,
        '0/0'
    )::float8 AS wal_bytes,
    CASE WHEN pg_is_in_recovery()
         THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END AS replay_delay_s;

-- name: snapshot_get
SELECT s.taken_at, s.data, extract(epoch FROM now() - s.taken_at) AS age_s
FROM skiplock.advisor_snapshots AS s
WHERE s.name = %(name)s;

-- name: snapshot_put
INSERT INTO skiplock.advisor_snapshots AS s (name, taken_at, data)
VALUES (%(name)s, now(), %(data)s)
ON CONFLICT (name) DO UPDATE
SET taken_at = now(),
    data = excluded.data;

-- name: relation_exists
SELECT to_regclass(%(name)s) IS NOT NULL AS exists;

-- name: maintenance_last_run
-- The newest run of a maintenance task (reap, archive) and the newest that ended well
-- (maintenance_runs_task_idx).
SELECT
    r.outcome,
    r.error,
    r.rows,
    r.actor,
    extract(epoch FROM now() - coalesce(r.finished_at, r.started_at)) AS age_s,
    (SELECT extract(epoch FROM now() - coalesce(o.finished_at, o.started_at))
     FROM skiplock.maintenance_runs AS o
     WHERE o.task = %(task)s
       AND o.outcome = 'ok'
     ORDER BY o.id DESC
     LIMIT 1) AS last_ok_age_s
FROM skiplock.maintenance_runs AS r
WHERE r.task = %(task)s
ORDER BY r.id DESC
LIMIT 1;

-- name: completed_counts
-- Completed rows older than the archival age, counted through jobs_completed_idx up to a cap,
-- and the oldest one.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j
        WHERE j.status = 'completed' AND j.finished_at < now() - make_interval(secs => %(age_s)s)
        LIMIT %(cap)s
    ) AS o) AS old_completed,
    (SELECT count(*) FROM (
        SELECT 1 FROM skiplock.jobs AS j WHERE j.status = 'completed' LIMIT %(cap)s
    ) AS c) AS completed,
    (SELECT extract(epoch FROM now() - min(j.finished_at))
     FROM skiplock.jobs AS j
     WHERE j.status = 'completed') AS oldest_completed_s;

-- name: capabilities
-- What this server and role let the advisor read, asked without provoking an error.
SELECT
    EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements') AS pg_stat_statements,
    has_function_privilege('pg_control_checkpoint()', 'execute') AS control_data;

-- name: scheduler_job
-- The scheduler's record of one of its jobs (reap, archive) and whether a live leader exists.
SELECT
    j.job,
    j.interval_seconds,
    j.last_error,
    extract(epoch FROM now() - j.last_finished_at) AS last_run_age_s,
    extract(epoch FROM now() - j.last_ok_at) AS last_ok_age_s,
    (SELECT n.id
     FROM skiplock.scheduler_nodes AS n
     WHERE n.is_leader
       AND n.stopped_at IS NULL
       AND n.last_seen >= now() - interval '30 seconds'
     ORDER BY n.last_seen DESC
     LIMIT 1) AS live_leader
FROM (SELECT %(job)s::text AS job) AS wanted
LEFT JOIN skiplock.scheduler_jobs AS j ON j.job = wanted.job;
