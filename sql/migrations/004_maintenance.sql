-- 004: maintenance. The archive becomes range-partitioned by finish time (retention drops whole
-- day partitions), archival finds its batches through a partial index on completed rows, and
-- maintenance runs and bulk dead-letter operations get tables of their own.

-- Archival walks completed rows oldest first. Without this index every batch would scan the
-- hot table for `status = 'completed'`. Its cost: one index insert per completion (the
-- completion UPDATE changes `status`, which other partial indexes already reference, so it was
-- never a HOT update anyway). bench/maintenance.py measures it on the claim path.
CREATE INDEX jobs_completed_idx ON skiplock.jobs (finished_at, id)
    WHERE status = 'completed';

-- 001 created a plain archive table as a placeholder; nothing has been released with it.
DROP TABLE skiplock.jobs_archive;

CREATE TABLE skiplock.jobs_archive (
    id                bigint      NOT NULL,
    queue             text        NOT NULL,
    kind              text        NOT NULL,
    payload           jsonb       NOT NULL,
    status            text        NOT NULL,
    priority          smallint    NOT NULL,
    run_at            timestamptz NOT NULL,
    attempts          integer     NOT NULL,
    max_attempts      integer     NOT NULL,
    idempotency_key   text,
    locked_by         text,
    locked_at         timestamptz,
    lease_until       timestamptz,
    last_error        text,
    errors            jsonb       NOT NULL,
    error_fingerprint text,
    created_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL,
    archived_at       timestamptz NOT NULL DEFAULT now(),
    -- A dead letter an operator purged into the archive (rather than deleting it).
    purged            boolean     NOT NULL DEFAULT false,
    purged_at         timestamptz,
    purged_by         text
) PARTITION BY RANGE (finished_at);

-- Day partitions (skiplock.jobs_archive_pYYYYMMDD, UTC days) are created ahead of time by the
-- archiver. The default partition takes anything else, so an insert is never refused; the
-- retention task empties it in bounded batches.
CREATE TABLE skiplock.jobs_archive_default PARTITION OF skiplock.jobs_archive DEFAULT;

-- Retention deletes what is left before the cutoff (the partition that straddles it, and the
-- default partition) in batches by finish time; the console looks archived jobs up by id.
CREATE INDEX jobs_archive_finished_idx ON skiplock.jobs_archive (finished_at);
CREATE INDEX jobs_archive_id_idx ON skiplock.jobs_archive (id);

-- One row per maintenance run (archive, retention, reap), written when it starts and updated
-- in the same transaction as each batch, so after a crash the row still tells what was done.
CREATE TABLE skiplock.maintenance_runs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task              text        NOT NULL,          -- archive, retention, reap
    actor             text        NOT NULL,          -- "scheduler", "cli:<user>", an operator
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    heartbeat_at      timestamptz NOT NULL DEFAULT now(),
    batches           integer     NOT NULL DEFAULT 0,
    rows              bigint      NOT NULL DEFAULT 0,
    slowest_batch_ms  double precision,
    outcome           text        NOT NULL DEFAULT 'running'
                      CHECK (outcome IN ('running', 'ok', 'error', 'cancelled', 'abandoned')),
    error             text,
    detail            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The backend that ran it: a 'running' row whose backend is gone was abandoned (kill -9).
    backend_pid       integer,
    backend_start     timestamptz
);
CREATE INDEX maintenance_runs_task_idx ON skiplock.maintenance_runs (task, id DESC);
CREATE INDEX maintenance_runs_running_idx ON skiplock.maintenance_runs (id) WHERE outcome = 'running';

-- A bulk replay or purge of dead letters: what was asked, by whom, and how far it got.
-- Rows are processed in (finished_at, id) order among jobs that had failed by `snapshot_at`;
-- the cursor advances in the same transaction as each batch, so a resumed operation never
-- touches a row twice and never picks up a job that failed again after it was replayed.
CREATE TABLE skiplock.bulk_operations (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action               text        NOT NULL CHECK (action IN ('replay', 'purge')),
    purge_mode           text        CHECK (purge_mode IN ('delete', 'archive')),
    selection            jsonb       NOT NULL,
    actor                text        NOT NULL,
    reason               text,
    state                text        NOT NULL DEFAULT 'queued'
                         CHECK (state IN ('queued', 'running', 'done', 'cancelled', 'failed')),
    snapshot_at          timestamptz NOT NULL,
    total                bigint      NOT NULL,
    done                 bigint      NOT NULL DEFAULT 0,
    batches              integer     NOT NULL DEFAULT 0,
    batch_size           integer     NOT NULL CHECK (batch_size > 0),
    rate                 double precision CHECK (rate > 0),   -- rows/s; NULL = unthrottled
    cursor_finished_at   timestamptz,
    cursor_id            bigint,
    created_at           timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    heartbeat_at         timestamptz,
    cancel_requested_at  timestamptz,
    cancelled_by         text,
    error                text
);
CREATE INDEX bulk_operations_active_idx ON skiplock.bulk_operations (id)
    WHERE state IN ('queued', 'running');
