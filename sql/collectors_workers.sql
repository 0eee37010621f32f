-- Worker collectors: the registry rows and their cumulative counters. The table holds one row
-- per worker process, so it stays small; stopped workers older than a day are not read.

-- name: workers
SELECT
    w.id,
    w.queues,
    w.in_flight,
    w.claimed,
    w.completed,
    w.failed,
    w.retried,
    w.lost,
    w.claim_calls,
    w.claim_seconds_sum,
    w.claim_histogram,
    w.pickup_count,
    w.pickup_seconds_sum,
    w.pickup_histogram,
    w.queue_counts,
    w.stopped_at IS NULL AND w.last_seen >= now() - make_interval(secs => %(live_within)s) AS live
FROM skiplock.workers AS w
WHERE w.stopped_at IS NULL
   OR w.stopped_at >= now() - interval '1 day'
ORDER BY w.id;
