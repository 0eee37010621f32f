-- 031: broker workers in the worker registry (issue 32; docs/exit-plan.md, "The worker backend").
--
-- `skiplock worker --backend nats` registers itself in skiplock.workers like a PostgreSQL
-- worker (one row, a heartbeat every [worker] flush_interval with its in-flight and finished
-- counters) when it has a database to write to, so the Workers page lists it. `backend` says
-- which backend the worker consumes from; the reads that are about claiming from
-- skiplock.jobs ("why isn't this job running?": the workers that could claim it) read the
-- 'postgres' rows only. NOT NULL with a default: the previous release's workers register
-- without naming it and are PostgreSQL workers.
ALTER TABLE skiplock.workers
    ADD COLUMN backend text NOT NULL DEFAULT 'postgres' CHECK (backend IN ('postgres', 'nats'));
