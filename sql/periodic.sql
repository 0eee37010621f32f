-- Periodic (cron) jobs: the schedules the scheduler leader declares, the slots it enqueues,
-- and what the console reads (console/periodic.py). Every statement is short; the slot
-- transaction holds the schedule's row lock for a few milliseconds.

-- name: db_now
SELECT now() AS now;

-- name: sync
-- Declare one schedule. A changed definition is updated (its slot history stays); an unchanged
-- one is not written at all, so a leader may declare every few seconds for free.
INSERT INTO skiplock.periodic AS p
    (name, kind, queue, payload, cron, every_seconds, timezone, catch_up, interval_seconds, source)
VALUES (
    %(name)s,
    %(kind)s,
    %(queue)s,
    %(payload)s,
    %(cron)s,
    %(every_seconds)s,
    %(timezone)s,
    %(catch_up)s,
    %(interval_seconds)s,
    %(source)s
)
ON CONFLICT (name) DO UPDATE
SET kind = excluded.kind,
    queue = excluded.queue,
    payload = excluded.payload,
    cron = excluded.cron,
    every_seconds = excluded.every_seconds,
    timezone = excluded.timezone,
    catch_up = excluded.catch_up,
    interval_seconds = excluded.interval_seconds,
    source = excluded.source,
    retired_at = NULL,
    updated_at = now()
WHERE (p.kind, p.queue, p.payload, p.cron, p.every_seconds, p.timezone, p.catch_up, p.interval_seconds, p.source)
      IS DISTINCT FROM
      (excluded.kind, excluded.queue, excluded.payload, excluded.cron, excluded.every_seconds,
       excluded.timezone, excluded.catch_up, excluded.interval_seconds, excluded.source)
   OR p.retired_at IS NOT NULL;

-- name: retire_others
UPDATE skiplock.periodic AS p
SET retired_at = now(),
    updated_at = now()
WHERE p.retired_at IS NULL
  AND NOT (p.name = ANY(%(names)s::text[]));

-- name: lock_entry
-- Serialises the schedulers on one schedule: the second waits, then sees the first's last_slot.
SELECT
    p.name,
    p.paused,
    p.last_slot,
    now() AS now
FROM skiplock.periodic AS p
WHERE p.name = %(name)s
  AND p.retired_at IS NULL
FOR UPDATE;

-- name: claim_slot
-- The exactly-once guard: a slot's row exists at most once, whatever the jobs tables hold.
INSERT INTO skiplock.periodic_runs AS r (name, slot, manual, actor)
VALUES (%(name)s, %(slot)s, %(manual)s, %(actor)s)
ON CONFLICT (name, slot, manual) DO NOTHING
RETURNING r.name;

-- name: set_run_job
UPDATE skiplock.periodic_runs AS r
SET job_id = %(job_id)s
WHERE r.name = %(name)s
  AND r.slot = %(slot)s
  AND r.manual = %(manual)s;

-- name: advance
UPDATE skiplock.periodic AS p
SET last_slot = %(last_slot)s,
    next_slot = %(next_slot)s,
    missed = p.missed + %(missed)s
WHERE p.name = %(name)s;

-- name: settle
-- Record the outcome of runs whose job finished: completed or failed in either jobs table, or
-- 'gone' when the job is in neither (purged, or past archive retention). Oldest first, bounded.
WITH candidates AS (
    SELECT
        r.name,
        r.slot,
        r.manual,
        r.job_id
    FROM skiplock.periodic_runs AS r
    WHERE r.outcome IS NULL
    ORDER BY r.enqueued_at
    LIMIT %(limit)s
),
found AS (
    SELECT
        c.name,
        c.slot,
        c.manual,
        j.status,
        j.finished_at
    FROM candidates AS c
    LEFT JOIN LATERAL (
        SELECT live.status, live.finished_at
        FROM skiplock.jobs AS live
        WHERE live.id = c.job_id
        UNION ALL
        SELECT archived.status, archived.finished_at
        FROM skiplock.jobs_archive AS archived
        WHERE archived.id = c.job_id
        LIMIT 1
    ) AS j ON true
),
settled AS (
    UPDATE skiplock.periodic_runs AS r
    SET outcome = coalesce(f.status, 'gone'),
        finished_at = coalesce(f.finished_at, now())
    FROM found AS f
    WHERE r.name = f.name
      AND r.slot = f.slot
      AND r.manual = f.manual
      AND (f.status IS NULL OR f.status IN ('completed', 'failed'))
    RETURNING r.name, r.outcome, r.finished_at
),
successes AS (
    SELECT
        s.name,
        max(s.finished_at) AS finished_at
    FROM settled AS s
    WHERE s.outcome = 'completed'
    GROUP BY s.name
),
updated AS (
    UPDATE skiplock.periodic AS p
    SET last_success_at = greatest(p.last_success_at, s.finished_at)
    FROM successes AS s
    WHERE p.name = s.name
    RETURNING p.name
)
SELECT
    (SELECT count(*) FROM settled) AS settled,
    (SELECT count(*) FROM updated) AS successes;

-- name: prune
-- Settled runs past the keep window leave in one bounded batch. Slots at or before a
-- schedule's last_slot are never enqueued again, so removing their rows cannot let one repeat.
DELETE FROM skiplock.periodic_runs AS r
WHERE (r.name, r.slot, r.manual) IN (
    SELECT old.name, old.slot, old.manual
    FROM skiplock.periodic_runs AS old
    JOIN skiplock.periodic AS p ON p.name = old.name
    WHERE old.outcome IS NOT NULL
      AND old.enqueued_at < now() - make_interval(secs => %(keep_seconds)s)
      AND (p.last_slot IS NULL OR old.slot <= p.last_slot OR old.manual)
    ORDER BY old.enqueued_at
    LIMIT %(limit)s
);

-- name: list
-- Every declared schedule with its newest run and that run's job state, live or archived.
SELECT
    p.name,
    p.kind,
    p.queue,
    p.payload,
    p.cron,
    p.every_seconds,
    p.timezone,
    p.catch_up,
    p.interval_seconds,
    p.source,
    p.paused,
    p.paused_at,
    p.paused_by,
    p.last_slot,
    p.next_slot,
    p.missed,
    p.last_success_at,
    p.created_at,
    last_run.slot AS last_run_slot,
    last_run.manual AS last_run_manual,
    last_run.enqueued_at AS last_run_at,
    last_run.job_id AS last_run_job_id,
    coalesce(last_run.outcome, job.status) AS last_run_status,
    now() AS now
FROM skiplock.periodic AS p
LEFT JOIN LATERAL (
    SELECT r.slot, r.manual, r.enqueued_at, r.job_id, r.outcome
    FROM skiplock.periodic_runs AS r
    WHERE r.name = p.name
    ORDER BY r.enqueued_at DESC
    LIMIT 1
) AS last_run ON true
LEFT JOIN LATERAL (
    SELECT live.status
    FROM skiplock.jobs AS live
    WHERE live.id = last_run.job_id
    UNION ALL
    SELECT archived.status
    FROM skiplock.jobs_archive AS archived
    WHERE archived.id = last_run.job_id
    LIMIT 1
) AS job ON last_run.outcome IS NULL
WHERE p.retired_at IS NULL
  AND (%(name)s::text IS NULL OR p.name = %(name)s)
ORDER BY p.name;

-- name: set_paused
UPDATE skiplock.periodic AS p
SET paused = %(paused)s,
    paused_at = CASE WHEN %(paused)s THEN now() END,
    paused_by = CASE WHEN %(paused)s THEN %(actor)s::text END,
    updated_at = now()
WHERE p.name = %(name)s
  AND p.retired_at IS NULL
RETURNING p.name;

-- name: get
SELECT
    p.name,
    p.kind,
    p.queue,
    p.payload
FROM skiplock.periodic AS p
WHERE p.name = %(name)s
  AND p.retired_at IS NULL;

-- name: manual_slot
SELECT clock_timestamp() AS slot;

-- name: collector
-- What the periodic collector turns into samples; the schedules table is small.
SELECT
    p.name,
    p.paused,
    p.interval_seconds,
    p.missed,
    p.last_success_at,
    p.created_at,
    extract(epoch FROM now() - coalesce(p.last_success_at, p.created_at)) AS success_age
FROM skiplock.periodic AS p
WHERE p.retired_at IS NULL
ORDER BY p.name;
