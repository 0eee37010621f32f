-- 005: the web console's users, API tokens and login attempts.
-- Roles are ordered viewer < operator < admin (console/users.py). Passwords are argon2id
-- hashes; API tokens are random 32-byte secrets stored as SHA-256 (a fast hash is enough for a
-- secret with 256 bits of entropy, and lets a request find its token by an index lookup).

CREATE TABLE skiplock.users (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.@+-]{1,64}$'),
    password_hash  text,                       -- NULL: can only sign in through the trusted header
    role           text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    disabled       boolean     NOT NULL DEFAULT false
);

CREATE TABLE skiplock.api_tokens (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_name      text        NOT NULL REFERENCES skiplock.users (name) ON DELETE CASCADE,
    token_sha256   text        NOT NULL UNIQUE,
    label          text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_used_at   timestamptz,
    revoked_at     timestamptz
);

-- Failed and successful sign-ins, for rate limiting across every web process (a limit kept in
-- one gunicorn worker's memory would multiply by the number of workers). Pruned in bounded
-- batches on each insert; only the last `web.login_window` seconds matter.
CREATE TABLE skiplock.login_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    ip             text        NOT NULL,
    user_name      text        NOT NULL,
    ok             boolean     NOT NULL
);
CREATE INDEX login_attempts_ip_idx ON skiplock.login_attempts (ip, at) WHERE NOT ok;
CREATE INDEX login_attempts_user_idx ON skiplock.login_attempts (user_name, at) WHERE NOT ok;
CREATE INDEX login_attempts_at_idx ON skiplock.login_attempts (at);
