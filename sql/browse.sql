-- The console's reads of the jobs table: the jobs browser, one job, per-queue figures, workers,
-- and single-job actions. Every query here is bounded by an index and runs under a statement
-- timeout (console.web.database). The browser's page query is composed in console/browse.py
-- from `jobs_where` plus one ORDER BY per state, each matching a partial index of 001.

-- name: jobs_window
-- The state's own index, in its order, from the page cursor on, at most %(window)s rows: every
-- listing reads through this, so a filter with no index of its own (queue, kind, payload,
-- error group) looks at a bounded number of jobs and says so, instead of scanning the table.
-- {table} (skiplock.jobs, or skiplock.jobs_archive for archived=1), {state}, {keyset}, {order}
-- and {index_time} are constant fragments from console/browse.py.
SELECT j.*
FROM {table} AS j
WHERE {state}
  AND {keyset}
  AND {index_time}
  AND (%(id)s::bigint IS NULL OR j.id = %(id)s)
  AND (%(min_id)s::bigint IS NULL OR j.id >= %(min_id)s)
  AND (%(max_id)s::bigint IS NULL OR j.id <= %(max_id)s)
  -- eligible (state pending): run_at is a column of jobs_claim_idx, checked in the index scan.
  AND (NOT %(eligible)s::bool OR j.run_at <= now())
  -- lease=expired (state running): the head of jobs_lease_idx, an index range.
  AND (NOT %(expired)s::bool OR j.lease_until < now())
  -- retrying (state pending): failed at least one attempt, waiting for the next one.
  AND (NOT %(retrying)s::bool OR (j.attempts > 0 AND j.last_error IS NOT NULL))
ORDER BY {order}
LIMIT %(window)s

-- name: jobs_filters
-- The filters applied to the window's rows.
WHERE (%(queue)s::text IS NULL OR j.queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
  AND (%(fingerprint)s::text IS NULL OR j.error_fingerprint = %(fingerprint)s)
  AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
  AND {outer_time}

-- name: jobs_page
SELECT
    j.id,
    j.queue,
    j.kind,
    j.status,
    j.priority,
    j.run_at,
    j.attempts,
    j.max_attempts,
    j.locked_by,
    j.lease_until,
    j.last_error,
    j.error_fingerprint,
    j.created_at,
    j.finished_at,
    -- Small payloads only (pg_column_size reads the stored size, it does not detoast): the
    -- listing shows a preview, redacted for viewers, and never ships megabytes per row.
    CASE WHEN pg_column_size(j.payload) <= 4096 THEN j.payload END AS payload
FROM ({window}) AS j
{filters}
ORDER BY {order}
LIMIT %(limit)s

-- name: jobs_export
SELECT
    j.id,
    j.queue,
    j.kind,
    j.status,
    j.priority,
    j.run_at,
    j.attempts,
    j.max_attempts,
    j.last_error,
    j.error_fingerprint,
    j.created_at,
    j.finished_at,
    j.payload,
    j.lease_until
FROM ({window}) AS j
{filters}
ORDER BY {order}
LIMIT %(limit)s

-- name: jobs_count
SELECT count(*) AS n
FROM (
    SELECT 1
    FROM ({window}) AS j
    {filters}
    LIMIT %(cap)s
) AS capped

-- name: jobs_window_end
-- The last row of a full window (none when the window holds every remaining job): where
-- "search further" continues.
SELECT j.*
FROM ({window}) AS j
ORDER BY {order}
OFFSET %(window)s - 1
LIMIT 1

-- name: id_range
SELECT min(j.id) AS lo, max(j.id) AS hi FROM skiplock.jobs AS j;

-- name: first_id_from
-- One probe of the binary search that turns a time into an id (ids grow with created_at).
SELECT j.id, j.created_at
FROM skiplock.jobs AS j
WHERE j.id >= %(id)s
ORDER BY j.id
LIMIT 1;

-- name: get_job
SELECT j.*, false AS archived
FROM skiplock.jobs AS j
WHERE j.id = %(id)s;

-- name: job_audit
-- Operator actions on one job (newest last). audit_log has no index on target, so this reads
-- at most the newest 10000 rows of the log; older actions are on the audit page.
SELECT r.at, r.actor, r.action, r.reason, r.outcome
FROM (
    SELECT a.at, a.actor, a.action, a.reason, a.outcome, a.target, a.selection
    FROM skiplock.audit_log AS a
    ORDER BY a.id DESC
    LIMIT 10000
) AS r
WHERE r.target = %(target)s
   OR r.selection @> jsonb_build_object('ids', jsonb_build_array(%(id)s::bigint))
ORDER BY r.at;

-- name: queue_flags
SELECT q.name AS queue, q.paused, q.paused_at, q.paused_by, q.backend
FROM skiplock.queues AS q;

-- name: workers
-- `backend`: 'nats' for a broker worker (migration 031), which claims nothing from skiplock.jobs.
SELECT
    w.id,
    w.backend,
    w.host,
    w.pid,
    w.queues,
    w.concurrency,
    w.version,
    w.release,
    w.started_at,
    w.last_seen,
    w.stopped_at,
    w.in_flight,
    w.claimed,
    w.completed,
    w.failed,
    w.retried,
    w.lost,
    w.reaped,
    w.claim_calls,
    w.claim_seconds_sum,
    w.claim_histogram,
    w.pickup_histogram,
    extract(epoch FROM now() - w.last_seen) AS seen_seconds_ago,
    extract(epoch FROM coalesce(w.stopped_at, now()) - w.started_at) AS uptime_seconds,
    extract(epoch FROM now()) AS now_epoch
FROM skiplock.workers AS w
WHERE w.stopped_at IS NULL
   OR w.stopped_at > now() - interval '1 hour'
ORDER BY w.stopped_at IS NOT NULL, w.last_seen DESC
LIMIT 500;

-- name: worker_history
-- The workers collector's per-worker counter marks of the last few minutes (see
-- console/collectors/workers.py); NULL when no collector has run.
SELECT s.state -> 'history' AS history
FROM skiplock.collector_state AS s
WHERE s.name = 'workers';

-- name: running_jobs_of
SELECT j.id, j.kind, j.queue, j.locked_by, j.locked_at, j.lease_until
FROM skiplock.jobs AS j
WHERE j.status = 'running'
ORDER BY j.lease_until
LIMIT %(limit)s;

-- name: run_now
-- A pending job waiting for its backoff (or scheduled later) becomes eligible now.
UPDATE skiplock.jobs AS j
SET run_at = now()
WHERE j.id = %(id)s
  AND j.status = 'pending'
  AND j.run_at > now()
RETURNING j.id, j.queue;

-- name: cancel_job
-- A pending job goes to the dead letters (replayable, purgeable) with a "Cancelled" entry.
UPDATE skiplock.jobs AS j
SET status = 'failed',
    finished_at = now(),
    last_error = %(message)s::text,
    error_fingerprint = 'Cancelled',
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'worker', NULL,
        'error_class', 'Cancelled', 'message', %(message)s::text, 'traceback', NULL))
WHERE j.id = %(id)s
  AND j.status = 'pending'
RETURNING j.id, j.queue;

-- The per-queue figures of the queues page (console.browse.queue_figures): bounded walks of
-- the three partial indexes, capped so a huge table costs what a small one does.

-- name: pending_by_queue
-- The first %(cap)s entries of the claim index in its own order (ORDER BY matches the index,
-- so the planner walks it and stops; queue comes from INCLUDE, run_at from the key, so this
-- is an index-only scan when the visibility map allows). Exact while pending <= cap.
SELECT
    p.queue,
    count(*) FILTER (WHERE p.run_at <= now()) AS eligible,
    count(*) FILTER (WHERE p.run_at > now()) AS scheduled,
    extract(epoch FROM now() - min(p.run_at) FILTER (WHERE p.run_at <= now()))::float8 AS oldest_eligible_s
FROM (
    SELECT j.queue, j.run_at
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(cap)s
) AS p
GROUP BY p.queue
ORDER BY p.queue;

-- name: running_by_queue
-- Running jobs through the lease index (bounded by workers x concurrency in practice, capped
-- anyway); stuck = lease already expired and not yet rescued by the reaper.
SELECT
    r.queue,
    count(*) AS running,
    count(*) FILTER (WHERE r.lease_until < now()) AS stuck,
    extract(epoch FROM now() - min(r.lease_until) FILTER (WHERE r.lease_until < now()))::float8 AS oldest_stuck_s
FROM (
    SELECT j.queue, j.lease_until
    FROM skiplock.jobs AS j
    WHERE j.status = 'running'
    ORDER BY j.lease_until
    LIMIT %(cap)s
) AS r
GROUP BY r.queue
ORDER BY r.queue;

-- name: failed_by_queue
-- Dead letters per queue: the newest %(cap)s through jobs_failed_idx (the queue needs a heap
-- fetch per entry). Exact while failed <= cap; beyond it the page shows a lower bound ("10,000+").
SELECT
    f.queue,
    count(*) AS failed
FROM (
    SELECT j.queue
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
    ORDER BY j.finished_at DESC, j.id DESC
    LIMIT %(cap)s
) AS f
GROUP BY f.queue
ORDER BY f.queue;


-- name: backlog_points_of
-- The eligible backlog of the queues %(queues)s (a text array: the page's rows) at each cycle
-- since %(since)s, from skiplock.samples_backlog (migration 035): its primary key's walk of
-- each queue, so a page of 100 queues reads their rows and nothing of the 4,900 others.
SELECT b.queue, b.collected_at, b.value
FROM skiplock.samples_backlog AS b
WHERE b.queue = ANY(%(queues)s::text[])
  AND b.collected_at >= %(since)s
ORDER BY b.queue, b.collected_at;

-- name: backlog_points_all
-- The same for every queue (a caller that names none).
SELECT b.queue, b.collected_at, b.value
FROM skiplock.samples_backlog AS b
WHERE b.collected_at >= %(since)s
ORDER BY b.queue, b.collected_at;

-- name: created_here
-- Whether this transaction inserted the job (false: an idempotency key or a uniqueness window
-- answered with an earlier job, which may since have left the hot table).
SELECT EXISTS (
    SELECT 1
    FROM skiplock.jobs AS j
    WHERE j.id = %(id)s
      AND j.xmin = pg_current_xact_id()::xid
) AS created;

-- name: search_payload
-- The search box: jobs whose payload holds %(values)s (a JSON array: the text as a string, and
-- as a number when it is one) at any depth, among the newest %(window)s jobs of the table (by
-- id, the primary key) and the latest %(window)s finished jobs of the archive
-- (jobs_archive_finished_idx): two bounded windows, never a scan of either table.
SELECT w.id, w.queue, w.kind, w.status, w.payload, w.archived
FROM (
    SELECT j.id, j.queue, j.kind, j.status, j.payload, false AS archived
    FROM skiplock.jobs AS j
    ORDER BY j.id DESC
    LIMIT %(window)s
) AS w
WHERE jsonb_path_exists(w.payload, '$.** ? (@ == $v[*])', jsonb_build_object('v', %(values)s::jsonb))
UNION ALL
SELECT a.id, a.queue, a.kind, a.status, a.payload, a.archived
FROM (
    SELECT x.id, x.queue, x.kind, x.status, x.payload, true AS archived
    FROM skiplock.jobs_archive AS x
    ORDER BY x.finished_at DESC
    LIMIT %(window)s
) AS a
WHERE jsonb_path_exists(a.payload, '$.** ? (@ == $v[*])', jsonb_build_object('v', %(values)s::jsonb))
ORDER BY archived, id DESC
LIMIT %(limit)s;
