-- The scheduler's leader election and its own health (skiplock.scheduler_nodes, scheduler_jobs).

-- name: try_lock
-- Session-level: held until this connection ends, however the process ends.
SELECT pg_try_advisory_lock(%(key)s);

-- name: still_alive
SELECT 1;

-- name: node_seen
INSERT INTO skiplock.scheduler_nodes AS n (id, host, pid, is_leader, leader_since, last_seen)
VALUES (%(id)s, %(host)s, %(pid)s, %(is_leader)s, %(leader_since)s, now())
ON CONFLICT (id) DO UPDATE
SET last_seen = now(),
    is_leader = excluded.is_leader,
    leader_since = excluded.leader_since,
    stopped_at = NULL;

-- name: node_stopped
UPDATE skiplock.scheduler_nodes AS n
SET stopped_at = now(),
    is_leader = false,
    leader_since = NULL
WHERE n.id = %(id)s;

-- name: job_ran
-- last_error is the last run's (NULL after a success); last_failure and last_failure_at keep the
-- latest failure through later successes, so a failure count always comes with its message.
INSERT INTO skiplock.scheduler_jobs AS j
    (job, leader, interval_seconds, last_started_at, last_finished_at, last_duration_ms, last_error,
     last_ok_at, runs, failures, last_failure, last_failure_at, updated_at)
VALUES (
    %(job)s, %(leader)s, %(interval)s, %(started_at)s, now(), %(duration_ms)s, %(error)s,
    CASE WHEN %(error)s::text IS NULL THEN now() END, 1, CASE WHEN %(error)s::text IS NULL THEN 0 ELSE 1 END,
    %(error)s, CASE WHEN %(error)s::text IS NOT NULL THEN now() END, now()
)
ON CONFLICT (job) DO UPDATE
SET leader = excluded.leader,
    interval_seconds = coalesce(excluded.interval_seconds, j.interval_seconds),
    last_started_at = excluded.last_started_at,
    last_finished_at = excluded.last_finished_at,
    last_duration_ms = excluded.last_duration_ms,
    last_error = excluded.last_error,
    last_ok_at = coalesce(excluded.last_ok_at, j.last_ok_at),
    runs = j.runs + 1,
    failures = j.failures + excluded.failures,
    last_failure = coalesce(excluded.last_failure, j.last_failure),
    last_failure_at = coalesce(excluded.last_failure_at, j.last_failure_at),
    updated_at = now();

-- name: nodes
-- A node is alive when it said so within three election intervals (it says so every tick);
-- the interval is not stored per node, so "alive" uses 30 s, which covers the default 5 s.
SELECT
    n.id,
    n.host,
    n.pid,
    n.started_at,
    n.last_seen,
    n.is_leader,
    n.leader_since,
    n.stopped_at,
    n.stopped_at IS NULL AND n.last_seen >= now() - interval '30 seconds' AS alive
FROM skiplock.scheduler_nodes AS n
WHERE n.last_seen >= now() - interval '1 hour'
ORDER BY n.is_leader DESC, n.last_seen DESC;

-- name: jobs
SELECT
    j.job,
    j.leader,
    j.interval_seconds,
    j.last_started_at,
    j.last_finished_at,
    j.last_duration_ms,
    j.last_error,
    j.last_ok_at,
    j.runs,
    j.failures,
    j.last_failure,
    j.last_failure_at,
    extract(epoch FROM now() - j.last_finished_at)::float8 AS age_s,
    j.interval_seconds IS NOT NULL
        AND j.last_finished_at < now() - make_interval(secs => 3 * j.interval_seconds) AS overdue
FROM skiplock.scheduler_jobs AS j
ORDER BY j.job;

-- name: restarts
-- Scheduler processes that died and were started again: a node that never said it stopped
-- (stopped_at NULL: a crash, SIGKILL, the OOM killer) and is no longer alive (unseen for 30 s,
-- as in `nodes`), paired with its replacement, the first node of its host that started after
-- its last sign of life; listed when the replacement started within the window. A second
-- standby started next to a live one is not a restart (the live one is not dead), nor is a
-- clean stop and start (a deploy: stopped_at is set), nor a process that died and was never
-- replaced. The table is small: one row per process start.
SELECT
    replacement.id,
    replacement.host,
    replacement.pid,
    replacement.started_at,
    dead.id AS replaced,
    dead.pid AS replaced_pid,
    dead.last_seen AS replaced_last_seen
FROM skiplock.scheduler_nodes AS dead
JOIN LATERAL (
    SELECT
        n.id,
        n.host,
        n.pid,
        n.started_at
    FROM skiplock.scheduler_nodes AS n
    WHERE n.host = dead.host
      AND n.id <> dead.id
      AND n.started_at >= dead.last_seen
    ORDER BY n.started_at
    LIMIT 1
) AS replacement ON true
WHERE dead.stopped_at IS NULL
  AND dead.last_seen < now() - interval '30 seconds'
  AND replacement.started_at >= now() - make_interval(secs => %(window_seconds)s)
ORDER BY replacement.started_at DESC, dead.last_seen DESC;
