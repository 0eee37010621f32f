-- Concurrency and rate limits per queue, concurrency per job kind (console/limits.py).
-- The limited claim is one short transaction: `lock_queue` (or `lock_kind`) first, then the
-- claim statement, whose snapshot is taken after the lock is granted, so it sees every claim
-- that the previous holder committed. Claims of a limited queue (kind) happen only here.

-- name: lock_queue
-- Serializes the limited claimers of one queue across the fleet; released at commit.
SELECT pg_advisory_xact_lock(hashtext('skiplock.queue:' || %(queue)s));

-- name: lock_kind
SELECT pg_advisory_xact_lock(hashtext('skiplock.kind:' || %(kind)s));

-- name: claim_queue
-- Claim from one limited queue at most min(%(limit)s, concurrency - running, floor(tokens))
-- jobs, and take the tokens spent out of its bucket. With %(kind)s NULL it claims jobs of
-- unlimited kinds only (limited kinds go through `claim_kind`, which comes here with %(kind)s
-- set, holding that kind's lock). The bucket is refilled by clock time (not now(): the
-- transaction may have started before the lock was granted). Running jobs are counted through
-- jobs_lease_idx: they are at most the fleet's handler threads. The candidates come from
-- jobs_queue_claim_idx (queue, then the claim order; `claim_indexes_wanted` below); with no room, LIMIT 0
-- reads no job at all.
--
-- A fair queue (group_concurrency set; docs/queue.md, "Fair queues") takes the `fair` branch
-- instead (the other one gets LIMIT 0 and reads nothing): the groups that have pending jobs are
-- found by a skip scan of jobs_group_claim_idx (queue, coalesce(group_key, ''), claim order), one probe per
-- group; each group gives at most group_concurrency - its running jobs (and at most the room)
-- of its head, ranked in the claim order; the candidates are taken by (running + rank: the
-- least loaded groups first, the rotation from `fair_cursor`: the groups after the one served
-- last, then the claim order). So every group gets one job before any gets a second, and among
-- equally loaded groups the turn goes round, whatever their backlog. The NULL group (jobs
-- enqueued without a group) is one group, keyed '' in the rotation. The statement reads
-- (groups with pending jobs) probes plus the heads it ranks, never a group's whole backlog.
--
-- Weights (skiplock.group_weights, migration 028; 1 for a group without a row): the rotation
-- is a sequence of visits, a group's visit being `weight` turns in a row. A head's turn u is
-- running + rank (its group's running jobs count as turns taken), plus, for the group served
-- last, the turns it already had in its visit (`fair_turns`); its visit is (u - 1) / weight.
-- Candidates go by visit, then the group served last (finishing its visit), the groups after
-- it, the groups before it, then key and claim order. With every weight 1 this is the order
-- above (running + rank, then the rotation from fair_cursor), row for row.
WITH RECURSIVE clock AS (
    SELECT clock_timestamp() AS at
),
bucket AS (
    SELECT
        q.name,
        q.paused,
        q.concurrency,
        q.group_concurrency,
        q.fair_cursor,
        -- A count left for another group (an earlier release moved the cursor) is not this one's.
        CASE WHEN q.fair_turns_of = q.fair_cursor THEN q.fair_turns END AS fair_turns,
        clock.at,
        CASE WHEN q.rate_count IS NOT NULL THEN
            least(q.burst,
                  coalesce(q.tokens, q.burst)
                  + greatest(0, extract(epoch FROM clock.at - coalesce(q.refilled_at, clock.at)))
                    * q.rate_count::double precision / q.rate_period)
        END AS tokens
    FROM skiplock.queues AS q
    CROSS JOIN clock
    WHERE q.name = %(queue)s
),
room AS (
    SELECT
        b.name,
        b.at,
        b.tokens,
        b.group_concurrency,
        b.fair_cursor,
        b.fair_turns,
        b.group_concurrency IS NOT NULL AS fair,
        CASE WHEN b.paused THEN 0
             ELSE greatest(0, least(
                 %(limit)s,
                 b.concurrency - (SELECT count(*)
                                  FROM skiplock.jobs AS r
                                  WHERE r.status = 'running'
                                    AND r.queue = b.name)::integer,
                 floor(b.tokens)::integer))
        END AS n
    FROM bucket AS b
),
plain AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.run_at <= now()
      AND j.queue = %(queue)s
      AND ((%(kind)s::text IS NULL AND j.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k))
           OR j.kind = %(kind)s::text)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT coalesce((SELECT CASE WHEN room.fair THEN 0 ELSE room.n END FROM room), 0)
    FOR UPDATE SKIP LOCKED
),
-- The fair branch. The groups with pending jobs (a skip scan: one index probe per group); the
-- NULL group is '' (a group key is never empty: console/queue/producer.py check_group).
groups (k) AS (
    (SELECT coalesce(j.group_key, '')
     FROM skiplock.jobs AS j
     WHERE j.status = 'pending'
       AND j.queue = %(queue)s
       AND (SELECT room.fair AND room.n > 0 FROM room)
     ORDER BY coalesce(j.group_key, '')
     LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(j.group_key, '')
            FROM skiplock.jobs AS j
            WHERE j.status = 'pending'
              AND j.queue = %(queue)s
              AND coalesce(j.group_key, '') > g.k
            ORDER BY coalesce(j.group_key, '')
            LIMIT 1)
    FROM groups AS g
    WHERE g.k IS NOT NULL
),
running_groups AS (
    SELECT coalesce(r.group_key, '') AS k, count(*)::integer AS n
    FROM skiplock.jobs AS r
    WHERE r.status = 'running'
      AND r.queue = %(queue)s
    GROUP BY coalesce(r.group_key, '')
),
allowed AS (
    -- How many more of each group may start: group_concurrency - running, and at most the room
    -- (a weight gives turns, not room). `used`: the turns of its current visit the group served
    -- last already had (at most its weight: a weight lowered since counts as a full visit); a
    -- NULL count (none kept, or kept by an earlier release) is a full visit, as in migration 025.
    SELECT
        g.k,
        coalesce(rg.n, 0) AS running,
        coalesce(gw.weight, 1) AS weight,
        CASE WHEN g.k = room.fair_cursor THEN least(coalesce(room.fair_turns, gw.weight, 1), coalesce(gw.weight, 1))
             ELSE 0 END AS used,
        greatest(0, least(room.n, room.group_concurrency - coalesce(rg.n, 0))) AS more
    FROM groups AS g
    CROSS JOIN room
    LEFT JOIN running_groups AS rg ON rg.k = g.k
    LEFT JOIN skiplock.group_weights AS gw ON gw.queue = %(queue)s AND gw.group_key = g.k
    WHERE g.k IS NOT NULL
),
ranked AS (
    -- Each group's head, at most `more` jobs, ranked in the claim order, with its turn.
    SELECT a.k, a.running, a.weight, h.id, h.priority, h.run_at, h.rank,
           a.running + h.rank + a.used AS turn
    FROM allowed AS a
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at,
               row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS rank
        FROM skiplock.jobs AS j
        WHERE j.status = 'pending'
          AND j.run_at <= now()
          AND j.queue = %(queue)s
          AND coalesce(j.group_key, '') = a.k
          AND ((%(kind)s::text IS NULL AND j.kind NOT IN (SELECT k.kind FROM skiplock.kind_limits AS k))
               OR j.kind = %(kind)s::text)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT a.more
    ) AS h
),
picked AS (
    -- The weighted round-robin: by visit ((turn - 1) / weight), then the place in the rotation
    -- (0: the group served last, finishing its visit; 1: the groups after it; 2: those before
    -- it), then the key and the claim order. `turns`: the turns this head is of its visit.
    SELECT r.id, r.k, (r.turn - 1) / r.weight AS visit,
           CASE WHEN cur.fair_cursor IS NULL OR r.k > cur.fair_cursor THEN 1
                WHEN r.k = cur.fair_cursor THEN 0 ELSE 2 END AS place,
           mod(r.turn - 1, r.weight) + 1 AS turns
    FROM ranked AS r
    CROSS JOIN (SELECT room.fair_cursor FROM room) AS cur
    ORDER BY visit, place, r.k, r.priority DESC, r.run_at, r.id
    LIMIT coalesce((SELECT CASE WHEN room.fair THEN room.n ELSE 0 END FROM room), 0)
),
fair AS (
    -- Locked by primary key (a join could pick a hash join over the whole table). Under the
    -- queue's lock no other claimer holds them; a row another statement locked (a cancel) is
    -- skipped and this claim takes one job fewer, never one more.
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p))
      AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
),
candidates AS (
    SELECT plain.id FROM plain
    UNION ALL
    SELECT fair.id FROM fair
),
claimed AS (
    -- Clock time (when the slot was granted), so the jobs' locked_at show the rate kept.
    UPDATE skiplock.jobs AS j
    SET status = 'running',
        locked_by = %(worker)s,
        locked_at = clock.at,
        lease_until = clock.at + make_interval(secs => %(lease)s),
        attempts = j.attempts + 1
    FROM clock
    -- By primary key: a join could pick a hash join over the whole table.
    WHERE j.id = ANY(ARRAY(SELECT c.id FROM candidates AS c))
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
              j.idempotency_key, j.locked_by, j.locked_at, j.lease_until, j.created_at, j.headers
),
spent AS (
    -- The bucket's tokens, and the fair rotation's place: the last group served, and how many
    -- turns of its visit it has had.
    UPDATE skiplock.queues AS q
    SET tokens = CASE WHEN room.tokens IS NOT NULL THEN room.tokens - (SELECT count(*) FROM claimed) ELSE q.tokens END,
        refilled_at = CASE WHEN room.tokens IS NOT NULL THEN room.at ELSE q.refilled_at END,
        (fair_cursor, fair_turns, fair_turns_of) =
            (SELECT coalesce(last.k, q.fair_cursor), coalesce(last.turns, q.fair_turns),
                    coalesce(last.k, q.fair_turns_of)
             FROM (SELECT NULL) AS one
             LEFT JOIN (SELECT p.k, p.turns FROM picked AS p
                        WHERE p.id IN (SELECT fair.id FROM fair)
                        ORDER BY p.visit DESC, p.place DESC, p.k DESC, p.turns DESC
                        LIMIT 1) AS last ON true)
    FROM room
    WHERE q.name = room.name
      AND (room.tokens IS NOT NULL OR (room.fair AND EXISTS (SELECT 1 FROM fair)))
    RETURNING q.tokens
)
SELECT
    claimed.*,
    (SELECT count(*) FROM spent) AS buckets_updated
FROM claimed
ORDER BY claimed.priority DESC, claimed.run_at, claimed.id;

-- name: kind_room
-- How many more jobs of a limited kind may start now (fleet-wide; under `lock_kind`).
SELECT k.concurrency - (SELECT count(*)
                        FROM skiplock.jobs AS r
                        WHERE r.status = 'running'
                          AND r.kind = k.kind)::integer AS room
FROM skiplock.kind_limits AS k
WHERE k.kind = %(kind)s;

-- name: claim_kind
-- Claim up to %(limit)s jobs of one limited kind from the queues that have no limits of their
-- own (and are not paused). The caller computed %(limit)s from `kind_room` under the kind's
-- lock; the kind's jobs in limited queues are claimed with `claim_queue`. The candidates come
-- from jobs_kind_claim_idx (kind, then the claim order; `claim_indexes_wanted` below): its own head,
-- never the other kinds' backlog.
WITH candidates AS (
    SELECT j.id
    FROM skiplock.jobs AS j
    WHERE j.status = 'pending'
      AND j.run_at <= now()
      AND j.kind = %(kind)s
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND j.queue NOT IN (SELECT q.name FROM skiplock.queues AS q WHERE q.paused OR q.limited OR q.fair)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE skiplock.jobs AS j
SET status = 'running',
    locked_by = %(worker)s,
    locked_at = now(),
    lease_until = now() + make_interval(secs => %(lease)s),
    attempts = j.attempts + 1
FROM candidates AS c
WHERE j.id = c.id
RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
          j.idempotency_key, j.locked_by, j.locked_at, j.lease_until, j.created_at, j.headers;

-- name: limited
-- What a worker claims through the limited path: limited queues (all of them; the worker
-- keeps those it serves) and limited kinds.
SELECT 'queue' AS unit, q.name
FROM skiplock.queues AS q
WHERE q.limited OR q.fair
UNION ALL
SELECT 'kind' AS unit, k.kind
FROM skiplock.kind_limits AS k
ORDER BY 1, 2;

-- name: set_limits
-- Set (or, with both NULL, remove) a queue's limits. A new or changed rate starts with a full
-- bucket; an unchanged rate keeps its tokens.
INSERT INTO skiplock.queues AS q (name, concurrency, rate_count, rate_period, burst, tokens, refilled_at,
                                  group_concurrency, limits_set_at, limits_set_by, updated_at)
VALUES (%(queue)s, %(concurrency)s, %(rate_count)s, %(rate_period)s, %(burst)s, %(burst)s,
        CASE WHEN %(rate_count)s::integer IS NOT NULL THEN clock_timestamp() END, %(group_concurrency)s,
        now(), %(actor)s, now())
ON CONFLICT (name) DO UPDATE
SET concurrency = excluded.concurrency,
    group_concurrency = excluded.group_concurrency,
    tokens = CASE WHEN q.rate_count IS NOT DISTINCT FROM excluded.rate_count
                   AND q.rate_period IS NOT DISTINCT FROM excluded.rate_period
                  THEN q.tokens ELSE excluded.tokens END,
    refilled_at = CASE WHEN q.rate_count IS NOT DISTINCT FROM excluded.rate_count
                        AND q.rate_period IS NOT DISTINCT FROM excluded.rate_period
                       THEN q.refilled_at ELSE excluded.refilled_at END,
    rate_count = excluded.rate_count,
    rate_period = excluded.rate_period,
    burst = excluded.burst,
    limits_set_at = excluded.limits_set_at,
    limits_set_by = excluded.limits_set_by,
    updated_at = now()
RETURNING q.name;

-- name: get_limits
SELECT q.name, q.concurrency, q.rate_count, q.rate_period, q.burst, q.group_concurrency
FROM skiplock.queues AS q
WHERE q.name = %(queue)s;

-- name: notify_limits
SELECT pg_notify('skiplock_limits', %(queue)s);

-- name: queue_limits
-- The limited queues with their usage now: running jobs and the bucket's tokens as of now.
SELECT
    q.name AS queue,
    q.concurrency,
    q.group_concurrency,
    q.rate_count,
    q.rate_period,
    q.burst,
    CASE WHEN q.rate_count IS NOT NULL THEN
        least(q.burst, coalesce(q.tokens, q.burst)
              + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(q.refilled_at, clock_timestamp())))
                * q.rate_count::double precision / q.rate_period)
    END AS tokens,
    (SELECT count(*) FROM skiplock.jobs AS r WHERE r.status = 'running' AND r.queue = q.name) AS running,
    -- A fair queue's weighted groups (migration 028; a group without a row has weight 1).
    (SELECT coalesce(jsonb_object_agg(w.group_key, w.weight ORDER BY w.group_key), '{}'::jsonb)
     FROM skiplock.group_weights AS w WHERE w.queue = q.name) AS group_weights,
    q.paused,
    q.limits_set_at,
    q.limits_set_by
FROM skiplock.queues AS q
WHERE q.limited OR q.fair
ORDER BY q.name;

-- name: kind_limits
SELECT
    k.kind,
    k.concurrency,
    (SELECT count(*) FROM skiplock.jobs AS r WHERE r.status = 'running' AND r.kind = k.kind) AS running,
    k.declared_by,
    k.updated_at
FROM skiplock.kind_limits AS k
ORDER BY k.kind;

-- name: declare_kind
INSERT INTO skiplock.kind_limits AS k (kind, concurrency, declared_by, updated_at)
VALUES (%(kind)s, %(concurrency)s, %(worker)s, now())
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency,
    declared_by = excluded.declared_by,
    updated_at = now()
WHERE k.concurrency IS DISTINCT FROM excluded.concurrency;

-- name: undeclare_kinds
-- Kinds this worker registers without a limit lose the limit an older deployment declared.
DELETE FROM skiplock.kind_limits AS k
WHERE k.kind = ANY(%(kinds)s::text[])
RETURNING k.kind;

-- The limited path's own indexes (console/limits.py `keep_claim_indexes`). A try of a limited
-- kind (`claim_kind`) or queue (`claim_queue`) through jobs_claim_idx alone, which is ordered
-- by priority and time, reads every eligible job of the others when it has nothing of its own
-- (7,000-10,000 buffers and 100-450 ms per try on a 500,000-job backlog). With the claim order
-- behind an equality on kind or queue, a try reads its own unit's head and stops.
--
-- They exist only while some unit is limited: each costs every enqueue one more index entry
-- (about 90 bytes of WAL a job) and every VACUUM of skiplock.jobs one more index to clean, a
-- price a team without limits should not pay. Nothing per claim or completion: the new row
-- version is `running` or `completed`, outside the predicate (and a claim was never HOT).
-- Built CONCURRENTLY by the scheduler's leader, so enqueues never wait for them.

-- name: claim_indexes_wanted
SELECT
    EXISTS (SELECT 1 FROM skiplock.kind_limits) AS kind,
    EXISTS (SELECT 1 FROM skiplock.queues AS q WHERE q.limited) AS queue,
    EXISTS (SELECT 1 FROM skiplock.queues AS q WHERE q.fair) AS fair;

-- name: claim_indexes_present
-- The limited path's indexes that exist, and whether each is valid (a CREATE INDEX
-- CONCURRENTLY that failed leaves an invalid one behind, which only costs). %(names)s: the
-- indexes console/limits.py CLAIM_INDEXES keeps.
SELECT c.relname AS name, i.indisvalid AS valid
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'skiplock'
  AND c.relname = ANY(%(names)s::text[]);

-- name: create_kind_claim_index
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_kind_claim_idx
    ON skiplock.jobs (kind, priority DESC, run_at, id)
    WHERE status = 'pending';

-- name: create_queue_claim_index
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_queue_claim_idx
    ON skiplock.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';

-- name: create_group_claim_index
-- The fair claim's index (a fair queue's groups, each group's head in the claim order), kept
-- while some queue has a group_concurrency.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_group_claim_idx
    ON skiplock.jobs (queue, (coalesce(group_key, '')), priority DESC, run_at, id)
    WHERE status = 'pending';

-- name: fair_queues
-- The fair queues, for the groups collector (console/collectors/groups.py).
SELECT q.name
FROM skiplock.queues AS q
WHERE q.fair
ORDER BY q.name;

-- name: fair_groups
-- Fair queues' groups, for a queue's page and for the groups collector (console/queue/limits.py
-- group_rows), for every queue of %(queues)s at once: the groups with pending jobs, found by the
-- fair claim's skip scan of jobs_group_claim_idx (at most %(groups)s of them a queue, in key
-- order), plus the groups with running jobs and those with dead letters that arrived within
-- the last %(window)s seconds; each with its eligible jobs (counted up to %(cap)s) and the
-- oldest run_at among those, its running jobs and those dead letters. Reads one probe per group
-- plus at most %(cap)s index entries per group; running jobs through jobs_lease_idx (at most
-- the fleet's handler threads); the dead letters once for all the queues, as the queue
-- collector's `arrived` does: the newest %(failed_cap)s of every queue, walking jobs_failed_idx
-- backwards (a heap fetch each, for the queue and group), so in a dead-letter storm the count
-- is the share of the newest ones. `waiting`: found by the walk. The caller runs it under a
-- statement timeout (the page's, or the collector's).
WITH RECURSIVE groups (q, k, n) AS (
    SELECT
        f.name,
        (SELECT coalesce(j.group_key, '')
         FROM skiplock.jobs AS j
         WHERE j.status = 'pending'
           AND j.queue = f.name
         ORDER BY coalesce(j.group_key, '')
         LIMIT 1),
        1
    FROM unnest(%(queues)s::text[]) AS f (name)
    UNION ALL
    SELECT
        g.q,
        (SELECT coalesce(j.group_key, '')
         FROM skiplock.jobs AS j
         WHERE j.status = 'pending'
           AND j.queue = g.q
           AND coalesce(j.group_key, '') > g.k
         ORDER BY coalesce(j.group_key, '')
         LIMIT 1),
        g.n + 1
    FROM groups AS g
    WHERE g.k IS NOT NULL
      AND g.n < %(groups)s
),
found AS (
    SELECT g.q, g.k
    FROM groups AS g
    WHERE g.k IS NOT NULL
),
running AS (
    SELECT r.queue AS q, coalesce(r.group_key, '') AS k, count(*) AS n
    FROM skiplock.jobs AS r
    WHERE r.status = 'running'
      AND r.queue = ANY(%(queues)s::text[])
    GROUP BY r.queue, coalesce(r.group_key, '')
),
failed AS (
    SELECT w.queue AS q, coalesce(w.group_key, '') AS k, count(*) AS n
    FROM (
        SELECT j.queue, j.group_key
        FROM skiplock.jobs AS j
        WHERE j.status = 'failed'
          AND j.finished_at >= now() - make_interval(secs => %(window)s)
        ORDER BY j.finished_at DESC, j.id DESC
        LIMIT %(failed_cap)s
    ) AS w
    WHERE w.queue = ANY(%(queues)s::text[])
    GROUP BY w.queue, coalesce(w.group_key, '')
),
keys AS (
    SELECT f.q, f.k FROM found AS f
    UNION
    SELECT r.q, r.k FROM running AS r
    UNION
    SELECT x.q, x.k FROM failed AS x
)
SELECT
    k.q AS queue,
    k.k,
    EXISTS (SELECT 1 FROM found AS f WHERE f.q = k.q AND f.k = k.k) AS waiting,
    b.eligible,
    extract(epoch FROM now() - b.oldest)::double precision AS age_seconds,
    coalesce(r.n, 0) AS running,
    coalesce(x.n, 0) AS failed
FROM keys AS k
CROSS JOIN LATERAL (
    SELECT count(*) AS eligible, min(e.run_at) AS oldest
    FROM (SELECT j.run_at
          FROM skiplock.jobs AS j
          WHERE j.status = 'pending'
            AND j.queue = k.q
            AND coalesce(j.group_key, '') = k.k
            AND j.run_at <= now()
          LIMIT %(cap)s) AS e
) AS b
LEFT JOIN running AS r ON r.q = k.q AND r.k = k.k
LEFT JOIN failed AS x ON x.q = k.q AND x.k = k.k;

-- name: group_weights
-- A fair queue's weighted groups (skiplock.group_weights, migration 028); a group without a
-- row has weight 1.
SELECT w.group_key, w.weight
FROM skiplock.group_weights AS w
WHERE w.queue = %(queue)s
ORDER BY w.group_key;

-- name: set_group_weight
-- Weight 1 is the default: its row is removed rather than kept, so the table holds only the
-- groups that differ (the claim reads it per group with pending jobs).
WITH gone AS (
    DELETE FROM skiplock.group_weights AS w
    WHERE w.queue = %(queue)s AND w.group_key = %(group)s AND %(weight)s::integer = 1
)
INSERT INTO skiplock.group_weights AS w (queue, group_key, weight, set_at, set_by)
SELECT %(queue)s, %(group)s, %(weight)s::integer, now(), %(actor)s
WHERE %(weight)s::integer <> 1
ON CONFLICT (queue, group_key) DO UPDATE
SET weight = excluded.weight, set_at = excluded.set_at, set_by = excluded.set_by;

-- name: clear_group_weights
-- `clear` lifts every limit of the queue: it is no longer fair, and its weights go with it.
DELETE FROM skiplock.group_weights AS w
WHERE w.queue = %(queue)s;
