-- 008: what the collectors remember between cycles, and the scheduler's own health.

-- The previous snapshot of every cumulative counter a collector turns into a rate (worker
-- counters, pg_stat_statements, pg_stat_slru, WAL position, vacuum counts). Kept in the
-- database, not in the process, so a scheduler restart or a new leader computes its first
-- rates against the last stored snapshot instead of producing garbage.
CREATE TABLE skiplock.collector_state (
    name        text        PRIMARY KEY,
    taken_at    timestamptz NOT NULL,
    state       jsonb       NOT NULL DEFAULT '{}'::jsonb
);

-- What a cycle saw that is not a number: who holds the xmin horizon (pid, application name,
-- age), the blocking tree, vacuum progress. Pages and the advisor show it next to the samples.
ALTER TABLE skiplock.collection_runs ADD COLUMN details jsonb NOT NULL DEFAULT '{}'::jsonb;

-- One row per scheduled job: the last run's start, duration and error, and the totals.
-- Written by the leader after every run; the web console reads it (console.scheduler.status).
CREATE TABLE skiplock.scheduler_jobs (
    job               text        PRIMARY KEY,
    leader            text,
    interval_seconds  double precision,
    last_started_at   timestamptz,
    last_finished_at  timestamptz,
    last_duration_ms  double precision,
    last_error        text,
    last_ok_at        timestamptz,
    runs              bigint      NOT NULL DEFAULT 0,
    failures          bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Every scheduler process, leader or standby, says it is alive here on each election tick.
CREATE TABLE skiplock.scheduler_nodes (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    is_leader   boolean     NOT NULL DEFAULT false,
    leader_since timestamptz,
    stopped_at  timestamptz
);
