-- 037: samples_latest kept by one join of a cycle's rows, not a probe per row (issue 31,
-- target 1: one collection cycle < 1 s at 5,000 queues).
--
-- 033's insert trigger upserted a statement's rows as they came: INSERT ... ON CONFLICT looks
-- each row up in samples_latest's primary key, (metric, labels), one descent of the index per
-- row comparing jsonb labels at every level. At 5,000 queues (45,000 samples a cycle) the
-- upsert took about 290 ms of server CPU, the largest part of a cycle's store, and the probes
-- alone 270 ms (docs/benchmarks.md, "samples_latest merged, not probed"). A MERGE joins the
-- statement's rows with samples_latest once, hashing both sides (a hash of each label set,
-- where the probes compared them): about 120 ms for the same cycle, the updates included
-- (the join about 60 ms, the 45,000 updates, HOT, about 55 ms). The collectors' connection
-- turns sequential scans off (console/collectors/base.py: no collector query should scan
-- anything large), which would leave the MERGE the per-row probes again, so the function turns
-- them back on for its own statements; the MERGE is planned at each call (EXECUTE), for the
-- rows that statement stored (a few rows may still be looked up in the index).
--
-- The result is 033's: the newest value and time of each series (a sample stored late does not
-- replace a newer one), and busy_at the newest time above zero (greatest() skips a NULL). A
-- statement that holds a series twice (a script, a test, a history seeded in one statement)
-- makes the MERGE fail with cardinality_violation ("cannot affect row a second time"), or with
-- unique_violation when the series is new, as does a series another transaction inserted
-- meanwhile; the trigger then does what 029's did, grouped and upserted. Only the insert
-- trigger's function changes; the delete, update and truncate triggers stay as they were.
CREATE OR REPLACE FUNCTION skiplock.samples_keep_latest() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = on
AS $$
BEGIN
    BEGIN
        EXECUTE $merge$
            MERGE INTO skiplock.samples_latest AS l
            USING inserted AS n
            ON l.metric = n.metric AND l.labels = n.labels
            WHEN MATCHED AND n.collected_at >= l.collected_at THEN
                UPDATE SET value = n.value, collected_at = n.collected_at,
                           busy_at = greatest(l.busy_at, CASE WHEN n.value > 0 THEN n.collected_at END)
            WHEN NOT MATCHED THEN
                INSERT (metric, labels, value, collected_at, busy_at)
                VALUES (n.metric, n.labels, n.value, n.collected_at,
                        CASE WHEN n.value > 0 THEN n.collected_at END)
        $merge$;
    EXCEPTION WHEN cardinality_violation OR unique_violation THEN
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
