-- 006: alerts. Rules managed in the UI, the state of each alert, its transitions, silences,
-- the outbox of notifications and the delivery log. Rules and destinations from the config
-- file are not stored here (the file is the source of truth for those).

-- Rules an admin manages in the UI. A config-file rule with the same name wins.
CREATE TABLE skiplock.alert_rules (
    name          text PRIMARY KEY,
    metric        text             NOT NULL,
    labels        jsonb            NOT NULL DEFAULT '{}'::jsonb,
    op            text             NOT NULL CHECK (op IN ('>', '>=', '<', '<=')),
    threshold     double precision NOT NULL,
    clear         double precision,           -- value that resolves a firing alert (hysteresis)
    for_seconds   double precision NOT NULL DEFAULT 0 CHECK (for_seconds >= 0),
    severity      text             NOT NULL DEFAULT 'warning',
    summary       text,
    runbook       text,
    webhooks      text[]           NOT NULL DEFAULT '{}',
    guard         jsonb,                      -- {"metric", "labels", "op", "threshold"} or NULL
    enabled       boolean          NOT NULL DEFAULT true,
    updated_by    text             NOT NULL,
    updated_at    timestamptz      NOT NULL DEFAULT now()
);

-- Destinations an admin manages in the UI. A config-file [[webhooks]] entry with the same name
-- wins. The secret is kept to sign and authenticate, and never sent back to a browser.
CREATE TABLE skiplock.alert_destinations (
    name          text PRIMARY KEY,
    kind          text        NOT NULL CHECK (kind IN ('json', 'slack', 'pagerduty')),
    url           text        NOT NULL,
    secret        text,
    headers       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    updated_by    text        NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per (rule, label set) ever evaluated: where it is in ok -> pending -> firing.
CREATE TABLE skiplock.alerts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule            text             NOT NULL,
    labels          jsonb            NOT NULL DEFAULT '{}'::jsonb,
    state           text             NOT NULL DEFAULT 'ok' CHECK (state IN ('ok', 'pending', 'firing')),
    state_since     timestamptz      NOT NULL DEFAULT now(),
    value           double precision,
    evaluated_at    timestamptz      NOT NULL DEFAULT now(),
    fired_at        timestamptz,
    resolved_at     timestamptz,
    notified        boolean          NOT NULL DEFAULT false,  -- a firing notification went out
    last_notified_at timestamptz,
    acknowledged_by text,
    acknowledged_at timestamptz,
    ack_note        text,
    UNIQUE (rule, labels)
);
CREATE INDEX alerts_active_idx ON skiplock.alerts (state) WHERE state <> 'ok';

-- Every transition worth a line in the history: pending, firing, repeat, resolved, acknowledged.
CREATE TABLE skiplock.alert_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id    bigint           NOT NULL REFERENCES skiplock.alerts (id),
    at          timestamptz      NOT NULL DEFAULT now(),
    kind        text             NOT NULL CHECK (kind IN ('pending', 'firing', 'repeat', 'resolved', 'acknowledged', 'silenced')),
    value       double precision,
    actor       text,
    detail      jsonb
);
CREATE INDEX alert_events_alert_idx ON skiplock.alert_events (alert_id, id DESC);
CREATE INDEX alert_events_at_idx ON skiplock.alert_events (at DESC);

-- Silences: a rule (NULL = every rule) and a label subset, until a time, with a reason.
CREATE TABLE skiplock.alert_silences (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule        text,
    labels      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    starts_at   timestamptz NOT NULL DEFAULT now(),
    ends_at     timestamptz NOT NULL,
    reason      text        NOT NULL CHECK (reason <> ''),
    created_by  text        NOT NULL,
    expired_by  text,                          -- who ended it early
    CHECK (ends_at > starts_at)
);
CREATE INDEX alert_silences_active_idx ON skiplock.alert_silences (ends_at);

-- The outbox: one row per notification and destination, written in the same transaction as the
-- transition, sent later by the scheduler. Sent in id order per (alert, destination).
CREATE TABLE skiplock.alert_outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        bigint      REFERENCES skiplock.alert_events (id),
    alert_id        bigint      REFERENCES skiplock.alerts (id),
    destination     text        NOT NULL,
    idempotency_key text        NOT NULL,
    notification    jsonb       NOT NULL,     -- the versioned document; transports format it
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'delivered', 'failed', 'gave_up')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_until    timestamptz,              -- a sender holds it (no transaction is held)
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    finished_at     timestamptz,
    UNIQUE (idempotency_key, destination)
);
CREATE INDEX alert_outbox_pending_idx ON skiplock.alert_outbox (next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX alert_outbox_order_idx ON skiplock.alert_outbox (alert_id, destination, id) WHERE status = 'pending';
CREATE INDEX alert_outbox_created_idx ON skiplock.alert_outbox (created_at DESC);
CREATE INDEX alert_outbox_finished_idx ON skiplock.alert_outbox (finished_at) WHERE status <> 'pending';

-- The delivery log: every attempt (and every "send test"), with the receiver's answer.
CREATE TABLE skiplock.alert_deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id     bigint      REFERENCES skiplock.alert_outbox (id) ON DELETE CASCADE,
    destination   text        NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    attempt       integer     NOT NULL DEFAULT 1,
    outcome       text        NOT NULL CHECK (outcome IN ('delivered', 'retry', 'failed', 'gave_up', 'test_ok', 'test_failed')),
    http_status   integer,
    error         text,
    duration_ms   double precision
);
CREATE INDEX alert_deliveries_at_idx ON skiplock.alert_deliveries (at DESC, id DESC);
CREATE INDEX alert_deliveries_outbox_idx ON skiplock.alert_deliveries (outbox_id);
