-- Error groups as the console remembers them (skiplock.error_groups, migration 021): what the
-- errorgroups collector observes each cycle, the groups that are new or regressed now, and an
-- operator's ignore / unignore. The dead letters are read through jobs_failed_idx
-- (finished_at, id) and jobs_failed_groups_idx (error_fingerprint, finished_at): every read is
-- bounded by a time window, a LIMIT or one group's index range.

-- name: recent_failures
-- The dead letters that failed for good since %(since)s (the newest %(cap)s of them, walking
-- jobs_failed_idx backwards), by fingerprint: how many, the first and last, their kinds and
-- queues, and the newest one's error as the example. A dead letter without a fingerprint (a
-- row written before fingerprints existed) belongs to no group.
WITH recent AS (
    SELECT
        j.id,
        j.error_fingerprint,
        j.queue,
        j.kind,
        j.finished_at,
        j.last_error
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
      AND j.finished_at >= %(since)s::timestamptz
    ORDER BY j.finished_at DESC, j.id DESC
    LIMIT %(cap)s
)
SELECT
    r.error_fingerprint AS fingerprint,
    count(*) AS count,
    min(r.finished_at) AS first_at,
    max(r.finished_at) AS last_at,
    array_agg(DISTINCT r.kind ORDER BY r.kind) AS kinds,
    array_agg(DISTINCT r.queue ORDER BY r.queue) AS queues,
    (array_agg(left(r.last_error, 2000) ORDER BY r.finished_at DESC, r.id DESC))[1] AS example,
    (array_agg(r.id ORDER BY r.finished_at DESC, r.id DESC))[1] AS example_job
FROM recent AS r
WHERE r.error_fingerprint IS NOT NULL
GROUP BY r.error_fingerprint
ORDER BY min(r.finished_at), r.error_fingerprint
LIMIT %(groups)s;

-- name: remembered
-- What the console knew of these groups before this cycle.
SELECT
    g.fingerprint,
    g.first_seen,
    g.last_seen,
    g.change,
    g.change_at
FROM skiplock.error_groups AS g
WHERE g.fingerprint = ANY(%(fingerprints)s::text[])
ORDER BY g.fingerprint;

-- name: earlier_dead_letters
-- A group the console has no row for may still have older dead letters (it failed before the
-- collector watched, or retention forgot it): the first and the last of them before %(before)s,
-- two probes of jobs_failed_groups_idx.
SELECT
    (SELECT j.finished_at
     FROM skiplock.jobs AS j
     WHERE j.status = 'failed'
       AND j.error_fingerprint = %(fingerprint)s
       AND j.finished_at < %(before)s::timestamptz
     ORDER BY j.error_fingerprint, j.finished_at
     LIMIT 1) AS first_seen,
    (SELECT j.finished_at
     FROM skiplock.jobs AS j
     WHERE j.status = 'failed'
       AND j.error_fingerprint = %(fingerprint)s
       AND j.finished_at < %(before)s::timestamptz
     ORDER BY j.error_fingerprint DESC, j.finished_at DESC
     LIMIT 1) AS last_seen;

-- name: save
-- Remember one group after this cycle: the times widen, kinds and queues are merged (at most 20
-- each), the example is the newest, and a change (new, regressed) replaces the one before.
-- An operator's ignore is left as it is.
INSERT INTO skiplock.error_groups AS g (
    fingerprint, first_seen, last_seen, kinds, queues, example, example_job, change, change_at, previous_seen
)
VALUES (
    %(fingerprint)s, %(first_seen)s, %(last_seen)s, %(kinds)s, %(queues)s, %(example)s, %(example_job)s,
    %(change)s, %(change_at)s, %(previous_seen)s
)
ON CONFLICT (fingerprint) DO UPDATE
SET first_seen = least(g.first_seen, excluded.first_seen),
    last_seen = greatest(g.last_seen, excluded.last_seen),
    kinds = ARRAY(SELECT DISTINCT k.name FROM unnest(g.kinds || excluded.kinds) AS k (name) ORDER BY k.name LIMIT 20),
    queues = ARRAY(SELECT DISTINCT q.name FROM unnest(g.queues || excluded.queues) AS q (name) ORDER BY q.name LIMIT 20),
    example = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.example ELSE g.example END,
    example_job = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.example_job ELSE g.example_job END,
    change = coalesce(excluded.change, g.change),
    change_at = CASE WHEN excluded.change IS NOT NULL THEN excluded.change_at ELSE g.change_at END,
    previous_seen = CASE WHEN excluded.change IS NOT NULL THEN excluded.previous_seen ELSE g.previous_seen END;

-- name: changed
-- The groups that are new or regressed now (their change began within %(new_for)s seconds
-- before %(now)s) and not ignored, newest first, each with its dead letters since the change
-- that are still dead letters (an index-only count of one group's range, capped).
SELECT
    g.fingerprint,
    g.change,
    g.change_at,
    (SELECT count(*)
     FROM (SELECT 1
           FROM skiplock.jobs AS j
           WHERE j.status = 'failed'
             AND j.error_fingerprint = g.fingerprint
             AND j.finished_at >= g.change_at
           LIMIT %(count_cap)s) AS capped)::bigint AS dead_letters
FROM skiplock.error_groups AS g
WHERE g.change IS NOT NULL
  AND g.change_at > %(now)s::timestamptz - make_interval(secs => %(new_for)s)
  AND g.ignored_at IS NULL
ORDER BY g.change_at DESC, g.fingerprint
LIMIT %(limit)s;

-- name: get
SELECT g.*
FROM skiplock.error_groups AS g
WHERE g.fingerprint = %(fingerprint)s;

-- name: get_many
-- The remembered state of the groups a page shows (the dead-letters page's groups).
SELECT g.*
FROM skiplock.error_groups AS g
WHERE g.fingerprint = ANY(%(fingerprints)s::text[])
ORDER BY g.fingerprint;

-- name: dead_letter_span
-- What the dead-letter set says of one group the console has no row for (it is being ignored
-- before the collector remembered it): the first dead letter (one probe of
-- jobs_failed_groups_idx), and from its newest 100 the last, the kinds, the queues and the example.
WITH newest AS (
    SELECT j.id, j.kind, j.queue, j.finished_at, j.last_error
    FROM skiplock.jobs AS j
    WHERE j.status = 'failed'
      AND j.error_fingerprint = %(fingerprint)s
    ORDER BY j.error_fingerprint DESC, j.finished_at DESC
    LIMIT 100
)
SELECT
    (SELECT j.finished_at
     FROM skiplock.jobs AS j
     WHERE j.status = 'failed' AND j.error_fingerprint = %(fingerprint)s
     ORDER BY j.error_fingerprint, j.finished_at
     LIMIT 1) AS first_seen,
    (SELECT max(n.finished_at) FROM newest AS n) AS last_seen,
    ARRAY(SELECT DISTINCT n.kind FROM newest AS n ORDER BY n.kind LIMIT 20) AS kinds,
    ARRAY(SELECT DISTINCT n.queue FROM newest AS n ORDER BY n.queue LIMIT 20) AS queues,
    (SELECT left(n.last_error, 2000) FROM newest AS n ORDER BY n.finished_at DESC, n.id DESC LIMIT 1) AS example,
    (SELECT n.id FROM newest AS n ORDER BY n.finished_at DESC, n.id DESC LIMIT 1) AS example_job;

-- name: ignore
-- Ignore a group (it never alerts); a group the console has no row for yet is remembered from
-- its dead letters. Nothing when it is already ignored (the caller says so).
INSERT INTO skiplock.error_groups AS g (
    fingerprint, first_seen, last_seen, kinds, queues, example, example_job, ignored_at, ignored_by, ignore_reason
)
VALUES (
    %(fingerprint)s, %(first_seen)s, %(last_seen)s, %(kinds)s, %(queues)s, %(example)s, %(example_job)s,
    now(), %(actor)s, %(reason)s
)
ON CONFLICT (fingerprint) DO UPDATE
SET ignored_at = now(),
    ignored_by = excluded.ignored_by,
    ignore_reason = excluded.ignore_reason
WHERE g.ignored_at IS NULL
RETURNING g.*;

-- name: unignore
UPDATE skiplock.error_groups AS g
SET ignored_at = NULL,
    ignored_by = NULL,
    ignore_reason = NULL
WHERE g.fingerprint = %(fingerprint)s
  AND g.ignored_at IS NOT NULL
RETURNING g.*;

-- name: recent_changes
-- New and regressed groups whose change began in [%(since)s, %(until)s], newest first (the
-- incident timeline).
SELECT
    g.fingerprint,
    g.change,
    g.change_at,
    g.previous_seen,
    g.kinds,
    g.queues,
    g.ignored_at
FROM skiplock.error_groups AS g
WHERE g.change IS NOT NULL
  AND g.change_at >= %(since)s::timestamptz
  AND g.change_at <= %(until)s::timestamptz
ORDER BY g.change_at DESC
LIMIT %(limit)s;
