-- 028: weighted round-robin between the groups of a fair queue (issue 31, item 3;
-- docs/queue.md, "Fair queues").
--
-- A group with weight w gets w turns for every turn of a weight-1 group when they compete. A
-- row per weighted group: a group without a row has weight 1, so the hundreds of tenants that
-- pay the same need nothing here, and a weight back to 1 deletes its row. The weight gives
-- turns, never room: the per-group cap stays the queue's group_concurrency.
CREATE TABLE skiplock.group_weights (
    queue      text        NOT NULL,
    group_key  text        NOT NULL CHECK (group_key <> ''),
    weight     integer     NOT NULL CHECK (weight BETWEEN 1 AND 100),
    set_at     timestamptz NOT NULL DEFAULT now(),
    set_by     text,
    PRIMARY KEY (queue, group_key)
);

-- The rotation's place within a visit: a weighted group keeps the turn for `weight` claims in
-- a row, so the claim must know how many of its current visit the group served last
-- (`fair_cursor`) has had. `fair_turns_of` names the group the count belongs to: an earlier
-- release's worker moves fair_cursor without knowing this count, and a count left for another
-- group is then ignored (read as a full visit: the rotation of migration 025, unweighted).
-- Nullable, no default: adding them rewrites nothing, and earlier releases never name them.
ALTER TABLE skiplock.queues
    ADD COLUMN fair_turns integer,
    ADD COLUMN fair_turns_of text;
