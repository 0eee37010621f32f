-- 021: what the console remembers of every error group (issue 33, "what changed").
--
-- The dead letters themselves are replayed and purged, so "a fingerprint never seen before" and
-- "a group that returns after a quiet period" cannot be read from skiplock.jobs alone. The
-- errorgroups collector (console/collectors/errorgroups.py) keeps one row per fingerprint it
-- saw fail for good: when first and last, which kinds and queues, one example, and the current
-- change, if any: `change` = 'new' (never seen before) or 'regressed' (back after
-- [scheduler] error_group_quiet without a dead letter), from `change_at`, with the last time
-- it was seen before it returned (`previous_seen`). An operator may ignore a group (who, when,
-- why; audited): an ignored group never alerts.
--
-- A table of its own, written only by the collector and by ignore/unignore: claim, complete and
-- fail never touch it, so it costs the hot path nothing. Rows of groups not seen for
-- [scheduler] retention_hour_days (and not ignored) are deleted by the retention job.
CREATE TABLE skiplock.error_groups (
    fingerprint     text        PRIMARY KEY,
    first_seen      timestamptz NOT NULL,
    last_seen       timestamptz NOT NULL,
    kinds           text[]      NOT NULL DEFAULT '{}',   -- at most 20, most recent kept
    queues          text[]      NOT NULL DEFAULT '{}',   -- at most 20, most recent kept
    example         text,                                -- the newest error text seen (first 2000 characters)
    example_job     bigint,                              -- the job it came from
    change          text        CHECK (change IN ('new', 'regressed')),
    change_at       timestamptz,                         -- the first dead letter of the change
    previous_seen   timestamptz,                         -- regressed: the last one before the quiet period
    ignored_at      timestamptz,
    ignored_by      text,
    ignore_reason   text,
    CHECK ((change IS NULL) = (change_at IS NULL)),
    CHECK ((ignored_at IS NULL) = (ignored_by IS NULL))
);

-- The collector's "which groups are new or regressed right now" walks this (a handful of rows).
CREATE INDEX error_groups_change_idx ON skiplock.error_groups (change_at DESC) WHERE change IS NOT NULL;
-- Retention deletes the groups not seen for a long time, oldest first.
CREATE INDEX error_groups_last_seen_idx ON skiplock.error_groups (last_seen);
