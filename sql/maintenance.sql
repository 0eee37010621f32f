-- Maintenance of the jobs tables: archival of completed jobs, archive partitions and retention,
-- and the maintenance-run rows that record each run. Every statement that changes rows is
-- bounded by %(batch_size)s; the Python side runs each in its own short transaction.
-- Queries with `{placeholders}` are DDL templates composed with psycopg.sql (partition names
-- and bounds cannot be bound parameters).

-- name: run_start
INSERT INTO skiplock.maintenance_runs (task, actor, detail, backend_pid, backend_start)
SELECT
    %(task)s,
    %(actor)s,
    %(detail)s,
    a.pid,
    a.backend_start
FROM pg_stat_activity AS a
WHERE a.pid = pg_backend_pid()
RETURNING id, started_at;

-- name: run_batch
-- Written in the same transaction as the batch it counts.
UPDATE skiplock.maintenance_runs AS r
SET batches = r.batches + 1,
    rows = r.rows + %(rows)s,
    slowest_batch_ms = greatest(r.slowest_batch_ms, %(batch_ms)s),
    heartbeat_at = now()
WHERE r.id = %(id)s;

-- name: run_finish
UPDATE skiplock.maintenance_runs AS r
SET finished_at = now(),
    heartbeat_at = now(),
    outcome = %(outcome)s,
    error = %(error)s,
    detail = r.detail || %(detail)s
WHERE r.id = %(id)s
RETURNING r.*;

-- name: runs_mark_abandoned
-- A 'running' row whose backend is no longer connected will never finish: its process died.
UPDATE skiplock.maintenance_runs AS r
SET outcome = 'abandoned',
    finished_at = r.heartbeat_at,
    error = 'the process running it went away (killed or lost its connection)'
WHERE r.outcome = 'running'
  AND NOT EXISTS (
      SELECT 1
      FROM pg_stat_activity AS a
      WHERE a.pid = r.backend_pid
        AND a.backend_start = r.backend_start
  )
RETURNING r.id;

-- name: runs_recent
SELECT
    r.id,
    r.task,
    r.actor,
    r.started_at,
    r.finished_at,
    r.heartbeat_at,
    r.batches,
    r.rows,
    r.slowest_batch_ms,
    r.outcome,
    r.error,
    r.detail
FROM skiplock.maintenance_runs AS r
WHERE (%(task)s::text IS NULL OR r.task = %(task)s)
ORDER BY r.id DESC
LIMIT %(limit)s;

-- name: runs_last_by_task
-- The newest run of each task (the maintenance page's summary): one index probe per task.
SELECT
    r.id,
    r.task,
    r.actor,
    r.started_at,
    r.finished_at,
    r.batches,
    r.rows,
    r.slowest_batch_ms,
    r.outcome,
    r.error
FROM unnest(%(tasks)s::text[]) AS t (task)
CROSS JOIN LATERAL (
    SELECT m.*
    FROM skiplock.maintenance_runs AS m
    WHERE m.task = t.task
    ORDER BY m.id DESC
    LIMIT 1
) AS r
ORDER BY r.task;

-- name: archive_batch
-- Move up to %(batch_size)s completed jobs finished before %(cutoff)s into the archive, oldest
-- first, in one statement. The keyset (finished_at, id) > cursor keeps each batch from
-- re-walking the dead index entries the previous batches left behind. SKIP LOCKED lets two
-- archivers run at once without waiting on each other. `id = ANY(ARRAY(...))` makes the
-- DELETE fetch exactly those rows by primary key (a join could pick a hash join over a seq scan).
WITH batch AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'completed'
      AND j.finished_at < %(cutoff)s
      AND (j.finished_at, j.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::bigint)
    ORDER BY j.finished_at, j.id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM skiplock.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT b.id FROM batch AS b))
      AND j.status = 'completed'
    RETURNING j.*
),
archived AS (
    INSERT INTO skiplock.jobs_archive (
        id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
        idempotency_key, locked_by, locked_at, lease_until, last_error, errors,
        error_fingerprint, created_at, finished_at, cancel_requested_at, headers, attempt_logs, group_key
    )
    SELECT
        m.id, m.queue, m.kind, m.payload, m.status, m.priority, m.run_at, m.attempts, m.max_attempts,
        m.idempotency_key, m.locked_by, m.locked_at, m.lease_until, m.last_error, m.errors,
        m.error_fingerprint, m.created_at, m.finished_at, m.cancel_requested_at, m.headers, m.attempt_logs, m.group_key
    FROM moved AS m
    RETURNING 1
)
SELECT
    (SELECT count(*) FROM moved) AS rows,
    (SELECT count(*) FROM archived) AS archived,
    last.finished_at AS last_finished_at,
    last.id AS last_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT m.finished_at, m.id
    FROM moved AS m
    ORDER BY m.finished_at DESC, m.id DESC
    LIMIT 1
) AS last ON true;

-- name: delete_batch
-- "delete" mode: the same batch, removed without a copy.
WITH batch AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'completed'
      AND j.finished_at < %(cutoff)s
      AND (j.finished_at, j.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::bigint)
    ORDER BY j.finished_at, j.id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM skiplock.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT b.id FROM batch AS b))
      AND j.status = 'completed'
    RETURNING j.finished_at, j.id
)
SELECT
    (SELECT count(*) FROM moved) AS rows,
    0::bigint AS archived,
    last.finished_at AS last_finished_at,
    last.id AS last_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT m.finished_at, m.id
    FROM moved AS m
    ORDER BY m.finished_at DESC, m.id DESC
    LIMIT 1
) AS last ON true;

-- name: oldest_completed
-- One index probe: the finish time of the oldest completed job still in the hot table.
SELECT j.finished_at
FROM skiplock.jobs AS j
WHERE j.status = 'completed'
ORDER BY j.finished_at, j.id
LIMIT 1;

-- name: archive_partitions
-- The archive's day partitions, oldest first, with their bounds read from the catalog.
SELECT
    c.relname AS name,
    to_date(substr(c.relname, length('jobs_archive_p') + 1), 'YYYYMMDD') AS day,
    c.reltuples::bigint AS estimated_rows
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'skiplock.jobs_archive'::regclass
  AND c.relname ~ '^jobs_archive_p[0-9]{8}$'
ORDER BY c.relname;

-- name: default_partition_has_rows
-- Would a new partition for [lo, hi) collide with rows already in the default partition?
SELECT EXISTS (
    SELECT 1
    FROM skiplock.jobs_archive_default AS d
    WHERE d.finished_at >= %(lo)s
      AND d.finished_at < %(hi)s
) AS has_rows;

-- name: create_partition
CREATE TABLE IF NOT EXISTS {partition}
    PARTITION OF skiplock.jobs_archive
    FOR VALUES FROM ({lo}) TO ({hi});

-- name: drop_partition
DROP TABLE IF EXISTS {partition};

-- name: retention_batch
-- Archived rows finished before %(cutoff)s that no partition drop removed (the partition that
-- straddles the cutoff, the default partition), oldest first, at most %(batch_size)s.
WITH batch AS (
    SELECT a.id
    FROM skiplock.jobs_archive AS a
    WHERE a.finished_at < %(cutoff)s
    ORDER BY a.finished_at
    LIMIT %(batch_size)s
)
DELETE FROM skiplock.jobs_archive AS a
WHERE a.id = ANY(ARRAY(SELECT b.id FROM batch AS b))
  AND a.finished_at < %(cutoff)s;

-- name: archive_lookup
-- One archived job by id (the console's "where did job 42 go?").
SELECT a.*
FROM skiplock.jobs_archive AS a
WHERE a.id = %(id)s
ORDER BY a.archived_at DESC
LIMIT 1;

-- name: archive_size
-- Partitioned tables have no storage of their own: sum the partitions.
SELECT
    count(*) AS partitions,
    coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint AS total_bytes,
    coalesce(sum(c.reltuples) FILTER (WHERE c.reltuples > 0), 0)::bigint AS estimated_rows
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'skiplock.jobs_archive'::regclass;

-- name: prune_runs
-- Maintenance-run rows older than the archive's retention go with it, a bounded batch per run.
-- Ids grow with time, so the oldest rows are at the start of the primary key.
DELETE FROM skiplock.maintenance_runs AS r
WHERE r.id = ANY(ARRAY(
    SELECT o.id
    FROM skiplock.maintenance_runs AS o
    WHERE o.outcome <> 'running'
      AND o.started_at < %(cutoff)s
    ORDER BY o.id
    LIMIT %(batch_size)s
));

-- name: task_try_lock
-- One run-now of a task at a time across every web worker: a session advisory lock (task
-- namespace, task number) held by the connection doing the work; never waited on.
SELECT pg_try_advisory_lock(%(lock_class)s::integer, %(task_key)s::integer) AS locked;

-- name: task_unlock
SELECT pg_advisory_unlock(%(lock_class)s::integer, %(task_key)s::integer) AS unlocked;

-- name: run_live
-- A 'running' row of this task whose backend is still connected (the scheduler's, the CLI's or
-- another console's run in progress).
SELECT
    r.id,
    r.actor,
    r.started_at
FROM skiplock.maintenance_runs AS r
JOIN pg_stat_activity AS a
  ON a.pid = r.backend_pid
 AND a.backend_start = r.backend_start
WHERE r.task = %(task)s
  AND r.outcome = 'running'
ORDER BY r.started_at
LIMIT 1;

-- name: known_queues
-- Every queue name with jobs or a row of its own, for `skiplock pause`'s refusal of a name no
-- queue has (console/maintenance/actions.py known_queues): the queues table, and the queues of
-- the first %(cap)s entries of the claim index, of the lease index, and of the newest
-- %(failed_cap)s dead letters (the queue figures' own bounds, sql/browse.sql). No scan. Search
-- reads the same names under the figures' caps (console/browse.py queue_names).
SELECT q.name AS queue
FROM skiplock.queues AS q
UNION
SELECT p.queue
FROM (
    SELECT j.queue
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(cap)s
) AS p
UNION
SELECT r.queue
FROM (
    SELECT j.queue
    FROM skiplock.jobs AS j
    WHERE j.status = 'running'
    ORDER BY j.lease_until
    LIMIT %(cap)s
) AS r
UNION
SELECT f.queue
FROM (
    SELECT j.queue
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
    ORDER BY j.finished_at DESC, j.id DESC
    LIMIT %(failed_cap)s
) AS f
ORDER BY 1;

-- name: caps_paused_queues
-- caps.paused_queues: queues paused now, and whether this one is (pausing it again adds nothing).
SELECT count(*) FILTER (WHERE q.paused) AS held,
       coalesce(bool_or(q.paused AND q.name = %(queue)s), false) AS exists
FROM skiplock.queues AS q;
