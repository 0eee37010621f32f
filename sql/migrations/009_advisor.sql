-- 009: the advisor's memory between runs. Cumulative server counters (pg_stat_statements for
-- the claim, the MultiXact counter, WAL bytes) only say something as a difference between two
-- readings; the advisor keeps its last reading and a few derived figures (the claim's
-- buffers-per-call baseline) here, one small row per signal, so `skiplock check` run from cron
-- sees trends even where no collector runs.

CREATE TABLE skiplock.advisor_snapshots (
    name      text        PRIMARY KEY,
    taken_at  timestamptz NOT NULL DEFAULT now(),
    data      jsonb       NOT NULL DEFAULT '{}'::jsonb
);
