-- The generation of what the pages built from the newest collection cycle show
-- (console/web/cycle.py): while it holds, every viewer is shown the same model, built once.

-- name: generation
-- Five values, each one index probe or a small aggregate: the newest sample (samples_time_idx:
-- a collection cycle, or samples a script stored), the newest alert evaluation (every evaluation stamps the
-- alerts it keeps), the newest audited action (the audit log's primary key: every change an
-- operator makes is audited) but the %(accounts)s ones, about accounts and sessions, which no
-- model shows (sixty people signing in made sixty models, each built by every web process),
-- the newest silence (created by a script as well as by the
-- console) and the clock's %(bucket)s-second bucket (a silence's end, the age of the newest
-- measurement).
SELECT
    (SELECT max(m.collected_at) FROM skiplock.samples AS m) AS measured,
    (SELECT max(a.evaluated_at) FROM skiplock.alerts AS a) AS evaluated,
    (SELECT max(l.id) FROM skiplock.audit_log AS l WHERE l.action <> ALL (%(accounts)s)) AS audited,
    (SELECT max(s.id) FROM skiplock.alert_silences AS s) AS silenced,
    floor(extract(epoch FROM clock_timestamp()) / %(bucket)s)::bigint AS bucket;

-- name: stored_model
-- The newest stored model `name` a request of these marks may be shown, less than %(fresh)s
-- seconds old (what it says about time is at most that old), with these settings: built after
-- the same audited action and silence (an operator's change shows at once), and after these
-- samples and evaluation or the ones before them (the leader is building the new cycle's model
-- meanwhile: the previous one is shown, as a web process shows its previous model while it
-- builds). Its id, not its body (a primary-key probe; the body is read once per web process).
SELECT c.id
FROM skiplock.cycle_models AS c
WHERE c.name = %(name)s
  AND c.audited IS NOT DISTINCT FROM %(audited)s
  AND c.silenced IS NOT DISTINCT FROM %(silenced)s
  AND (c.measured IS NOT DISTINCT FROM %(measured)s OR c.measured < %(measured)s)
  AND (c.evaluated IS NOT DISTINCT FROM %(evaluated)s OR c.evaluated < %(evaluated)s)
  AND c.settings = %(settings)s
  AND c.built_at > clock_timestamp() - make_interval(secs => %(fresh)s);

-- name: stored_body
-- The body of the model found by `stored_model`; no row when the scheduler replaced it since.
SELECT c.model::text AS model FROM skiplock.cycle_models AS c WHERE c.name = %(name)s AND c.id = %(id)s;

-- name: store_model
-- The scheduler's model of a cycle, replacing the previous one of the same name (one statement).
INSERT INTO skiplock.cycle_models AS c (name, measured, evaluated, audited, silenced, settings, build_ms, model)
VALUES (%(name)s, %(measured)s, %(evaluated)s, %(audited)s, %(silenced)s, %(settings)s, %(build_ms)s, %(model)s::json)
ON CONFLICT (name) DO UPDATE SET
    id = DEFAULT, measured = EXCLUDED.measured, evaluated = EXCLUDED.evaluated, audited = EXCLUDED.audited,
    silenced = EXCLUDED.silenced, settings = EXCLUDED.settings, built_at = clock_timestamp(),
    build_ms = EXCLUDED.build_ms, model = EXCLUDED.model
RETURNING c.id;
