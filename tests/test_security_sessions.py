"""Server-side sessions (issue 11, item 3): sign-out, a new password, another role and
`skiplock users disable` end sessions; idle timeout and absolute lifetime (times moved in the
database, never slept); polls do not extend the idle timer; `skiplock users sessions`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from console import users as users_mod
from console.cli import main
from console.config import ConfigError, load_config
from tests.web_fixtures import CSRF, PASSWORD

PAGE = "/api/v1/openapi.json"  # any signed-in GET


def _login(client, name, password=PASSWORD):
    client.get("/login")
    with client.session_transaction() as session:
        token = session["csrf"]
    return client.post("/login", data={"name": name, "password": password, "csrf_token": token})


def _cli(dsn, *args):
    return CliRunner().invoke(main, ["--dsn", dsn, "users", *args], catch_exceptions=False)


def _sessions(conn, name):
    return conn.execute(
        "SELECT id, created_at, last_seen_at, revoked_at FROM skiplock.web_sessions WHERE user_name = %s ORDER BY created_at",
        (name,),
    ).fetchall()


def test_a_cookie_saved_before_sign_out_is_refused_after_it(web_app, personas, conn, client_as):
    elsewhere = client_as("operator")  # the same user signed in on another device
    bystander = client_as("viewer")
    client = web_app.test_client()
    assert _login(client, "operator").status_code == 302
    saved = client.get_cookie("skiplock_session").value
    with client.session_transaction() as session:
        csrf = session["csrf"]
        assert set(session.keys()) <= {"sid", "csrf", "_permanent"}  # no user name, no role in the cookie
    assert client.post("/logout", headers={"X-CSRF-Token": csrf}).status_code == 302
    replay = web_app.test_client()
    replay.set_cookie("skiplock_session", saved)
    assert replay.get(PAGE).status_code == 401
    assert replay.get("/").status_code == 302  # pages send it to the login form
    assert elsewhere.get(PAGE).status_code == 401  # sign-out ends every session of the user
    assert bystander.get(PAGE).status_code == 200  # and only that user's
    assert all(row[3] is not None for row in _sessions(conn, "operator"))  # revoked_at


def test_a_new_password_ends_the_users_sessions(client_as, conn):
    client, other = client_as("operator"), client_as("operator")
    bystander = client_as("viewer")
    assert client.get(PAGE).status_code == other.get(PAGE).status_code == 200
    users_mod.add_user(conn, "operator", "operator", "a brand new password")
    assert client.get(PAGE).status_code == other.get(PAGE).status_code == 401
    assert bystander.get(PAGE).status_code == 200  # only that user's sessions


def test_a_role_change_ends_the_users_sessions_but_the_same_role_does_not(client_as, conn):
    client = client_as("operator")
    users_mod.set_role(conn, "operator", "operator")
    users_mod.add_user(conn, "operator", "operator", None)  # `users add` again, same role, no password
    assert client.get(PAGE).status_code == 200
    assert users_mod.set_role(conn, "operator", "viewer") == 1
    assert client.get(PAGE).status_code == 401


def test_the_admin_page_changing_a_role_ends_that_users_sessions(client_as):
    operator, admin = client_as("operator"), client_as("admin")
    saved = admin.post("/admin/users", data={"name": "operator", "role": "viewer", "csrf_token": CSRF,
                                               "reason": "demoted"})
    assert saved.status_code == 302
    assert operator.get(PAGE).status_code == 401
    assert admin.get(PAGE).status_code == 200


def test_users_disable_ends_the_sessions_in_the_same_statement(client_as, conn, dsn):
    client = client_as("operator")
    result = _cli(dsn, "disable", "operator", "--reason", "left the team")
    assert result.exit_code == 0, result.output
    assert all(row[3] is not None for row in _sessions(conn, "operator"))  # revoked, not merely refused
    _cli(dsn, "enable", "operator", "--reason", "back")
    assert client.get(PAGE).status_code == 401  # enabling again does not revive them


def test_idle_timeout_and_absolute_lifetime(web_settings, personas, conn):
    from console.web import create_app

    web_settings.update({"web.session_idle": "1h", "web.session_max": "2d"})
    app = create_app(web_settings)
    try:
        idle = users_mod.start_session(conn, "viewer")
        old = users_mod.start_session(conn, "viewer")
        fresh = users_mod.start_session(conn, "viewer")
        conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '61 minutes' WHERE id = %s",
                     (users_mod._digest(idle),))
        # used a minute ago, but signed in three days ago
        conn.execute("UPDATE skiplock.web_sessions SET created_at = now() - interval '3 days', "
                     "last_seen_at = now() - interval '1 minute' WHERE id = %s", (users_mod._digest(old),))
        conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '59 minutes' WHERE id = %s",
                     (users_mod._digest(fresh),))
        answers = {}
        for label, token in (("idle", idle), ("old", old), ("fresh", fresh)):
            client = app.test_client()
            with client.session_transaction() as session:
                session["sid"] = token
            answers[label] = client.get(PAGE).status_code
        assert answers == {"idle": 401, "old": 401, "fresh": 200}
    finally:
        app.extensions["skiplock"].close()


def test_the_default_lifetimes_are_12h_idle_and_7d_absolute(client_as, conn):
    client = client_as("viewer")
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '11 hours 50 minutes'")
    assert client.get(PAGE).status_code == 200  # and that request counts as activity
    conn.execute("UPDATE skiplock.web_sessions SET created_at = now() - interval '6 days 23 hours'")
    assert client.get(PAGE).status_code == 200
    conn.execute("UPDATE skiplock.web_sessions SET created_at = now() - interval '7 days 1 minute'")
    assert client.get(PAGE).status_code == 401


def test_a_poll_does_not_extend_the_idle_timer_and_a_click_does(client_as, conn):
    client = client_as("viewer")
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '11 hours'")
    before = _sessions(conn, "viewer")[0][2]
    assert client.get(PAGE, headers={"HX-Request": "true", "X-Skiplock-Poll": "1"}).status_code == 200
    assert _sessions(conn, "viewer")[0][2] == before
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '12 hours 1 minute'")
    # polling for hours does not keep it alive: once idle, the poll is refused too
    assert client.get(PAGE, headers={"HX-Request": "true", "X-Skiplock-Poll": "1"}).status_code == 401


def test_activity_moves_last_seen_at_most_once_a_minute(client_as, conn):
    client = client_as("viewer")
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '30 seconds'")
    stamp = _sessions(conn, "viewer")[0][2]
    assert client.get(PAGE).status_code == 200
    assert _sessions(conn, "viewer")[0][2] == stamp  # under a minute old: no write
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '2 hours'")
    assert client.get(PAGE, headers={"HX-Request": "true"}).status_code == 200  # htmx, not a poll
    moved = conn.execute("SELECT now() - last_seen_at < interval '5 seconds' FROM skiplock.web_sessions").fetchone()[0]
    assert moved


def test_skiplock_js_marks_its_polls():
    from console.resources import resource_dir

    script = (resource_dir("static") / "skiplock.js").read_text()
    assert 'triggeringEvent' in script and '"X-Skiplock-Poll"' in script


def test_cli_lists_sessions_and_revokes_one_by_prefix_or_all(client_as, conn, dsn):
    first, second, third = client_as("operator"), client_as("operator"), client_as("operator")
    ids = [row[0] for row in _sessions(conn, "operator")]
    listing = _cli(dsn, "sessions", "operator")
    assert listing.exit_code == 0
    assert all(sid[:12] in listing.output for sid in ids) and listing.output.count("live") == 3
    assert "127.0.0.1" in listing.output and "pytest" in listing.output

    one = ids[[c.session_token for c in (first, second, third)].index(second.session_token)]
    assert users_mod._digest(second.session_token) == one
    ended = _cli(dsn, "sessions", "operator", "--revoke", one[:8], "--reason", "lost laptop")
    assert ended.exit_code == 0 and "ended 1 session" in ended.output
    assert [c.get(PAGE).status_code for c in (first, second, third)] == [200, 401, 200]
    assert "revoked" in _cli(dsn, "sessions", "operator").output

    bad = CliRunner().invoke(main, ["--dsn", dsn, "users", "sessions", "operator", "--revoke", "xyz", "--reason", "test run"])
    assert bad.exit_code != 0 and "hex digits" in bad.output

    unexplained = CliRunner().invoke(main, ["--dsn", dsn, "users", "sessions", "operator", "--revoke"])
    assert unexplained.exit_code == 2 and "--reason" in unexplained.output  # nothing ended without a why
    everything = _cli(dsn, "sessions", "operator", "--revoke", "--reason", "stolen cookie")
    assert everything.exit_code == 0 and "ended 2 sessions" in everything.output
    assert [c.get(PAGE).status_code for c in (first, second, third)] == [401, 401, 401]
    audit = conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE action = 'sessions_revoke'").fetchone()[0]
    assert audit == 2


def test_the_retired_session_hours_setting_names_its_replacements(tmp_path):
    path = tmp_path / "skiplock.toml"
    path.write_text("[web]\nsession_hours = 24\n")
    with pytest.raises(ConfigError, match=r"web\.session_idle.*web\.session_max"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=r"SKIPLOCK_WEB_SESSION_HOURS.*web\.session_idle"):
        load_config(env={"SKIPLOCK_WEB_SESSION_HOURS": "24"})


@pytest.fixture
def fast_polls(web_settings):
    web_settings["web.poll_fast"] = 0.3
    return web_settings


@pytest.mark.browser
def test_the_browsers_polls_say_so_and_leave_the_idle_timer_alone(fast_polls, live_server, page, personas, conn):
    import re

    page.goto(live_server + "/queues")
    page.fill("input[name=name]", "viewer")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(live_server + "/queues")))
    conn.execute("UPDATE skiplock.web_sessions SET last_seen_at = now() - interval '3 hours'")
    stamp = _sessions(conn, "viewer")[0][2]
    with page.expect_request(lambda r: r.headers.get("x-skiplock-poll") == "1", timeout=10_000) as polled:
        pass
    assert polled.value.headers.get("hx-request") == "true"
    with page.expect_response(lambda r: r.request.headers.get("x-skiplock-poll") == "1", timeout=10_000) as answered:
        pass
    assert answered.value.status == 200
    assert _sessions(conn, "viewer")[0][2] == stamp  # polls went on, the idle timer did not move
    page.reload()
    moved = conn.execute("SELECT now() - last_seen_at < interval '1 minute' FROM skiplock.web_sessions").fetchone()[0]
    assert moved  # a real page load is activity
