-- The price of a horizon holder or a lock blocker (console/holders.py): who a backend is (its
-- identity is pid AND backend_start: a pid is reused by the next backend), what the stored
-- samples say changed since it started, and the signal that ends it. Shared-memory reads and
-- index walks of skiplock.samples (samples_metric_time_idx) only; the caller runs each under a
-- statement_timeout (console.db.time_limited).

-- name: backends
-- The identity and state of the backends with these pids (in this database or not: the caller
-- says why one is refused). holds_horizon: it has an xmin or an xid (it holds back vacuum).
SELECT
    a.pid,
    a.backend_start,
    a.backend_type,
    a.datname::text AS datname,
    a.application_name,
    a.usename::text AS usename,
    a.state,
    a.xact_start,
    a.state_change,
    left(a.query, 200) AS query,
    (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL) AS holds_horizon,
    a.pid = pg_backend_pid() AS is_me,
    coalesce(a.application_name, '') LIKE ANY(%(console_apps)s::text[]) AS console_app,
    a.datname = current_database() AS this_database
FROM pg_stat_activity AS a
WHERE a.pid = ANY(%(pids)s::int[])
ORDER BY a.pid;

-- name: cancel_backend
-- Cancel the running query of the backend with this pid AND this backend_start, if it is still
-- that backend and still one the console may end (the checks of console/holders.py repeated in
-- the same statement as the signal: no row when it changed in between).
SELECT
    pg_cancel_backend(a.pid) AS signalled
FROM pg_stat_activity AS a
WHERE a.pid = %(pid)s
  AND a.backend_start = %(backend_start)s
  AND a.backend_type = 'client backend'
  AND a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND NOT coalesce(a.application_name, '') LIKE ANY(%(console_apps)s::text[])
  AND NOT a.pid = ANY(%(own_pids)s::int[]);

-- name: terminate_backend
-- Terminate the backend with this pid AND this backend_start (as cancel_backend).
SELECT
    pg_terminate_backend(a.pid) AS signalled
FROM pg_stat_activity AS a
WHERE a.pid = %(pid)s
  AND a.backend_start = %(backend_start)s
  AND a.backend_type = 'client backend'
  AND a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND NOT coalesce(a.application_name, '') LIKE ANY(%(console_apps)s::text[])
  AND NOT a.pid = ANY(%(own_pids)s::int[]);

-- name: values_at
-- The newest sample of %(metric)s per label set at or before %(at)s, no older than
-- %(lookback)s seconds before it: "the sample just before the holder started", or (at = now)
-- the latest. Series of external queues included (their labels say so).
SELECT DISTINCT ON (s.labels)
    s.labels,
    s.value,
    s.collected_at
FROM skiplock.samples AS s
WHERE s.metric = %(metric)s
  AND s.collected_at <= %(at)s
  AND s.collected_at >= %(at)s - make_interval(secs => %(lookback)s)
ORDER BY s.labels, s.collected_at DESC;

-- name: window_backlog
-- Skiplock's eligible backlog (the overview's "jobs waiting" total, skiplock.samples_totals)
-- averaged over the collection cycles in (%(start)s, %(end)s]: whether the workers had work
-- waiting, so a lower throughput meant less capacity, or kept up, so it followed the arrivals.
SELECT
    count(*)::int AS cycles,
    avg(c.value)::float8 AS mean
FROM (
    SELECT t.collected_at, sum(t.value) AS value
    FROM skiplock.samples_totals AS t
    WHERE t.metric = 'queue_depth'
      AND t.labels @> '{"state": "eligible"}'::jsonb
      AND t.collected_at > %(start)s
      AND t.collected_at <= %(end)s
      AND t.value IS NOT NULL
    GROUP BY t.collected_at
) AS c;

-- name: window_mean
-- The mean over the collection cycles in (%(start)s, %(end)s] of one figure per cycle: the sum
-- (throughput: completed + failed) or the max (claim latency) of the samples of %(metric)s
-- whose labels contain one of %(selectors)s. Skiplock's own series only (no `external` label).
-- cycles: how many cycles the mean is over (the caller wants at least two).
SELECT
    count(*)::int AS cycles,
    avg(c.value)::float8 AS mean,
    min(c.at) AS first_at,
    max(c.at) AS last_at
FROM (
    SELECT
        s.collected_at AS at,
        CASE WHEN %(agg)s::text = 'max' THEN max(s.value) ELSE sum(s.value) END AS value
    FROM skiplock.samples AS s
    WHERE s.metric = %(metric)s
      AND s.collected_at > %(start)s
      AND s.collected_at <= %(end)s
      AND s.value IS NOT NULL
      AND s.labels @> ANY(%(selectors)s::jsonb[])
      AND NOT s.labels ? 'external'
    GROUP BY s.collected_at
) AS c;
