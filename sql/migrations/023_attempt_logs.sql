-- 023: the log records a job's handler emitted, per attempt (issue 33, "per-attempt logs").
--
-- `attempt_logs` is an array of one entry per attempt that logged something: the attempt, its
-- worker, when it ended, its outcome ('completed' or 'failed') and its records (time, level,
-- logger, message, extra), bounded by the worker ([worker] log_records, log_message_chars,
-- log_attempt_chars) and redacted before they leave it (console/queue/joblogs.py). At most
-- [queue] error_history entries are kept, the oldest dropped first, as for `errors`.
--
-- A column of the job's row, not a side table: the records then follow the job wherever it
-- goes with no statement of their own. The archiver, the dead-letter purge "to the archive"
-- and a retention that drops a whole day partition move or remove them with the row, so no
-- log row can outlive its job. The failed attempt's records are written by the same UPDATE
-- that records the failure, the completed attempt's by the UPDATE that completes it.
-- NULL when no attempt logged anything: the claim does not return it, and a handler that logs
-- nothing completes through the same statement as before (console/queue/protocol.py).
-- Additive: earlier releases' workers and archivers name their columns and never see this one.
ALTER TABLE skiplock.jobs ADD COLUMN attempt_logs jsonb;
ALTER TABLE skiplock.jobs_archive ADD COLUMN attempt_logs jsonb;
