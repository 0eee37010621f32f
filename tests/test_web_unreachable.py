"""/healthz and the database-down page say "unreachable", never the connection error text, host
or user (anyone may read them); the reason goes to the log at WARNING, without the password."""

from __future__ import annotations

import logging
import socket

import psycopg

from console.users import start_session
from tests.web_fixtures import CSRF


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signed_in(app, token: str = "any-session-token"):
    """A client whose cookie names a session (looked up in the database on every request)."""
    client = app.test_client()
    with client.session_transaction() as session:
        session["sid"] = token
        session["csrf"] = CSRF
    return client


def _bodies(app) -> dict[str, tuple[int, str]]:
    client = _signed_in(app)
    out = {}
    for name, path, headers in (("healthz", "/healthz", {}), ("page", "/jobs", {}),
                                ("api", "/api/v1/jobs", {"Accept": "application/json"})):
        resp = client.get(path, headers=headers)
        out[name] = (resp.status_code, resp.get_data(as_text=True))
    return out


def test_closed_port_shows_no_host_user_or_error_text(web_settings, caplog):
    from console.web import create_app

    port = _closed_port()
    web_settings.update({"database.dsn": f"postgresql://skiplock_probe_user:hunter2secret@127.0.0.1:{port}/probe_db",
                         "web.db_wait": 0.3})
    app = create_app(web_settings)
    try:
        with caplog.at_level(logging.WARNING):
            bodies = _bodies(app)
    finally:
        app.extensions["skiplock"].close()
    for name, (status, body) in bodies.items():
        assert status == 503, name
        assert "unreachable" in body, name
        for secret in ("skiplock_probe_user", "hunter2secret", str(port), "probe_db", "127.0.0.1",
                       "no database connection", "Connection refused", "couldn't get a connection"):
            assert secret not in body, (name, secret, body[:500])
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "unreachable" in logged
    assert "hunter2secret" not in logged


def test_broken_connection_error_text_stays_in_the_log(web_settings, personas, admin_dsn, dsn, conn, caplog):
    """A pooled connection the server has killed: psycopg's words ("terminating connection due
    to administrator command") reach the log, not the page nor /healthz."""
    from console.web import create_app

    web_settings.update({"database.pool_size": 1, "web.db_wait": 2.0})
    app = create_app(web_settings)
    try:
        app.extensions["skiplock"].pool.wait(timeout=10)
        dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        bodies = {}
        token = start_session(conn, "operator", "127.0.0.1", "pytest")
        for name, path, headers in (("healthz", "/healthz", {}), ("page", "/jobs", {}),
                                    ("api", "/api/v1/jobs", {"Accept": "application/json"})):
            # the pool refills in the background after a broken connection: kill the new one too
            app.extensions["skiplock"].pool.wait(timeout=10)
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND application_name = 'skiplock-web'", (dbname,))
            with caplog.at_level(logging.WARNING):
                resp = _signed_in(app, token).get(path, headers=headers)
            bodies[name] = (resp.status_code, resp.get_data(as_text=True))
    finally:
        app.extensions["skiplock"].close()
    for name, (status, body) in bodies.items():
        assert status == 503, (name, body[:300])
        assert "unreachable" in body, name
        assert "terminating connection" not in body and "administrator command" not in body, (name, body[:500])
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "terminating connection" in logged or "server closed the connection" in logged, logged
