-- Users, API tokens and login attempts of the web console (migration 005).

-- name: upsert_user
INSERT INTO skiplock.users (name, password_hash, role)
VALUES (%(name)s, %(password_hash)s, %(role)s)
ON CONFLICT (name) DO UPDATE
SET password_hash = coalesce(EXCLUDED.password_hash, skiplock.users.password_hash),
    role = EXCLUDED.role,
    disabled = false,
    updated_at = now()
RETURNING name, role, (xmax = 0) AS created;

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
     WHERE t.user_name = u.name AND t.revoked_at IS NULL) AS tokens
FROM skiplock.users AS u
ORDER BY u.name;

-- name: set_role
UPDATE skiplock.users
SET role = %(role)s, updated_at = now()
WHERE name = %(name)s
RETURNING name;

-- name: set_disabled
UPDATE skiplock.users
SET disabled = %(disabled)s, updated_at = now()
WHERE name = %(name)s
RETURNING name;

-- name: set_password_hash
UPDATE skiplock.users
SET password_hash = %(password_hash)s, updated_at = now()
WHERE name = %(name)s
RETURNING name;

-- name: insert_token
INSERT INTO skiplock.api_tokens (user_name, token_sha256, label)
VALUES (%(name)s, %(token_sha256)s, %(label)s)
RETURNING id;

-- name: user_by_token
-- The user a live token belongs to; also stamps last_used_at (at most once a minute, so a
-- script polling every second does not write a row version per request).
WITH found AS (
    SELECT t.id, t.user_name
    FROM skiplock.api_tokens AS t
    WHERE t.token_sha256 = %(token_sha256)s
      AND t.revoked_at IS NULL
), touched AS (
    UPDATE skiplock.api_tokens AS t
    SET last_used_at = now()
    FROM found
    WHERE t.id = found.id
      AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')
)
SELECT
    u.name,
    u.role,
    u.disabled,
    found.id AS token_id
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
    t.revoked_at
FROM skiplock.api_tokens AS t
WHERE (%(name)s::text IS NULL OR t.user_name = %(name)s)
ORDER BY t.id;

-- name: recent_failures
-- Failed sign-ins within the window, by address and by user name (partial indexes on NOT ok).
SELECT
    (SELECT count(*) FROM skiplock.login_attempts AS a
     WHERE NOT a.ok AND a.ip = %(ip)s AND a.at > now() - make_interval(secs => %(window)s)) AS by_ip,
    (SELECT count(*) FROM skiplock.login_attempts AS a
     WHERE NOT a.ok AND a.user_name = %(name)s AND a.at > now() - make_interval(secs => %(window)s)) AS by_user;

-- name: record_attempt
INSERT INTO skiplock.login_attempts (ip, user_name, ok)
VALUES (%(ip)s, %(name)s, %(ok)s);

-- name: prune_attempts
-- Bounded: at most 1000 old rows per sign-in.
DELETE FROM skiplock.login_attempts
WHERE id IN (
    SELECT a.id
    FROM skiplock.login_attempts AS a
    WHERE a.at < now() - make_interval(secs => %(keep)s)
    ORDER BY a.at
    LIMIT 1000
);
