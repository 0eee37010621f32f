-- Chart series for the overview and queue pages, reduced in the database to about one point per
-- pixel column: values sharing a collection time are summed (or maxed) across labels, split by
-- one label or not, then averaged (or maxed) per time bucket. Walks samples_metric_time_idx /
-- the rollup's primary key; bounded by time. Skiplock's own series only: those of
-- [[external_queues]] sources (label external) have their own panel.

-- name: split_keys
-- How many lines a chart split by %(split)s would draw over the window: the distinct values of
-- that label among the series with a sample since %(since)s, read from the newest sample of each
-- series (a series sampled in the window has its newest sample in it). At 5,000 queues this
-- reads 5,000 rows where the split series itself returned 600,000 to be thrown away.
SELECT count(DISTINCT coalesce(l.labels ->> %(split)s::text, '')) AS keys
FROM skiplock.samples_latest AS l
WHERE l.metric = %(metric)s
  AND l.collected_at >= %(since)s
  AND (%(labels)s::jsonb IS NULL OR l.labels @> %(labels)s::jsonb)
  AND NOT l.labels ? 'external';

-- name: tables_with
-- The tables a per-table metric was sampled for in the last 15 minutes (the newest sample of
-- each series: the samples of 15 minutes at 5,000 queues are millions of rows).
SELECT DISTINCT l.labels ->> 'table' AS table_name
FROM skiplock.samples_latest AS l
WHERE l.metric = %(metric)s
  AND l.collected_at >= now() - interval '15 minutes';

-- name: series_raw
WITH per_time AS (
    SELECT
        s.collected_at AS at,
        coalesce(s.labels ->> %(split)s::text, '') AS key,
        CASE WHEN %(agg)s::text = 'max' THEN max(s.value) ELSE sum(s.value) END AS value
    FROM skiplock.samples AS s
    WHERE s.metric = %(metric)s
      AND s.collected_at >= %(since)s
      AND (%(until)s::timestamptz IS NULL OR s.collected_at < %(until)s::timestamptz)
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
      AND (%(until)s::timestamptz IS NULL OR r.bucket < %(until)s::timestamptz)
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

-- name: series_totals
-- The total across queues of %(metric)s (skiplock.samples_totals, migration 032: one row per
-- cycle and kept label set), reduced like series_raw: the rows sharing a time (a cycle stored in
-- parts) added up (or maxed), then averaged (or maxed) per bucket. `first_at` is the oldest
-- total in each bucket: the caller reads the samples for the part of the window before the
-- first total (history stored before 032). Walks samples_totals_metric_time_idx.
WITH per_time AS (
    SELECT
        t.collected_at AS at,
        CASE WHEN %(agg)s::text = 'max' THEN max(t.value) ELSE sum(t.value) END AS value
    FROM skiplock.samples_totals AS t
    WHERE t.metric = %(metric)s
      AND t.collected_at >= %(since)s
      AND (%(labels)s::jsonb IS NULL OR t.labels @> %(labels)s::jsonb)
    GROUP BY 1
)
SELECT
    date_bin(%(step)s::interval, p.at, %(since)s) AS at,
    '' AS key,
    CASE WHEN %(agg)s::text = 'max' THEN max(p.value) ELSE avg(p.value) END AS value,
    min(p.at) AS first_at
FROM per_time AS p
GROUP BY 1
ORDER BY 1;
