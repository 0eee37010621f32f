-- 027: the newest sample of each series, kept as samples are written (issue 31, item 1).
--
-- Pages read "the newest value of each (metric, labels) within 15 minutes". Over
-- skiplock.samples that is a DISTINCT ON across every cycle of the window: with 5,000 queues
-- (45,000 samples a cycle) and a cycle every 15 s, 2.6 million rows sorted for every overview,
-- 10-13 s on the 2-core machine, past the pages' statement timeout, so the overview said "not
-- available" exactly when the fleet was widest. This table holds one row per series, the
-- newest; reading it costs what one cycle's samples cost.
--
-- Triggers keep it, whoever writes: this release's collectors, an older release's scheduler
-- during a rolling upgrade, a script. An insert keeps the newer of each series (a sample stored
-- late does not replace a newer one); a delete (retention, which deletes the oldest first)
-- drops a series whose newest row it removed; an update (nothing in Skiplock updates samples; a
-- script or a test may move them in time) reads its series again; a truncate empties it.
CREATE TABLE skiplock.samples_latest (
    metric        text             NOT NULL,
    labels        jsonb            NOT NULL,
    value         double precision,
    collected_at  timestamptz      NOT NULL,
    PRIMARY KEY (metric, labels)
) WITH (fillfactor = 50);  -- room on each page, so the per-cycle updates stay HOT

INSERT INTO skiplock.samples_latest (metric, labels, value, collected_at)
SELECT DISTINCT ON (s.metric, s.labels) s.metric, s.labels, s.value, s.collected_at
FROM skiplock.samples AS s
WHERE s.collected_at >= now() - interval '1 hour'  -- the pages read 15 minutes at most
ORDER BY s.metric, s.labels, s.collected_at DESC;

CREATE FUNCTION skiplock.samples_keep_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.samples_latest AS l (metric, labels, value, collected_at)
    SELECT DISTINCT ON (n.metric, n.labels) n.metric, n.labels, n.value, n.collected_at
    FROM inserted AS n
    ORDER BY n.metric, n.labels, n.collected_at DESC
    ON CONFLICT (metric, labels) DO UPDATE
    SET value = excluded.value, collected_at = excluded.collected_at
    WHERE excluded.collected_at >= l.collected_at;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_forget_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM skiplock.samples_latest AS l
    USING removed AS r
    WHERE l.metric = r.metric AND l.labels = r.labels AND l.collected_at = r.collected_at;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_redo_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM skiplock.samples_latest AS l
    USING (SELECT o.metric, o.labels FROM before_update AS o
           UNION SELECT n.metric, n.labels FROM after_update AS n) AS t
    WHERE l.metric = t.metric AND l.labels = t.labels;
    INSERT INTO skiplock.samples_latest (metric, labels, value, collected_at)
    SELECT DISTINCT ON (s.metric, s.labels) s.metric, s.labels, s.value, s.collected_at
    FROM skiplock.samples AS s
    JOIN (SELECT o.metric, o.labels FROM before_update AS o
          UNION SELECT n.metric, n.labels FROM after_update AS n) AS t
      ON t.metric = s.metric AND t.labels = s.labels
    ORDER BY s.metric, s.labels, s.collected_at DESC;
    RETURN NULL;
END;
$$;

CREATE FUNCTION skiplock.samples_clear_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE skiplock.samples_latest;
    RETURN NULL;
END;
$$;

CREATE TRIGGER samples_keep_latest AFTER INSERT ON skiplock.samples
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_keep_latest();
CREATE TRIGGER samples_forget_latest AFTER DELETE ON skiplock.samples
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_forget_latest();
CREATE TRIGGER samples_redo_latest AFTER UPDATE ON skiplock.samples
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_redo_latest();
CREATE TRIGGER samples_clear_latest AFTER TRUNCATE ON skiplock.samples
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.samples_clear_latest();
