"""Production-safe defaults (issue 11, item 7) and the parts of item 8 about request origin and
API tokens: production mode is the default (gunicorn gets it, `skiplock serve` turns it off),
a secret key is required, cookies are Secure, HSTS over HTTPS, /metrics is closed unless a token
or metrics_public; cross-site unsafe requests are refused; read-only and expiring tokens."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from console import users as users_mod
from console.cli import main
from console.config import ConfigError
from tests.web_fixtures import CSRF

KEY = "k" * 40


@pytest.fixture
def make_app(dsn):
    from console.web import create_app

    apps = []

    def make(**settings):
        app = create_app({"database.dsn": dsn, **{f"web.{k}": v for k, v in settings.items()}})
        app.config["TESTING"] = True
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["skiplock"].close()


def test_production_is_the_default_and_refuses_to_start_without_a_secret_key(make_app):
    with pytest.raises(ConfigError) as refused:
        make_app()  # nothing says production: it is the default
    assert "web.secret_key" in str(refused.value) and "SKIPLOCK_WEB_SECRET_KEY" in str(refused.value)


def test_production_cookies_are_secure(make_app):
    cookie = make_app(secret_key=KEY).test_client().get("/login").headers["Set-Cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    dev = make_app(production=False).test_client().get("/login").headers["Set-Cookie"]
    assert "Secure" not in dev


def test_skiplock_serve_is_the_development_server_and_says_so(dsn, monkeypatch):
    from flask import Flask

    seen = {}

    def fake_run(app, **kwargs):
        seen["production"] = app.extensions["skiplock"].config.web.production
        seen["secure"] = app.config["SESSION_COOKIE_SECURE"]

    monkeypatch.setattr(Flask, "run", fake_run)
    result = CliRunner().invoke(main, ["--dsn", dsn, "serve", "--port", "8123"], env={"SKIPLOCK_WEB_SECRET_KEY": ""},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "development server" in result.output and "production mode off" in result.output
    assert seen == {"production": False, "secure": False}


def test_hsts_only_over_https_and_x_forwarded_proto_only_from_a_counted_proxy(make_app):
    direct = make_app(secret_key=KEY).test_client()
    assert "Strict-Transport-Security" not in direct.get("/healthz").headers
    assert "Strict-Transport-Security" not in direct.get("/healthz", headers={"X-Forwarded-Proto": "https"}).headers
    assert direct.get("/healthz", base_url="https://localhost").headers["Strict-Transport-Security"].startswith("max-age=")

    proxied = make_app(secret_key=KEY, proxy_count=1).test_client()
    assert "Strict-Transport-Security" in proxied.get("/healthz", headers={"X-Forwarded-Proto": "https"}).headers
    assert "Strict-Transport-Security" not in proxied.get("/healthz", headers={"X-Forwarded-Proto": "http"}).headers

    dev = make_app(production=False).test_client()
    assert "Strict-Transport-Security" not in dev.get("/healthz", base_url="https://localhost").headers


def test_metrics_need_a_token_in_production_unless_public(make_app):
    closed = make_app(secret_key=KEY).test_client().get("/metrics")
    assert closed.status_code == 401 and b"web.metrics_token" in closed.data and b"web.metrics_public" in closed.data

    client = make_app(secret_key=KEY, metrics_token="scrape-me").test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200

    assert make_app(secret_key=KEY, metrics_public=True).test_client().get("/metrics").status_code == 200


def test_cross_site_unsafe_requests_are_refused(client_as):
    client = client_as("admin")
    evil = client.post("/logout", headers={"X-CSRF-Token": CSRF, "Origin": "https://evil.example"})
    assert evil.status_code == 403 and b"Origin" in evil.data
    assert client.post("/logout", headers={"X-CSRF-Token": CSRF, "Origin": "null"}).status_code == 403
    assert client.post("/logout", headers={"X-CSRF-Token": CSRF, "Origin": "http://localhost:8080"}).status_code == 403
    cross = client.post("/logout", headers={"X-CSRF-Token": CSRF, "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403 and b"cross-site" in cross.data
    # the login form too (login CSRF)
    anonymous = client_as(None)
    login = anonymous.post("/login", data={"name": "admin", "password": "x" * 10, "csrf_token": CSRF},
                           headers={"Origin": "https://evil.example"})
    assert login.status_code == 403
    # our own origin, same-site and a user-typed navigation pass
    assert client.post("/logout", headers={"X-CSRF-Token": CSRF, "Sec-Fetch-Site": "same-site"}).status_code == 302
    again = client_as("admin")
    ok = again.post("/logout", headers={"X-CSRF-Token": CSRF, "Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 302


def test_origin_behind_a_proxy_is_the_public_one(web_settings, personas, conn):
    from console.web import create_app

    web_settings["web.proxy_count"] = 1
    app = create_app(web_settings)
    try:
        client = app.test_client()
        with client.session_transaction() as session:
            session["csrf"] = CSRF
            session["sid"] = users_mod.start_session(conn, "admin")
        headers = {"X-CSRF-Token": CSRF, "Origin": "https://console.example", "X-Forwarded-Proto": "https",
                   "X-Forwarded-Host": "console.example"}
        assert client.post("/logout", headers=headers).status_code == 302
    finally:
        app.extensions["skiplock"].close()


def test_token_requests_skip_the_origin_check(client_as, conn):
    token = users_mod.create_token(conn, "operator", "script")
    response = client_as(None).post("/api/v1/alerts/silences/999999/expire",
                                    headers={"Authorization": f"Bearer {token}", "Origin": "https://elsewhere.example"})
    assert response.status_code not in (401, 403)


def test_a_read_only_token_reads_and_may_not_write(client_as, conn):
    read_only = users_mod.create_token(conn, "operator", "grafana", read_only=True)
    writer = users_mod.create_token(conn, "operator", "script")
    client = client_as(None)
    assert client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {read_only}"}).status_code == 200
    refused = client.post("/api/v1/alerts/silences/999999/expire", headers={"Authorization": f"Bearer {read_only}"})
    assert refused.status_code == 403 and b"read-only" in refused.data
    allowed = client.post("/api/v1/alerts/silences/999999/expire", headers={"Authorization": f"Bearer {writer}"})
    assert allowed.status_code not in (401, 403)


def test_an_expired_token_gets_401_token_expired(client_as, conn):
    token = users_mod.create_token(conn, "viewer", "short", expires_in=3600)
    client = client_as(None)
    assert client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    conn.execute("UPDATE skiplock.api_tokens SET expires_at = now() - interval '1 second'")
    expired = client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert expired.status_code == 401 and b"token expired" in expired.data


def test_cli_token_scope_and_expiry(dsn, personas, conn):
    def cli(*args):
        return CliRunner().invoke(main, ["--dsn", dsn, "users", *args], catch_exceptions=False)

    made = cli("token", "viewer", "--read-only", "--expires", "90d", "--label", "grafana", "--reason", "dashboards")
    assert made.exit_code == 0 and made.output.startswith(users_mod.TOKEN_PREFIX)
    read_only, days = conn.execute(
        "SELECT read_only, extract(epoch FROM expires_at - created_at) / 86400 FROM skiplock.api_tokens").fetchone()
    assert read_only and round(days) == 90
    cli("token", "viewer", "--label", "forever", "--reason", "test run")
    listing = cli("tokens").output.splitlines()
    assert "read-only" in listing[0] and "expires " in listing[0] and "grafana" in listing[0]
    assert "read-write" in listing[1] and "never expires" in listing[1]
    bad = CliRunner().invoke(main, ["--dsn", dsn, "users", "token", "viewer", "--expires", "soon", "--reason", "test run"])
    assert bad.exit_code != 0 and "90d" in bad.output


def test_admin_form_makes_a_read_only_expiring_token(client_as, conn):
    response = client_as("admin").post("/admin/users/viewer/token",
                                       data={"csrf_token": CSRF, "label": "ro", "expires": "30d", "read_only": "1",
                                             "reason": "dashboards"})
    assert response.status_code == 200
    row = conn.execute("SELECT read_only, expires_at > now() + interval '29 days' FROM skiplock.api_tokens").fetchone()
    assert row == (True, True)
    bad = client_as("admin").post("/admin/users/viewer/token", data={"csrf_token": CSRF, "expires": "forever", "reason": "test run"})
    assert bad.status_code == 400
