-- 016: dead-letter error groups from an index alone (issue 13: "dead-letters page p95 < 150 ms
-- at 10 M rows").
--
-- The groups query aggregates every dead letter by fingerprint. Through jobs_failed_idx
-- (finished_at, id) it fetched each failed row from the heap (queue, kind, last_error) and
-- sorted them all for the newest example. This index is ordered by fingerprint and carries
-- finished_at, queue and kind, so the aggregate is an index-only scan in group order, and each
-- shown group's example is one probe of the same index (newest finished_at first).
--
-- Cost on the hot path: it is partial on status = 'failed', so only a job that fails for good
-- (or a failed row that is replayed or purged) writes an entry; claim, complete and retry
-- never touch it. status already decides HOT eligibility (the claim index's predicate), so the
-- updates that were HOT stay HOT.
CREATE INDEX jobs_failed_groups_idx ON skiplock.jobs (error_fingerprint, finished_at)
    INCLUDE (queue, kind)
    WHERE status = 'failed';
