-- name: record
INSERT INTO skiplock.audit_log (actor, action, target, selection, reason, rows, outcome, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(selection)s, %(reason)s, %(rows)s, %(outcome)s, %(detail)s)
RETURNING id, at;

-- name: search
-- Newest first, keyset-paginated on id; every filter optional.
SELECT
    a.id,
    a.at,
    a.actor,
    a.action,
    a.target,
    a.selection,
    a.reason,
    a.rows,
    a.outcome,
    a.detail
FROM skiplock.audit_log AS a
-- An actor named with --actor is stored as 'NAME (cli:user@host)' (and a token as 'owner (label)'):
-- the bare name finds those rows too.
WHERE (%(actor)s::text IS NULL OR a.actor = %(actor)s OR starts_with(a.actor, %(actor)s || ' ('))
  AND (%(action)s::text IS NULL OR a.action = %(action)s)
  AND (%(since)s::timestamptz IS NULL OR a.at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR a.at < %(until)s)
  AND (%(before_id)s::bigint IS NULL OR a.id < %(before_id)s)
ORDER BY a.id DESC
LIMIT %(limit)s;

-- name: between
-- What operators did in a time window (an alert's "what changed just before it fired"):
-- audit_log_at_idx, newest first, at most %(limit)s rows.
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
WHERE a.at >= %(since)s
  AND a.at <= %(until)s
  AND NOT (a.action = ANY(%(exclude)s::text[]))
ORDER BY a.at DESC, a.id DESC
LIMIT %(limit)s;

-- name: caps_enqueues
-- caps.enqueue_per_minute: jobs this actor enqueued from the console in the last minute (the
-- form, the API, a periodic entry's run now), from the audit rows those write in the same
-- transaction as the job. The (action, at) index.
SELECT count(*) AS held
FROM skiplock.audit_log AS a
WHERE a.action IN ('enqueue', 'periodic_run_now')
  AND a.at > now() - interval '1 minute'
  AND a.actor = %(actor)s;
