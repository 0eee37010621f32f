-- 002: the audit log. Append-only from the application's point of view: the console's code
-- only ever INSERTs here, and a trigger refuses UPDATE and DELETE so a bug cannot rewrite it.

CREATE TABLE skiplock.audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,          -- operator login, "scheduler", "cli:<os user>"
    action      text        NOT NULL,          -- replay, purge, pause, resume, reap, archive, silence, ...
    target      text,                          -- e.g. "queue:mail", "job:42", "rule:queue_age"
    selection   jsonb,                         -- the filter or id list as understood
    reason      text,                          -- what the operator typed
    rows        bigint,                        -- rows affected
    outcome     text        NOT NULL DEFAULT 'ok' CHECK (outcome IN ('ok', 'error', 'cancelled', 'started')),
    detail      jsonb
);
CREATE INDEX audit_log_at_idx ON skiplock.audit_log (at DESC);
CREATE INDEX audit_log_action_idx ON skiplock.audit_log (action, at DESC);

CREATE FUNCTION skiplock.audit_log_is_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'skiplock.audit_log is append-only';
END;
$$;

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON skiplock.audit_log
    FOR EACH ROW EXECUTE FUNCTION skiplock.audit_log_is_append_only();
