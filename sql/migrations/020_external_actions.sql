-- 020: operator actions on queues Skiplock did not create ([[external_queues]] entries with
-- `actions = true`; console.external.actions). An operation replays or purges exactly the dead
-- letters its preview showed: their keys are kept as its items, in order, and it works through
-- them in batches from its cursor (a resume goes on from there, never beyond the items).

CREATE TABLE skiplock.external_operations (
    id bigserial PRIMARY KEY,
    source text NOT NULL,                 -- the [[external_queues]] entry's name
    system text NOT NULL,                 -- pgqueuer, procrastinate, graphile-worker, pg-boss, bullmq
    database_name text,                   -- the [[databases]] entry whose console started it
    action text NOT NULL CHECK (action IN ('replay', 'purge')),
    selection jsonb NOT NULL,
    actor text NOT NULL,
    reason text,
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'cancelled', 'failed')),
    total integer NOT NULL CHECK (total > 0),  -- the previewed jobs (the items)
    done integer NOT NULL DEFAULT 0,      -- jobs the library changed
    skipped integer NOT NULL DEFAULT 0,   -- items no longer dead letters when their batch came
    batches integer NOT NULL DEFAULT 0,
    batch_size integer NOT NULL CHECK (batch_size > 0),
    rate double precision,
    cursor integer NOT NULL DEFAULT 0,    -- items up to this ordinal are worked through
    previewed_at timestamptz,
    keys_digest text NOT NULL,            -- MD5 of the items' keys in order, as previewed
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    heartbeat_at timestamptz,
    finished_at timestamptz,
    cancel_requested_at timestamptz,
    cancelled_by text,
    error text
);

CREATE INDEX external_operations_source_idx ON skiplock.external_operations (source, id);
CREATE INDEX external_operations_active_idx ON skiplock.external_operations (id)
    WHERE state IN ('queued', 'running');

CREATE TABLE skiplock.external_operation_items (
    operation_id bigint NOT NULL REFERENCES skiplock.external_operations (id) ON DELETE CASCADE,
    ord integer NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (operation_id, ord)
);
