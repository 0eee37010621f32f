-- 003: where collectors store what they measure. One row per (time, metric, labels).
-- value NULL means "not available" (the collector timed out or the signal does not exist on
-- this server), which panels and alert rules treat differently from 0.

CREATE TABLE skiplock.samples (
    collected_at  timestamptz      NOT NULL,
    metric        text             NOT NULL,
    labels        jsonb            NOT NULL DEFAULT '{}'::jsonb,
    value         double precision
);

-- "latest value of each metric" and "series of one metric" both walk this index backwards.
CREATE INDEX samples_metric_time_idx ON skiplock.samples (metric, collected_at DESC);
-- Retention deletes the oldest rows in bounded batches.
CREATE INDEX samples_time_idx ON skiplock.samples (collected_at);

-- Downsampled history kept longer than raw samples: per minute and per hour.
CREATE TABLE skiplock.samples_rollup (
    resolution    text             NOT NULL CHECK (resolution IN ('minute', 'hour')),
    bucket        timestamptz      NOT NULL,
    metric        text             NOT NULL,
    labels        jsonb            NOT NULL DEFAULT '{}'::jsonb,
    min_value     double precision,
    max_value     double precision,
    avg_value     double precision,
    last_value    double precision,
    samples       integer          NOT NULL,
    PRIMARY KEY (resolution, metric, labels, bucket)
);
CREATE INDEX samples_rollup_time_idx ON skiplock.samples_rollup (resolution, bucket);

-- One row per collection cycle: when, how long, and each collector's own time and error.
CREATE TABLE skiplock.collection_runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at    timestamptz      NOT NULL,
    finished_at   timestamptz      NOT NULL,
    duration_ms   double precision NOT NULL,
    -- {"queue": {"ms": 3.1, "error": null}, "vacuum": {"ms": 1.2, "error": "statement timeout"}}
    collectors    jsonb            NOT NULL DEFAULT '{}'::jsonb,
    leader        text
);
CREATE INDEX collection_runs_started_idx ON skiplock.collection_runs (started_at DESC);
