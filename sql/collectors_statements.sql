-- pg_stat_statements for the claim statement, and the rolled-back probe claim. Only this
-- database's rows are read (the extension's counters are cluster-wide).

-- name: pgss_available
SELECT
    EXISTS (SELECT 1 FROM pg_extension AS e WHERE e.extname = 'pg_stat_statements') AS installed,
    current_setting('shared_preload_libraries') LIKE '%%pg_stat_statements%%' AS preloaded;

-- name: claim_statement_ids
-- Discovery by shape, not by a hard-coded queryid: the statements that claim from skiplock.jobs
-- (FOR UPDATE SKIP LOCKED and an attempts increment; the reaper has the first but not the
-- second). Reading query text is the expensive part of pg_stat_statements, so the collector
-- runs this only every few minutes and remembers the ids.
SELECT
    s.queryid,
    CASE WHEN s.query ILIKE '%%completed_ids%%' THEN 'complete_and_claim' ELSE 'claim' END AS statement
FROM pg_stat_statements(true) AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND s.query ILIKE '%%for update skip locked%%'
  AND s.query ILIKE '%%skiplock.jobs%%'
  AND s.query ILIKE '%%attempts = j.attempts +%%'
ORDER BY s.queryid;

-- name: claims_without_skip_locked
-- Claim-like statements that wait on row locks instead of skipping them: a SELECT with FOR
-- UPDATE or FOR NO KEY UPDATE and a LIMIT ("the next n rows"), without SKIP LOCKED or NOWAIT.
-- Every worker running one queues behind the row another worker holds: a convoy, visible here
-- from history even when nobody is waiting right now. Skiplock's own tables are left out: its
-- claim skips locked rows, and its dead-letter batches lock on purpose (a replay must not jump
-- over a row that is merely busy). Reads query text: run it at discovery time, not every cycle.
SELECT
    s.queryid,
    left(regexp_replace(min(s.query), '\s+', ' ', 'g'), 300) AS query,
    sum(s.calls)::float8 AS calls,
    (sum(s.total_exec_time) / nullif(sum(s.calls), 0))::float8 AS mean_ms
FROM pg_stat_statements(true) AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND s.query ~* '\mfor\s+(no\s+key\s+)?update\M'
  AND s.query ~* '\mlimit\M'
  AND s.query !~* '\mskip\s+locked\M'
  AND s.query !~* '\mnowait\M'
  AND s.query !~* '^\s*explain\M'
  AND s.query !~* '\mskiplock\.'
GROUP BY s.queryid
ORDER BY sum(s.calls) DESC, s.queryid
LIMIT %(limit)s;

-- name: claim_statement_counters
-- Counters only (no text), summed over users: the collector takes deltas between cycles.
SELECT
    s.queryid,
    sum(s.calls)::float8 AS calls,
    sum(s.rows)::float8 AS rows,
    sum(s.total_exec_time)::float8 AS total_exec_ms,
    sum(s.shared_blks_hit + s.shared_blks_read)::float8 AS shared_blks
FROM pg_stat_statements(false) AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND s.queryid = ANY(%(ids)s::bigint[])
GROUP BY s.queryid
ORDER BY s.queryid;

-- name: probe_queues
-- Queues with an eligible job at the head of the claim index (bounded walk), for per-queue probes.
SELECT DISTINCT p.queue
FROM (
    SELECT j.queue
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.run_at <= now()
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT 1000
) AS p
ORDER BY p.queue
LIMIT %(limit)s;

-- name: pgss_entries
-- How many statements this database has in pg_stat_statements (no text read): when it changes,
-- a new statement may be a claim, so the collector looks at the text again.
SELECT count(*)::bigint AS entries
FROM pg_stat_statements(false) AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());

-- name: probe_planner_defaults
-- The collector session turns bitmap and sequential scans off (for its capped counts); the
-- probe must plan the claim exactly as a worker's session does, so it turns them back on
-- for its own transaction.
SELECT
    set_config('enable_bitmapscan', 'on', true),
    set_config('enable_seqscan', 'on', true);
