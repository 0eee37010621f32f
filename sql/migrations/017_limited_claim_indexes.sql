-- 017: the limited path finds its own jobs without walking everyone else's (issue 14: "unlimited
-- queues pay no measurable claim cost for the feature").
--
-- A try of a limited kind (limits.sql `claim_kind`) or of a limited queue (`claim_queue`) went
-- through jobs_claim_idx, which is ordered by priority and time only: with nothing of its own
-- eligible it read every eligible job of the other kinds and queues, one heap fetch each (kind
-- is not in that index; queue is only INCLUDEd, and an index scan filters INCLUDE columns after
-- the heap fetch): 7,000-10,000 buffers and 100-450 ms per try on a 500,000-job backlog, once
-- per poll interval per worker (docs/benchmarks.md, "The cost of limits on unlimited queues").
-- These two indexes have the claim's order behind an equality on kind or queue, so a try reads
-- its own unit's head and stops: a handful of buffers, whatever the size of the rest.
--
-- What they cost, and what they do not:
-- - one entry each per enqueue and per retry (a row that enters `pending`);
-- - nothing per claim or completion: the new row version is `running` or `completed`, outside
--   the predicate, so no entry is written (a claim was never a HOT update anyway: it changes
--   status and lease_until, both already indexed). status, queue, kind, priority and run_at are
--   all in jobs_claim_idx already, so no update that was HOT stops being HOT;
-- - vacuum cleans two more indexes, each about the size of jobs_claim_idx (pending rows only);
-- - the fast claim (queue.sql `claim`, `complete_and_claim`) still walks jobs_claim_idx: it has
--   no equality on kind, and its queue test is `= ANY(...)` or absent.
-- Plain CREATE INDEX (migrations run in one transaction): enqueues wait while it builds, a few
-- seconds per million pending jobs.
CREATE INDEX jobs_kind_claim_idx ON skiplock.jobs (kind, priority DESC, run_at, id)
    WHERE status = 'pending';

CREATE INDEX jobs_queue_claim_idx ON skiplock.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
