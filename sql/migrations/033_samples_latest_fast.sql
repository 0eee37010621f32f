-- 033: samples_latest kept without sorting a cycle (issue 31, target 1: one collection cycle
-- < 1 s at 5,000 queues).
--
-- The insert trigger of 027/029 grouped the statement's rows by (metric, labels) to keep the
-- newest of each series, a sort of every row on its jsonb labels: at 5,000 queues (45,000
-- samples a cycle) it was the largest part of the store, which was most of the cycle
-- (docs/benchmarks.md, "One collection cycle"). A collection cycle stores each series once, so
-- the upsert can take the rows as they come. A statement that holds a series twice (a script,
-- a test, a history seeded in one statement) makes that upsert fail with cardinality_violation
-- ("cannot affect row a second time"); the trigger then does what 029's did, grouped. The
-- result is the same either way: the newest value and time of each series, and busy_at the
-- newest time above zero (greatest() skips a NULL).
CREATE OR REPLACE FUNCTION skiplock.samples_keep_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        INSERT INTO skiplock.samples_latest AS l (metric, labels, value, collected_at, busy_at)
        SELECT n.metric, n.labels, n.value, n.collected_at,
               CASE WHEN n.value > 0 THEN n.collected_at END
        FROM inserted AS n
        ON CONFLICT (metric, labels) DO UPDATE
        SET value = excluded.value, collected_at = excluded.collected_at,
            busy_at = greatest(l.busy_at, excluded.busy_at)
        WHERE excluded.collected_at >= l.collected_at;
    EXCEPTION WHEN cardinality_violation THEN
        INSERT INTO skiplock.samples_latest AS l (metric, labels, value, collected_at, busy_at)
        SELECT n.metric, n.labels,
               (array_agg(n.value ORDER BY n.collected_at DESC))[1],
               max(n.collected_at),
               max(n.collected_at) FILTER (WHERE n.value > 0)
        FROM inserted AS n
        GROUP BY n.metric, n.labels
        ON CONFLICT (metric, labels) DO UPDATE
        SET value = excluded.value, collected_at = excluded.collected_at,
            busy_at = greatest(l.busy_at, excluded.busy_at)
        WHERE excluded.collected_at >= l.collected_at;
    END;
    RETURN NULL;
END;
$$;
