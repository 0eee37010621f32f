-- 030: the exit plan's first slice (issue 32; docs/exit-plan.md): a queue may be served by a
-- broker (NATS JetStream) instead of skiplock.jobs, and its jobs still enqueue in the
-- application's transaction, through an outbox that a relay publishes from.
--
-- The backend is a column of the queue's row: enqueue already looks the row up by its primary
-- key in the same statement (sql/queue.sql), so routing costs no extra round trip. A queue
-- without a row, or with 'postgres', is served by skiplock.jobs as before. NOT NULL with a
-- default: an earlier release's INSERTs into skiplock.queues (pause, limits) fill it.
ALTER TABLE skiplock.queues
    ADD COLUMN backend text NOT NULL DEFAULT 'postgres' CHECK (backend IN ('postgres', 'nats'));

-- One row per job of a broker queue, written by enqueue in the caller's transaction. The relay
-- (console/queue/broker/relay.py) publishes unsent rows in id order, each with Nats-Msg-Id =
-- msg_id (JetStream's de-duplication window), and sets sent_at once the broker acknowledged it,
-- in a transaction of its own. Sent rows are kept for [broker] outbox_keep (the idempotency key
-- holds while its row is here, as a job's does while it is in skiplock.jobs) and then deleted
-- by the relay in bounded batches.
--
-- The id is drawn from the jobs' identity sequence: a job id names one job whichever backend
-- serves it, and the id enqueue returns is the id the broker worker's handler sees.
CREATE TABLE skiplock.outbox (
    id              bigint      PRIMARY KEY DEFAULT nextval('skiplock.jobs_id_seq'::regclass),
    msg_id          uuid        NOT NULL DEFAULT gen_random_uuid(),
    queue           text        NOT NULL,
    kind            text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}',
    priority        smallint    NOT NULL DEFAULT 0,
    run_at          timestamptz NOT NULL DEFAULT now(),
    max_attempts    integer     NOT NULL DEFAULT 5,
    idempotency_key text        UNIQUE,
    headers         jsonb,
    group_key       text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz
);

-- What the relay reads: the unsent rows in id order, and nothing else.
CREATE INDEX outbox_unsent_idx ON skiplock.outbox (id) WHERE sent_at IS NULL;
-- What pruning reads: the sent rows, oldest first.
CREATE INDEX outbox_sent_idx ON skiplock.outbox (sent_at) WHERE sent_at IS NOT NULL;
