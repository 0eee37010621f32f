"""Fixtures for the web console's tests: an app on the test's database, personas, signed-in
clients, a live server for Playwright, and Chromium's launch arguments (TOOLCHAIN.md).

Imported by tests/conftest.py, so every test module can use them.
"""

from __future__ import annotations

import threading

import pytest

from console.users import hash_password

PASSWORD = "correct horse battery staple"
PERSONAS = ("viewer", "operator", "admin")
CSRF = "test-csrf-token"


@pytest.fixture(scope="session")
def password_hash(cheap_password_hashing) -> str:
    return hash_password(PASSWORD)  # cheap argon2id parameters in tests (tests/conftest.py)


@pytest.fixture
def web_settings(dsn) -> dict:
    """The settings a test app gets; a test may change them before asking for `web_app`.
    Development mode (production mode is the default; tests/test_security_production.py tests it)."""
    return {"database.dsn": dsn, "web.secret_key": "test-secret-key", "web.db_wait": 2.0, "web.production": False,
            "TESTING": True}


@pytest.fixture
def web_app(web_settings):
    from console.web import create_app

    app = create_app(web_settings)
    yield app
    app.extensions["skiplock"].close()


@pytest.fixture
def personas(conn, password_hash) -> dict[str, str]:
    """Users named after their role (viewer, operator, admin), all with PASSWORD."""
    for role in PERSONAS:
        conn.execute(
            "INSERT INTO skiplock.users (name, password_hash, role) VALUES (%s, %s, %s)",
            (role, password_hash, role),
        )
    return {role: role for role in PERSONAS}


@pytest.fixture
def client_as(web_app, personas, conn):
    """client_as("operator") -> a test client signed in as that persona (None: anonymous).

    A real server-side session (a skiplock.web_sessions row, as the login form makes) is
    started directly (the login form has its own tests); its token is `client.session_token`.
    The CSRF token is CSRF, so `client.post(url, data={"csrf_token": CSRF})` or
    headers={"X-CSRF-Token": CSRF}.
    """
    from console.users import start_session

    def make(role: str | None):
        client = web_app.test_client()
        client.session_token = None
        with client.session_transaction() as session:
            session["csrf"] = CSRF
            if role:
                client.session_token = start_session(conn, personas[role], "127.0.0.1", "pytest")
                session["sid"] = client.session_token
        return client

    return make


@pytest.fixture
def live_server(web_app):
    """The app on a real port (Werkzeug in a thread): yields its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, web_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


@pytest.fixture
def page_as(page, live_server, web_app, personas, conn):
    """page_as("viewer") -> the Playwright page, signed in as that persona without the login form:
    a real server-side session (as `client_as` starts one) in the app's own signed cookie. For
    browser tests about something else than signing in; it skips the form and the overview it
    lands on (about 3 s per test on a busy CI machine). The CSRF token is CSRF."""
    from console.users import start_session

    def make(role: str):
        token = start_session(conn, personas[role], "127.0.0.1", "playwright")
        cookie = web_app.session_interface.get_signing_serializer(web_app).dumps({"sid": token, "csrf": CSRF})
        page.context.add_cookies([{"name": web_app.config["SESSION_COOKIE_NAME"], "value": cookie,
                                   "url": live_server, "httpOnly": True, "sameSite": "Lax"}])
        return page

    return make


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": "/usr/bin/chromium",
        "args": [
            "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
        ],
    }
