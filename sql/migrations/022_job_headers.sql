-- 022: headers travel with a job from its enqueue to its runs. Today they carry the producer's
-- trace context (W3C traceparent/tracestate, console/queue/telemetry.py) when OpenTelemetry is
-- configured, and are NULL otherwise: no index, nothing on the claim path reads them, and the
-- claim returns them with the row it already returns. Additive: earlier releases' workers and
-- producers name their columns and never see this one.
ALTER TABLE skiplock.jobs ADD COLUMN headers jsonb;
ALTER TABLE skiplock.jobs_archive ADD COLUMN headers jsonb;
