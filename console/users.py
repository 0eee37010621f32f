"""Console users, roles, API tokens, web sessions and sign-in throttling (migrations 005, 010).

Roles are ordered: a viewer reads everything (payloads redacted), an operator also acts on
jobs and queues, an admin also manages users, alert rules and webhooks. `has_role(user_role,
needed)` is the only comparison anyone should make.

Passwords are hashed with argon2id at the parameters below (HASH_*: OWASP's minimum, chosen and
measured in docs/security.md, "Password hashing cost"); a hash made with other parameters still
verifies and is rehashed at its next sign-in. API tokens are shown once, when created, and
stored as SHA-256; a token may expire and may be read-only.

Web sessions are rows of `skiplock.web_sessions` keyed by the SHA-256 of a random token (the
cookie holds the token). A new password, another role or disabling the user ends every session
of that user in the same SQL statement as the change (sql/users.sql), so the web admin page,
the CLI and anything else calling these functions get it alike.

Sign-in throttling (`throttle`, then `login_succeeded` or `login_failed`) counts per (user name,
client address) with exponential backoff, and the failures per address across user names; an
IPv6 address counts by its /64. A stranger guessing one user's password therefore slows down
only himself, and sixty people behind one NAT address signing in with their right passwords are
never refused by the address's ceiling.

This module does not know about HTTP or cookies; `console.web.auth` does.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from psycopg.rows import dict_row

from console import caps
from console.caps import Caps
from console.sqlfiles import query

ROLES = ("viewer", "operator", "admin")
_RANK = {role: rank for rank, role in enumerate(ROLES)}
_NAME = re.compile(r"^[A-Za-z0-9_.@+-]{1,64}$")
MIN_PASSWORD = 8
TOKEN_PREFIX = "skl_"

# argon2id parameters of new hashes: OWASP's minimum configuration (19 MiB, 2 passes, 1 lane).
# argon2-cffi's defaults (RFC 9106's low-memory profile: 64 MiB, 3 passes, 4 lanes) cost ten
# times as much: 60 people signing in within a minute on 2 cores queued 20 s for their checks.
# Measured, and the trade-off stated, in docs/security.md ("Password hashing cost").
HASH_TIME_COST = 2
HASH_MEMORY_KIB = 19 * 1024
HASH_PARALLELISM = 1


def product_hasher() -> PasswordHasher:
    return PasswordHasher(time_cost=HASH_TIME_COST, memory_cost=HASH_MEMORY_KIB, parallelism=HASH_PARALLELISM)


_hasher = product_hasher()


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a wrong name costs as long as a wrong
    password. Made on first use, not at import: an argon2 hash costs tens of milliseconds (a
    second on a loaded machine), and every worker, CLI command and test subprocess imports
    this module through the CLI without ever checking a password."""
    return _hasher.hash(secrets.token_hex(16))


class UserError(ValueError):
    """A bad user name, role or password (the message says which)."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    via: str = "session"  # session | token | header
    read_only: bool = False  # a read-only API token: safe methods only

    def can(self, role: str) -> bool:
        return has_role(self.role, role)


def check_role(role: str) -> str:
    if role not in _RANK:
        raise UserError(f"role must be one of {', '.join(ROLES)} (got {role!r})")
    return role


def has_role(user_role: str | None, needed: str) -> bool:
    """True when `user_role` is at least `needed` (viewer < operator < admin)."""
    return user_role in _RANK and _RANK[user_role] >= _RANK[check_role(needed)]


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError("user name must be 1-64 characters: letters, digits, and _ . @ + -")
    return name


def hash_password(password: str) -> str:
    if not isinstance(password, str) or len(password) < MIN_PASSWORD:
        raise UserError(f"password must be at least {MIN_PASSWORD} characters")
    return _hasher.hash(password)


def add_user(conn: psycopg.Connection, name: str, role: str, password: str | None) -> bool:
    """Create the user, or update the role (and password, if given) of an existing one and
    re-enable it. Returns True when the user was created. password=None leaves a new user
    without a password: it can only sign in through the trusted proxy header."""
    check_name(name)
    check_role(role)
    password_hash = hash_password(password) if password is not None else None
    row = conn.execute(query("users", "upsert_user"), {"name": name, "role": role, "password_hash": password_hash}).fetchone()
    return bool(row[2])  # a new password or another role also ended the user's sessions (the SQL does)


def get_user(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "get_user"), {"name": name}).fetchone()


def list_users(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "list_users")).fetchall()


def _one(conn: psycopg.Connection, name_of_query: str, params: dict[str, Any], name: str) -> int:
    """Run a user change; returns how many sessions it ended."""
    row = conn.execute(query("users", name_of_query), params).fetchone()
    if row is None:
        raise UserError(f"no user named {name!r}")
    return int(row[1])


def set_role(conn: psycopg.Connection, name: str, role: str) -> int:
    """Another role ends the user's sessions; returns how many."""
    return _one(conn, "set_role", {"name": name, "role": check_role(role)}, name)


def set_disabled(conn: psycopg.Connection, name: str, disabled: bool) -> int:
    """Disabling ends the user's sessions; returns how many."""
    return _one(conn, "set_disabled", {"name": name, "disabled": disabled}, name)


def set_password(conn: psycopg.Connection, name: str, password: str) -> int:
    """A new password ends the user's sessions; returns how many."""
    return _one(conn, "set_password_hash", {"name": name, "password_hash": hash_password(password)}, name)


def authenticate(conn: psycopg.Connection, name: str, password: str) -> User | None:
    """The user when name and password match an enabled account, else None (same cost either way).
    Holds `conn` while hashing: fine for the CLI; the web sign-in uses the three steps below and
    gives its pooled connection back while the password is checked."""
    row = password_row(conn, name)
    user, rehashed = check_password(row, password)
    if user is not None and rehashed:
        save_rehash(conn, row, rehashed)
    return user


def password_row(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    """What `check_password` needs of the user `name` (None: no such user or an impossible name)."""
    return get_user(conn, name) if isinstance(name, str) and _NAME.match(name or "") else None


def check_password(row: dict[str, Any] | None, password: str) -> tuple[User | None, str | None]:
    """(the user, or None when the password is wrong, the user unknown, disabled or without a
    password; a new hash when the stored one has other parameters than HASH_*, else None).
    No database: the slow part of a sign-in, run without holding a connection. An unknown user
    is checked against a dummy hash, so a wrong name costs as long as a wrong password."""
    stored = row["password_hash"] if row and row["password_hash"] else _dummy_hash()
    try:
        _hasher.verify(stored, password or "")
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return None, None
    if row is None or row["disabled"] or not row["password_hash"]:
        return None, None
    rehashed = _hasher.hash(password) if _hasher.check_needs_rehash(stored) else None
    return User(row["name"], row["role"]), rehashed


def save_rehash(conn: psycopg.Connection, row: dict[str, Any], rehashed: str) -> bool:
    """Store the rehash of a verified password, unless the password changed since `row` was read."""
    return conn.execute(query("users", "rehash_password"),
                        {"name": row["name"], "password_hash": rehashed, "old_hash": row["password_hash"]}).fetchone() is not None


def active_user(conn: psycopg.Connection, name: str, via: str = "session") -> User | None:
    """The user if it exists and is enabled (role read fresh, so a demotion applies at once)."""
    row = get_user(conn, name)
    if row is None or row["disabled"]:
        return None
    return User(row["name"], row["role"], via)


# --- API tokens ------------------------------------------------------------------------------

def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_expiry(text: str | None) -> float | None:
    """'90d', '12h', '30m' (or a bare number of seconds) -> seconds; None or '' -> never."""
    from console.config import duration

    if text is None or str(text).strip() == "":
        return None
    try:
        seconds = duration(text).total_seconds()
    except ValueError:
        raise UserError(f"expiry must look like 90d, 12h or 30m (got {text!r})") from None
    if seconds <= 0:
        raise UserError(f"expiry must be longer than 0 (got {text!r})")
    return seconds


def create_token(conn: psycopg.Connection, name: str, label: str = "", *, read_only: bool = False,
                 expires_in: float | None = None, cap: int = Caps().tokens_per_user) -> str:
    """A new API token for `name`; the only time the secret is visible. `read_only` tokens may
    only read (GET/HEAD); `expires_in` seconds from now the token stops working (None: never).
    CapReached when the user already has `cap` live tokens (caps.tokens_per_user)."""
    if get_user(conn, check_name(name)) is None:
        raise UserError(f"no user named {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with conn.transaction():
        caps.serialise(conn, "tokens")
        held = conn.execute(query("users", "caps_live_tokens"), {"name": name}).fetchone()[0]
        caps.within(held, cap, what=f"live API tokens of {name!r}", setting="caps.tokens_per_user",
                    advice="revoke one first (skiplock users tokens; skiplock users revoke ID)")
        conn.execute(query("users", "insert_token"), {"name": name, "token_sha256": _digest(token), "label": label[:200],
                                                      "read_only": bool(read_only), "expires_in": expires_in})
    return token


class TokenExpired(Exception):
    """A token that exists and was not revoked, but is past its expiry."""


def user_for_token(conn: psycopg.Connection, token: str) -> User | None:
    """The token's user, None for an unknown, revoked or disabled one; TokenExpired when expired."""
    if not token or len(token) > 200:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("users", "user_by_token"), {"token_sha256": _digest(token)}).fetchone()
    if row is None or row["disabled"]:
        return None
    if row["expired"]:
        raise TokenExpired(row["token_id"])
    return User(row["name"], row["role"], "token", read_only=row["read_only"])


def token_label(conn: psycopg.Connection, token: str) -> str | None:
    """How the audit log names a live token: its label, else `#<id>`; None when not live."""
    if not token or len(token) > 200:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("users", "token_label"), {"token_sha256": _digest(token)}).fetchone()
    if row is None:
        return None
    return (row["label"] or "").strip() or f"#{row['id']}"


def revoke_token(conn: psycopg.Connection, token_id: int) -> bool:
    return conn.execute(query("users", "revoke_token"), {"id": token_id}).fetchone() is not None


def list_tokens(conn: psycopg.Connection, name: str | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "list_tokens"), {"name": name}).fetchall()


# --- web sessions ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SessionLimits:
    idle: float = 12 * 3600         # seconds without a (non-poll) request before a session ends
    max: float = 7 * 86400          # seconds after sign-in a session ends regardless
    per_user: int = Caps().sessions_per_user  # open sessions of one user; a new one ends the oldest


def start_session(conn: psycopg.Connection, name: str, ip: str = "", user_agent: str = "",
                  limits: SessionLimits = SessionLimits()) -> str:
    """A new session for `name`; returns the token for the cookie (only its SHA-256 is stored).
    The user keeps at most `limits.per_user` open sessions (caps.sessions_per_user): this one
    ends the oldest beyond it, so signing in again and again cannot grow the table without end,
    and never locks the user out."""
    token = secrets.token_urlsafe(32)
    with conn.transaction():
        caps.serialise(conn, "sessions")
        conn.execute(query("users", "insert_session"),
                     {"id": _digest(token), "name": name, "ip": ip[:64], "user_agent": user_agent[:300]})
        conn.execute(query("users", "revoke_oldest_sessions"), {"name": name, "keep": limits.per_user})
        conn.execute(query("users", "prune_sessions"), {"max": limits.max})
    return token


def session_user(conn: psycopg.Connection, token: str, limits: SessionLimits, *, touch: bool = True) -> User | None:
    """The user of a live session, None when it is unknown, revoked, idle or too old, or the user
    is disabled. `touch=False` (a background poll) leaves the idle timer alone."""
    if not token or not isinstance(token, str) or len(token) > 200:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("users", "session_user"),
                          {"id": _digest(token), "idle": limits.idle, "max": limits.max, "touch": touch}).fetchone()
    if row is None or row["disabled"]:
        return None
    return User(row["name"], row["role"], "session")


def end_session(conn: psycopg.Connection, token: str) -> bool:
    """Sign-out: this session's cookie stops working, even a copy saved before."""
    if not token or not isinstance(token, str):
        return False
    return conn.execute(query("users", "end_session"), {"id": _digest(token)}).fetchone() is not None


def end_user_sessions(conn: psycopg.Connection, name: str, prefix: str | None = None) -> list[str]:
    """End every live session of `name`, or the one whose id starts with `prefix`; returns the ids.

    A prefix must be at least 6 hex digits and must not match two live sessions."""
    if get_user(conn, check_name(name)) is None:
        raise UserError(f"no user named {name!r}")
    if prefix is not None:
        prefix = prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{6,64}", prefix):
            raise UserError(f"a session id prefix is 6 to 64 hex digits (got {prefix!r})")
        with conn.transaction():
            ended = [row[0] for row in conn.execute(query("users", "end_user_sessions"),
                                                    {"name": name, "prefix": prefix}).fetchall()]
            if len(ended) > 1:
                raise _Ambiguous(len(ended))
        return ended
    return [row[0] for row in conn.execute(query("users", "end_user_sessions"), {"name": name, "prefix": None}).fetchall()]


class _Ambiguous(UserError):
    def __init__(self, count: int):
        super().__init__(f"that prefix matches {count} live sessions: give more of the id")


def list_sessions(conn: psycopg.Connection, name: str, limits: SessionLimits) -> list[dict[str, Any]]:
    """The user's sessions, newest first, with state live | idle | expired | revoked."""
    if get_user(conn, check_name(name)) is None:
        raise UserError(f"no user named {name!r}")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "list_sessions"), {"name": name, "idle": limits.idle, "max": limits.max}).fetchall()


# --- sign-in throttling ----------------------------------------------------------------------

@dataclass(frozen=True)
class LoginLimits:
    window: int = 900        # seconds: the address window, and the quiet time after which a pair starts over
    per_ip: int = 20         # failed attempts per address (IPv6: per /64) per window, across user names
    free: int = 5            # failures of one (user name, address) before backoff starts
    cap: float = 300.0       # longest backoff of one pair, in seconds
    busy_wait: float = 15.0  # seconds an attempt waits for the address's pending checks before a 429


def client_key(address: str | None) -> str:
    """The address sign-in throttling counts by: IPv4 as is, IPv6 by its /64 network (one host
    usually owns a whole /64), an IPv4-mapped IPv6 address as the IPv4 address."""
    raw = (address or "").strip()
    try:
        ip = ipaddress.ip_address(raw.split("%", 1)[0])
    except ValueError:
        return raw[:64] or "unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _pair(name: str, address_key: str) -> str:
    return f"{address_key}|{name[:64]}"


@dataclass(frozen=True)
class Throttled:
    message: str
    retry_after: int
    # Only pending checks of the address's other attempts stand in the way: ask again shortly
    # (without holding a connection) rather than refuse; refuse if they are still there after
    # LoginLimits.busy_wait.
    busy: bool = False


BUSY_MESSAGE = "too many sign-ins from this address are being checked right now; try again in a moment"


def throttle(conn: psycopg.Connection, address_key: str, name: str, limits: LoginLimits) -> Throttled | None:
    """Check one sign-in attempt before the password is verified. Returns why it is refused (and
    how long to wait), or None when it may go ahead: it is then pending, and counts as a failure
    of the address until `login_succeeded` gives it back (`login_failed` keeps it counted). Each
    check is one upsert, so parallel attempts cannot exceed a limit. A `busy` answer counted
    nothing (sql/users.sql, throttle_address)."""
    allowed, busy, retry = conn.execute(query("users", "throttle_address"),
                                        {"subject": address_key, "window": limits.window, "max": limits.per_ip}).fetchone()
    if busy:
        return Throttled(BUSY_MESSAGE, 1, busy=True)
    if not allowed:
        return Throttled(f"too many failed sign-ins from this address; try again in {_human(retry)}", retry)
    allowed, _failures, retry = conn.execute(
        query("users", "throttle_pair"),
        {"subject": _pair(name, address_key), "window": limits.window, "free": limits.free, "cap": limits.cap},
    ).fetchone()
    conn.execute(query("users", "prune_throttle"), {"keep": max(limits.window, 86400)})
    if not allowed:
        # Guessing on against a blocked pair is what an attacker does: a failure of the address.
        login_failed(conn, address_key)
        return Throttled(f"too many failed sign-ins for this user from this address; try again in {_human(retry)}", retry)
    return None


def login_succeeded(conn: psycopg.Connection, address_key: str, name: str) -> None:
    """The pending attempt was right: the pair starts over and the address gets its place back."""
    conn.execute(query("users", "login_succeeded"), {"pair": _pair(name, address_key), "addr": address_key})


def login_failed(conn: psycopg.Connection, address_key: str) -> None:
    """The pending attempt failed: it stays counted against the address, no longer pending."""
    conn.execute(query("users", "login_failed"), {"addr": address_key})


def _human(seconds: int) -> str:
    return f"{seconds} s" if seconds < 120 else f"{(seconds + 59) // 60} min"
