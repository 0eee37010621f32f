-- Fix and replay (console/maintenance/edit_replay.py): one dead letter's payload, priority,
-- queue or run-at changed and the job put back to pending, in one short transaction.
--
-- `version` is a digest of everything an apply is bound to: the state (status, attempts,
-- finished_at) and the editable fields. A preview shows it; the apply's UPDATE carries it as a
-- guard, so a job replayed, edited, claimed or failed again since the preview is not touched.
-- Times enter the digest as epoch seconds, so the session's TimeZone does not change it.
-- The expression is written twice below (job_for_edit, edit_and_replay): keep them equal
-- (tests/test_edit_replay.py checks a preview's version applies).

-- name: job_for_edit
-- The job as an edit sees it (the form, the preview).
SELECT
    j.id,
    j.queue,
    j.kind,
    j.status,
    j.priority,
    j.run_at,
    j.payload,
    j.attempts,
    j.max_attempts,
    j.finished_at,
    j.locked_by,
    md5(jsonb_build_array(
        j.status, j.attempts, extract(epoch FROM j.finished_at), j.queue, j.priority,
        extract(epoch FROM j.run_at), j.payload
    )::text) AS version
FROM skiplock.jobs AS j
WHERE j.id = %(id)s::bigint;

-- name: lock_job_for_edit
-- The same, locked: the apply's transaction holds the row until it commits, so no worker,
-- replay or purge changes it between the checks and the update.
SELECT
    j.id,
    j.queue,
    j.kind,
    j.status,
    j.priority,
    j.run_at,
    j.payload,
    j.attempts,
    j.max_attempts,
    j.finished_at,
    j.locked_by,
    md5(jsonb_build_array(
        j.status, j.attempts, extract(epoch FROM j.finished_at), j.queue, j.priority,
        extract(epoch FROM j.run_at), j.payload
    )::text) AS version
FROM skiplock.jobs AS j
WHERE j.id = %(id)s::bigint
FOR UPDATE;

-- name: edit_and_replay
-- The edit and the replay in one statement, guarded by the job's state and the previewed
-- version: the job goes back to pending with the new values (NULL: unchanged; a NULL run-at:
-- now), a fresh attempt budget, and an "edited and replayed by" entry in its error history
-- (field names only: the values are in the audit log, redacted). No row: it was not a failed
-- job of that version any more. Workers are told (NOTIFY) in the same statement.
WITH edited AS (
    UPDATE skiplock.jobs AS j
    SET payload = CASE WHEN %(set_payload)s::boolean THEN %(payload)s::jsonb ELSE j.payload END,
        priority = coalesce(%(priority)s::smallint, j.priority),
        queue = coalesce(%(queue)s::text, j.queue),
        run_at = coalesce(%(run_at)s::timestamptz, now()),
        status = 'pending',
        attempts = 0,
        finished_at = NULL,
        locked_by = NULL,
        locked_at = NULL,
        lease_until = NULL,
        errors = CASE WHEN jsonb_array_length(j.errors) >= %(history)s::integer THEN j.errors - 0 ELSE j.errors END
                 || jsonb_build_array(jsonb_build_object(
                        'attempt', j.attempts,
                        'at', now(),
                        'worker', NULL,
                        'error_class', 'Replayed',
                        'message', 'edited (' || %(fields)s::text || ') and replayed by ' || %(actor)s::text,
                        'traceback', NULL,
                        'event', 'edit_replay',
                        'actor', %(actor)s::text,
                        'reason', %(reason)s::text))
    WHERE j.id = %(id)s::bigint
      AND j.status = 'failed'
      AND md5(jsonb_build_array(
              j.status, j.attempts, extract(epoch FROM j.finished_at), j.queue, j.priority,
              extract(epoch FROM j.run_at), j.payload
          )::text) = %(version)s::text
    RETURNING j.id, j.queue, j.kind, j.status, j.priority, j.run_at
),
notified AS (
    SELECT pg_notify('skiplock_jobs', e.queue)
    FROM edited AS e
)
SELECT
    e.id,
    e.queue,
    e.kind,
    e.status,
    e.priority,
    e.run_at,
    (SELECT count(*) FROM notified) AS notified
FROM edited AS e
ORDER BY e.id;
