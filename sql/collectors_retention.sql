-- Sample retention and downsampling, each statement bounded by a batch size.

-- name: rollup_minutes
-- Fold raw samples of complete minutes in [%(from)s, %(to)s) into per-minute rows. Re-running
-- a window replaces its rows, so a retry after a crash double-counts nothing.
INSERT INTO skiplock.samples_rollup AS r
    (resolution, bucket, metric, labels, min_value, max_value, avg_value, last_value, samples)
SELECT
    'minute',
    date_trunc('minute', s.collected_at) AS bucket,
    s.metric,
    s.labels,
    min(s.value),
    max(s.value),
    avg(s.value),
    (array_agg(s.value ORDER BY s.collected_at DESC))[1],
    count(*)
FROM skiplock.samples AS s
WHERE s.collected_at >= %(from)s
  AND s.collected_at < %(to)s
GROUP BY 2, s.metric, s.labels
ORDER BY 2, s.metric
ON CONFLICT (resolution, metric, labels, bucket) DO UPDATE
SET min_value = excluded.min_value,
    max_value = excluded.max_value,
    avg_value = excluded.avg_value,
    last_value = excluded.last_value,
    samples = excluded.samples;

-- name: rollup_hours
-- Fold per-minute rows of complete hours in [%(from)s, %(to)s) into per-hour rows.
INSERT INTO skiplock.samples_rollup AS r
    (resolution, bucket, metric, labels, min_value, max_value, avg_value, last_value, samples)
SELECT
    'hour',
    date_trunc('hour', m.bucket) AS bucket,
    m.metric,
    m.labels,
    min(m.min_value),
    max(m.max_value),
    sum(m.avg_value * m.samples) / nullif(sum(m.samples) FILTER (WHERE m.avg_value IS NOT NULL), 0),
    (array_agg(m.last_value ORDER BY m.bucket DESC))[1],
    sum(m.samples)::integer
FROM skiplock.samples_rollup AS m
WHERE m.resolution = 'minute'
  AND m.bucket >= %(from)s
  AND m.bucket < %(to)s
GROUP BY 2, m.metric, m.labels
ORDER BY 2, m.metric
ON CONFLICT (resolution, metric, labels, bucket) DO UPDATE
SET min_value = excluded.min_value,
    max_value = excluded.max_value,
    avg_value = excluded.avg_value,
    last_value = excluded.last_value,
    samples = excluded.samples;

-- name: oldest_raw
SELECT min(s.collected_at) AS oldest
FROM skiplock.samples AS s;

-- name: oldest_minute
SELECT min(r.bucket) AS oldest
FROM skiplock.samples_rollup AS r
WHERE r.resolution = 'minute';

-- name: delete_raw_batch
-- At most %(batch)s of the oldest raw samples older than the cutoff (samples_time_idx).
DELETE FROM skiplock.samples AS s
WHERE s.ctid = ANY(ARRAY(
    SELECT o.ctid
    FROM skiplock.samples AS o
    WHERE o.collected_at < %(cutoff)s
    ORDER BY o.collected_at
    LIMIT %(batch)s
));

-- name: delete_totals_batch
-- At most %(batch)s of the oldest per-cycle totals (migration 032) older than the cutoff: the
-- raw samples' cutoff, so a total goes with the samples it summed (samples_totals_time_idx).
DELETE FROM skiplock.samples_totals AS t
WHERE t.ctid = ANY(ARRAY(
    SELECT o.ctid
    FROM skiplock.samples_totals AS o
    WHERE o.collected_at < %(cutoff)s
    ORDER BY o.collected_at
    LIMIT %(batch)s
));

-- name: delete_rollup_batch
DELETE FROM skiplock.samples_rollup AS r
WHERE (r.resolution, r.metric, r.labels, r.bucket) IN (
    SELECT o.resolution, o.metric, o.labels, o.bucket
    FROM skiplock.samples_rollup AS o
    WHERE o.resolution = %(resolution)s
      AND o.bucket < %(cutoff)s
    ORDER BY o.bucket
    LIMIT %(batch)s
);

-- name: delete_runs_batch
DELETE FROM skiplock.collection_runs AS c
WHERE c.id = ANY(ARRAY(
    SELECT o.id
    FROM skiplock.collection_runs AS o
    WHERE o.started_at < %(cutoff)s
    ORDER BY o.started_at
    LIMIT %(batch)s
));

-- name: delete_workers_batch
-- Registry rows of workers gone longer than the grace: stopped (stopped_at) or killed (no
-- heartbeat since last_seen). The table holds one row per worker process, so it stays small.
DELETE FROM skiplock.workers AS w
WHERE w.id = ANY(ARRAY(
    SELECT o.id
    FROM skiplock.workers AS o
    WHERE coalesce(o.stopped_at, o.last_seen) < %(cutoff)s
      AND o.last_seen < %(cutoff)s
    ORDER BY o.last_seen
    LIMIT %(batch)s
));

-- name: delete_scheduler_nodes_batch
-- Rows of scheduler processes gone longer than raw samples are kept: one row is added per
-- process start, so without this a scheduler restarted by its supervisor grows the table for
-- ever. Within the window they still count restarts (collectors/restarts.py) and mark them on
-- the timeline; a live node's last_seen is seconds old, so it is never a candidate.
DELETE FROM skiplock.scheduler_nodes AS n
WHERE n.id = ANY(ARRAY(
    SELECT o.id
    FROM skiplock.scheduler_nodes AS o
    WHERE o.last_seen < %(cutoff)s
    ORDER BY o.last_seen
    LIMIT %(batch)s
));

-- name: delete_error_groups_batch
-- Error groups (skiplock.error_groups) not seen since %(cutoff)s and not ignored, oldest first:
-- one that fails again after that is new again.
DELETE FROM skiplock.error_groups AS g
WHERE g.fingerprint IN (
    SELECT o.fingerprint
    FROM skiplock.error_groups AS o
    WHERE o.last_seen < %(cutoff)s::timestamptz
      AND o.ignored_at IS NULL
    ORDER BY o.last_seen
    LIMIT %(batch)s
);
