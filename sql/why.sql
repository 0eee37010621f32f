-- "Why isn't this job running?" (console/why.py): the facts behind the answer, for one job or
-- one queue. Each query reads one row, one worker registry, or a bounded window of an index:
-- none scans the jobs table. Running jobs are counted through jobs_lease_idx (at most the
-- fleet's handler threads), pending ones through jobs_claim_idx in its own order.

-- name: queue_state
-- One queue's pause flag and limits, its running jobs, and its bucket's tokens as of now (the
-- limited claim's own arithmetic, sql/limits.sql `claim_queue`). No row: the queue was never
-- paused nor limited (then it has no flags, and its running jobs come from `running_in`).
SELECT
    q.name AS queue,
    q.paused,
    q.paused_at,
    q.paused_by,
    q.concurrency,
    q.rate_count,
    q.rate_period,
    q.burst,
    CASE WHEN q.rate_count IS NOT NULL THEN
        least(q.burst, coalesce(q.tokens, q.burst)
              + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(q.refilled_at, clock_timestamp())))
                * q.rate_count::double precision / q.rate_period)
    END AS tokens,
    q.group_concurrency,
    q.limits_set_by,
    q.limits_set_at
FROM skiplock.queues AS q
WHERE q.name = %(queue)s;

-- name: group_running
-- Running jobs of one group of a fair queue (NULL: the queue's NULL group), through
-- jobs_lease_idx like the other running counts.
SELECT count(*) AS running
FROM skiplock.jobs AS r
WHERE r.status = 'running'
  AND r.queue = %(queue)s
  AND r.group_key IS NOT DISTINCT FROM %(group)s::text;

-- name: running_in
-- Running jobs of one queue and of one kind, and how many of them are past their lease (held
-- by a worker that stopped renewing it). Through jobs_lease_idx: running rows only.
SELECT
    count(*) FILTER (WHERE r.queue = %(queue)s) AS queue_running,
    count(*) FILTER (WHERE r.queue = %(queue)s AND r.lease_until < now()) AS queue_expired,
    count(*) FILTER (WHERE r.kind = %(kind)s::text) AS kind_running
FROM (
    SELECT j.queue, j.kind, j.lease_until
    FROM skiplock.jobs AS j
    WHERE j.status = 'running'
    ORDER BY j.lease_until
    LIMIT %(cap)s
) AS r;

-- name: kind_limit
SELECT k.kind, k.concurrency, k.declared_by, k.updated_at
FROM skiplock.kind_limits AS k
WHERE k.kind = %(kind)s;

-- name: pause_audit
-- Who paused the queue and why: the audit row written in the same transaction as the pause
-- (console.maintenance.pause_queue), found through audit_log_action_idx (action, at DESC) in
-- the minute around the pause. None when the queue was paused from code (console.queue.pause).
SELECT a.id, a.at, a.actor, a.reason
FROM skiplock.audit_log AS a
WHERE a.action = 'pause'
  AND a.target = 'queue:' || %(queue)s
  AND a.at >= %(paused_at)s::timestamptz - interval '1 minute'
  AND a.at <= %(paused_at)s::timestamptz + interval '1 minute'
ORDER BY a.at DESC, a.id DESC
LIMIT 1;

-- name: workers
-- The worker registry: live workers and those that stopped or went quiet within the hour
-- (the Workers page's set), with what they listen on and which kinds they handle (NULL: not
-- reported). `seen_seconds_ago` decides live or stale against the console's threshold.
-- PostgreSQL workers only: a broker worker (backend 'nats', migration 031) never claims from
-- skiplock.jobs, so it is no answer to "why isn't this job running?".
SELECT
    w.id,
    w.host,
    w.pid,
    w.queues,
    w.kinds,
    w.concurrency,
    w.in_flight,
    w.last_seen,
    w.stopped_at,
    extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago
FROM skiplock.workers AS w
WHERE w.backend = 'postgres'
  AND (w.stopped_at IS NULL
       OR w.stopped_at > now() - interval '1 hour')
ORDER BY w.stopped_at IS NOT NULL, w.last_seen DESC
LIMIT 500;

-- name: worker
-- One worker's registry row (the holder of a running job's lease), whatever its age.
SELECT
    w.id,
    w.host,
    w.pid,
    w.queues,
    w.kinds,
    w.concurrency,
    w.in_flight,
    w.last_seen,
    w.stopped_at,
    extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago
FROM skiplock.workers AS w
WHERE w.id = %(id)s;

-- name: ahead
-- How many eligible jobs a worker claims before this one: the claim's own order (priority
-- DESC, run_at, id) over jobs_claim_idx, in two index ranges so each is an index condition:
-- the higher priorities (from the index's start to this priority), and this priority before
-- this job's (run_at, id), all due since this job is. Each range is read for at most %(window)s entries (LIMIT inside),
-- then filtered to the queues the job's workers claim from; `higher_full`/`same_full` say a
-- window was full, so the count is a lower bound. Paused and limited queues and limited kinds
-- are left out as the fast claim leaves them out (%(own_queue_only)s: the job's queue is
-- limited, and its own claim (sql/limits.sql) looks at that queue alone).
WITH higher AS (
    -- Scheduled entries are counted into the window and filtered out below: a filter inside
    -- would let a long run of them be read past the window.
    SELECT j.queue, j.kind, j.run_at
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.priority > %(priority)s
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(window)s
),
same AS (
    SELECT j.queue, j.kind
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.priority = %(priority)s
      AND (j.run_at, j.id) < (%(run_at)s::timestamptz, %(id)s::bigint)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(window)s
),
skipped AS (
    SELECT q.name
    FROM skiplock.queues AS q
    WHERE q.paused OR q.limited OR q.fair
)
SELECT
    (SELECT count(*) FROM higher) >= %(window)s AS higher_full,
    (SELECT count(*) FROM same) >= %(window)s AS same_full,
    (SELECT count(*)
     FROM higher AS h
     WHERE h.run_at <= now()
       AND (%(queues)s::text[] IS NULL OR h.queue = ANY(%(queues)s::text[]))
       AND (%(own_queue_only)s OR h.queue NOT IN (SELECT s.name FROM skipped AS s))
       AND (%(own_queue_only)s OR h.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k))
    ) AS higher,
    (SELECT count(*)
     FROM same AS s2
     WHERE (%(queues)s::text[] IS NULL OR s2.queue = ANY(%(queues)s::text[]))
       AND (%(own_queue_only)s OR s2.queue NOT IN (SELECT s.name FROM skipped AS s))
       AND (%(own_queue_only)s OR s2.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k))
    ) AS same;

-- name: queue_head
-- One queue's first eligible job in claim order, its eligible and scheduled counts, and its
-- next scheduled time, from the first %(window)s entries of jobs_claim_idx (the queue figures'
-- own bound, sql/browse.sql `pending_by_queue`); `full` says the window was full, so a queue
-- whose jobs lie beyond it reads as a lower bound.
WITH w AS (
    SELECT j.id, j.queue, j.kind, j.priority, j.run_at
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(window)s
),
mine AS (
    SELECT w.*, row_number() OVER (ORDER BY w.priority DESC, w.run_at, w.id) AS n
    FROM w
    WHERE w.queue = %(queue)s
)
SELECT
    (SELECT count(*) FROM w) >= %(window)s AS full,
    (SELECT count(*) FROM mine WHERE mine.run_at <= now()) AS eligible,
    (SELECT count(*) FROM mine WHERE mine.run_at > now()) AS scheduled,
    (SELECT min(mine.run_at) FROM mine WHERE mine.run_at > now()) AS next_run_at,
    (SELECT mine.id FROM mine WHERE mine.run_at <= now() ORDER BY mine.n LIMIT 1) AS head_id;

-- name: walk_indexes
-- For this transaction only: the bounded windows above must walk their index in its order and
-- stop at the LIMIT. When a window is a large share of an index range the planner otherwise
-- prefers a bitmap scan of the whole range plus a sort, whose cost grows with the backlog (the
-- collectors' sessions turn the same two off: console/collectors/base.py).
SELECT
    set_config('enable_bitmapscan', 'off', true),
    set_config('enable_seqscan', 'off', true);
