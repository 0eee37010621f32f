"""Console users, roles, API tokens and sign-in rate limiting (tables from migration 005).

Roles are ordered: a viewer reads everything (payloads redacted), an operator also acts on
jobs and queues, an admin also manages users, alert rules and webhooks. `has_role(user_role,
needed)` is the only comparison anyone should make.

Passwords are hashed with argon2id (argon2-cffi's defaults). API tokens are shown once, when
created, and stored as SHA-256.

This module does not know about HTTP or sessions; `console.web.auth` does.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from psycopg.rows import dict_row

from console.sqlfiles import query

ROLES = ("viewer", "operator", "admin")
_RANK = {role: rank for rank, role in enumerate(ROLES)}
_NAME = re.compile(r"^[A-Za-z0-9_.@+-]{1,64}$")
MIN_PASSWORD = 8
TOKEN_PREFIX = "skl_"

_hasher = PasswordHasher()
# Verified against when the user does not exist, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_hex(16))


class UserError(ValueError):
    """A bad user name, role or password (the message says which)."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    via: str = "session"  # session | token | header

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
    return bool(row[2])


def get_user(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "get_user"), {"name": name}).fetchone()


def list_users(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("users", "list_users")).fetchall()


def _one(conn: psycopg.Connection, name_of_query: str, params: dict[str, Any], name: str) -> None:
    if conn.execute(query("users", name_of_query), params).fetchone() is None:
        raise UserError(f"no user named {name!r}")


def set_role(conn: psycopg.Connection, name: str, role: str) -> None:
    _one(conn, "set_role", {"name": name, "role": check_role(role)}, name)


def set_disabled(conn: psycopg.Connection, name: str, disabled: bool) -> None:
    _one(conn, "set_disabled", {"name": name, "disabled": disabled}, name)


def set_password(conn: psycopg.Connection, name: str, password: str) -> None:
    _one(conn, "set_password_hash", {"name": name, "password_hash": hash_password(password)}, name)


def authenticate(conn: psycopg.Connection, name: str, password: str) -> User | None:
    """The user when name and password match an enabled account, else None (same cost either way)."""
    row = get_user(conn, name) if isinstance(name, str) and _NAME.match(name or "") else None
    stored = row["password_hash"] if row and row["password_hash"] else _DUMMY_HASH
    try:
        _hasher.verify(stored, password or "")
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return None
    if row is None or row["disabled"] or not row["password_hash"]:
        return None
    if _hasher.check_needs_rehash(stored):
        conn.execute(query("users", "set_password_hash"), {"name": name, "password_hash": _hasher.hash(password)})
    return User(row["name"], row["role"])


def active_user(conn: psycopg.Connection, name: str, via: str = "session") -> User | None:
    """The user if it exists and is enabled (role read fresh, so a demotion applies at once)."""
    row = get_user(conn, name)
    if row is None or row["disabled"]:
        return None
    return User(row["name"], row["role"], via)


# --- API tokens ------------------------------------------------------------------------------

def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(conn: psycopg.Connection, name: str, label: str = "") -> str:
    """A new API token for `name`; the only time the secret is visible."""
    if get_user(conn, check_name(name)) is None:
        raise UserError(f"no user named {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(query("users", "insert_token"), {"name": name, "token_sha256": _digest(token), "label": label[:200]})
    return token


def user_for_token(conn: psycopg.Connection, token: str) -> User | None:
    if not token or len(token) > 200:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("users", "user_by_token"), {"token_sha256": _digest(token)}).fetchone()
    if row is None or row["disabled"]:
        return None
    return User(row["name"], row["role"], "token")


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


# --- sign-in rate limiting -------------------------------------------------------------------

@dataclass(frozen=True)
class LoginLimits:
    window: int = 900       # seconds
    per_ip: int = 20        # failures per address per window
    per_user: int = 10      # failures per user name per window


def login_blocked(conn: psycopg.Connection, ip: str, name: str, limits: LoginLimits) -> str | None:
    """A message when this address or user name has failed too often recently, else None."""
    by_ip, by_user = conn.execute(
        query("users", "recent_failures"), {"ip": ip, "name": name[:64], "window": limits.window}
    ).fetchone()
    minutes = max(1, limits.window // 60)
    if by_ip >= limits.per_ip:
        return f"too many failed sign-ins from this address; try again within {minutes} min"
    if by_user >= limits.per_user:
        return f"too many failed sign-ins for this user; try again within {minutes} min"
    return None


def record_attempt(conn: psycopg.Connection, ip: str, name: str, ok: bool, limits: LoginLimits) -> None:
    with conn.transaction():
        conn.execute(query("users", "record_attempt"), {"ip": ip, "name": name[:64], "ok": ok})
        conn.execute(query("users", "prune_attempts"), {"keep": max(limits.window, 86400)})
