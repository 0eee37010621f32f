-- Queries of `skiplock demo` (console/demo/). Each reads through a partial index or the small
-- workers table; none scans the jobs table.

-- name: forgotten_transaction
-- The traffic generator's bad neighbour: a snapshot (REPEATABLE READ) and an xid, then idle.
-- Counting failed jobs walks jobs_failed_idx only.
SELECT
    count(*) AS dead_letters,
    txid_current() AS xid
FROM skiplock.jobs AS j
WHERE j.status = 'failed';

-- name: status
-- The one-line summary the demo prints every minute. Pending, running and failed counts walk
-- their partial indexes; completed comes from the workers' own counters.
SELECT
    (SELECT coalesce(sum(w.completed), 0) FROM skiplock.workers AS w) AS completed,
    (SELECT coalesce(sum(w.retried), 0) FROM skiplock.workers AS w) AS retried,
    (SELECT count(*) FROM skiplock.jobs AS j WHERE j.status = 'pending') AS pending,
    (SELECT count(*) FROM skiplock.jobs AS j WHERE j.status = 'running') AS running,
    (SELECT count(*) FROM skiplock.jobs AS j WHERE j.status = 'failed') AS dead_letters,
    (SELECT count(*) FROM skiplock.jobs AS j
      WHERE j.status = 'running' AND j.lease_until < now()) AS stuck_leases;

-- name: kill_moment
-- Whether the demo may kill worker %(worker)s (a LIKE pattern of its id: host:pid:token) now: it
-- holds a running job, and the reaper's newest run finished less than %(fresh)s seconds ago.
SELECT
    EXISTS (
        SELECT 1
        FROM skiplock.jobs AS j
        WHERE j.status = 'running'
          AND j.locked_by LIKE %(worker)s
    ) AS holds,
    coalesce((
        SELECT r.finished_at > now() - make_interval(secs => %(fresh)s)
        FROM skiplock.maintenance_runs AS r
        WHERE r.task = 'reap'
          AND r.finished_at IS NOT NULL
        ORDER BY r.id DESC
        LIMIT 1
    ), false) AS reaped_recently,
    EXISTS (
        SELECT 1
        FROM skiplock.maintenance_runs AS r
        WHERE r.task = 'reap'
    ) AS reaper_seen;
