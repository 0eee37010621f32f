-- Queue collectors: depth, age, stuck leases, dead letters. None of these scans the jobs table:
-- each walks one partial index (pending: jobs_claim_idx, running: jobs_lease_idx, failed:
-- jobs_failed_idx) and stops after %(cap)s entries, or reads catalog statistics.

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

-- name: failed_total
-- Dead letters in total: an index-only walk of jobs_failed_idx, stopped at the cap.
SELECT count(*) AS failed
FROM (
    SELECT 1
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
    ORDER BY j.finished_at, j.id
    LIMIT %(cap)s
) AS f;

-- name: failed_by_queue
-- Dead letters per queue: the newest %(cap)s through jobs_failed_idx (the queue needs a heap
-- fetch per entry, so this cap is smaller than the total's). Exact while failed <= cap;
-- beyond it the collector scales the shares to the total.
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

-- name: status_estimates
-- Rows by status from the planner's statistics (last ANALYZE): completed rows are never
-- counted, and a pending backlog beyond the cap is scaled to this estimate.
SELECT
    s.status,
    (greatest(c.reltuples, 0) * s.freq)::float8 AS estimate
FROM pg_class AS c
CROSS JOIN LATERAL (
    SELECT
        unnest(st.most_common_vals::text::text[]) AS status,
        unnest(st.most_common_freqs) AS freq
    FROM pg_stats AS st
    WHERE st.schemaname = 'skiplock'
      AND st.tablename = 'jobs'
      AND st.attname = 'status'
) AS s
WHERE c.oid = 'skiplock.jobs'::regclass
ORDER BY s.status;

-- name: known_queues
-- Queues the operator has touched (paused or resumed), so an empty queue still reports 0.
SELECT q.name, q.paused
FROM skiplock.queues AS q
ORDER BY q.name;
