-- Reading and writing stored samples. Every read is bounded by time and walks an index.

-- name: insert_samples
-- The arrays go in binary (the `b` placeholders): in text, psycopg quotes every JSON label set
-- character by character, which was most of a 5,000-queue collection cycle. The label sets go
-- as one JSON array (labels), zipped with the other two by ROWS FROM: one json.dumps of the
-- cycle instead of one per sample (45,000 at 5,000 queues).
INSERT INTO skiplock.samples (collected_at, metric, labels, value)
SELECT %(at)s, s.metric, s.labels, s.value
FROM ROWS FROM (
    unnest(%(metrics)b::text[]),
    jsonb_array_elements(%(labels)b::jsonb),
    unnest(%(values)b::double precision[])
) AS s (metric, labels, value);

-- name: latest
-- The newest value of every (metric, labels) seen within the last %(within)s seconds: one row per
-- series in skiplock.samples_latest, which triggers keep as samples are written (migration 027).
SELECT
    l.metric,
    l.labels,
    l.value,
    l.collected_at
FROM skiplock.samples_latest AS l
WHERE l.collected_at >= now() - make_interval(secs => %(within)s)
  AND (%(metric)s::text IS NULL OR l.metric = %(metric)s)
ORDER BY l.metric, l.labels;

-- name: latest_of_queues
-- The newest value of each series of %(metric)s whose queue label is one of %(queues)s (a text
-- array: the rows a page shows), leaving out an external source's (label external), seen
-- within the last %(within)s seconds. In `latest`'s order, so a queue's series come as they did.
SELECT
    l.labels ->> 'queue' AS queue,
    l.value
FROM skiplock.samples_latest AS l
WHERE l.metric = %(metric)s
  AND l.labels ->> 'queue' = ANY(%(queues)s::text[])
  AND NOT l.labels ? 'external'
  AND l.collected_at >= now() - make_interval(secs => %(within)s)
ORDER BY l.metric, l.labels;

-- name: latest_labelled
-- The newest value of the series of %(metrics)s whose labels contain %(labels)s (a JSON object),
-- seen within the last %(within)s seconds: the primary key's walk of those metrics, filtered.
SELECT
    l.metric,
    l.labels,
    l.value,
    l.collected_at
FROM skiplock.samples_latest AS l
WHERE l.metric = ANY(%(metrics)s::text[])
  AND l.labels @> %(labels)s::jsonb
  AND l.collected_at >= now() - make_interval(secs => %(within)s)
ORDER BY l.metric, l.labels;

-- name: series_raw
SELECT
    s.collected_at AS at,
    s.labels,
    s.value
FROM skiplock.samples AS s
WHERE s.metric = %(metric)s
  AND s.collected_at >= %(since)s
  AND (%(labels)s::jsonb IS NULL OR s.labels @> %(labels)s::jsonb)
ORDER BY s.collected_at;

-- name: series_rollup
SELECT
    r.bucket AS at,
    r.labels,
    r.avg_value AS value,
    r.max_value,
    r.min_value
FROM skiplock.samples_rollup AS r
WHERE r.resolution = %(resolution)s
  AND r.metric = %(metric)s
  AND r.bucket >= %(since)s
  AND (%(labels)s::jsonb IS NULL OR r.labels @> %(labels)s::jsonb)
ORDER BY r.bucket;

-- name: last_collection
SELECT
    c.started_at,
    c.finished_at,
    c.duration_ms,
    c.collectors,
    c.leader
FROM skiplock.collection_runs AS c
ORDER BY c.started_at DESC
LIMIT 1;

-- name: latest_cycle
-- Every sample of the newest collection cycle (samples_time_idx), so a series that vanished
-- (a queue emptied and forgotten) is not reported from an older cycle.
SELECT
    s.metric,
    s.labels,
    s.value,
    s.collected_at
FROM skiplock.samples AS s
WHERE s.collected_at = (
    SELECT c.started_at
    FROM skiplock.collection_runs AS c
    ORDER BY c.started_at DESC
    LIMIT 1
)
ORDER BY s.metric, s.labels;

-- name: queue_activity
-- Every queue the collectors reported within the last %(within)s seconds (its queue_depth and
-- queue_throughput series), with the newest sample and the newest one in which the queue was
-- busy: it had work (eligible, scheduled or running jobs) or finished some (queue_throughput
-- above 0: the workers' counters catch jobs too fast for any sample to see running). An emptied
-- queue stays listed and says since when it is idle (console.signals.queue_idle). One row per
-- series from samples_latest, whose triggers keep each series' newest sample and the newest
-- above zero (migrations 027 and 029), not a day of samples. Capped at %(cap)s queues.
SELECT
    l.labels ->> 'queue' AS queue,
    max(l.collected_at) AS last_seen,
    max(l.busy_at) FILTER (
        WHERE l.busy_at >= now() - make_interval(secs => %(within)s)
          AND (l.metric = 'queue_throughput'
               OR l.labels ->> 'state' IN ('eligible', 'scheduled', 'running'))
    ) AS last_busy
FROM skiplock.samples_latest AS l
WHERE l.metric IN ('queue_depth', 'queue_throughput')
  AND l.collected_at >= now() - make_interval(secs => %(within)s)
  AND l.labels ? 'queue'
  AND NOT l.labels ? 'external'
GROUP BY l.labels ->> 'queue'
ORDER BY queue
LIMIT %(cap)s;
