-- 012: periodic (cron) jobs. `periodic` is one row per schedule, written by the scheduler
-- leader from the config file and the code-defined schedules; `periodic_runs` is one row per
-- enqueued slot. Its primary key is what makes a slot run once: the leader inserts the row and
-- enqueues the job in one transaction, and enqueues only when the row was new. The job's
-- idempotency key (periodic:<name>:<slot>) is unique only while the job is in the hot table,
-- so the archiver would otherwise let a late second scheduler enqueue the slot again.

CREATE TABLE skiplock.periodic (
    name              text PRIMARY KEY,
    kind              text        NOT NULL,
    queue             text        NOT NULL,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    cron              text,
    every_seconds     integer     CHECK (every_seconds > 0),
    timezone          text        NOT NULL DEFAULT 'UTC',
    catch_up          boolean     NOT NULL DEFAULT false,
    -- Longest gap between two slots of the schedule: what "late" is measured against.
    interval_seconds  double precision NOT NULL,
    source            text        NOT NULL CHECK (source IN ('config', 'code')),
    paused            boolean     NOT NULL DEFAULT false,
    paused_at         timestamptz,
    paused_by         text,
    -- Newest slot handled (enqueued, or skipped while paused or after downtime).
    last_slot         timestamptz,
    next_slot         timestamptz,
    missed            bigint      NOT NULL DEFAULT 0,
    last_success_at   timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Set when no running scheduler declares the schedule any more; cleared when one does again.
    retired_at        timestamptz,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

CREATE TABLE skiplock.periodic_runs (
    name         text        NOT NULL REFERENCES skiplock.periodic (name),
    slot         timestamptz NOT NULL,
    -- A "run now" from the console: its slot is the moment it was asked for.
    manual       boolean     NOT NULL DEFAULT false,
    job_id       bigint,
    actor        text,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    -- Filled in by the scheduler once the job finished (or left both jobs tables unseen).
    outcome      text        CHECK (outcome IN ('completed', 'failed', 'gone')),
    finished_at  timestamptz,
    PRIMARY KEY (name, slot, manual)
);

-- The settle pass reads runs whose outcome is not known yet, oldest first.
CREATE INDEX periodic_runs_unsettled_idx ON skiplock.periodic_runs (enqueued_at)
    WHERE outcome IS NULL;
-- The page's "last run" per schedule, and pruning of old settled runs.
CREATE INDEX periodic_runs_recent_idx ON skiplock.periodic_runs (name, enqueued_at DESC);
