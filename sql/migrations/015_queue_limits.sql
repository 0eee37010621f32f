-- 015: concurrency and rate limits per queue, and concurrency per job kind (docs/queue.md,
-- "Concurrency and rate limits").
--
-- A queue with a limit is claimed only through the limited path (console.limits): under a
-- transaction-level advisory lock per queue, it counts the queue's running jobs and refills a
-- token bucket kept in this row, and claims at most what both allow. The workers' fast claim
-- leaves limited queues (and limited kinds) alone, so a queue without limits pays only a
-- hashed lookup per claim statement.
--
-- No index is added: running rows are few (at most the fleet's total handler threads), and the
-- limited path counts them through jobs_lease_idx. An index on running rows would cost every
-- claim of every queue one more index insertion (a claim is never a HOT update).
ALTER TABLE skiplock.queues
    ADD COLUMN concurrency    integer CHECK (concurrency > 0),
    -- The rate as the operator wrote it: `rate_count` jobs per `rate_period` seconds (1 or 60).
    ADD COLUMN rate_count     integer CHECK (rate_count > 0),
    ADD COLUMN rate_period    integer CHECK (rate_period IN (1, 60)),
    -- Token bucket: at most `burst` tokens, `tokens` as of `refilled_at` (clock time).
    ADD COLUMN burst          double precision CHECK (burst >= 1),
    ADD COLUMN tokens         double precision,
    ADD COLUMN refilled_at    timestamptz,
    ADD COLUMN limits_set_at  timestamptz,
    ADD COLUMN limits_set_by  text,
    ADD COLUMN limited        boolean GENERATED ALWAYS AS (concurrency IS NOT NULL OR rate_count IS NOT NULL) STORED,
    ADD CONSTRAINT queues_rate_whole CHECK ((rate_count IS NULL) = (rate_period IS NULL)
                                            AND (rate_count IS NULL) = (burst IS NULL));

-- Concurrency per job kind, declared in code (`@console.task("kind", concurrency=N)`): each
-- worker writes the limits of the kinds it registers when it starts.
CREATE TABLE skiplock.kind_limits (
    kind          text PRIMARY KEY,
    concurrency   integer     NOT NULL CHECK (concurrency > 0),
    declared_by   text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
