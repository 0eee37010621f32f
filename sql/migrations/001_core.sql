-- 001: the queue itself. Names here are a public contract (DESIGN.md, issue "queue core"):
-- user code and workers in other languages read and write these columns.

CREATE TABLE skiplock.jobs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text        NOT NULL DEFAULT 'default',
    kind              text        NOT NULL,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status            text        NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    priority          smallint    NOT NULL DEFAULT 0,
    run_at            timestamptz NOT NULL DEFAULT now(),
    attempts          integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      integer     NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    idempotency_key   text,
    locked_by         text,
    locked_at         timestamptz,
    lease_until       timestamptz,
    last_error        text,
    -- Bounded history, newest last: [{attempt, at, worker, error_class, message, traceback}].
    errors            jsonb       NOT NULL DEFAULT '[]'::jsonb,
    -- Error class + normalised message of the latest failure: dead letters group by it.
    error_fingerprint text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz
);

-- The claim index: exactly the claim's predicate and ORDER BY, so a claim reads the first
-- eligible entries and stops. Finished and running rows are not in it at all. INCLUDE (queue)
-- lets per-queue pending counts be answered from the index alone.
CREATE INDEX jobs_claim_idx ON skiplock.jobs (priority DESC, run_at, id)
    INCLUDE (queue)
    WHERE status = 'pending';

-- The reaper's index: running jobs by lease expiry.
CREATE INDEX jobs_lease_idx ON skiplock.jobs (lease_until)
    WHERE status = 'running';

-- Dead letters by failure time (console listing, replay and purge selections). Only a job
-- that fails for good pays for this entry; the hot path never touches it.
CREATE INDEX jobs_failed_idx ON skiplock.jobs (finished_at, id)
    WHERE status = 'failed';

-- An idempotency key is unique while its row is in the hot table.
CREATE UNIQUE INDEX jobs_idempotency_key_idx ON skiplock.jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Every claim leaves a dead entry at the head of the claim index until vacuum removes it, and
-- every later claim scans past it (research/baseline-perf.md: -70% in a minute on a large
-- backlog). Vacuum this table on a fixed number of changed rows rather than a fraction of its
-- size, and without cost-based sleeping, so a big backlog does not postpone cleanup.
ALTER TABLE skiplock.jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 50000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);

-- The archive keeps the same columns; the maintenance migration partitions and indexes it.
CREATE TABLE skiplock.jobs_archive (
    LIKE skiplock.jobs INCLUDING DEFAULTS,
    archived_at timestamptz NOT NULL DEFAULT now()
);

-- Paused queues: claims skip them; in-flight jobs finish.
CREATE TABLE skiplock.queues (
    name        text PRIMARY KEY,
    paused      boolean     NOT NULL DEFAULT false,
    paused_at   timestamptz,
    paused_by   text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per worker process: identity and cumulative counters, flushed every few seconds.
-- Collectors turn counter deltas into rates and latency quantiles.
CREATE TABLE skiplock.workers (
    id                   text PRIMARY KEY,
    host                 text        NOT NULL,
    pid                  integer     NOT NULL,
    queues               text[],
    concurrency          integer     NOT NULL,
    started_at           timestamptz NOT NULL DEFAULT now(),
    last_seen            timestamptz NOT NULL DEFAULT now(),
    stopped_at           timestamptz,
    in_flight            integer     NOT NULL DEFAULT 0,
    claimed              bigint      NOT NULL DEFAULT 0,
    completed            bigint      NOT NULL DEFAULT 0,
    failed               bigint      NOT NULL DEFAULT 0,
    retried              bigint      NOT NULL DEFAULT 0,
    lost                 bigint      NOT NULL DEFAULT 0,
    claim_calls          bigint      NOT NULL DEFAULT 0,
    claim_seconds_sum    double precision NOT NULL DEFAULT 0,
    -- Claim round-trip histogram: counts per upper bound in workers_histogram_bounds (ms).
    claim_histogram      bigint[]    NOT NULL DEFAULT '{}',
    pickup_count         bigint      NOT NULL DEFAULT 0,
    pickup_seconds_sum   double precision NOT NULL DEFAULT 0,
    pickup_histogram     bigint[]    NOT NULL DEFAULT '{}',
    runtime_histogram    bigint[]    NOT NULL DEFAULT '{}'
);
