-- 036: the overview's model of the newest collection cycle, built once per cycle by the
-- scheduler's leader and read by every web process (console/web/cycle_store.py, issue 31
-- target 2: sixty people polling the overview).
--
-- One row per model name (the overview of the last hour, say): the scheduler replaces it after
-- every cycle's alert evaluation, so the table never holds more rows than there are names.
-- A row says what it was built after: the generation's marks (console/web/cycle.py: the newest
-- sample, evaluation, audited action and silence), when it was built (a web process shows it
-- only while it is younger than one clock bucket) and a fingerprint of the settings it was
-- built with (the rules of the config file, the redacted keys, the rate window), so that a web
-- process with other settings builds its own instead. `model` is tagged JSON (never pickle:
-- a web process must not run code a row names), `json` rather than `jsonb` so that it is
-- stored and read back as written (keys in their order, no parse into the binary form).
CREATE TABLE skiplock.cycle_models (
    name text PRIMARY KEY,
    id bigint GENERATED ALWAYS AS IDENTITY,
    measured timestamptz,
    evaluated timestamptz,
    audited bigint,
    silenced bigint,
    settings text NOT NULL,
    built_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    build_ms double precision NOT NULL,
    model json NOT NULL
);
