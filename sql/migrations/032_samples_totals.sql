-- 032: each cycle's total across queues of the series the overview's charts sum (issue 31, item 1).
--
-- Past six queues the overview draws one line per chart, the total across queues: the depth of
-- eligible jobs (summed), the oldest waiting job (the max) and the dead letters (summed). Read
-- from skiplock.samples, that total scanned every queue's samples of the window: at 5,000
-- queues and a 15 s cycle, 1.2 million rows a chart for the default hour, three charts a
-- build. This table holds one row per cycle and total, so a chart past six queues reads one
-- series (console/web/overview.py `chart_lines`; docs/benchmarks.md, "The history's reads").
--
-- A statement trigger on skiplock.samples keeps it, whoever writes (this release's collectors,
-- an older release's scheduler during a rolling upgrade, a script): each insert adds the totals
-- of the rows it stored, per collection time. Two inserts at the same time (a cycle stored in
-- parts) each add their own rows, which the chart adds up (or takes the max of) per time, as it
-- did over the samples. The series and how each is totalled are listed in console/samples.py
-- (TOTALS); an external source's series (label external) are not Skiplock's queues and are
-- left out, as the charts leave them out. Updates of samples (nothing in Skiplock updates them)
-- do not move totals. Retention deletes totals with the raw samples (the same cutoff); a
-- truncate of the samples empties it.
--
-- History stored before this migration has no totals: the chart reads the samples for the
-- part of its window before the first total, and the totals after it.
CREATE TABLE skiplock.samples_totals (
    collected_at  timestamptz      NOT NULL,
    metric        text             NOT NULL,
    labels        jsonb            NOT NULL DEFAULT '{}'::jsonb,  -- the labels kept: queue_depth's state
    value         double precision,                              -- NULL when every series was NULL
    series        integer          NOT NULL                      -- how many samples went into it
);

CREATE INDEX samples_totals_metric_time_idx ON skiplock.samples_totals (metric, collected_at);
CREATE INDEX samples_totals_time_idx ON skiplock.samples_totals (collected_at);

-- The last hour's totals (the overview's default window) from the samples already stored.
INSERT INTO skiplock.samples_totals (collected_at, metric, labels, value, series)
SELECT
    n.collected_at,
    n.metric,
    CASE WHEN n.state IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('state', n.state) END,
    CASE WHEN n.metric = 'queue_age_seconds' THEN max(n.value) ELSE sum(n.value) END,
    count(*)
FROM (
    SELECT s.collected_at, s.metric, s.value,
           CASE WHEN s.metric = 'queue_depth' THEN s.labels ->> 'state' END AS state
    FROM skiplock.samples AS s
    WHERE s.metric IN ('queue_depth', 'queue_age_seconds', 'dead_letters')
      AND s.collected_at >= now() - interval '1 hour'
      AND NOT s.labels ? 'external'
) AS n
GROUP BY n.collected_at, n.metric, n.state;

CREATE FUNCTION skiplock.samples_add_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Grouped by the state's text, the kept labels built once per total, not once per row.
    INSERT INTO skiplock.samples_totals (collected_at, metric, labels, value, series)
    SELECT
        n.collected_at,
        n.metric,
        CASE WHEN n.state IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('state', n.state) END,
        CASE WHEN n.metric = 'queue_age_seconds' THEN max(n.value) ELSE sum(n.value) END,
        count(*)
    FROM (
        SELECT i.collected_at, i.metric, i.value,
               CASE WHEN i.metric = 'queue_depth' THEN i.labels ->> 'state' END AS state
        FROM inserted AS i
        WHERE i.metric IN ('queue_depth', 'queue_age_seconds', 'dead_letters')
          AND NOT i.labels ? 'external'
    ) AS n
    GROUP BY n.collected_at, n.metric, n.state;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_clear_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE skiplock.samples_totals;
    RETURN NULL;
END;
$$;

CREATE TRIGGER samples_add_totals AFTER INSERT ON skiplock.samples
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_add_totals();
CREATE TRIGGER samples_clear_totals AFTER TRUNCATE ON skiplock.samples
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_clear_totals();
