-- 018: what the incident path must still show after the fact.

-- The last value of an alert's series that met its rule's condition (the value of its latest
-- pending or firing evaluation that was over the threshold). A resolved alert's summary reads
-- "Resolved. Last over the threshold: ... 420s (over 300s)" from it, instead of rendering the
-- value that cleared it into the rule's summary ("has waited 0s (over 300s)").
ALTER TABLE skiplock.alerts ADD COLUMN last_over_value double precision;

-- A scheduler job's last failure, kept after later successes (last_error is the last run's
-- error and is cleared by a success): "5 failures" on the Maintenance page always comes with
-- the message of the latest one and when it happened.
ALTER TABLE skiplock.scheduler_jobs ADD COLUMN last_failure text;
ALTER TABLE skiplock.scheduler_jobs ADD COLUMN last_failure_at timestamptz;
