-- Dead letters (jobs with status 'failed'): error groups, selections, and the bulk replay and
-- purge operations. Every read walks the partial index jobs_failed_idx (finished_at, id)
-- WHERE status = 'failed', so its cost follows the size of the dead-letter set, never of the
-- jobs table.
--
-- A line `-- :selection` in a query is replaced by the `selection` fragment below (static
-- text, composed in console/maintenance/deadletters.py), so the filter is written once.
-- It always starts with status = 'failed': only dead letters are ever replayed or purged,
-- whatever the filter says.

-- name: selection
    j.status = 'failed'
    AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
    AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
    AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
    AND (%(fingerprint)s::text IS NULL OR j.error_fingerprint = %(fingerprint)s::text)
    AND (%(failed_since)s::timestamptz IS NULL OR j.finished_at >= %(failed_since)s::timestamptz)
    AND (%(failed_before)s::timestamptz IS NULL OR j.finished_at < %(failed_before)s::timestamptz)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)

-- name: count_matching
SELECT count(*) AS total
FROM skiplock.jobs AS j
WHERE
-- :selection
;

-- name: count_matching_at
-- The exact count an operation will work through: what had failed by %(snapshot_at)s, with an
-- id no higher than %(max_id)s (NULL: no id bound), and the highest such id (the bound the
-- operation keeps).
SELECT count(*) AS total, max(j.id) AS max_id
FROM skiplock.jobs AS j
WHERE
-- :selection
    AND j.finished_at <= %(snapshot_at)s::timestamptz
    AND (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s::bigint);

-- name: preview_snapshot
-- What a preview shows and a start is later bound to: the count, the highest matching id and
-- the time, in one statement (one snapshot). finished_at <= now() keeps a failure committed
-- while this statement started out of the count, as the start's bound will.
SELECT now() AS previewed_at, count(*) AS total, max(j.id) AS max_id
FROM skiplock.jobs AS j
WHERE
-- :selection
    AND j.finished_at <= now();

-- name: list_matching
-- Newest failures first, keyset-paginated on (finished_at, id).
SELECT
    j.id,
    j.queue,
    j.kind,
    j.payload,
    j.attempts,
    j.max_attempts,
    j.last_error,
    j.error_fingerprint,
    j.created_at,
    j.finished_at
FROM skiplock.jobs AS j
WHERE
-- :selection
    AND (%(before_finished_at)s::timestamptz IS NULL
         OR (j.finished_at, j.id) < (%(before_finished_at)s::timestamptz, %(before_id)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: last_attempt_logs
-- The last attempt's log records of one dead letter (the sample a group's page shows, issue 33
-- "per-attempt logs"): one primary-key probe, and only this job's attempt_logs is read.
SELECT
    j.id,
    j.attempts,
    j.attempt_logs -> -1 AS entry
FROM skiplock.jobs AS j
WHERE j.id = %(id)s
  AND j.status = 'failed'
ORDER BY j.id;

-- name: groups
-- Error groups: dead letters by fingerprint, largest first. The aggregate is an index-only scan
-- of jobs_failed_groups_idx (error_fingerprint, finished_at) INCLUDE (queue, kind) in group
-- order; only the shown groups' examples touch the heap, one backward probe of the same index
-- each (the newest; the second branch is the group without a fingerprint). A page of
-- %(limit)s groups from %(offset)s; `total_groups` counts them all (the window runs over the
-- grouped rows, before the LIMIT), and each group names its first %(names)s queues and kinds
-- with `queue_count` and `kind_count` for all of them (a group a producer spreads over 5,000
-- queues is one row, not 5,000 names).
WITH per_queue_kind AS (
    -- First (fingerprint, queue, kind): a hash aggregate to a handful of rows, so the DISTINCT
    -- arrays below sort a handful of names rather than one per dead letter.
    SELECT
        j.error_fingerprint,
        j.queue,
        j.kind,
        count(*) AS count,
        min(j.finished_at) AS first_seen,
        max(j.finished_at) AS last_seen
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
    GROUP BY j.error_fingerprint, j.queue, j.kind
),
grouped AS (
    SELECT
        p.error_fingerprint,
        sum(p.count)::bigint AS count,
        min(p.first_seen) AS first_seen,
        max(p.last_seen) AS last_seen,
        (array_agg(DISTINCT p.queue ORDER BY p.queue))[1:%(names)s] AS queues,
        (array_agg(DISTINCT p.kind ORDER BY p.kind))[1:%(names)s] AS kinds,
        count(DISTINCT p.queue) AS queue_count,
        count(DISTINCT p.kind) AS kind_count,
        count(*) OVER () AS total_groups
    FROM per_queue_kind AS p
    GROUP BY p.error_fingerprint
    ORDER BY sum(p.count) DESC, coalesce(p.error_fingerprint, '(no fingerprint)')
    LIMIT %(limit)s
    OFFSET %(offset)s
)
SELECT
    coalesce(grouped.error_fingerprint, '(no fingerprint)') AS fingerprint,
    grouped.count,
    grouped.first_seen,
    grouped.last_seen,
    grouped.queues,
    grouped.kinds,
    grouped.queue_count,
    grouped.kind_count,
    grouped.total_groups,
    example.last_error AS example
FROM grouped
LEFT JOIN LATERAL (
    (SELECT e.last_error
     FROM skiplock.jobs AS e
     WHERE e.status = 'failed'
       AND e.error_fingerprint = grouped.error_fingerprint
       AND (%(queue)s::text IS NULL OR e.queue = %(queue)s::text)
       AND (%(kind)s::text IS NULL OR e.kind = %(kind)s::text)
     ORDER BY e.error_fingerprint DESC, e.finished_at DESC
     LIMIT 1)
    UNION ALL
    (SELECT e.last_error
     FROM skiplock.jobs AS e
     WHERE e.status = 'failed'
       AND grouped.error_fingerprint IS NULL
       AND e.error_fingerprint IS NULL
       AND (%(queue)s::text IS NULL OR e.queue = %(queue)s::text)
       AND (%(kind)s::text IS NULL OR e.kind = %(kind)s::text)
     ORDER BY e.error_fingerprint DESC, e.finished_at DESC
     LIMIT 1)
    LIMIT 1
) AS example ON true
ORDER BY grouped.count DESC, fingerprint;

-- name: replay_batch
-- Replay the next %(batch_size)s matching dead letters after the cursor, in (finished_at, id)
-- order, among those that had failed by the operation's snapshot with an id no higher than its
-- bound (max_id: the preview's highest id; NULL for operations older than migration 011).
-- Each goes back to pending,
-- runs now, gets a fresh attempt budget, and carries a "replayed by" entry in its history.
-- FOR UPDATE (not SKIP LOCKED): a row another operation holds is waited for, then rechecked,
-- so the cursor never jumps over a row that was merely busy.
WITH batch AS (
    SELECT j.id, j.finished_at
    FROM skiplock.jobs AS j
    WHERE
-- :selection
      AND j.finished_at <= %(snapshot_at)s::timestamptz
      AND (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s::bigint)
      AND (j.finished_at, j.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::bigint)
    ORDER BY j.finished_at, j.id
    LIMIT %(batch_size)s
    FOR UPDATE
),
replayed AS (
    UPDATE skiplock.jobs AS j
    SET status = 'pending',
        run_at = now(),
        attempts = 0,
        finished_at = NULL,
        locked_by = NULL,
        locked_at = NULL,
        lease_until = NULL,
        errors = CASE WHEN jsonb_array_length(j.errors) >= %(history)s THEN j.errors - 0 ELSE j.errors END
                 || jsonb_build_array(jsonb_build_object(
                        'attempt', j.attempts,
                        'at', now(),
                        'worker', NULL,
                        'error_class', 'Replayed',
                        'message', 'replayed by ' || %(actor)s::text,
                        'traceback', NULL,
                        'event', 'replay',
                        'actor', %(actor)s::text,
                        'operation', %(operation)s::bigint,
                        'reason', %(reason)s::text))
    WHERE j.id = ANY(ARRAY(SELECT b.id FROM batch AS b))
      AND j.status = 'failed'
    RETURNING j.id, j.queue
),
notified AS (
    SELECT pg_notify('skiplock_jobs', q.queue)
    FROM (SELECT DISTINCT r.queue FROM replayed AS r) AS q
)
SELECT
    (SELECT count(*) FROM replayed) AS rows,
    (SELECT count(*) FROM notified) AS queues_notified,
    last.finished_at AS last_finished_at,
    last.id AS last_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT b.finished_at, b.id
    FROM batch AS b
    ORDER BY b.finished_at DESC, b.id DESC
    LIMIT 1
) AS last ON true;

-- name: purge_batch
-- Purge the next batch (same walk as replay_batch): delete, or move into the archive marked
-- purged when %(to_archive)s.
WITH batch AS (
    SELECT j.id, j.finished_at
    FROM skiplock.jobs AS j
    WHERE
-- :selection
      AND j.finished_at <= %(snapshot_at)s::timestamptz
      AND (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s::bigint)
      AND (j.finished_at, j.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::bigint)
    ORDER BY j.finished_at, j.id
    LIMIT %(batch_size)s
    FOR UPDATE
),
removed AS (
    DELETE FROM skiplock.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT b.id FROM batch AS b))
      AND j.status = 'failed'
    RETURNING j.*
),
archived AS (
    INSERT INTO skiplock.jobs_archive (
        id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
        idempotency_key, locked_by, locked_at, lease_until, last_error, errors,
        error_fingerprint, created_at, finished_at, cancel_requested_at, headers, attempt_logs, group_key, purged, purged_at, purged_by
    )
    SELECT
        r.id, r.queue, r.kind, r.payload, r.status, r.priority, r.run_at, r.attempts, r.max_attempts,
        r.idempotency_key, r.locked_by, r.locked_at, r.lease_until, r.last_error, r.errors,
        r.error_fingerprint, r.created_at, r.finished_at, r.cancel_requested_at, r.headers, r.attempt_logs, r.group_key, true, now(), %(actor)s::text
    FROM removed AS r
    WHERE %(to_archive)s::boolean
    RETURNING 1
)
SELECT
    (SELECT count(*) FROM removed) AS rows,
    (SELECT count(*) FROM archived) AS archived,
    last.finished_at AS last_finished_at,
    last.id AS last_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT b.finished_at, b.id
    FROM batch AS b
    ORDER BY b.finished_at DESC, b.id DESC
    LIMIT 1
) AS last ON true;

-- name: op_insert
INSERT INTO skiplock.bulk_operations (
    action, purge_mode, selection, actor, reason, snapshot_at, total, batch_size, rate,
    max_id, previewed_at, previewed_total
)
VALUES (
    %(action)s, %(purge_mode)s, %(selection)s, %(actor)s, %(reason)s, %(snapshot_at)s,
    %(total)s, %(batch_size)s, %(rate)s,
    %(max_id)s, %(previewed_at)s, %(previewed_total)s
)
RETURNING id;

-- name: op_get
SELECT o.*
FROM skiplock.bulk_operations AS o
WHERE o.id = %(id)s;

-- name: op_lock
-- The runner's per-batch check, in the batch's transaction: the row is locked until commit,
-- so a cancel waits at most one batch and then is seen by the next one.
SELECT o.*
FROM skiplock.bulk_operations AS o
WHERE o.id = %(id)s
FOR UPDATE;

-- name: op_begin
UPDATE skiplock.bulk_operations AS o
SET state = 'running',
    started_at = coalesce(o.started_at, now()),
    heartbeat_at = now(),
    error = NULL
WHERE o.id = %(id)s
  AND o.state IN ('queued', 'running')
RETURNING o.*;

-- name: op_batch_done
UPDATE skiplock.bulk_operations AS o
SET done = o.done + %(rows)s,
    batches = o.batches + 1,
    cursor_finished_at = coalesce(%(cursor_finished_at)s::timestamptz, o.cursor_finished_at),
    cursor_id = coalesce(%(cursor_id)s::bigint, o.cursor_id),
    heartbeat_at = now()
WHERE o.id = %(id)s
RETURNING o.done;

-- name: op_finish
UPDATE skiplock.bulk_operations AS o
SET state = %(state)s,
    finished_at = now(),
    heartbeat_at = now(),
    error = %(error)s,
    cancelled_by = coalesce(%(cancelled_by)s::text, o.cancelled_by)
WHERE o.id = %(id)s
RETURNING o.*;

-- name: op_request_cancel
UPDATE skiplock.bulk_operations AS o
SET cancel_requested_at = coalesce(o.cancel_requested_at, now()),
    cancelled_by = coalesce(o.cancelled_by, %(actor)s::text)
WHERE o.id = %(id)s
  AND o.state IN ('queued', 'running')
RETURNING o.*;

-- name: op_reopen
-- Resume a cancelled or failed operation from its cursor (same snapshot, same selection).
UPDATE skiplock.bulk_operations AS o
SET state = 'queued',
    finished_at = NULL,
    cancel_requested_at = NULL,
    cancelled_by = NULL,
    error = NULL
WHERE o.id = %(id)s
  AND o.state IN ('cancelled', 'failed')
RETURNING o.*;

-- name: ops_active
-- Operations nobody finished: running ones (the runner may have died; the advisory lock
-- tells), and queued ones older than %(min_age)s (a fresh one is about to be started by the
-- process that created it). A runner throttled to pauses of %(release_after)s s or more sleeps
-- without its connection, so without the lock: its operation is left alone until its pause
-- (batch_size / rate after the last batch's heartbeat) and %(grace)s more have passed.
SELECT o.id
FROM skiplock.bulk_operations AS o
WHERE (o.state = 'running'
       AND (o.rate IS NULL
            OR o.heartbeat_at IS NULL
            OR o.batch_size / o.rate < %(release_after)s
            OR o.heartbeat_at + make_interval(secs => least(o.batch_size / o.rate, 1e9)) + %(grace)s::interval < now()))
   OR (o.state = 'queued' AND o.created_at < now() - %(min_age)s::interval)
ORDER BY o.id;

-- name: op_try_lock
-- The runner holds this session lock while it works the operation; a second runner (or the
-- scheduler's resume) gets false and leaves it alone. It goes away with the runner's session.
SELECT pg_try_advisory_lock(%(lock_class)s::integer, %(lock_id)s::integer) AS locked;

-- name: op_unlock
SELECT pg_advisory_unlock(%(lock_class)s::integer, %(lock_id)s::integer) AS unlocked;

-- name: op_try_xact_lock
-- cancel(): if no runner holds the operation, it can be closed at once.
SELECT pg_try_advisory_xact_lock(%(lock_class)s::integer, %(lock_id)s::integer) AS locked;

-- name: ops_held
-- What the bulk caps count (console.caps): operations queued or running (a sleeping, throttled
-- one included), in all and of this actor. The partial index bulk_operations_active_idx.
SELECT count(*) AS held,
       count(*) FILTER (WHERE o.actor = %(actor)s) AS mine,
       coalesce(string_agg('#' || o.id, ', ' ORDER BY o.id) FILTER (WHERE o.actor = %(actor)s), '') AS my_ids
FROM skiplock.bulk_operations AS o
WHERE o.state IN ('queued', 'running');

-- name: ops_recent
SELECT o.*
FROM skiplock.bulk_operations AS o
ORDER BY o.id DESC
LIMIT %(limit)s;
