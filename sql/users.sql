-- Users, API tokens, web sessions and sign-in throttling of the web console (migrations 005, 010).
-- Every change of a password, a role or the disabled flag ends the user's web sessions in the
-- same statement (the `ended` CTE), so no face can forget to.

-- name: upsert_user
-- `old` reads the row as it was before this statement (one snapshot for every CTE): a new
-- password or another role ends the existing sessions.
WITH old AS (
    SELECT u.role
    FROM skiplock.users AS u
    WHERE u.name = %(name)s
), saved AS (
    INSERT INTO skiplock.users (name, password_hash, role)
    VALUES (%(name)s, %(password_hash)s, %(role)s)
    ON CONFLICT (name) DO UPDATE
    SET password_hash = coalesce(EXCLUDED.password_hash, skiplock.users.password_hash),
        role = EXCLUDED.role,
        disabled = false,
        updated_at = now()
    RETURNING name, role, (xmax = 0) AS created
), ended AS (
    UPDATE skiplock.web_sessions AS s
    SET revoked_at = now()
    FROM saved
    WHERE s.user_name = saved.name
      AND s.revoked_at IS NULL
      AND (%(password_hash)s::text IS NOT NULL OR saved.role IS DISTINCT FROM (SELECT old.role FROM old))
    RETURNING s.id
)
SELECT
    saved.name,
    saved.role,
    saved.created,
    (SELECT count(*) FROM ended) AS sessions_ended
FROM saved;

-- name: get_user
SELECT
    u.name,
    u.password_hash,
    u.role,
    u.created_at,
    u.disabled
FROM skiplock.users AS u
WHERE u.name = %(name)s;

-- name: list_users
SELECT
    u.name,
    u.role,
    u.created_at,
    u.updated_at,
    u.disabled,
    (u.password_hash IS NOT NULL) AS has_password,
    (SELECT count(*) FROM skiplock.api_tokens AS t
     WHERE t.user_name = u.name
       AND t.revoked_at IS NULL
       AND (t.expires_at IS NULL OR t.expires_at > now())) AS tokens
FROM skiplock.users AS u
ORDER BY u.name;

-- name: set_role
-- Another role ends the user's sessions (the same role again leaves them alone).
WITH old AS (
    SELECT u.name, u.role
    FROM skiplock.users AS u
    WHERE u.name = %(name)s
), changed AS (
    UPDATE skiplock.users AS u
    SET role = %(role)s, updated_at = now()
    FROM old
    WHERE u.name = old.name
    RETURNING u.name, old.role AS old_role
), ended AS (
    UPDATE skiplock.web_sessions AS s
    SET revoked_at = now()
    FROM changed
    WHERE s.user_name = changed.name
      AND s.revoked_at IS NULL
      AND changed.old_role <> %(role)s
    RETURNING s.id
)
SELECT
    changed.name,
    (SELECT count(*) FROM ended) AS sessions_ended
FROM changed;

-- name: set_disabled
-- Disabling ends the user's sessions.
WITH changed AS (
    UPDATE skiplock.users
    SET disabled = %(disabled)s, updated_at = now()
    WHERE name = %(name)s
    RETURNING name, disabled
), ended AS (
    UPDATE skiplock.web_sessions AS s
    SET revoked_at = now()
    FROM changed
    WHERE s.user_name = changed.name
      AND s.revoked_at IS NULL
      AND changed.disabled
    RETURNING s.id
)
SELECT
    changed.name,
    (SELECT count(*) FROM ended) AS sessions_ended
FROM changed;

-- name: set_password_hash
-- A new password ends the user's sessions.
WITH changed AS (
    UPDATE skiplock.users
    SET password_hash = %(password_hash)s, updated_at = now()
    WHERE name = %(name)s
    RETURNING name
), ended AS (
    UPDATE skiplock.web_sessions AS s
    SET revoked_at = now()
    FROM changed
    WHERE s.user_name = changed.name
      AND s.revoked_at IS NULL
    RETURNING s.id
)
SELECT
    changed.name,
    (SELECT count(*) FROM ended) AS sessions_ended
FROM changed;

-- name: rehash_password
-- The same password under the current argon2 parameters (at sign-in): sessions stay. Only if the
-- hash is still the one just verified: the password is checked without holding a connection,
-- and a new password set meanwhile must not be overwritten by the old one's rehash.
UPDATE skiplock.users
SET password_hash = %(password_hash)s
WHERE name = %(name)s
  AND password_hash = %(old_hash)s
RETURNING name;

-- name: insert_token
INSERT INTO skiplock.api_tokens (user_name, token_sha256, label, read_only, expires_at)
VALUES (
    %(name)s,
    %(token_sha256)s,
    %(label)s,
    %(read_only)s,
    CASE WHEN %(expires_in)s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %(expires_in)s) END
)
RETURNING id, expires_at;

-- name: user_by_token
-- The user a live token belongs to; also stamps last_used_at (at most once a minute, so a
-- script polling every second does not write a row version per request).
WITH found AS (
    SELECT
        t.id,
        t.user_name,
        t.read_only,
        coalesce(t.expires_at <= now(), false) AS expired
    FROM skiplock.api_tokens AS t
    WHERE t.token_sha256 = %(token_sha256)s
      AND t.revoked_at IS NULL
), touched AS (
    UPDATE skiplock.api_tokens AS t
    SET last_used_at = now()
    FROM found
    WHERE t.id = found.id
      AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')
      AND NOT found.expired
)
SELECT
    u.name,
    u.role,
    u.disabled,
    found.id AS token_id,
    found.read_only,
    found.expired
FROM found
JOIN skiplock.users AS u ON u.name = found.user_name;

-- name: revoke_token
UPDATE skiplock.api_tokens
SET revoked_at = now()
WHERE id = %(id)s
  AND revoked_at IS NULL
RETURNING id;

-- name: token_label
-- What the audit log calls a live token: its id and label (never the secret).
SELECT
    t.id,
    t.label
FROM skiplock.api_tokens AS t
WHERE t.token_sha256 = %(token_sha256)s
  AND t.revoked_at IS NULL
ORDER BY t.id
LIMIT 1;

-- name: list_tokens
SELECT
    t.id,
    t.user_name,
    t.label,
    t.created_at,
    t.last_used_at,
    t.revoked_at,
    t.expires_at,
    t.read_only,
    coalesce(t.expires_at <= now(), false) AS expired
FROM skiplock.api_tokens AS t
WHERE (%(name)s::text IS NULL OR t.user_name = %(name)s)
ORDER BY t.id;


-- name: insert_session
INSERT INTO skiplock.web_sessions (id, user_name, ip, user_agent)
VALUES (%(id)s, %(name)s, %(ip)s, %(user_agent)s);

-- name: prune_sessions
-- Bounded: at most 1000 sessions past their absolute lifetime (plus a day, so `users sessions`
-- still shows yesterday's) per sign-in.
DELETE FROM skiplock.web_sessions
WHERE id IN (
    SELECT s.id
    FROM skiplock.web_sessions AS s
    WHERE s.created_at < now() - make_interval(secs => %(max)s) - interval '1 day'
    ORDER BY s.created_at
    LIMIT 1000
);

-- name: session_user
-- The user of a live session: not revoked, younger than web.session_max, seen within
-- web.session_idle. Stamps last_seen_at when `touch` (not a background poll) and the stamp is
-- over a minute old, so a busy tab writes at most one row version a minute.
WITH found AS (
    SELECT s.id, s.user_name
    FROM skiplock.web_sessions AS s
    WHERE s.id = %(id)s
      AND s.revoked_at IS NULL
      AND s.created_at > now() - make_interval(secs => %(max)s)
      AND s.last_seen_at > now() - make_interval(secs => %(idle)s)
), touched AS (
    UPDATE skiplock.web_sessions AS s
    SET last_seen_at = now()
    FROM found
    WHERE s.id = found.id
      AND %(touch)s
      AND s.last_seen_at < now() - interval '1 minute'
)
SELECT
    u.name,
    u.role,
    u.disabled
FROM found
JOIN skiplock.users AS u ON u.name = found.user_name;

-- name: end_session
UPDATE skiplock.web_sessions
SET revoked_at = now()
WHERE id = %(id)s
  AND revoked_at IS NULL
RETURNING id;

-- name: end_user_sessions
-- Every live session of the user, or only those whose id starts with `prefix`.
UPDATE skiplock.web_sessions
SET revoked_at = now()
WHERE user_name = %(name)s
  AND revoked_at IS NULL
  AND (%(prefix)s::text IS NULL OR starts_with(id, %(prefix)s))
RETURNING id;

-- name: list_sessions
SELECT
    s.id,
    s.user_name,
    s.created_at,
    s.last_seen_at,
    s.ip,
    s.user_agent,
    s.revoked_at,
    CASE
        WHEN s.revoked_at IS NOT NULL THEN 'revoked'
        WHEN s.created_at <= now() - make_interval(secs => %(max)s) THEN 'expired'
        WHEN s.last_seen_at <= now() - make_interval(secs => %(idle)s) THEN 'idle'
        ELSE 'live'
    END AS state
FROM skiplock.web_sessions AS s
WHERE s.user_name = %(name)s
ORDER BY s.created_at DESC, s.id
LIMIT 200;

-- name: throttle_address
-- Check one sign-in attempt from an address against web.login_max_per_ip in one statement (the
-- row lock of the upsert serialises parallel attempts), in a fixed window of web.login_window
-- seconds. `failures` holds the failed attempts of the window plus the `pending` ones whose
-- password is being checked now: a pending attempt holds its place, so parallel guesses cannot
-- overshoot, and gives it back when its password was right (login_succeeded). Outcomes:
--   allowed: there was room; the attempt is counted as failed and pending.
--   busy: no room, but only because of pending checks (failures - pending < max): the caller
--     waits for them and asks again; nothing is counted. Sixty people behind one NAT address
--     signing in at once wait for each other's checks instead of being refused.
--   neither: the failures of the window alone reach the ceiling; refused until it ends.
-- A new window starts both counts at zero: a pending check lost with its process (a killed
-- worker) then holds a place for one window at most.
INSERT INTO skiplock.login_throttle AS t (scope, subject, failures, pending, window_start, last_at, allowed)
VALUES ('addr', %(subject)s, 1, 1, now(), now(), 1 <= %(max)s)
ON CONFLICT (scope, subject) DO UPDATE
SET (failures, pending, window_start, last_at, allowed) = (
    SELECT
        CASE WHEN n.failures < %(max)s THEN n.failures + 1 ELSE n.failures END,
        CASE WHEN n.failures < %(max)s THEN n.pending + 1 ELSE n.pending END,
        n.window_start,
        now(),
        n.failures < %(max)s
    FROM (
        SELECT
            CASE WHEN w.expired THEN 0 ELSE t.failures END AS failures,
            CASE WHEN w.expired THEN 0 ELSE t.pending END AS pending,
            CASE WHEN w.expired THEN now() ELSE t.window_start END AS window_start
        FROM (SELECT t.window_start <= now() - make_interval(secs => %(window)s) AS expired) AS w
    ) AS n
)
RETURNING
    t.allowed,
    NOT t.allowed AND t.failures - t.pending < %(max)s AS busy,
    greatest(1, ceil(extract(epoch FROM t.window_start + make_interval(secs => %(window)s) - now())))::int AS retry_after;

-- name: throttle_pair
-- Check and count one attempt of a (user name, address) pair in one statement. While
-- blocked_until is in the future the attempt is refused and not counted. Otherwise it counts as
-- a failure until login_succeeded says otherwise; from the `free`-th failure on, each one blocks
-- the pair for 2, 4, 8 ... seconds, at most `cap`. A pair quiet for `window` seconds starts over.
INSERT INTO skiplock.login_throttle AS t (scope, subject, failures, window_start, last_at, blocked_until, allowed)
VALUES (
    'pair',
    %(subject)s,
    1,
    now(),
    now(),
    CASE WHEN 1 >= %(free)s THEN now() + make_interval(secs => least(%(cap)s, 2)) END,
    true
)
ON CONFLICT (scope, subject) DO UPDATE
SET (failures, last_at, blocked_until, allowed) = (
    SELECT
        n.failures,
        now(),
        CASE
            WHEN n.blocked THEN t.blocked_until
            WHEN n.failures >= %(free)s
                THEN now() + make_interval(secs => least(%(cap)s, power(2, least(n.failures - %(free)s + 1, 30))))
        END,
        NOT n.blocked
    FROM (
        SELECT
            q.blocked,
            CASE WHEN q.quiet THEN 1 WHEN q.blocked THEN t.failures ELSE t.failures + 1 END AS failures
        FROM (
            SELECT
                greatest(t.last_at, t.blocked_until) <= now() - make_interval(secs => %(window)s) AS quiet,
                coalesce(t.blocked_until > now(), false) AS blocked
        ) AS q
    ) AS n
)
RETURNING
    t.allowed,
    t.failures,
    greatest(1, ceil(extract(epoch FROM t.blocked_until - now())))::int AS retry_after;

-- name: login_succeeded
-- The pending attempt was right: the pair starts over, and the address gets back the place the
-- attempt held (a right password is not a failure, so any number of people behind one address
-- may sign in).
WITH pair AS (
    DELETE FROM skiplock.login_throttle
    WHERE scope = 'pair'
      AND subject = %(pair)s
)
UPDATE skiplock.login_throttle
SET failures = greatest(failures - 1, 0),
    pending = greatest(pending - 1, 0)
WHERE scope = 'addr'
  AND subject = %(addr)s;

-- name: login_failed
-- The pending attempt failed (a wrong password or user name, or refused by its pair's backoff):
-- it stays counted in the address's failures and is no longer pending.
UPDATE skiplock.login_throttle
SET pending = greatest(pending - 1, 0)
WHERE scope = 'addr'
  AND subject = %(addr)s;

-- name: prune_throttle
-- Bounded: at most 1000 counters untouched for `keep` seconds (and not blocked) per attempt.
DELETE FROM skiplock.login_throttle
WHERE (scope, subject) IN (
    SELECT t.scope, t.subject
    FROM skiplock.login_throttle AS t
    WHERE t.last_at < now() - make_interval(secs => %(keep)s)
      AND (t.blocked_until IS NULL OR t.blocked_until < now())
    ORDER BY t.last_at
    LIMIT 1000
);

-- name: caps_live_tokens
-- caps.tokens_per_user: the user's tokens that still work (not revoked, not expired).
SELECT count(*) AS held
FROM skiplock.api_tokens AS t
WHERE t.user_name = %(name)s
  AND t.revoked_at IS NULL
  AND (t.expires_at IS NULL OR t.expires_at > now());

-- name: revoke_oldest_sessions
-- caps.sessions_per_user: a sign-in past the cap ends the user's oldest sessions still open.
UPDATE skiplock.web_sessions AS s
SET revoked_at = now()
WHERE s.id IN (
    SELECT o.id
    FROM skiplock.web_sessions AS o
    WHERE o.user_name = %(name)s
      AND o.revoked_at IS NULL
    ORDER BY o.created_at DESC, o.id
    OFFSET %(keep)s
)
RETURNING s.id;
