-- 017: what the signals need from the worker registry (issue 25, "the signal must be true").
--
-- queue_counts: each worker's finished jobs per queue since it started,
--   {"<queue>": [completed, failed, retried]}, written whole with the other counters at every
--   flush. The workers collector turns the deltas into per-queue throughput, so "idle" means
--   nothing finished in the window, not "no job happened to be running when a sample was
--   taken" (a queue completing two fast jobs a second was labelled idle).
-- reaped: jobs the reaper rescued from this worker after its lease expired (it was killed, hung
--   or lost its connection). A worker killed with SIGKILL cannot count its own lost work; the
--   reaper, which finds the jobs it held, does. The Workers page's Lost column is lost + reaped.
--
-- Both are metadata-only column additions (constant defaults): no rewrite of the table, and a
-- worker of the previous release keeps flushing its counters (it names its columns).
ALTER TABLE skiplock.workers
    ADD COLUMN queue_counts jsonb  NOT NULL DEFAULT '{}',
    ADD COLUMN reaped       bigint NOT NULL DEFAULT 0;
