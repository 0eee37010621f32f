-- 010: server-side web sessions, sign-in throttle counters, and API token scope and expiry.

-- One row per sign-in. The cookie carries a random token; the row is keyed by its SHA-256, so a
-- copy of this table does not let anyone sign in. A session is live while revoked_at is NULL,
-- created_at is within web.session_max and last_seen_at within web.session_idle
-- (console/users.py). Sign-out ends one; a password change, a role change and disabling the
-- user end all of the user's sessions in the same statement as the change.
CREATE TABLE skiplock.web_sessions (
    id             text        PRIMARY KEY,    -- sha256 hex of the cookie's token
    user_name      text        NOT NULL REFERENCES skiplock.users (name) ON DELETE CASCADE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    ip             text        NOT NULL DEFAULT '',
    user_agent     text        NOT NULL DEFAULT '',
    revoked_at     timestamptz
);
CREATE INDEX web_sessions_user_idx ON skiplock.web_sessions (user_name) WHERE revoked_at IS NULL;
CREATE INDEX web_sessions_created_idx ON skiplock.web_sessions (created_at);

-- Sign-in throttle counters, checked and counted in one upsert per attempt so parallel requests
-- cannot slip past a limit. scope 'pair': one (user name, client address) with exponential
-- backoff; scope 'addr': one client address (an IPv6 /64) across user names, a fixed window.
CREATE TABLE skiplock.login_throttle (
    scope          text        NOT NULL CHECK (scope IN ('pair', 'addr')),
    subject        text        NOT NULL,
    failures       integer     NOT NULL DEFAULT 0,
    window_start   timestamptz NOT NULL DEFAULT now(),
    last_at        timestamptz NOT NULL DEFAULT now(),
    blocked_until  timestamptz,
    allowed        boolean     NOT NULL DEFAULT true,   -- the verdict of the latest attempt
    PRIMARY KEY (scope, subject)
);
CREATE INDEX login_throttle_last_idx ON skiplock.login_throttle (last_at);

-- The per-user-name limit locked the real user out whenever a stranger guessed; its log of
-- attempts is replaced by the counters above.
DROP TABLE skiplock.login_attempts;

ALTER TABLE skiplock.api_tokens
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN read_only  boolean NOT NULL DEFAULT false;
