-- 014: uniqueness windows and cancel requests (issue 14: "Enqueue and act from the console",
-- "Uniqueness windows").

-- An operator's request that a running job stop. It belongs to the claim it was made during:
-- the worker reads it with the heartbeat as `cancel_requested_at >= locked_at`, so a later
-- claim of the same job (a retry, a replay, a release) is not cancelled by an old request.
-- Nullable without a default: adding it rewrites nothing, and no index reads it.
ALTER TABLE skiplock.jobs ADD COLUMN cancel_requested_at timestamptz;
-- The archive keeps every column of a job (tests/test_contract_archive.py compares them all).
ALTER TABLE skiplock.jobs_archive ADD COLUMN cancel_requested_at timestamptz;

-- Uniqueness windows: `enqueue(..., unique_for=...)` claims (kind, idempotency_key) here until
-- expires_at, pointing at the job it made. A second enqueue of the same key inside the window
-- gets that job's id whatever became of the job (completed, failed, archived); only enqueues
-- that pass unique_for read or write this table, so the plain enqueue path costs nothing more.
CREATE TABLE skiplock.unique_keys (
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    job_id          bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (kind, idempotency_key)
);

-- Retention prunes expired windows oldest first, in bounded batches.
CREATE INDEX unique_keys_expires_idx ON skiplock.unique_keys (expires_at);
