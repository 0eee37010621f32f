-- 029: when each series was last busy, kept beside its newest sample (issue 31, item 1).
--
-- The overview, the Queues page, search and the maintenance forms list every queue seen in the
-- last 24 hours and say since when an emptied one has been idle (console.samples.queue_activity).
-- That read scanned a day of queue_depth and queue_throughput samples: at 5,000 queues, four
-- series each and a cycle every 15 s, over a hundred million rows, for each page, so the wider
-- the fleet the surer the pages said "not available". samples_latest already holds one row per
-- series; `busy_at` adds the newest time its value was above zero, and the read becomes one row
-- per series.
--
-- The insert trigger keeps it: a newer sample above zero moves it forward, one at zero leaves
-- it. The update trigger (scripts and tests moving samples in time) reads it again from the
-- samples. An earlier release's writes of skiplock.samples keep it the same way.
ALTER TABLE skiplock.samples_latest ADD COLUMN busy_at timestamptz;

-- The last day's busy times of the series the pages read it for.
UPDATE skiplock.samples_latest AS l
SET busy_at = b.busy_at
FROM (SELECT s.metric, s.labels, max(s.collected_at) AS busy_at
      FROM skiplock.samples AS s
      WHERE s.metric IN ('queue_depth', 'queue_throughput')
        AND s.collected_at >= now() - interval '24 hours'
        AND s.value > 0
      GROUP BY s.metric, s.labels) AS b
WHERE l.metric = b.metric AND l.labels = b.labels;

CREATE OR REPLACE FUNCTION skiplock.samples_keep_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.samples_latest AS l (metric, labels, value, collected_at, busy_at)
    SELECT n.metric, n.labels,
           (array_agg(n.value ORDER BY n.collected_at DESC))[1],
           max(n.collected_at),
           max(n.collected_at) FILTER (WHERE n.value > 0)
    FROM inserted AS n
    GROUP BY n.metric, n.labels
    ON CONFLICT (metric, labels) DO UPDATE
    SET value = excluded.value, collected_at = excluded.collected_at,
        busy_at = greatest(l.busy_at, excluded.busy_at)  -- greatest() skips a NULL
    WHERE excluded.collected_at >= l.collected_at;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION skiplock.samples_redo_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM skiplock.samples_latest AS l
    USING (SELECT o.metric, o.labels FROM before_update AS o
           UNION SELECT n.metric, n.labels FROM after_update AS n) AS t
    WHERE l.metric = t.metric AND l.labels = t.labels;
    INSERT INTO skiplock.samples_latest (metric, labels, value, collected_at, busy_at)
    SELECT s.metric, s.labels,
           (array_agg(s.value ORDER BY s.collected_at DESC))[1],
           max(s.collected_at),
           max(s.collected_at) FILTER (WHERE s.value > 0)
    FROM skiplock.samples AS s
    JOIN (SELECT o.metric, o.labels FROM before_update AS o
          UNION SELECT n.metric, n.labels FROM after_update AS n) AS t
      ON t.metric = s.metric AND t.labels = s.labels
    GROUP BY s.metric, s.labels;
    RETURN NULL;
END;
$$;
