-- 025: fair queues (issue 31, "Fair queues"; docs/queue.md, "Fair queues").
--
-- A job may carry a group key (a tenant, customer or integration): `group_key`, NULL when the
-- producer gave none (all of a queue's NULL-group jobs are one group). A queue may declare
-- `group_concurrency`: at no instant do more than N of its jobs of one group run, fleet-wide.
-- Such a queue is a limited queue: the workers' fast claim leaves it alone and the limited path
-- (sql/limits.sql, `claim_queue`) claims it under the queue's advisory lock, counting the
-- running jobs of each group and interleaving the groups round-robin.
--
-- Nullable columns without a default: adding them rewrites neither jobs table, and earlier
-- releases' producers, workers and archiver name their columns and never see these ones.
-- The index the fair claim reads (queue, group_key, claim order) is built by the scheduler only
-- while some queue is fair (console/queue/limits.py keep_claim_indexes), like the other
-- limited-path indexes: a team without fair queues pays nothing per enqueue.
ALTER TABLE skiplock.jobs ADD COLUMN group_key text;
ALTER TABLE skiplock.jobs_archive ADD COLUMN group_key text;

ALTER TABLE skiplock.queues
    ADD COLUMN group_concurrency integer CHECK (group_concurrency > 0),
    -- The round-robin's place: the group key (coalesce(group_key, ''), '' being the NULL group)
    -- the last fair claim served last; the next claim serves the groups after it first.
    ADD COLUMN fair_cursor text;

-- Whether the queue is fair. `limited` (015) is left as it is: an earlier release's workers
-- name it, and changing a generated column's expression means dropping it on PostgreSQL 15.
-- This release's fast claim leaves `paused OR limited OR fair` queues alone. An earlier
-- release's workers know nothing of groups (they would claim a fair queue as an ordinary one):
-- give a queue a group_concurrency once every worker runs this release (docs/queue.md).
ALTER TABLE skiplock.queues
    ADD COLUMN fair boolean GENERATED ALWAYS AS (coalesce(group_concurrency, 0) > 0) STORED;
