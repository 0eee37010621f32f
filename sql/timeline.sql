-- The incident timeline (console/timeline.py): what happened in one database between
-- %(since)s and %(until)s, one query per kind of event. Every read is bounded by the window on
-- an index (alert_events_at_idx, audit_log_at_idx, samples_metric_time_idx,
-- collection_runs_started_idx; scheduler_nodes and workers are small registries), and each
-- returns at most %(cap)s rows with `total`, how many the window holds (counted up to
-- %(count_cap)s), so the page can say "N more". Samples and collection runs are read from
-- %(lookback)s seconds before the window, so the first sample inside it has one to compare with.

-- name: alerts
-- Alerts that fired or resolved (acknowledging is an operator action: the audit log has it).
WITH hits AS (
    SELECT
        e.id,
        e.at,
        e.kind,
        e.value,
        a.id AS alert_id,
        a.rule,
        a.labels
    FROM skiplock.alert_events AS e
    JOIN skiplock.alerts AS a ON a.id = e.alert_id
    WHERE e.at >= %(since)s::timestamptz
      AND e.at <= %(until)s::timestamptz
      AND e.kind IN ('firing', 'resolved')
    ORDER BY e.at, e.id
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.id
LIMIT %(cap)s;

-- name: actions
-- Operator actions (sign-ins left out: they change nothing).
WITH hits AS (
    SELECT
        a.id,
        a.at,
        a.actor,
        a.action,
        a.target,
        a.selection,
        a.reason,
        a.rows,
        a.outcome
    FROM skiplock.audit_log AS a
    WHERE a.at >= %(since)s::timestamptz
      AND a.at <= %(until)s::timestamptz
      AND a.action <> 'login'
    ORDER BY a.at, a.id
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.id
LIMIT %(cap)s;

-- name: scheduler
-- Scheduler processes: each start (with the node it replaced when one died on the same host
-- before it: a restart, as sql/scheduler.sql `restarts` pairs them), each clean stop, each
-- process that went silent without stopping (dead: unseen for 30 s, as `nodes` says), and the
-- time each node became leader as its row still says it (a node that stepped down or stopped
-- cleanly since has forgotten it: docs/console.md says so).
WITH hits AS (
    SELECT n.started_at AS at, 'start' AS what, n.id, n.host, n.pid, replaced.id AS replaced,
           replaced.last_seen AS replaced_last_seen
    FROM skiplock.scheduler_nodes AS n
    LEFT JOIN LATERAL (
        SELECT d.id, d.last_seen
        FROM skiplock.scheduler_nodes AS d
        WHERE d.host = n.host
          AND d.id <> n.id
          AND d.stopped_at IS NULL
          AND d.last_seen <= n.started_at
          AND d.last_seen < now() - interval '30 seconds'
        ORDER BY d.last_seen DESC
        LIMIT 1
    ) AS replaced ON true
    WHERE n.started_at >= %(since)s::timestamptz
      AND n.started_at <= %(until)s::timestamptz
    UNION ALL
    SELECT n.stopped_at, 'stop', n.id, n.host, n.pid, NULL, NULL
    FROM skiplock.scheduler_nodes AS n
    WHERE n.stopped_at >= %(since)s::timestamptz
      AND n.stopped_at <= %(until)s::timestamptz
    UNION ALL
    SELECT n.last_seen, 'lost', n.id, n.host, n.pid, NULL, NULL
    FROM skiplock.scheduler_nodes AS n
    WHERE n.stopped_at IS NULL
      AND n.last_seen < now() - interval '30 seconds'
      AND n.last_seen >= %(since)s::timestamptz
      AND n.last_seen <= %(until)s::timestamptz
    UNION ALL
    SELECT n.leader_since, 'leader', n.id, n.host, n.pid, NULL, NULL
    FROM skiplock.scheduler_nodes AS n
    WHERE n.leader_since >= %(since)s::timestamptz
      AND n.leader_since <= %(until)s::timestamptz
),
capped AS (
    SELECT h.*
    FROM hits AS h
    ORDER BY h.at, h.id, h.what
    LIMIT %(count_cap)s
)
SELECT
    c.*,
    count(*) OVER () AS total
FROM capped AS c
ORDER BY c.at, c.id, c.what
LIMIT %(cap)s;

-- name: workers
-- Worker processes in the registry: each start, each clean exit, and each worker that went
-- silent without saying it stopped (killed, hung, cut off) longer than %(live_within)s seconds
-- ago, with the jobs the reaper rescued from it. A worker gone longer than
-- [worker] registry_grace has left the registry, and so the timeline.
WITH hits AS (
    SELECT w.started_at AS at, 'start' AS what, w.id, w.host, w.pid, w.queues, w.concurrency,
           w.completed, w.failed, w.lost + w.reaped AS lost, w.version, w.release
    FROM skiplock.workers AS w
    WHERE w.started_at >= %(since)s::timestamptz
      AND w.started_at <= %(until)s::timestamptz
    UNION ALL
    SELECT w.stopped_at, 'stop', w.id, w.host, w.pid, w.queues, w.concurrency,
           w.completed, w.failed, w.lost + w.reaped, w.version, w.release
    FROM skiplock.workers AS w
    WHERE w.stopped_at >= %(since)s::timestamptz
      AND w.stopped_at <= %(until)s::timestamptz
    UNION ALL
    SELECT w.last_seen, 'lost', w.id, w.host, w.pid, w.queues, w.concurrency,
           w.completed, w.failed, w.lost + w.reaped, w.version, w.release
    FROM skiplock.workers AS w
    WHERE w.stopped_at IS NULL
      AND w.last_seen < now() - make_interval(secs => %(live_within)s)
      AND w.last_seen >= %(since)s::timestamptz
      AND w.last_seen <= %(until)s::timestamptz
),
capped AS (
    SELECT h.*
    FROM hits AS h
    ORDER BY h.at, h.id, h.what
    LIMIT %(count_cap)s
)
SELECT
    c.*,
    count(*) OVER () AS total
FROM capped AS c
ORDER BY c.at, c.id, c.what
LIMIT %(cap)s;

-- name: deploys
-- Deploys: a worker start whose (version, release) (migration 024) differs from that of the
-- worker that started last before it serving an overlapping set of queues (a worker of every
-- queue, queues NULL, overlaps all). Only workers that reported a version count, on both sides:
-- a worker of an earlier release (NULL) is neither a deploy nor the thing one is compared with.
-- Comparing within overlapping queues keeps two fleets with their own releases in one database
-- (a billing app and a mail app) from reading as a deploy each time one of them starts a worker;
-- the previous start may be before the window (the registry is small; rows leave it
-- [worker] registry_grace after the worker ended, and then nothing is compared with them).
WITH hits AS (
    SELECT w.started_at AS at, w.id, w.host, w.pid, w.queues, w.version, w.release,
           p.id AS previous_id, p.version AS previous_version, p.release AS previous_release,
           p.started_at AS previous_started_at
    FROM skiplock.workers AS w
    CROSS JOIN LATERAL (
        SELECT b.id, b.version, b.release, b.started_at
        FROM skiplock.workers AS b
        WHERE b.version IS NOT NULL
          AND b.id <> w.id
          AND (b.started_at, b.id) < (w.started_at, w.id)
          AND (b.queues IS NULL OR w.queues IS NULL OR b.queues && w.queues)
        ORDER BY b.started_at DESC, b.id DESC
        LIMIT 1
    ) AS p
    WHERE w.version IS NOT NULL
      AND w.started_at >= %(since)s::timestamptz
      AND w.started_at <= %(until)s::timestamptz
      AND (p.version, p.release) IS DISTINCT FROM (w.version, w.release)
),
capped AS (
    SELECT h.*
    FROM hits AS h
    ORDER BY h.at, h.id
    LIMIT %(count_cap)s
)
SELECT
    c.*,
    count(*) OVER () AS total
FROM capped AS c
ORDER BY c.at, c.id
LIMIT %(cap)s;

-- name: autovacuum
-- Autovacuum runs on the queue's tables: the collectors' table_vacuum_count{kind=autovacuum}
-- went up between two samples. The run's time is the sample's time less the table's
-- table_last_autovacuum_age_seconds of the same cycle (the latest run, when several ran).
WITH counts AS (
    SELECT
        s.collected_at,
        s.labels ->> 'table' AS tbl,
        s.value,
        lag(s.value) OVER (PARTITION BY s.labels ->> 'table' ORDER BY s.collected_at) AS before
    FROM skiplock.samples AS s
    WHERE s.metric = 'table_vacuum_count'
      AND s.labels ->> 'kind' = 'autovacuum'
      AND s.collected_at >= %(since)s::timestamptz - make_interval(secs => %(lookback)s)
      AND s.collected_at <= %(until)s::timestamptz
),
runs AS (
    SELECT
        c.collected_at,
        c.tbl,
        (c.value - c.before)::bigint AS runs,
        (SELECT a.value
         FROM skiplock.samples AS a
         WHERE a.metric = 'table_last_autovacuum_age_seconds'
           AND a.collected_at = c.collected_at
           AND a.labels ->> 'table' = c.tbl
         LIMIT 1) AS age_s
    FROM counts AS c
    WHERE c.before IS NOT NULL
      AND c.value > c.before
),
hits AS (
    SELECT
        greatest(r.collected_at - make_interval(secs => coalesce(r.age_s, 0)),
                 %(since)s::timestamptz) AS at,
        r.collected_at AS seen_at,
        r.tbl,
        r.runs
    FROM runs AS r
    WHERE r.collected_at >= %(since)s::timestamptz
    ORDER BY r.collected_at, r.tbl
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.tbl
LIMIT %(cap)s;

-- name: xmin_holders
-- A new xmin horizon holder: one in a collection cycle's xmin_holders (the database collector's
-- detail) that the cycle before did not list (same kind and id). A cycle without the detail
-- (its collector failed) compares with nothing, so it announces nobody.
WITH cycles AS (
    SELECT
        c.id,
        c.started_at,
        c.details -> 'xmin_holders' AS holders,
        lag(c.details -> 'xmin_holders') OVER (ORDER BY c.started_at, c.id) AS before
    FROM skiplock.collection_runs AS c
    WHERE c.started_at >= %(since)s::timestamptz - make_interval(secs => %(lookback)s)
      AND c.started_at <= %(until)s::timestamptz
),
hits AS (
    SELECT
        c.started_at AS at,
        c.id AS run_id,
        h.value ->> 'kind' AS holder_kind,
        h.value ->> 'id' AS holder_id,
        h.value ->> 'application_name' AS application_name,
        h.value ->> 'state' AS state,
        (h.value ->> 'age_s')::float8 AS age_s,
        (h.value ->> 'xid_age')::float8 AS xid_age
    FROM cycles AS c
    CROSS JOIN LATERAL jsonb_array_elements(c.holders) AS h (value)
    WHERE c.started_at >= %(since)s::timestamptz
      AND jsonb_typeof(c.holders) = 'array'
      AND jsonb_typeof(c.before) = 'array'
      AND NOT EXISTS (
          SELECT 1
          FROM jsonb_array_elements(c.before) AS b (value)
          WHERE b.value ->> 'kind' = h.value ->> 'kind'
            AND b.value ->> 'id' = h.value ->> 'id'
      )
    ORDER BY c.started_at, c.id, h.value ->> 'id'
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.run_id, h.holder_id
LIMIT %(cap)s;

-- name: lock_waits
-- Lock waits begin: a cycle whose lock_waiters (the database collector's detail) lists
-- sessions when the cycle before listed none. The relations they wait on and the longest wait
-- come from the detail; the queries they run are not read.
WITH cycles AS (
    SELECT
        c.id,
        c.started_at,
        c.details -> 'lock_waiters' AS waiters,
        lag(c.details -> 'lock_waiters') OVER (ORDER BY c.started_at, c.id) AS before
    FROM skiplock.collection_runs AS c
    WHERE c.started_at >= %(since)s::timestamptz - make_interval(secs => %(lookback)s)
      AND c.started_at <= %(until)s::timestamptz
),
hits AS (
    SELECT
        c.started_at AS at,
        c.id AS run_id,
        jsonb_array_length(c.waiters) AS sessions,
        ARRAY(SELECT DISTINCT coalesce(w.value ->> 'relation', w.value ->> 'locktype')
              FROM jsonb_array_elements(c.waiters) AS w (value)
              ORDER BY 1
              LIMIT 5) AS relations,
        (SELECT max((w.value ->> 'waiting_s')::float8)
         FROM jsonb_array_elements(c.waiters) AS w (value)) AS longest_s
    FROM cycles AS c
    WHERE c.started_at >= %(since)s::timestamptz
      AND jsonb_typeof(c.waiters) = 'array'
      AND jsonb_typeof(c.before) = 'array'
      AND jsonb_array_length(c.waiters) > 0
      AND jsonb_array_length(c.before) = 0
    ORDER BY c.started_at, c.id
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.run_id
LIMIT %(cap)s;

-- name: replica_lag
-- A replica's replay lag crossing %(threshold)s seconds upwards (above) or back (below),
-- between two samples of replica_lag_seconds with the same labels.
WITH lags AS (
    SELECT
        s.collected_at,
        s.labels,
        s.value,
        lag(s.value) OVER (PARTITION BY s.labels ORDER BY s.collected_at) AS before
    FROM skiplock.samples AS s
    WHERE s.metric = 'replica_lag_seconds'
      AND s.collected_at >= %(since)s::timestamptz - make_interval(secs => %(lookback)s)
      AND s.collected_at <= %(until)s::timestamptz
),
hits AS (
    SELECT
        l.collected_at AS at,
        l.labels,
        l.value,
        l.before,
        CASE WHEN l.value > %(threshold)s THEN 'above' ELSE 'below' END AS direction
    FROM lags AS l
    WHERE l.collected_at >= %(since)s::timestamptz
      AND l.value IS NOT NULL
      AND l.before IS NOT NULL
      AND (l.value > %(threshold)s) <> (l.before > %(threshold)s)
    ORDER BY l.collected_at, l.labels::text
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.labels::text
LIMIT %(cap)s;

-- name: error_groups
-- Error groups that became new or regressed in the window (skiplock.error_groups, written by
-- the errorgroups collector), ignored ones included and marked.
WITH hits AS (
    SELECT
        g.fingerprint,
        g.change,
        g.change_at AS at,
        g.previous_seen,
        g.kinds,
        g.queues,
        g.ignored_at
    FROM skiplock.error_groups AS g
    WHERE g.change IS NOT NULL
      AND g.change_at >= %(since)s::timestamptz
      AND g.change_at <= %(until)s::timestamptz
    ORDER BY g.change_at, g.fingerprint
    LIMIT %(count_cap)s
)
SELECT
    h.*,
    count(*) OVER () AS total
FROM hits AS h
ORDER BY h.at, h.fingerprint
LIMIT %(cap)s;
