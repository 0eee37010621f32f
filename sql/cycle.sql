-- The generation of what the pages built from the newest collection cycle show
-- (console/web/cycle.py): while it holds, every viewer is shown the same model, built once.

-- name: generation
-- Five values, each one index probe or a small aggregate: the newest sample (samples_time_idx:
-- a collection cycle, or samples a script stored), the newest alert evaluation (every evaluation stamps the
-- alerts it keeps), the newest audited action (the audit log's primary key: every change an
-- operator makes is audited), the newest silence (created by a script as well as by the
-- console) and the clock's %(bucket)s-second bucket (a silence's end, the age of the newest
-- measurement).
SELECT
    (SELECT max(m.collected_at) FROM skiplock.samples AS m) AS measured,
    (SELECT max(a.evaluated_at) FROM skiplock.alerts AS a) AS evaluated,
    (SELECT max(l.id) FROM skiplock.audit_log AS l) AS audited,
    (SELECT max(s.id) FROM skiplock.alert_silences AS s) AS silenced,
    floor(extract(epoch FROM clock_timestamp()) / %(bucket)s)::bigint AS bucket;
