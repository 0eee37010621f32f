-- Operator actions on queues Skiplock did not create (console.external.actions): replay, purge,
-- cancel, pause and resume, each made the way the library itself makes it (by calling its own
-- SQL function where it has one, else by the same change its client code makes), only on a
-- source whose [[external_queues]] entry has `actions = true`.
--
-- The adapter fills the {placeholders} with psycopg.sql pieces: {table} the queue table,
-- {schema} the library's schema, {key} a job's key as text, {key_match} the predicate that
-- finds jobs by a batch of keys through the primary key (bound as %(keys)s, or as pairs:
-- %(key_queues)s/%(key_ids)s, %(key_names)s/%(key_ids)s), {queue}, {failed}, {pending},
-- {failed_at}, {error}, {attempts} from its Shape. Values are bound.
--
-- A library function is called once per job of a MATERIALIZED CTE that already holds exactly
-- the jobs to change: never from a join the planner could evaluate before its filter (a
-- LATERAL call beside a semi-join on the keys called BullMQ's remove() for every failed job).
--
-- An action's batch is one transaction: `lock_*` takes the row locks of the batch's jobs that
-- are still what the action needs (FOR UPDATE: wait for a worker or another operation, never
-- skip), then the library's statement changes exactly those; the libraries' workers claim with
-- FOR UPDATE SKIP LOCKED, so none claims a job in the middle of it, and a job claimed or
-- changed before the lock is no longer matched (counted as skipped, never touched).

-- name: dead_letters_digest
-- What a preview shows and a start is bound to: the number of dead letters matching the
-- selection (read up to %(cap)s + 1, so "more than the cap" is known), and an MD5 of their
-- keys in order: the start recomputes it and refuses when another set of jobs matches.
SELECT
    now() AS previewed_at,
    count(*)::bigint AS total,
    md5(coalesce(string_agg(d.key, E'\n' ORDER BY d.key), '')) AS digest
FROM (
    SELECT {key} AS key
    FROM {table} AS j
    WHERE ({failed})
      AND (%(queue)s::text IS NULL OR ({queue})::text = %(queue)s::text)
      AND (%(all_keys)s::boolean OR ({key_match}))
    LIMIT %(cap)s
) AS d;

-- name: dead_letters_keys
-- The keys an operation works through, in key order (at most %(cap)s).
SELECT {key} AS key
FROM {table} AS j
WHERE ({failed})
  AND (%(queue)s::text IS NULL OR ({queue})::text = %(queue)s::text)
  AND (%(all_keys)s::boolean OR ({key_match}))
ORDER BY 1
LIMIT %(cap)s;

-- name: dead_letters_list
-- Dead letters matching the selection, newest failure first (the library's time of failure,
-- then the key), keyset-paginated after (%(before_at)s, %(before_key)s).
SELECT
    {key} AS key,
    ({queue})::text AS queue,
    ({failed_at})::timestamptz AS failed_at,
    left(({error})::text, 2000) AS error,
    ({attempts})::integer AS attempts
FROM {table} AS j
WHERE ({failed})
  AND (%(queue)s::text IS NULL OR ({queue})::text = %(queue)s::text)
  AND (%(all_keys)s::boolean OR ({key_match}))
  AND (%(before_key)s::text IS NULL
       OR (coalesce(({failed_at})::timestamptz, '-infinity'), {key})
          < (coalesce(%(before_at)s::timestamptz, '-infinity'), %(before_key)s::text))
ORDER BY coalesce(({failed_at})::timestamptz, '-infinity') DESC, 1 DESC
LIMIT %(limit)s;

-- name: lock_dead_letters
-- The batch's jobs that are still dead letters, locked until the batch commits.
SELECT {key} AS key
FROM {table} AS j
WHERE ({key_match})
  AND ({failed})
ORDER BY 1
FOR UPDATE OF j;

-- name: lock_waiting
-- The batch's jobs that still wait (for cancel), locked until the batch commits.
SELECT {key} AS key
FROM {table} AS j
WHERE ({key_match})
  AND ({pending})
ORDER BY 1
FOR UPDATE OF j;

-- --- PGQueuer (1.6.0: pgqueuer/adapters/persistence/qb.py, core/insights.py) ------------------

-- name: pgqueuer_replay
-- Its requeue of held jobs: failed -> queued, due now, attempts from 0, no queue manager, and
-- a 'queued' row in its log.
WITH requeued AS (
    UPDATE {table} AS j
    SET status = 'queued',
        execute_after = now(),
        updated = now(),
        attempts = 0,
        queue_manager_id = NULL
    WHERE ({key_match})
      AND j.status = 'failed'
    RETURNING j.id, j.entrypoint, j.priority
),
logged AS (
    INSERT INTO {log} (job_id, status, entrypoint, priority)
    SELECT r.id, 'queued', r.entrypoint, r.priority
    FROM requeued AS r
    RETURNING 1
)
SELECT (SELECT count(*) FROM requeued) AS n;

-- name: pgqueuer_purge
-- A held failed job deleted, with a 'deleted' row in its log (as its clear_queue records a
-- removal).
WITH removed AS (
    DELETE FROM {table} AS j
    WHERE ({key_match})
      AND j.status = 'failed'
    RETURNING j.id, j.entrypoint, j.priority
),
logged AS (
    INSERT INTO {log} (job_id, status, entrypoint, priority)
    SELECT r.id, 'deleted', r.entrypoint, r.priority
    FROM removed AS r
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS n;

-- name: pgqueuer_cancel
-- A queued job deleted with a 'canceled' row in its log (its mark_job_as_cancelled; no worker
-- holds a queued job, so no cancellation NOTIFY is owed).
WITH removed AS (
    DELETE FROM {table} AS j
    WHERE ({key_match})
      AND j.status = 'queued'
    RETURNING j.id, j.entrypoint, j.priority
),
logged AS (
    INSERT INTO {log} (job_id, status, entrypoint, priority)
    SELECT r.id, 'canceled', r.entrypoint, r.priority
    FROM removed AS r
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS n;

-- --- Procrastinate (3.10.0: procrastinate/sql/schema.sql, queries.sql) -------------------------

-- name: procrastinate_replay
-- Its own function, as its shell's `retry` calls it: failed -> todo, scheduled now (its trigger
-- records the 'retried' event and NOTIFYs the workers).
WITH target AS MATERIALIZED (
    SELECT j.id
    FROM {table} AS j
    WHERE ({key_match})
      AND j.status = 'failed'
)
SELECT count({schema}.procrastinate_retry_job_v2(t.id, now(), NULL, NULL, NULL)) AS n
FROM target AS t;

-- name: procrastinate_purge
-- What its delete_old_jobs deletes (a failed job, its events by ON DELETE CASCADE), chosen by id.
WITH removed AS (
    DELETE FROM {table} AS j
    WHERE ({key_match})
      AND j.status = 'failed'
    RETURNING 1
)
SELECT count(*) AS n
FROM removed;

-- name: procrastinate_cancel
-- Its own function, as JobManager.cancel_job_by_id calls it (abort false, keep the job): a todo
-- job becomes cancelled.
WITH target AS MATERIALIZED (
    SELECT j.id
    FROM {table} AS j
    WHERE ({key_match})
      AND j.status = 'todo'
)
SELECT count({schema}.procrastinate_cancel_job_v1(t.id, false, false)) AS n
FROM target AS t;

-- --- graphile-worker (0.18.0: website/docs/admin-functions.md, sql/000016.sql) ----------------

-- name: graphile_replay
-- reschedule_jobs: runs now, with its whole attempt budget again (it skips a locked job).
SELECT count(*) AS n
FROM {schema}.reschedule_jobs(
    ARRAY(SELECT j.id FROM {table} AS j WHERE ({key_match}) AND ({failed})),
    run_at => now(),
    attempts => 0
);

-- name: graphile_purge
-- complete_jobs: "completing a job deletes it" (it skips a locked job).
SELECT count(*) AS n
FROM {schema}.complete_jobs(
    ARRAY(SELECT j.id FROM {table} AS j WHERE ({key_match}) AND ({failed}))
);

-- name: graphile_cancel
-- permanently_fail_jobs: a waiting job keeps its row as a dead letter with the reason as its
-- last error (it skips a locked job).
SELECT count(*) AS n
FROM {schema}.permanently_fail_jobs(
    ARRAY(SELECT j.id FROM {table} AS j WHERE ({key_match}) AND ({pending})),
    %(note)s::text
);

-- --- pg-boss (10.4.2: src/plans.js retryJobs, deleteJobs, cancelJobs) -------------------------

-- name: pgboss_replay
-- Its retry of a dead letter: failed -> retry with one more retry allowed (start_after is in the
-- past, so its fetch takes it at once).
WITH retried AS (
    UPDATE {table} AS j
    SET state = 'retry',
        retry_limit = j.retry_limit + 1
    WHERE ({key_match})
      AND j.state = 'failed'
    RETURNING 1
)
SELECT count(*) AS n
FROM retried;

-- name: pgboss_purge
-- Its deleteJob, of failed jobs only.
WITH removed AS (
    DELETE FROM {table} AS j
    WHERE ({key_match})
      AND j.state = 'failed'
    RETURNING 1
)
SELECT count(*) AS n
FROM removed;

-- name: pgboss_cancel
-- Its cancel, of waiting jobs only (created or retry).
WITH cancelled AS (
    UPDATE {table} AS j
    SET completed_on = now(),
        state = 'cancelled'
    WHERE ({key_match})
      AND j.state IN ('created', 'retry')
    RETURNING 1
)
SELECT count(*) AS n
FROM cancelled;

-- --- BullMQ on PostgreSQL (6.7.0: src/postgres/migrations/0002_functions.sql) -----------------

-- name: bullmq_replay
-- Its own function, as Job.retry('failed') calls it (attempts reset): failed -> waiting.
WITH target AS MATERIALIZED (
    SELECT j.queue, j.id
    FROM {table} AS j
    WHERE ({key_match})
      AND j.state = 'failed'
)
SELECT count(*) FILTER (WHERE {schema}.reprocess_job(t.queue, t.id, 'failed', false, true, true) = 1) AS n
FROM target AS t;

-- name: bullmq_purge
-- Its own function, as Job.remove() calls it (it refuses a locked job and returns 0).
WITH target AS MATERIALIZED (
    SELECT j.queue, j.id
    FROM {table} AS j
    WHERE ({key_match})
      AND j.state = 'failed'
)
SELECT coalesce(sum({schema}.remove(t.queue, t.id, false)), 0)::bigint AS n
FROM target AS t;

-- name: bullmq_cancel
-- Job.remove() of a job that still waits (waiting or delayed).
WITH target AS MATERIALIZED (
    SELECT j.queue, j.id
    FROM {table} AS j
    WHERE ({key_match})
      AND j.state IN ('waiting', 'delayed')
)
SELECT coalesce(sum({schema}.remove(t.queue, t.id, false)), 0)::bigint AS n
FROM target AS t;

-- name: bullmq_pause
-- Queue.pause(): its function sets the queue's `paused` flag (workers stop taking its jobs).
SELECT {schema}.pause(%(queue)s::text, true);

-- name: bullmq_resume
-- Queue.resume(): its function clears the flag and wakes the workers.
SELECT {schema}.pause(%(queue)s::text, false);

-- name: bullmq_paused
-- The queues BullMQ has paused (its meta flag).
SELECT m.queue
FROM {meta} AS m
WHERE m.field = 'paused'
  AND m.value = '1'
ORDER BY m.queue;

-- --- pgmq (pgmq.sql 1.13.0, from the PyPI package pgmq 1.1.4) --------------------------------

-- name: pgmq_cancel
-- Its own archive(queue, msg_ids): a message that still waits leaves the queue for its archive
-- table (a message a consumer read and still hides is not waiting: left alone).
SELECT count(*) AS n
FROM pgmq.archive(
    {qname}::text,
    ARRAY(SELECT j.msg_id FROM {table} AS j WHERE ({key_match}) AND ({pending}))
);

-- --- Skiplock's own record of the operations (skiplock.external_operations) -------------------

-- name: op_insert
INSERT INTO skiplock.external_operations (
    source, system, database_name, action, selection, actor, reason, total, batch_size, rate,
    previewed_at, keys_digest
)
VALUES (
    %(source)s, %(system)s, %(database_name)s, %(action)s, %(selection)s, %(actor)s, %(reason)s,
    %(total)s, %(batch_size)s, %(rate)s, %(previewed_at)s, %(keys_digest)s
)
RETURNING id;

-- name: op_items_insert
INSERT INTO skiplock.external_operation_items (operation_id, ord, key)
SELECT %(id)s, k.ord, k.key
FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, ord);

-- name: op_items_next
-- The next batch of the operation's keys after its cursor.
SELECT i.ord, i.key
FROM skiplock.external_operation_items AS i
WHERE i.operation_id = %(id)s
  AND i.ord > %(cursor)s
ORDER BY i.ord
LIMIT %(batch_size)s;

-- name: op_get
SELECT o.*
FROM skiplock.external_operations AS o
WHERE o.id = %(id)s;

-- name: op_lock
SELECT o.*
FROM skiplock.external_operations AS o
WHERE o.id = %(id)s
FOR UPDATE;

-- name: op_begin
UPDATE skiplock.external_operations AS o
SET state = 'running',
    started_at = coalesce(o.started_at, now()),
    heartbeat_at = now(),
    error = NULL
WHERE o.id = %(id)s
  AND o.state IN ('queued', 'running')
RETURNING o.*;

-- name: op_batch_done
UPDATE skiplock.external_operations AS o
SET done = o.done + %(rows)s,
    skipped = o.skipped + %(skipped)s,
    batches = o.batches + 1,
    cursor = %(cursor)s,
    heartbeat_at = now()
WHERE o.id = %(id)s
RETURNING o.done;

-- name: op_finish
UPDATE skiplock.external_operations AS o
SET state = %(state)s,
    finished_at = now(),
    heartbeat_at = now(),
    error = %(error)s,
    cancelled_by = coalesce(%(cancelled_by)s::text, o.cancelled_by)
WHERE o.id = %(id)s
RETURNING o.*;

-- name: op_request_cancel
UPDATE skiplock.external_operations AS o
SET cancel_requested_at = coalesce(o.cancel_requested_at, now()),
    cancelled_by = coalesce(o.cancelled_by, %(actor)s::text)
WHERE o.id = %(id)s
  AND o.state IN ('queued', 'running')
RETURNING o.*;

-- name: op_reopen
UPDATE skiplock.external_operations AS o
SET state = 'queued',
    finished_at = NULL,
    cancel_requested_at = NULL,
    cancelled_by = NULL,
    error = NULL
WHERE o.id = %(id)s
  AND o.state IN ('cancelled', 'failed')
RETURNING o.*;

-- name: ops_active
-- Operations nobody finished: running ones (the advisory lock tells whether a runner lives),
-- and queued ones older than %(min_age)s.
SELECT o.id
FROM skiplock.external_operations AS o
WHERE o.state = 'running'
   OR (o.state = 'queued' AND o.created_at < now() - %(min_age)s::interval)
ORDER BY o.id;

-- name: ops_recent
SELECT o.*
FROM skiplock.external_operations AS o
WHERE (%(source)s::text IS NULL OR o.source = %(source)s::text)
ORDER BY o.id DESC
LIMIT %(limit)s;

-- name: op_try_lock
SELECT pg_try_advisory_lock(%(lock_class)s::integer, %(lock_id)s::integer) AS locked;

-- name: op_unlock
SELECT pg_advisory_unlock(%(lock_class)s::integer, %(lock_id)s::integer) AS unlocked;

-- name: op_try_xact_lock
SELECT pg_try_advisory_xact_lock(%(lock_class)s::integer, %(lock_id)s::integer) AS locked;
