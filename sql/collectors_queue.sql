-- Queue collectors: depth, age, stuck leases, dead letters. None of these scans the jobs table:
-- each walks one partial index (pending: jobs_claim_idx, running: jobs_lease_idx, failed:
-- jobs_failed_idx) and stops after %(cap)s entries, or reads catalog statistics.

-- name: queue_snapshot
-- Everything the queue collector needs in one statement (one round trip):
--   pending: the first %(cap)s entries of the claim index in its own order (ORDER BY matches the
--     index, so it is walked and stopped; queue comes from INCLUDE, run_at from the key: an
--     index-only scan when the visibility map allows). Exact while pending <= cap.
--   running: running jobs through the lease index; stuck = lease expired, not yet reaped.
--   failed_total: an index-only walk of jobs_failed_idx stopped at %(failed_total_cap)s.
--   failed: the newest %(failed_queue_cap)s dead letters by queue (a heap fetch each for the queue).
--   estimates: rows by status from the planner's statistics (last ANALYZE), for completed rows
--     (never counted) and for scaling a pending backlog beyond the cap.
--   known: queues the operator paused or resumed, so an empty queue still reports 0.
--   arrived: dead letters that arrived within the last %(window)s seconds, by queue (the newest
--     %(failed_queue_cap)s of them, walking jobs_failed_idx backwards), with the oldest arrival
--     time seen: the collector divides by the window, or by the span seen when the cap was hit.
SELECT
    (
        SELECT coalesce(jsonb_agg(p ORDER BY p.queue), '[]'::jsonb)
        FROM (
            SELECT
                h.queue,
                count(*) FILTER (WHERE h.run_at <= now()) AS eligible,
                count(*) FILTER (WHERE h.run_at > now()) AS scheduled,
                extract(epoch FROM now() - min(h.run_at) FILTER (WHERE h.run_at <= now()))::float8 AS oldest_eligible_s
            FROM (
                SELECT j.queue, j.run_at
                FROM skiplock.jobs AS j
                WHERE j.status = 'pending'
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT %(cap)s
            ) AS h
            GROUP BY h.queue
        ) AS p
    ) AS pending,
    (
        SELECT coalesce(jsonb_agg(r ORDER BY r.queue), '[]'::jsonb)
        FROM (
            SELECT
                l.queue,
                count(*) AS running,
                count(*) FILTER (WHERE l.lease_until < now()) AS stuck,
                extract(epoch FROM now() - min(l.lease_until) FILTER (WHERE l.lease_until < now()))::float8 AS oldest_stuck_s
            FROM (
                SELECT j.queue, j.lease_until
                FROM skiplock.jobs AS j
                WHERE j.status = 'running'
                ORDER BY j.lease_until
                LIMIT %(cap)s
            ) AS l
            GROUP BY l.queue
        ) AS r
    ) AS running,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM skiplock.jobs AS j
            WHERE j.status = 'failed'
            ORDER BY j.finished_at, j.id
            LIMIT %(failed_total_cap)s
        ) AS f
    ) AS failed_total,
    (
        SELECT coalesce(jsonb_agg(f ORDER BY f.queue), '[]'::jsonb)
        FROM (
            SELECT n.queue, count(*) AS failed
            FROM (
                SELECT j.queue
                FROM skiplock.jobs AS j
                WHERE j.status = 'failed'
                ORDER BY j.finished_at DESC, j.id DESC
                LIMIT %(failed_queue_cap)s
            ) AS n
            GROUP BY n.queue
        ) AS f
    ) AS failed,
    (
        SELECT coalesce(jsonb_object_agg(e.status, e.estimate), '{}'::jsonb)
        FROM (
            SELECT
                s.status,
                (greatest(c.reltuples, 0) * s.freq)::float8 AS estimate
            FROM pg_class AS c
            CROSS JOIN LATERAL (
                SELECT
                    unnest(st.most_common_vals::text::text[]) AS status,
                    unnest(st.most_common_freqs) AS freq
                FROM pg_stats AS st
                WHERE st.schemaname = 'skiplock'
                  AND st.tablename = 'jobs'
                  AND st.attname = 'status'
            ) AS s
            WHERE c.oid = 'skiplock.jobs'::regclass
        ) AS e
    ) AS estimates,
    (
        SELECT coalesce(jsonb_agg(q.name ORDER BY q.name), '[]'::jsonb)
        FROM skiplock.queues AS q
    ) AS known,
    (
        SELECT jsonb_build_object(
            'seen', coalesce(sum(a.jobs), 0),
            'span_s', extract(epoch FROM now() - min(a.first_at))::float8,
            'by_queue', coalesce(jsonb_object_agg(a.queue, a.jobs), '{}'::jsonb))
        FROM (
            SELECT w.queue, count(*) AS jobs, min(w.finished_at) AS first_at
            FROM (
                SELECT j.queue, j.finished_at
                FROM skiplock.jobs AS j
                WHERE j.status = 'failed'
                  AND j.finished_at >= now() - make_interval(secs => %(window)s)
                ORDER BY j.finished_at DESC, j.id DESC
                LIMIT %(failed_queue_cap)s
            ) AS w
            GROUP BY w.queue
        ) AS a
    ) AS arrived;
