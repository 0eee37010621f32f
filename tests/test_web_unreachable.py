"""/healthz and the database-down page say "unreachable", never the connection error text, host
or user (anyone may read them); the reason goes to the log at WARNING, without the password."""

from __future__ import annotations

import logging
import socket
import threading
import time

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


def _terminate_web_sessions(admin_dsn: str, dbname: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        return admin.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE datname = %s AND application_name = 'skiplock-web'", (dbname,)).fetchone()[0]


def _terminate_sessions_blocked_by(admin_dsn: str, pid: int) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        return admin.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(l.pid)) FROM pg_locks AS l "
                             "WHERE NOT l.granted AND %s = ANY(pg_blocking_pids(l.pid))", (pid,)).fetchone()[0]


def test_after_the_pooled_sessions_die_every_request_is_served(web_settings, personas, admin_dsn, dsn, conn):
    """A PostgreSQL restart (here: every pooled session terminated) must not fail one request per
    pooled connection: the pool checks a connection before lending it and replaces a dead one."""
    from console.web import create_app

    web_settings.update({"database.pool_size": 3, "web.db_wait": 5.0})
    app = create_app(web_settings)
    try:
        pool = app.extensions["skiplock"].pool
        held = [pool.getconn(timeout=10) for _ in range(3)]  # three sessions in the pool, all idle
        for c in held:
            pool.putconn(c)
        dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        killed = _terminate_web_sessions(admin_dsn, dbname)
        assert killed == 3
        token = start_session(conn, "operator", "127.0.0.1", "pytest")
        client = _signed_in(app, token)
        statuses = [client.get(path, headers=headers).status_code
                    for _ in range(3)
                    for path, headers in (("/healthz", {}), ("/jobs", {}), ("/api/v1/jobs", {"Accept": "application/json"}))]
    finally:
        app.extensions["skiplock"].close()
    assert statuses == [200] * 9, statuses


def test_a_connection_lost_mid_request_keeps_its_error_text_in_the_log(web_settings, personas, admin_dsn, dsn, conn,
                                                                        caplog):
    """A session the server ends while a page waits on it: psycopg's words ("terminating
    connection due to administrator command") reach the log, not the page nor the API. The
    request waits on a lock held here, and the session is terminated while it waits."""
    from console.web import create_app

    web_settings.update({"database.pool_size": 1, "web.db_wait": 2.0})
    app = create_app(web_settings)
    token = start_session(conn, "operator", "127.0.0.1", "pytest")
    bodies = {}
    try:
        for name, path, headers in (("page", "/jobs", {}), ("api", "/api/v1/jobs", {"Accept": "application/json"})):
            results = []

            def get(path=path, headers=headers, results=results):
                results.append(_signed_in(app, token).get(path, headers=headers))

            with psycopg.connect(dsn, autocommit=True) as holder:
                with holder.transaction():
                    holder.execute("LOCK TABLE skiplock.jobs IN ACCESS EXCLUSIVE MODE")
                    request = threading.Thread(target=get)
                    with caplog.at_level(logging.WARNING):
                        request.start()
                        deadline = time.monotonic() + 10
                        while not _terminate_sessions_blocked_by(admin_dsn, holder.info.backend_pid):
                            assert time.monotonic() < deadline, "the request never waited on the lock"
                            time.sleep(0.01)
                        request.join(10)
            assert results, f"{name}: no response within 10 s"
            bodies[name] = (results[0].status_code, results[0].get_data(as_text=True))
    finally:
        app.extensions["skiplock"].close()
    for name, (status, body) in bodies.items():
        assert status == 503, (name, body[:300])
        assert "unreachable" in body, name
        assert "terminating connection" not in body and "administrator command" not in body, (name, body[:500])
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "terminating connection" in logged or "server closed the connection" in logged, logged
