-- Broker queues (issue 32; docs/exit-plan.md): which backend serves a queue, and the outbox the
-- relay publishes from (migration 030). Every statement is one short transaction of its own:
-- the relay never holds a transaction open across a call to the broker.

-- name: backend_of
SELECT coalesce(
    (SELECT q.backend FROM skiplock.queues AS q WHERE q.name = %(queue)s),
    'postgres'
) AS backend;

-- name: set_backend
-- The row is created when the queue has none (a queue exists by being named).
INSERT INTO skiplock.queues AS q (name, backend, updated_at)
VALUES (%(queue)s, %(backend)s, now())
ON CONFLICT (name) DO UPDATE
SET backend = excluded.backend,
    updated_at = now();

-- name: broker_queues
SELECT q.name AS queue
FROM skiplock.queues AS q
WHERE q.backend = %(backend)s
ORDER BY q.name;

-- name: relay_lock
-- One relay per database: a session advisory lock held by the leader's connection (released
-- by PostgreSQL when that session ends, a kill -9 included). The key is ('skiplock', 'relay')
-- hashed, so it cannot meet the scheduler's or the vacuum's lock.
SELECT pg_try_advisory_lock(hashtext('skiplock'), hashtext('relay')) AS leader;

-- name: outbox_take
-- The oldest unsent rows that are due (a job enqueued with run_at in the future waits here
-- until then: JetStream has no delayed delivery on the servers Skiplock supports). A read
-- only: the leader is the only relay, so nothing is locked, and the rows are marked sent by
-- `outbox_sent` only after the broker acknowledged them. `skip` names the queues whose streams
-- the relay could not look up or create just now: their rows wait, and do not fill every batch
-- ahead of other queues' rows.
SELECT
    o.id,
    o.msg_id,
    o.queue,
    o.kind,
    o.payload::text AS payload,
    o.priority,
    o.run_at,
    o.max_attempts,
    o.idempotency_key,
    o.headers::text AS headers,
    o.group_key,
    o.created_at
FROM skiplock.outbox AS o
WHERE o.sent_at IS NULL
  AND o.run_at <= now()
  AND o.queue <> ALL(%(skip)s::text[])
ORDER BY o.id
LIMIT %(limit)s;

-- name: outbox_sent
UPDATE skiplock.outbox AS o
SET sent_at = now()
WHERE o.id = ANY(%(ids)s::bigint[])
  AND o.sent_at IS NULL;

-- name: outbox_next_due
-- Seconds until the next unsent row that waits for its run_at (NULL: none), so the relay
-- sleeps no longer than that. Rows already due are not counted: one whose publish failed is
-- tried again at the next poll, not in a tight loop.
SELECT extract(epoch FROM min(o.run_at) - now()) AS seconds
FROM skiplock.outbox AS o
WHERE o.sent_at IS NULL
  AND o.run_at > now();

-- name: outbox_prune
-- Up to %(batch_size)s sent rows older than %(keep)s seconds, oldest first (outbox_sent_idx).
DELETE FROM skiplock.outbox AS o
WHERE o.id IN (
    SELECT s.id
    FROM skiplock.outbox AS s
    WHERE s.sent_at IS NOT NULL
      AND s.sent_at < now() - make_interval(secs => %(keep)s::double precision)
    ORDER BY s.sent_at
    LIMIT %(batch_size)s
);

-- name: outbox_counts
SELECT
    count(*) FILTER (WHERE o.sent_at IS NULL) AS unsent,
    count(*) FILTER (WHERE o.sent_at IS NOT NULL) AS sent
FROM skiplock.outbox AS o
WHERE (%(queue)s::text IS NULL OR o.queue = %(queue)s::text);

-- name: outbox_unsent_of_queue
-- One queue's unsent outbox rows, the first %(cap)s in id order through outbox_unsent_idx
-- (unsent rows only: a handful while the relay keeps up), and how many of those wait for
-- their run_at. Exact below the cap; `skiplock queues move --status` and `exit-plan` read it.
SELECT
    count(*) AS unsent,
    count(*) FILTER (WHERE u.run_at > now()) AS waiting,
    min(u.created_at) AS oldest
FROM (
    SELECT o.run_at, o.created_at
    FROM skiplock.outbox AS o
    WHERE o.sent_at IS NULL
      AND o.queue = %(queue)s
    ORDER BY o.id
    LIMIT %(cap)s
) AS u;

-- name: relay_leader
-- Who holds the relay's leader lock (`relay_lock`: a two-key advisory lock, which pg_locks shows
-- as classid = first key, objid = second key, objsubid = 2), from pg_locks: no table is read.
SELECT
    l.pid,
    a.application_name,
    a.client_addr::text AS client_addr,
    a.backend_start
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a
    ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.granted
  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND l.classid = hashtext('skiplock')::oid
  AND l.objid = hashtext('relay')::oid
  AND l.objsubid = 2
ORDER BY l.pid;

-- name: register_broker_worker
-- A broker worker (`skiplock worker --backend nats`) in the worker registry (migration 031):
-- the same row as a PostgreSQL worker's, with backend 'nats'. One autocommit statement, never
-- inside a transaction that waits on the broker.
INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, kinds, version, release, backend)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(kinds)s, %(version)s, %(release)s, 'nats')
ON CONFLICT (id) DO UPDATE
SET last_seen = now(),
    stopped_at = NULL,
    kinds = excluded.kinds,
    version = excluded.version,
    release = excluded.release,
    backend = 'nats';

-- name: flush_broker_worker
-- A broker worker's heartbeat: its counters since start, written whole (a lost flush is repaired
-- by the next one). `claimed` counts the messages it was delivered; it makes no claims of
-- skiplock.jobs, so the claim and pickup figures stay zero.
UPDATE skiplock.workers AS w
SET last_seen = now(),
    stopped_at = CASE WHEN %(stopping)s THEN now() ELSE NULL END,
    in_flight = %(in_flight)s,
    claimed = %(claimed)s,
    completed = %(completed)s,
    failed = %(failed)s,
    retried = %(retried)s
WHERE w.id = %(id)s;

-- name: live_broker_workers
-- Broker workers of a queue registered and heard from within %(within)s seconds (migration 031):
-- the exit plan's "start broker workers" step.
SELECT
    w.id,
    w.host,
    w.pid
FROM skiplock.workers AS w
WHERE w.backend = 'nats'
  AND w.stopped_at IS NULL
  AND w.last_seen > now() - make_interval(secs => %(within)s)
  AND %(queue)s = ANY(w.queues)
ORDER BY w.id
LIMIT 10;
