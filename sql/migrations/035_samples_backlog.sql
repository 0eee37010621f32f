-- 035: each queue's eligible backlog per cycle, kept for the Queues page's drain estimates
-- (issue 31, target 1: every page p95 < 300 ms at 5,000 queues).
--
-- The Queues page says of each queue it shows whether its backlog is clearing or growing, from
-- the queue's eligible depth over the last 15 minutes (console/browse.py `backlog_points`).
-- Read from skiplock.samples, whose only indexes are by metric and time, that was every queue's
-- queue_depth samples of the window for every request: at 5,000 queues and a 15 s cycle, 1.5
-- million rows scanned and 300,000 decoded, 3.5 s and more (docs/benchmarks.md, "The pages and
-- one cycle at width"). This table holds one row per queue and cycle, keyed by queue, so the
-- page reads the 60 or so rows of each queue it shows, and nothing of the others.
--
-- A row is the sum of the queue's eligible-state queue_depth samples stored at that time whose
-- value was measured (not NULL), leaving out an external source's series (label external), as
-- backlog_points summed them: a queue on both backends during a move has their sum. A statement
-- trigger on skiplock.samples keeps it, whoever writes (this release's collectors, an earlier
-- release's scheduler during a rolling upgrade, a script); two inserts at the same time (a
-- cycle stored in parts) add up. The same trigger deletes the rows older than 30 minutes, twice
-- the page's window, so the table stays at about 120 rows a queue without the retention job.
-- Samples older than that are not copied (a script storing history). A delete or an update of
-- samples of the last 30 minutes (nothing in Skiplock does either; a script or a test may)
-- sums the queues and times it touched again from the samples; retention's deletes, of samples
-- 48 hours old, touch none. A truncate empties it.
CREATE TABLE skiplock.samples_backlog (
    queue         text             NOT NULL,
    collected_at  timestamptz      NOT NULL,
    value         double precision NOT NULL,
    PRIMARY KEY (queue, collected_at)
);

CREATE INDEX samples_backlog_time_idx ON skiplock.samples_backlog (collected_at);

-- The last 30 minutes from the samples already stored.
INSERT INTO skiplock.samples_backlog (queue, collected_at, value)
SELECT s.labels ->> 'queue', s.collected_at, sum(s.value)
FROM skiplock.samples AS s
WHERE s.metric = 'queue_depth'
  AND s.collected_at >= now() - interval '30 minutes'
  AND s.labels ->> 'state' = 'eligible'
  AND s.labels ? 'queue'
  AND NOT s.labels ? 'external'
  AND s.value IS NOT NULL
GROUP BY s.labels ->> 'queue', s.collected_at;

CREATE FUNCTION skiplock.samples_add_backlog() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.samples_backlog AS b (queue, collected_at, value)
    SELECT i.labels ->> 'queue', i.collected_at, sum(i.value)
    FROM inserted AS i
    WHERE i.metric = 'queue_depth'
      AND i.collected_at >= now() - interval '30 minutes'
      AND i.labels ->> 'state' = 'eligible'
      AND i.labels ? 'queue'
      AND NOT i.labels ? 'external'
      AND i.value IS NOT NULL
    GROUP BY i.labels ->> 'queue', i.collected_at
    ON CONFLICT (queue, collected_at) DO UPDATE SET value = b.value + excluded.value;
    DELETE FROM skiplock.samples_backlog AS b
    WHERE b.collected_at < now() - interval '30 minutes';
    RETURN NULL;
END;
$$;

-- The rows of the (queue, time) pairs a delete or an update touched, summed again from the
-- samples as they are now (a pair with no measured sample left has no row).
CREATE FUNCTION skiplock.samples_resum_backlog(touched jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM skiplock.samples_backlog AS b
    USING jsonb_to_recordset(touched) AS t (queue text, collected_at timestamptz)
    WHERE b.queue = t.queue AND b.collected_at = t.collected_at;
    INSERT INTO skiplock.samples_backlog (queue, collected_at, value)
    SELECT s.labels ->> 'queue', s.collected_at, sum(s.value)
    FROM (SELECT DISTINCT t.queue, t.collected_at
          FROM jsonb_to_recordset(touched) AS t (queue text, collected_at timestamptz)) AS t
    JOIN skiplock.samples AS s
      ON s.metric = 'queue_depth' AND s.collected_at = t.collected_at AND s.labels ->> 'queue' = t.queue
    WHERE s.labels ->> 'state' = 'eligible'
      AND NOT s.labels ? 'external'
      AND s.value IS NOT NULL
    GROUP BY s.labels ->> 'queue', s.collected_at;
END;
$$;

CREATE FUNCTION skiplock.samples_forget_backlog() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    touched jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('queue', r.labels ->> 'queue', 'collected_at', r.collected_at))
    INTO touched
    FROM removed AS r
    WHERE r.metric = 'queue_depth'
      AND r.collected_at >= now() - interval '30 minutes'
      AND r.labels ->> 'state' = 'eligible'
      AND r.labels ? 'queue';
    IF touched IS NOT NULL THEN
        PERFORM skiplock.samples_resum_backlog(touched);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_redo_backlog() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    touched jsonb;
BEGIN
    SELECT jsonb_agg(DISTINCT jsonb_build_object('queue', t.labels ->> 'queue', 'collected_at', t.collected_at))
    INTO touched
    FROM (SELECT o.metric, o.labels, o.collected_at FROM before_update AS o
          UNION ALL SELECT n.metric, n.labels, n.collected_at FROM after_update AS n) AS t
    WHERE t.metric = 'queue_depth'
      AND t.collected_at >= now() - interval '30 minutes'
      AND t.labels ->> 'state' = 'eligible'
      AND t.labels ? 'queue';
    IF touched IS NOT NULL THEN
        PERFORM skiplock.samples_resum_backlog(touched);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_clear_backlog() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE skiplock.samples_backlog;
    RETURN NULL;
END;
$$;

CREATE TRIGGER samples_add_backlog AFTER INSERT ON skiplock.samples
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_add_backlog();
CREATE TRIGGER samples_forget_backlog AFTER DELETE ON skiplock.samples
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_forget_backlog();
CREATE TRIGGER samples_redo_backlog AFTER UPDATE ON skiplock.samples
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_redo_backlog();
CREATE TRIGGER samples_clear_backlog AFTER TRUNCATE ON skiplock.samples
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_clear_backlog();
