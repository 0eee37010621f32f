-- The queue protocol. Every statement here is one short transaction on its own (workers run
-- in autocommit), except `enqueue*`, which joins the caller's transaction on purpose.

-- name: enqueue
-- Insert one job; with an idempotency key already present, insert nothing (the caller then
-- looks the existing id up). pg_notify rides in the same statement: PostgreSQL delivers it
-- when the caller's transaction commits, and folds identical payloads into one.
-- The enqueue statements cast every parameter: asyncpg (console/queue/handles.py) lets the
-- server infer each parameter's type, and a bare parameter in a SELECT list is text.
-- A queue whose backend is 'nats' (migration 030) gets the job in skiplock.outbox instead, in
-- the same transaction, and the relay's doorbell (skiplock_outbox) rings at commit
-- (docs/exit-plan.md). The queue's row is read by its primary key; a key held by a job of
-- either table makes the enqueue a no-op.
WITH route AS (
    SELECT EXISTS (
        SELECT 1
        FROM skiplock.queues AS q
        WHERE q.name = %(queue)s::text
          AND q.backend = 'nats'
    ) AS brokered
),
inserted AS (
    INSERT INTO skiplock.jobs (queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    SELECT
        %(queue)s::text,
        %(kind)s::text,
        %(payload)s::jsonb,
        %(priority)s::smallint,
        coalesce(%(run_at)s::timestamptz, now()),
        %(max_attempts)s::integer,
        %(idempotency_key)s::text,
        %(headers)s::jsonb,
        %(group_key)s::text
    FROM route
    WHERE NOT route.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.outbox AS o WHERE o.idempotency_key = %(idempotency_key)s::text)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue
),
outboxed AS (
    INSERT INTO skiplock.outbox (queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    SELECT
        %(queue)s::text,
        %(kind)s::text,
        %(payload)s::jsonb,
        %(priority)s::smallint,
        coalesce(%(run_at)s::timestamptz, now()),
        %(max_attempts)s::integer,
        %(idempotency_key)s::text,
        %(headers)s::jsonb,
        %(group_key)s::text
    FROM route
    WHERE route.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.jobs AS j WHERE j.idempotency_key = %(idempotency_key)s::text)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, queue
)
SELECT
    inserted.id,
    pg_notify('skiplock_jobs', inserted.queue) AS notified
FROM inserted
UNION ALL
SELECT
    outboxed.id,
    pg_notify('skiplock_outbox', outboxed.queue) AS notified
FROM outboxed;

-- name: enqueue_many
-- Each job goes to skiplock.jobs, or to skiplock.outbox when its queue's backend is 'nats'
-- (as `enqueue`). The ids are drawn in input order first (`numbered`, materialised: it calls
-- nextval), so a batch that mixes both backends still gets ascending ids in input order.
WITH input AS (
    SELECT *
    FROM unnest(
        %(queues)s::text[],
        %(kinds)s::text[],
        %(payloads)s::jsonb[],
        %(priorities)s::smallint[],
        %(run_ats)s::timestamptz[],
        %(max_attempts)s::integer[],
        %(keys)s::text[],
        %(groups)s::text[]
    ) WITH ORDINALITY AS i (queue, kind, payload, priority, run_at, max_attempts, idempotency_key, group_key, position)
),
numbered AS (
    SELECT
        nextval('skiplock.jobs_id_seq'::regclass) AS id,
        input.*,
        coalesce(q.backend = 'nats', false) AS brokered
    FROM input
    LEFT JOIN skiplock.queues AS q ON q.name = input.queue
    ORDER BY input.position
),
inserted AS (
    -- One headers value for the whole batch: the enqueue_many call's trace context, or NULL.
    INSERT INTO skiplock.jobs (id, queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    OVERRIDING SYSTEM VALUE
    SELECT
        n.id,
        n.queue,
        n.kind,
        n.payload,
        n.priority,
        coalesce(n.run_at, now()),
        n.max_attempts,
        n.idempotency_key,
        %(headers)s::jsonb,
        n.group_key
    FROM numbered AS n
    WHERE NOT n.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.outbox AS o WHERE o.idempotency_key = n.idempotency_key)
    ORDER BY n.position
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, idempotency_key
),
outboxed AS (
    INSERT INTO skiplock.outbox (id, queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    SELECT
        n.id,
        n.queue,
        n.kind,
        n.payload,
        n.priority,
        coalesce(n.run_at, now()),
        n.max_attempts,
        n.idempotency_key,
        %(headers)s::jsonb,
        n.group_key
    FROM numbered AS n
    WHERE n.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.jobs AS j WHERE j.idempotency_key = n.idempotency_key)
    ORDER BY n.position
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, queue, idempotency_key
),
notified AS (
    SELECT pg_notify('skiplock_jobs', q.queue)
    FROM (SELECT DISTINCT inserted.queue FROM inserted) AS q
),
relay_notified AS (
    SELECT pg_notify('skiplock_outbox', q.queue)
    FROM (SELECT DISTINCT outboxed.queue FROM outboxed) AS q
),
written AS (
    SELECT inserted.id, inserted.idempotency_key FROM inserted
    UNION ALL
    SELECT outboxed.id, outboxed.idempotency_key FROM outboxed
)
SELECT
    written.id,
    written.idempotency_key,
    (SELECT count(*) FROM notified) + (SELECT count(*) FROM relay_notified) AS notifications
FROM written
ORDER BY written.id;

-- name: reserve_ids
-- enqueue_many's COPY path: %(n)s ids drawn from the jobs' identity sequence, as one array
-- (the caller sorts them), and the transaction's now() (the default run_at). The sequence is
-- named as a regclass literal, resolved once when the statement is parsed: through
-- pg_get_serial_sequence() it was looked up again for every row, 0.30 s of a 100 k batch's
-- 1.2 s against 0.04 s (docs/benchmarks.md, "Enqueue"). Migration 001's identity column made it.
-- `brokered`: some queue of the batch is served by a broker (migration 030); COPY writes only
-- skiplock.jobs, so the producer then takes the INSERT path, which routes each job.
SELECT
    array_agg(nextval('skiplock.jobs_id_seq'::regclass)) AS ids,
    now() AS now,
    EXISTS (
        SELECT 1
        FROM skiplock.queues AS q
        WHERE q.name = ANY(%(queues)s::text[])
          AND q.backend = 'nats'
    ) AS brokered
FROM generate_series(1, %(n)s::integer);

-- name: enqueue_copy
-- The COPY behind enqueue_many's key-less batches; identity values given here are kept.
COPY skiplock.jobs (id, queue, kind, payload, priority, run_at, max_attempts, headers, group_key) FROM STDIN;

-- name: notify_queues
-- One doorbell per distinct queue (delivered when the caller's transaction commits).
SELECT pg_notify('skiplock_jobs', q.queue)
FROM unnest(%(queues)s::text[]) AS q (queue);

-- name: enqueue_unique
-- Insert one job and claim its uniqueness window (kind, idempotency_key) in one statement, in
-- the caller's transaction. The window row is taken when there is none or when it expired
-- (the conditional DO UPDATE); a held window returns no `claimed_id` and the caller reads the
-- holder. The job's id is drawn first so the window can point at it. A concurrent enqueue of
-- the same key waits on the window row until this transaction ends, then sees it held.
-- A broker queue's job goes to skiplock.outbox (as `enqueue`), under the same window.
WITH route AS (
    SELECT EXISTS (
        SELECT 1
        FROM skiplock.queues AS q
        WHERE q.name = %(queue)s::text
          AND q.backend = 'nats'
    ) AS brokered
),
new_job AS (
    SELECT nextval(pg_get_serial_sequence('skiplock.jobs', 'id')) AS id
),
claimed AS (
    INSERT INTO skiplock.unique_keys AS u (kind, idempotency_key, job_id, expires_at)
    SELECT %(kind)s::text, %(idempotency_key)s::text, new_job.id, now() + make_interval(secs => %(unique_for)s::double precision)
    FROM new_job
    ON CONFLICT (kind, idempotency_key) DO UPDATE
    SET job_id = excluded.job_id,
        created_at = now(),
        expires_at = excluded.expires_at
    WHERE u.expires_at <= now()
    RETURNING u.job_id
),
inserted AS (
    INSERT INTO skiplock.jobs (id, queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    OVERRIDING SYSTEM VALUE
    SELECT
        claimed.job_id,
        %(queue)s::text,
        %(kind)s::text,
        %(payload)s::jsonb,
        %(priority)s::smallint,
        coalesce(%(run_at)s::timestamptz, now()),
        %(max_attempts)s::integer,
        %(idempotency_key)s::text,
        %(headers)s::jsonb,
        %(group_key)s::text
    FROM claimed, route
    WHERE NOT route.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.outbox AS o WHERE o.idempotency_key = %(idempotency_key)s::text)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue
),
outboxed AS (
    INSERT INTO skiplock.outbox (id, queue, kind, payload, priority, run_at, max_attempts, idempotency_key, headers, group_key)
    SELECT
        claimed.job_id,
        %(queue)s::text,
        %(kind)s::text,
        %(payload)s::jsonb,
        %(priority)s::smallint,
        coalesce(%(run_at)s::timestamptz, now()),
        %(max_attempts)s::integer,
        %(idempotency_key)s::text,
        %(headers)s::jsonb,
        %(group_key)s::text
    FROM claimed, route
    WHERE route.brokered
      AND NOT EXISTS (SELECT 1 FROM skiplock.jobs AS j WHERE j.idempotency_key = %(idempotency_key)s::text)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, queue
)
SELECT
    (SELECT claimed.job_id FROM claimed) AS claimed_id,
    coalesce((SELECT inserted.id FROM inserted), (SELECT outboxed.id FROM outboxed)) AS inserted_id,
    (SELECT pg_notify('skiplock_jobs', inserted.queue) FROM inserted) AS notified,
    (SELECT pg_notify('skiplock_outbox', outboxed.queue) FROM outboxed) AS relay_notified;

-- name: unique_holder
-- The job a held window points at (it may have been archived, or purged since).
SELECT u.job_id
FROM skiplock.unique_keys AS u
WHERE u.kind = %(kind)s::text
  AND u.idempotency_key = %(idempotency_key)s::text
  AND u.expires_at > now();

-- name: unique_point
-- The window was claimed but the hot table already held a job with this key: point at it.
UPDATE skiplock.unique_keys AS u
SET job_id = %(job_id)s::bigint
WHERE u.kind = %(kind)s::text
  AND u.idempotency_key = %(idempotency_key)s::text;

-- name: unique_window_of
-- The window a job holds, if any (the job page).
SELECT u.kind, u.idempotency_key, u.created_at, u.expires_at, u.expires_at > now() AS active
FROM skiplock.unique_keys AS u
WHERE u.kind = %(kind)s
  AND u.idempotency_key = %(idempotency_key)s
  AND u.job_id = %(job_id)s;

-- name: prune_unique_keys
-- Up to %(batch_size)s expired windows, oldest first (unique_keys_expires_idx).
DELETE FROM skiplock.unique_keys AS u
WHERE (u.kind, u.idempotency_key) IN (
    SELECT e.kind, e.idempotency_key
    FROM skiplock.unique_keys AS e
    WHERE e.expires_at <= now()
    ORDER BY e.expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
  AND u.expires_at <= now();  -- rechecked if an enqueue took the window over meanwhile

-- name: request_cancel
-- An operator asks a running job to stop. greatest() keeps the request at or after the claim
-- it is for, so the worker's test (cancel_requested_at >= locked_at) holds for this claim only.
UPDATE skiplock.jobs AS j
SET cancel_requested_at = greatest(clock_timestamp(), j.locked_at)
WHERE j.id = %(id)s
  AND j.status = 'running'
RETURNING j.id, j.queue, j.locked_by, j.attempts;

-- name: ids_by_keys
-- The jobs holding these keys, in skiplock.jobs or (a broker queue's) skiplock.outbox.
SELECT
    k.idempotency_key,
    k.id
FROM (
    SELECT j.idempotency_key, j.id
    FROM skiplock.jobs AS j
    WHERE j.idempotency_key = ANY(%(keys)s::text[])
    UNION ALL
    SELECT o.idempotency_key, o.id
    FROM skiplock.outbox AS o
    WHERE o.idempotency_key = ANY(%(keys)s::text[])
) AS k
ORDER BY k.id;

-- name: claim
-- Claim up to %(limit)s eligible jobs in one statement. The inner SELECT walks the partial
-- claim index in its own order and skips rows other workers hold; paused queues, queues with
-- limits, fair queues (025) and kinds with limits are left alone (hashed subplans, evaluated once per statement:
-- console/limits.py claims limited queues and kinds under their own lock).
WITH candidates AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.run_at <= now()
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND j.queue NOT IN (SELECT q.name FROM skiplock.queues AS q WHERE q.paused OR q.limited OR q.fair)
      AND j.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE skiplock.jobs AS j
SET status = 'running',
    locked_by = %(worker)s,
    locked_at = now(),
    lease_until = now() + make_interval(secs => %(lease)s),
    attempts = j.attempts + 1
FROM candidates AS c
WHERE j.id = c.id
RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
          j.idempotency_key, j.locked_by, j.locked_at, j.lease_until, j.created_at, j.headers;

-- name: complete_and_claim
-- Complete the jobs a worker finished (fenced by owner and attempt) and claim the next batch, in
-- one round trip and one commit. The claim cannot pick the rows just completed: they were
-- running, not pending, in the statement's snapshot. The worker itself passes no jobs to
-- complete: it completes them just before, with complete_many (console/queue/worker.py says
-- why); the bench's loops (bench/throughput.py) and other callers still use both parts.
--
-- The fence (owner, attempt, status 'running') is compared with columns of `d`, not with
-- constants, in every fenced statement of this file (complete_many, complete_logged, heartbeat,
-- release, fail): as constants they let the planner reach the jobs through jobs_lease_idx
-- (status = 'running'), and the statistics of a queue table hold almost no running rows, so the
-- plan it prefers, once prepared (generic), scans every job the worker holds and compares each
-- with every id of the list: time = jobs held x jobs finished. A worker holding ten batches of
-- 1,000 spent 15 s and more on one such completion (docs/queue.md, "Batch handlers"). As join
-- conditions they leave it one way in, the primary key, per id of the list: time = jobs
-- finished. OFFSET 0 keeps `d` a subquery, so the planner cannot fold the constants back in.
-- tests/test_batch_handlers.py checks the generic plans.
WITH finished AS (
    UPDATE skiplock.jobs AS j
    SET status = 'completed',
        finished_at = now(),
        lease_until = NULL
    FROM (SELECT u.id, u.attempt, %(worker)s::text AS worker, 'running'::text AS status
          FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS u (id, attempt)
          OFFSET 0) AS d
    WHERE j.id = d.id
      AND j.attempts = d.attempt
      AND j.locked_by = d.worker
      AND j.status = d.status
    RETURNING j.id
),
candidates AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.run_at <= now()
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND j.queue NOT IN (SELECT q.name FROM skiplock.queues AS q WHERE q.paused OR q.limited OR q.fair)
      AND j.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k)
      -- A worker with sync and async handlers claims for each runtime's free slots apart
      -- (console/queue/worker.py, "mixed"); NULL for every other worker.
      AND (%(kinds)s::text[] IS NULL OR j.kind = ANY(%(kinds)s::text[]))
      AND (%(skip_kinds)s::text[] IS NULL OR j.kind <> ALL(%(skip_kinds)s::text[]))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE skiplock.jobs AS j
    SET status = 'running',
        locked_by = %(worker)s,
        locked_at = now(),
        lease_until = now() + make_interval(secs => %(lease)s),
        attempts = j.attempts + 1
    FROM candidates AS c
    WHERE j.id = c.id
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
              j.idempotency_key, j.locked_by, j.locked_at, j.lease_until, j.created_at, j.headers
)
SELECT
    f.completed_ids,
    claimed.*
FROM (SELECT coalesce(array_agg(finished.id), '{}') AS completed_ids FROM finished) AS f
LEFT JOIN claimed ON true;

-- name: complete_many
UPDATE skiplock.jobs AS j
SET status = 'completed',
    finished_at = now(),
    lease_until = NULL
-- the fence as join conditions: see complete_and_claim
FROM (SELECT u.id, u.attempt, %(worker)s::text AS worker, 'running'::text AS status
      FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS u (id, attempt)
      OFFSET 0) AS d
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = d.worker
  AND j.status = d.status
RETURNING j.id;

-- name: complete_many_archive
-- complete_many for `worker.complete_into_archive`: the completed jobs leave the hot table in
-- the completing statement, moved into skiplock.jobs_archive as the archiver would move them,
-- fenced the same way (a job whose claim was lost is neither deleted nor archived). The column
-- list is the archiver's (maintenance.sql archive_batch); tests/test_contract_archive.py checks
-- that every column of skiplock.jobs arrives, through this statement and complete_logged_archive.
WITH moved AS (
    DELETE FROM skiplock.jobs AS j
    USING (SELECT u.id, u.attempt, %(worker)s::text AS worker, 'running'::text AS status
           FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS u (id, attempt)
           OFFSET 0) AS d
    WHERE j.id = d.id
      AND j.attempts = d.attempt
      AND j.locked_by = d.worker
      AND j.status = d.status
    RETURNING j.*
)
INSERT INTO skiplock.jobs_archive (
    id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
    idempotency_key, locked_by, locked_at, lease_until, last_error, errors,
    error_fingerprint, created_at, finished_at, cancel_requested_at, headers, attempt_logs, group_key
)
SELECT
    m.id, m.queue, m.kind, m.payload, 'completed', m.priority, m.run_at, m.attempts, m.max_attempts,
    m.idempotency_key, m.locked_by, m.locked_at, NULL, m.last_error, m.errors,
    m.error_fingerprint, m.created_at, now(), m.cancel_requested_at, m.headers, m.attempt_logs, m.group_key
FROM moved AS m
RETURNING id;

-- name: complete_logged
-- Complete jobs whose attempt logged records, with those records, fenced like complete_many.
-- Only these jobs pay for it: the others complete through complete_and_claim / complete_many,
-- unchanged. %(done)s is one JSON array of {id, attempt, entry} (one value to send, not three
-- arrays of which one is jsonb[]: each jsonb element would be adapted on its own).
UPDATE skiplock.jobs AS j
SET status = 'completed',
    finished_at = now(),
    lease_until = NULL,
    attempt_logs = CASE WHEN jsonb_array_length(coalesce(j.attempt_logs, '[]')) >= %(history)s
                        THEN (j.attempt_logs - 0) || jsonb_build_array(d.entry)
                        ELSE coalesce(j.attempt_logs, '[]') || jsonb_build_array(d.entry) END
-- the fence as join conditions: see complete_and_claim
FROM (SELECT r.id, r.attempt, r.entry, %(worker)s::text AS worker, 'running'::text AS status
      FROM jsonb_to_recordset(%(done)s::jsonb) AS r (id bigint, attempt integer, entry jsonb)
      OFFSET 0) AS d
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = d.worker
  AND j.status = d.status
RETURNING j.id;

-- name: complete_logged_archive
-- complete_logged for `worker.complete_into_archive`: the jobs move into the archive with their
-- records, fenced the same way (see complete_many_archive).
WITH moved AS (
    DELETE FROM skiplock.jobs AS j
    USING (SELECT r.id, r.attempt, r.entry, %(worker)s::text AS worker, 'running'::text AS status
           FROM jsonb_to_recordset(%(done)s::jsonb) AS r (id bigint, attempt integer, entry jsonb)
           OFFSET 0) AS d
    WHERE j.id = d.id
      AND j.attempts = d.attempt
      AND j.locked_by = d.worker
      AND j.status = d.status
    RETURNING j.*, d.entry
)
INSERT INTO skiplock.jobs_archive (
    id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
    idempotency_key, locked_by, locked_at, lease_until, last_error, errors,
    error_fingerprint, created_at, finished_at, cancel_requested_at, headers, attempt_logs, group_key
)
SELECT
    m.id, m.queue, m.kind, m.payload, 'completed', m.priority, m.run_at, m.attempts, m.max_attempts,
    m.idempotency_key, m.locked_by, m.locked_at, NULL, m.last_error, m.errors,
    m.error_fingerprint, m.created_at, now(), m.cancel_requested_at, m.headers,
    CASE WHEN jsonb_array_length(coalesce(m.attempt_logs, '[]')) >= %(history)s
         THEN (m.attempt_logs - 0) || jsonb_build_array(m.entry)
         ELSE coalesce(m.attempt_logs, '[]') || jsonb_build_array(m.entry) END,
    m.group_key
FROM moved AS m
RETURNING id;

-- name: fail
-- Record a failed attempt, fenced like completion. Retry with backoff while attempts remain
-- (and the error allows it); otherwise the job becomes a dead letter ('failed').
UPDATE skiplock.jobs AS j
SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
    run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                  THEN now() + make_interval(secs => %(delay)s)
                  ELSE j.run_at END,
    finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE now() END,
    lease_until = NULL,
    last_error = %(last_error)s,
    error_fingerprint = %(fingerprint)s,
    errors = CASE WHEN jsonb_array_length(j.errors) >= %(history)s
                  THEN (j.errors - 0) || jsonb_build_array(%(entry)s::jsonb)
                  ELSE j.errors || jsonb_build_array(%(entry)s::jsonb) END,
    -- The attempt's log records (console/queue/joblogs.py), NULL when it logged nothing: the
    -- same bounded history as `errors`.
    attempt_logs = CASE WHEN %(logs)s::jsonb IS NULL THEN j.attempt_logs
                        WHEN jsonb_array_length(coalesce(j.attempt_logs, '[]')) >= %(history)s
                        THEN (j.attempt_logs - 0) || jsonb_build_array(%(logs)s::jsonb)
                        ELSE coalesce(j.attempt_logs, '[]') || jsonb_build_array(%(logs)s::jsonb) END
-- the fence as join conditions (see complete_and_claim): as constants, the planner went through
-- jobs_lease_idx and read every job the worker holds to fail one (a batch of 1,000 that failed
-- whole, while the worker held 10,000: 1,000 x 10,000 rows)
FROM (SELECT %(id)s::bigint AS id, %(attempt)s::integer AS attempt, %(worker)s::text AS worker,
             'running'::text AS status
      OFFSET 0) AS d
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = d.worker
  AND j.status = d.status
RETURNING j.status;

-- name: heartbeat
-- Also returns whether an operator asked this claim to stop (console "cancel requested").
UPDATE skiplock.jobs AS j
SET lease_until = now() + make_interval(secs => %(lease)s)
-- the fence as join conditions: see complete_and_claim
FROM (SELECT u.id, u.attempt, %(worker)s::text AS worker, 'running'::text AS status
      FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS u (id, attempt)
      OFFSET 0) AS d
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = d.worker
  AND j.status = d.status
RETURNING j.id, j.lease_until, coalesce(j.cancel_requested_at >= j.locked_at, false) AS cancel_requested;

-- name: release
-- Give jobs back on shutdown without counting the attempt (the work never ran to an end).
UPDATE skiplock.jobs AS j
SET status = 'pending',
    attempts = j.attempts - 1,
    locked_by = NULL,
    locked_at = NULL,
    lease_until = NULL
-- the fence as join conditions: see complete_and_claim
FROM (SELECT u.id, u.attempt, %(worker)s::text AS worker, 'running'::text AS status
      FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS u (id, attempt)
      OFFSET 0) AS d
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = d.worker
  AND j.status = d.status
RETURNING j.id;

-- name: reap
-- Rescue up to %(batch_size)s running jobs whose lease expired. FOR UPDATE SKIP LOCKED plus the
-- repeated predicate make it safe against a worker completing the same job at this moment:
-- whichever commits first wins, and the other's fenced UPDATE matches nothing.
-- The worker that held each rescued job is charged with it (workers.reaped): a worker killed
-- with SIGKILL cannot count its own lost work, and the Workers page shows it as lost.
WITH expired AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'running'
      AND j.lease_until < now()
    ORDER BY j.lease_until
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE skiplock.jobs AS j
    SET status = CASE WHEN j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
        run_at = CASE WHEN j.attempts < j.max_attempts
                      THEN now() + make_interval(secs => least(%(backoff_cap)s,
                               %(backoff_base)s * power(2, greatest(j.attempts - 1, 0)))
                               * (0.5 + random() / 2))
                      ELSE j.run_at END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        last_error = 'LeaseExpired: lease expired while held by ' || coalesce(j.locked_by, 'unknown worker'),
        error_fingerprint = 'LeaseExpired: lease expired while held by <worker>',
        errors = CASE WHEN jsonb_array_length(j.errors) >= %(history)s THEN j.errors - 0 ELSE j.errors END
                 || jsonb_build_array(jsonb_build_object(
                        'attempt', j.attempts,
                        'at', now(),
                        'worker', j.locked_by,
                        'error_class', 'LeaseExpired',
                        'message', 'lease expired at ' || j.lease_until::text || '; rescued by the reaper',
                        'traceback', NULL)),
        lease_until = NULL
    FROM expired AS e
    WHERE j.id = e.id
      AND j.status = 'running'
      AND j.lease_until < now()
    RETURNING j.id, j.status, j.locked_by
),
charged AS (
    UPDATE skiplock.workers AS w
    SET reaped = w.reaped + c.jobs
    FROM (
        SELECT r.locked_by, count(*) AS jobs
        FROM rescued AS r
        WHERE r.locked_by IS NOT NULL
        GROUP BY r.locked_by
    ) AS c
    WHERE w.id = c.locked_by
)
SELECT r.id, r.status
FROM rescued AS r
ORDER BY r.id;

-- name: set_paused
INSERT INTO skiplock.queues AS q (name, paused, paused_at, paused_by, updated_at)
VALUES (%(queue)s, %(paused)s, CASE WHEN %(paused)s THEN now() END, %(actor)s, now())
ON CONFLICT (name) DO UPDATE
SET paused = excluded.paused,
    paused_at = excluded.paused_at,
    paused_by = excluded.paused_by,
    updated_at = now()
RETURNING q.name, q.paused;

-- name: notify_control
SELECT pg_notify('skiplock_control', %(message)s);

-- name: paused_queues
SELECT q.name
FROM skiplock.queues AS q
WHERE q.paused
ORDER BY q.name;

-- name: get_job
SELECT j.*
FROM skiplock.jobs AS j
WHERE j.id = %(id)s;

-- name: register_worker
-- kinds: what this worker's tasks modules register (console "why isn't this job running?").
-- version, release: Skiplock's version and the application's release (`[worker] release`; NULL
-- when unset), which the timeline compares to show deploys (migration 024).
INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, kinds, version, release)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(kinds)s, %(version)s, %(release)s)
ON CONFLICT (id) DO UPDATE
SET last_seen = now(),
    stopped_at = NULL,
    kinds = excluded.kinds,
    version = excluded.version,
    release = excluded.release;

-- name: flush_worker
-- The worker process keeps its counters since start and writes them whole (a lost flush is
-- repaired by the next one). Collectors take deltas between samples.
UPDATE skiplock.workers AS w
SET last_seen = now(),
    stopped_at = CASE WHEN %(stopping)s THEN now() ELSE NULL END,
    in_flight = %(in_flight)s,
    claimed = %(claimed)s,
    completed = %(completed)s,
    failed = %(failed)s,
    retried = %(retried)s,
    lost = %(lost)s,
    queue_counts = %(queue_counts)s,
    claim_calls = %(claim_calls)s,
    claim_seconds_sum = %(claim_seconds_sum)s,
    claim_histogram = %(claim_histogram)s,
    pickup_count = %(pickup_count)s,
    pickup_seconds_sum = %(pickup_seconds_sum)s,
    pickup_histogram = %(pickup_histogram)s,
    runtime_histogram = %(runtime_histogram)s
WHERE w.id = %(id)s;

-- name: try_vacuum_lock
-- One worker vacuums the jobs table at a time (session-level advisory lock, never waited on).
SELECT pg_try_advisory_lock(hashtext('skiplock.jobs vacuum'));

-- name: vacuum_unlock
SELECT pg_advisory_unlock(hashtext('skiplock.jobs vacuum'));

-- name: vacuum_jobs
-- Removes the dead claim-index entries that every claim would otherwise scan past. No row
-- locks; SKIP_LOCKED steps aside when autovacuum (or an operator) is already vacuuming it.
VACUUM (SKIP_LOCKED) skiplock.jobs;
