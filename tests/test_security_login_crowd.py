"""Sixty people behind one address sign in; a guesser behind it is still refused; the hashing
cost is the documented one (issue 31, item 2; docs/security.md, "Sign-in throttling" and
"Password hashing cost").

The crowd test checks real argon2id hashes at the product's parameters (not the tests' cheap
ones, tests/conftest.py) over real HTTP, so that the checks overlap as they do when sixty
people sign in within a minute: each one's place in the address's ceiling is held while its
password is checked."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher
from argon2.profiles import RFC_9106_LOW_MEMORY

import console.users as users
from console.sqlfiles import query
from tests.test_security_login import ON_CALL, STRANGER, _attempt, _parallel_attempts
from tests.web_fixtures import PASSWORD

CROWD = 60
CEILING = 8  # web.login_max_per_ip in these tests: far fewer than the crowd


@pytest.fixture
def ceiling(web_settings):
    web_settings.update({"web.login_free_failures": 3, "web.login_backoff_cap": 20, "web.login_max_per_ip": CEILING,
                         "web.db_wait": 30.0, "database.pool_size": 16})  # more connections than the ceiling
    return web_settings


@pytest.fixture
def product_hashing(monkeypatch):
    """The product's argon2id parameters in this process, for this test only."""
    monkeypatch.setattr(users, "_hasher", users.product_hasher())
    users._dummy_hash.cache_clear()
    yield
    users._dummy_hash.cache_clear()


def _address_counts(conn, address: str) -> tuple[int, int]:
    row = conn.execute("SELECT failures, pending FROM skiplock.login_throttle WHERE scope = 'addr' AND subject = %s",
                       (address,)).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def test_sixty_people_behind_one_address_sign_in_at_once(ceiling, product_hashing, live_server, personas, conn):
    stored = users.hash_password(PASSWORD)  # one hash for all: each sign-in still checks it in full
    names = [f"oncall{i:02d}" for i in range(CROWD)]
    for name in names:
        conn.execute(query("users", "upsert_user"), {"name": name, "role": "viewer", "password_hash": stored})
    codes = _parallel_attempts(live_server, names, PASSWORD)
    assert codes == [302] * CROWD, {code: codes.count(code) for code in set(codes)}
    # right passwords leave nothing counted against the address...
    assert _address_counts(conn, "127.0.0.1") == (0, 0)
    # ...and a guesser behind the same address still gets exactly the ceiling
    guesses = _parallel_attempts(live_server, [f"nobody{i}" for i in range(CEILING + 4)], "wrong-password")
    assert guesses.count(401) == CEILING and guesses.count(429) == 4, guesses


def test_a_guessing_run_across_user_names_is_refused_even_between_right_sign_ins(ceiling, web_app, personas, conn):
    """Someone with an account of his own signs in between guesses: his right password gives
    back only its own place, never a failure, so the guesses still stop at the ceiling."""
    for i in range(CEILING):
        assert _attempt(web_app, f"nobody{i}", "wrong-password", STRANGER).status_code == 401
        if i < CEILING - 1:
            assert _attempt(web_app, "viewer", PASSWORD, STRANGER).status_code == 302
    assert _address_counts(conn, STRANGER) == (CEILING, 0)
    refused = _attempt(web_app, "nobody-more", "wrong-password", STRANGER)
    assert refused.status_code == 429 and b"failed sign-ins from this address" in refused.data
    # the right password from there waits out the window too; from elsewhere it signs in
    assert _attempt(web_app, "viewer", PASSWORD, STRANGER).status_code == 429
    assert _attempt(web_app, "viewer", PASSWORD, ON_CALL).status_code == 302


def test_a_legacy_hash_signs_in_and_is_rehashed(product_hashing, web_app, personas, conn):
    """Hashes made before the parameters were chosen (argon2-cffi's defaults) still verify, and
    the first right sign-in stores the password at the current parameters; a wrong one changes
    nothing."""
    legacy = PasswordHasher.from_parameters(RFC_9106_LOW_MEMORY).hash(PASSWORD)
    conn.execute("UPDATE skiplock.users SET password_hash = %s WHERE name = 'viewer'", (legacy,))
    current = f"$argon2id$v=19$m={users.HASH_MEMORY_KIB},t={users.HASH_TIME_COST},p={users.HASH_PARALLELISM}$"

    def stored() -> str:
        return conn.execute("SELECT password_hash FROM skiplock.users WHERE name = 'viewer'").fetchone()[0]

    assert _attempt(web_app, "viewer", "wrong-password", ON_CALL).status_code == 401
    assert stored() == legacy
    assert _attempt(web_app, "viewer", PASSWORD, ON_CALL).status_code == 302
    rehashed = stored()
    assert rehashed.startswith(current) and rehashed != legacy
    assert _attempt(web_app, "viewer", PASSWORD, ON_CALL).status_code == 302
    assert stored() == rehashed  # already current: not hashed again


def test_a_rehash_never_overwrites_a_password_changed_meanwhile(product_hashing, personas, conn):
    legacy = PasswordHasher.from_parameters(RFC_9106_LOW_MEMORY).hash(PASSWORD)
    conn.execute("UPDATE skiplock.users SET password_hash = %s WHERE name = 'viewer'", (legacy,))
    row = users.password_row(conn, "viewer")
    user, rehashed = users.check_password(row, PASSWORD)
    assert user is not None and rehashed
    users.set_password(conn, "viewer", "a brand new password")  # while the old one was being checked
    assert users.save_rehash(conn, row, rehashed) is False
    assert users.authenticate(conn, "viewer", "a brand new password") is not None
    assert users.authenticate(conn, "viewer", PASSWORD) is None


def test_the_password_is_checked_without_a_pooled_connection(web_app, personas, monkeypatch):
    from flask import g

    held: list[bool] = []
    check = users.check_password

    def spy(row, password):
        held.append(any(g.get(key) is not None for key in ("_skiplock_conn", "_skiplock_home_conn",
                                                             "_skiplock_replica_conn")))
        return check(row, password)

    monkeypatch.setattr(users, "check_password", spy)
    assert _attempt(web_app, "viewer", PASSWORD, ON_CALL).status_code == 302
    assert _attempt(web_app, "viewer", "wrong-password", ON_CALL).status_code == 401
    assert held == [False, False]


def test_pending_checks_make_an_attempt_wait_and_only_failures_refuse(conn):
    """The address counter's three outcomes (sql/users.sql, throttle_address), on the database."""
    limits = users.LoginLimits(per_ip=3)
    address = "203.0.113.9"
    assert [users.throttle(conn, address, f"u{i}", limits) for i in range(3)] == [None] * 3
    assert _address_counts(conn, address) == (3, 3)
    busy = users.throttle(conn, address, "u3", limits)  # every place held by a check in progress
    assert busy is not None and busy.busy and busy.retry_after == 1
    assert _address_counts(conn, address) == (3, 3)  # waiting counts nothing
    users.login_succeeded(conn, address, "u0")  # a right password gives its place back
    assert users.throttle(conn, address, "u3", limits) is None
    for _ in ("u1", "u2", "u3"):  # the other three were wrong
        users.login_failed(conn, address)
    assert _address_counts(conn, address) == (3, 0)
    refused = users.throttle(conn, address, "u4", limits)  # three failures: the ceiling itself
    assert refused is not None and not refused.busy and refused.retry_after > 1
    assert "failed sign-ins from this address" in refused.message
    # a new window starts both counts over
    conn.execute("UPDATE skiplock.login_throttle SET window_start = now() - interval '16 minutes' WHERE scope = 'addr'")
    assert users.throttle(conn, address, "u4", limits) is None
    assert _address_counts(conn, address) == (1, 1)
