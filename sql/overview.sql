-- Chart series for the overview and queue pages, reduced in the database to about one point per
-- pixel column: values sharing a collection time are summed (or maxed) across labels, split by
-- one label or not, then averaged (or maxed) per time bucket. Walks samples_metric_time_idx /
-- the rollup's primary key; bounded by time. Skiplock's own series only: those of
-- [[external_queues]] sources (label external) have their own panel.

-- name: series_raw
WITH per_time AS (
    SELECT
        s.collected_at AS at,
        coalesce(s.labels ->> %(split)s::text, '') AS key,
        CASE WHEN %(agg)s::text = 'max' THEN max(s.value) ELSE sum(s.value) END AS value
    FROM skiplock.samples AS s
    WHERE s.metric = %(metric)s
      AND s.collected_at >= %(since)s
      AND (%(labels)s::jsonb IS NULL OR s.labels @> %(labels)s::jsonb)
      AND NOT s.labels ? 'external'
    GROUP BY 1, 2
)
SELECT
    date_bin(%(step)s::interval, p.at, %(since)s) AS at,
    p.key,
    CASE WHEN %(agg)s::text = 'max' THEN max(p.value) ELSE avg(p.value) END AS value
FROM per_time AS p
GROUP BY 1, 2
ORDER BY 2, 1;

-- name: series_rollup
WITH per_time AS (
    SELECT
        r.bucket AS at,
        coalesce(r.labels ->> %(split)s::text, '') AS key,
        CASE WHEN %(agg)s::text = 'max' THEN max(r.max_value) ELSE sum(r.avg_value) END AS value
    FROM skiplock.samples_rollup AS r
    WHERE r.resolution = %(resolution)s
      AND r.metric = %(metric)s
      AND r.bucket >= %(since)s
      AND (%(labels)s::jsonb IS NULL OR r.labels @> %(labels)s::jsonb)
      AND NOT r.labels ? 'external'
    GROUP BY 1, 2
)
SELECT
    date_bin(%(step)s::interval, p.at, %(since)s) AS at,
    p.key,
    CASE WHEN %(agg)s::text = 'max' THEN max(p.value) ELSE avg(p.value) END AS value
FROM per_time AS p
GROUP BY 1, 2
ORDER BY 2, 1;
