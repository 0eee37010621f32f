"""The console's foundation: sign-in, roles, CSRF, tokens, SSO header, errors, a database that
is down, /healthz, and the persona matrix over every argument-free GET route."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from console.cli import main
from console.config import ConfigError
from console.users import authenticate, has_role
from tests.web_fixtures import CSRF, PASSWORD


def _login(client, name, password=PASSWORD, next_url=None):
    client.get("/login")
    with client.session_transaction() as session:
        token = session["csrf"]
    data = {"name": name, "password": password, "csrf_token": token}
    if next_url:
        data["next"] = next_url
    return client.post("/login", data=data)


def test_roles_are_ordered():
    assert has_role("admin", "operator") and has_role("operator", "viewer")
    assert not has_role("viewer", "operator") and not has_role(None, "viewer")
    with pytest.raises(ValueError):
        has_role("viewer", "root")


def test_login_form_signs_in_and_out(web_app, personas, conn):
    client = web_app.test_client()
    assert client.get("/jobs").status_code in (302, 404)
    response = _login(client, "operator", next_url="/api/v1/openapi.json")
    assert response.status_code == 302
    assert response.headers["Location"] == "/api/v1/openapi.json"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert client.get("/api/v1/openapi.json").status_code == 200
    row = conn.execute("SELECT actor, action FROM skiplock.audit_log WHERE action = 'login'").fetchone()
    assert row == ("operator", "login")
    with client.session_transaction() as session:
        token = session["csrf"]
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/api/v1/openapi.json").status_code == 401


def test_login_refuses_offsite_next(web_app, personas):
    client = web_app.test_client()
    response = _login(client, "viewer", next_url="//evil.example/x")
    assert response.status_code == 302
    assert "evil" not in response.headers["Location"]


def test_wrong_password_and_unknown_user_are_refused_alike(web_app, personas):
    client = web_app.test_client()
    wrong = _login(client, "viewer", password="not the password")
    unknown = _login(client, "nobody", password="not the password")
    assert wrong.status_code == unknown.status_code == 401
    assert b"wrong user name or password" in wrong.data and b"wrong user name or password" in unknown.data


def test_login_without_csrf_token_is_refused(web_app, personas):
    client = web_app.test_client()
    client.get("/login")
    response = client.post("/login", data={"name": "viewer", "password": PASSWORD})
    assert response.status_code == 403
    assert b"CSRF" in response.data
    with client.session_transaction() as session:
        assert "user" not in session


# Sign-in throttling (per user name and address, per address): tests/test_security_login.py


def test_disabled_user_loses_its_session_at_once(client_as, conn):
    client = client_as("operator")
    assert client.get("/api/v1/openapi.json").status_code == 200
    conn.execute("UPDATE skiplock.users SET disabled = true WHERE name = 'operator'")
    assert client.get("/api/v1/openapi.json").status_code == 401
    assert client.get("/").status_code == 302


def test_post_without_csrf_is_refused_even_when_signed_in(client_as):
    client = client_as("admin")
    assert client.post("/logout").status_code == 403
    assert client.post("/logout", headers={"X-CSRF-Token": "wrong"}).status_code == 403
    assert client.post("/logout", headers={"X-CSRF-Token": CSRF}).status_code == 302


def test_pages_are_not_cached(client_as):
    response = client_as("viewer").get("/api/v1/openapi.json")
    assert response.headers["Cache-Control"] == "no-store"
    login = client_as(None).get("/login")
    assert login.headers["Cache-Control"] == "no-store"


def test_static_htmx_is_vendored_with_its_licence(web_app):
    client = web_app.test_client()
    assert client.get("/static/htmx-2.0.11.min.js").status_code == 200
    assert b"BSD" in client.get("/static/htmx-2.0.11.LICENSE").data


def test_healthz_says_whether_the_database_answers(web_app):
    response = web_app.test_client().get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "database": "ok"}


@pytest.fixture
def down_settings(web_settings):
    web_settings.update({"database.dsn": "postgresql://postgres@127.0.0.1:1/nothing", "web.db_wait": 0.2})
    return web_settings


def test_database_down_gives_a_page_saying_so(down_settings):
    from console.web import create_app

    app = create_app(down_settings)
    try:
        client = app.test_client()
        health = client.get("/healthz")
        assert health.status_code == 503 and health.get_json()["database"] == "unreachable"
        with client.session_transaction() as session:
            session["sid"] = "any-session-token"  # looked up in the database, which is down
            session["csrf"] = CSRF
        page = client.get("/")
        assert page.status_code == 503
        assert b"The database is unreachable" in page.data
        api = client.get("/api/v1/openapi.json")
        assert api.status_code == 503 and "unreachable" in api.get_json()["error"]
        # The login form itself still renders; signing in says the database is down.
        anon = app.test_client()
        assert anon.get("/login").status_code == 200
        assert _login(anon, "viewer").status_code == 503
    finally:
        app.extensions["skiplock"].close()


def test_production_mode_refuses_to_start_without_a_secret_key(dsn):
    from console.web import create_app

    with pytest.raises(ConfigError, match="web.secret_key"):
        create_app({"database.dsn": dsn, "web.production": True})
    app = create_app({"database.dsn": dsn, "web.production": True, "web.secret_key": "k" * 40})
    assert app.config["SESSION_COOKIE_SECURE"] is True
    app.extensions["skiplock"].close()


def test_api_token_authenticates_scripts(web_app, personas, conn):
    runner = CliRunner()
    result = runner.invoke(main, ["--dsn", web_app.extensions["skiplock"].dsn, "users", "token", "viewer", "--label", "ci",
                                  "--reason", "nightly report"])
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    client = web_app.test_client()
    ok = client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.get_json()["openapi"].startswith("3.")
    assert client.get("/api/v1/openapi.json", headers={"Authorization": "Bearer nope"}).status_code == 401
    token_id = conn.execute("SELECT id FROM skiplock.api_tokens").fetchone()[0]
    assert runner.invoke(main, ["--dsn", web_app.extensions["skiplock"].dsn, "users", "revoke", str(token_id),
                                 "--reason", "report retired"]).exit_code == 0
    assert client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    # A token works only on the API, never as a page session.
    assert client.get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 302


@pytest.fixture
def sso_settings(web_settings):
    web_settings["web.trusted_header"] = "X-Forwarded-User"
    return web_settings


def test_trusted_header_signs_in_known_users_only(sso_settings, web_app, personas):
    client = web_app.test_client()
    assert client.get("/api/v1/openapi.json", headers={"X-Forwarded-User": "viewer"}).status_code == 200
    refused = client.get("/api/v1/openapi.json", headers={"X-Forwarded-User": "mallory"})
    assert refused.status_code == 403 and "mallory" in refused.get_json()["error"]


def test_trusted_header_is_ignored_when_not_configured(web_app, personas):
    assert web_app.test_client().get("/api/v1/openapi.json", headers={"X-Forwarded-User": "admin"}).status_code == 401


def test_cli_users_add_takes_the_password_from_the_environment(dsn, conn):
    runner = CliRunner()
    result = runner.invoke(main, ["--dsn", dsn, "users", "add", "alice", "--role", "operator", "--reason", "on-call"],
                           env={"SKIPLOCK_PASSWORD": "s3cret-enough"})
    assert result.exit_code == 0, result.output
    assert "created user alice (operator)" in result.output
    assert authenticate(conn, "alice", "s3cret-enough").role == "operator"
    assert authenticate(conn, "alice", "wrong-password") is None
    stored = conn.execute("SELECT password_hash FROM skiplock.users WHERE name = 'alice'").fetchone()[0]
    assert stored.startswith("$argon2id$")
    bad = runner.invoke(main, ["--dsn", dsn, "users", "add", "bob", "--role", "root", "--reason", "test run"], env={"SKIPLOCK_PASSWORD": "x" * 10})
    assert bad.exit_code == 2 and "root" in bad.output
    short = runner.invoke(main, ["--dsn", dsn, "users", "add", "bob", "--role", "viewer", "--reason", "test run"], env={"SKIPLOCK_PASSWORD": "short"})
    assert short.exit_code == 2 and "at least 8 characters" in short.output
    audit = conn.execute("SELECT action, target FROM skiplock.audit_log").fetchall()
    assert ("user_add", "user:alice") in audit


def test_errors_are_messages_not_500(client_as):
    client = client_as("viewer")
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and b"404" in missing.data
    api_missing = client.get("/api/v1/nothing-here")
    assert api_missing.status_code == 404 and "error" in api_missing.get_json()


def test_openapi_describes_every_api_route(web_app, client_as):
    doc = client_as("viewer").get("/api/v1/openapi.json").get_json()
    api_rules = {r.rule for r in web_app.url_map.iter_rules() if r.rule.startswith("/api/v1/")}
    import re

    documented = set(doc["paths"])
    for rule in api_rules:
        assert re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule) in documented, f"{rule} has no @api_doc"


# --- the persona matrix ------------------------------------------------------------------

def _declared_role(view) -> str | None:
    if getattr(view, "_skiplock_public", False):
        return None
    return getattr(view, "_skiplock_role", None)


def test_every_rule_builds_the_url_werkzeug_builds(web_app):
    """The app's rules compile their URL builders lazily (console/web/routing.py leans on a private
    Werkzeug method): each rule must build, with and without unknown arguments (a query string),
    exactly what Werkzeug's own Rule builds."""
    from werkzeug.routing import Map, Rule

    from console.web.routing import LazyBuildRule

    rules = list(web_app.url_map.iter_rules())
    # Flask adds the static rule in its constructor, before the app can choose the class.
    assert len(rules) > 100 and all(isinstance(rule, LazyBuildRule) for rule in rules if rule.endpoint != "static")
    plain = Map([Rule(rule.rule, endpoint=rule.endpoint, defaults=rule.defaults, methods=rule.methods)
                 for rule in rules], converters=web_app.url_map.converters)
    lazy, eager = web_app.url_map.bind("console.test"), plain.bind("console.test")
    for rule in rules:
        values = {arg: 7 if type(rule._converters[arg]).__name__ == "IntegerConverter" else "a b/c"
                  for arg in rule.arguments if arg not in (rule.defaults or {})}
        for extra in ({}, {"q": "x&y", "page": 2}):
            assert lazy.build(rule.endpoint, {**values, **extra}, method=sorted(rule.methods)[0]) == \
                eager.build(rule.endpoint, {**values, **extra}, method=sorted(rule.methods)[0]), rule.rule


def test_every_route_declares_its_role(web_app):
    """A route must say @requires(...) or @public, so nobody relies on the defaults by accident."""
    undeclared = [
        rule.rule for rule in web_app.url_map.iter_rules()
        if rule.endpoint != "static"
        and not getattr(web_app.view_functions[rule.endpoint], "_skiplock_public", False)
        and _declared_role(web_app.view_functions[rule.endpoint]) is None
    ]
    assert undeclared == []


@pytest.mark.parametrize("persona", [None, "viewer", "operator", "admin"])
def test_persona_matrix_over_argument_free_get_routes(web_app, client_as, persona):
    """Anonymous: pages redirect to /login, the API says 401. A signed-in user below the
    route's role: 403. At or above it: 200 (or a redirect for / and similar)."""
    client = client_as(persona)
    checked = 0
    for rule in web_app.url_map.iter_rules():
        if "GET" not in rule.methods or rule.arguments or rule.endpoint == "static":
            continue
        view = web_app.view_functions[rule.endpoint]
        role = _declared_role(view)
        response = client.get(rule.rule)
        checked += 1
        where = f"{persona} GET {rule.rule}"
        if role is None:
            assert response.status_code in (200, 302, 503), where
        elif persona is None:
            expected = 401 if rule.rule.startswith("/api/") else 302
            assert response.status_code == expected, where
            if expected == 302:
                assert "/login" in response.headers["Location"], where
        elif not has_role(persona, role):
            assert response.status_code == 403, where
        else:
            assert response.status_code in (200, 302), f"{where}: {response.status_code} {response.data[:200]!r}"
    assert checked >= 3
