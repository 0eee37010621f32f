"""Issue 26, class 7: forwarded headers are believed exactly as `web.proxy_count` says, under the
real gunicorn the Procfile runs (with its gunicorn.conf.py), not only under the test client.

Gunicorn's own default believes X-Forwarded-Proto/-Ssl/-Protocol, and SCRIPT_NAME as a header,
from any client at 127.0.0.1: with proxy_count = 0 a local client got HSTS by asking for it.
Each test starts gunicorn from the Procfile's web line and talks to it over a raw socket, so the
headers are exactly the ones written here.
"""

from __future__ import annotations

import http.client
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_web_serve import free_port, stop, wait_healthy
from tests.web_fixtures import PASSWORD

ROOT = Path(__file__).resolve().parent.parent
HSTS = "Strict-Transport-Security"
# Every header some server or framework reads as "the client spoke HTTPS".
HTTPS_CLAIMS = [{"X-Forwarded-Proto": "https"}, {"X-Forwarded-Ssl": "on"}, {"X-Forwarded-Protocol": "ssl"},
                {"X-Forwarded-Proto": "https", "X-Forwarded-Ssl": "on", "X-Forwarded-Protocol": "ssl"}]

pytestmark = pytest.mark.slow


@contextmanager
def procfile_gunicorn(subprocess_env, proxy_count: int):
    line = next(entry for entry in (ROOT / "Procfile").read_text().splitlines() if entry.startswith("web:"))
    argv = shlex.split(line.split(":", 1)[1])
    assert argv[0] == "gunicorn" and "gunicorn.conf.py" in argv, "the Procfile's web line must use gunicorn.conf.py"
    port = free_port()
    env = {**subprocess_env, "SKIPLOCK_WEB_SECRET_KEY": "proxy-test-key", "SKIPLOCK_WEB_PRODUCTION": "true",
           "SKIPLOCK_WEB_PROXY_COUNT": str(proxy_count)}
    env.pop("FORWARDED_ALLOW_IPS", None)
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    proc = subprocess.Popen([gunicorn, *argv[1:], "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        wait_healthy(port, proc)
        yield port
    finally:
        stop(proc)


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
            body: str | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    response.text = response.read().decode("utf-8", "replace")
    connection.close()
    return response


def sign_in(port: int, extra: dict[str, str]) -> tuple[int, str, str]:
    """Sign in as the admin persona with `extra` headers on the POST: (status, cookie, csrf)."""
    form = request(port, "GET", "/login")
    cookie = form.getheader("Set-Cookie").split(";", 1)[0]
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
    body = f"csrf_token={csrf}&name=admin&password={PASSWORD.replace(' ', '+')}&next=/"
    answer = request(port, "POST", "/login", {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded",
                                              **extra}, body)
    signed_in = (answer.getheader("Set-Cookie") or cookie).split(";", 1)[0]
    page = request(port, "GET", "/audit", {"Cookie": signed_in})  # the session's own CSRF token
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    return answer.status, signed_in, found.group(1) if found else ""


def test_with_no_proxy_a_local_client_cannot_claim_https_an_address_a_host_or_a_script_name(
        subprocess_env, personas, conn):
    with procfile_gunicorn(subprocess_env, proxy_count=0) as port:
        for claim in HTTPS_CLAIMS:
            answer = request(port, "GET", "/login", claim)
            assert answer.status == 200 and answer.getheader(HSTS) is None, f"{claim} was believed: HSTS sent"
        # SCRIPT_NAME as a header would move every link under /evil and route /evil/login as /login.
        moved = request(port, "GET", "/evil/login", {"SCRIPT_NAME": "/evil"})
        assert moved.status == 400 or 'action="/evil/' not in moved.text, "SCRIPT_NAME from a header was believed"
        # An underscore twin of a forwarded header is refused, never mapped onto HTTP_X_FORWARDED_PROTO.
        assert request(port, "GET", "/login", {"X_Forwarded_Proto": "https"}).getheader(HSTS) is None

        status, cookie, csrf = sign_in(port, {"X-Forwarded-For": "203.0.113.9", "X-Real-Ip": "203.0.113.9"})
        assert status == 302
        assert conn.execute("SELECT ip FROM skiplock.web_sessions").fetchone()[0] == "127.0.0.1"
        # A forged X-Forwarded-Host does not make another site's Origin look like ours.
        forged = request(port, "POST", "/logout", {"Cookie": cookie, "X-CSRF-Token": csrf, "Origin": "http://evil.example",
                                                   "X-Forwarded-Host": "evil.example"})
        assert forged.status == 403 and "origin" in forged.text.lower()
        assert conn.execute("SELECT count(*) FROM skiplock.web_sessions WHERE revoked_at IS NULL").fetchone()[0] == 1
        honest = request(port, "POST", "/logout", {"Cookie": cookie, "X-CSRF-Token": csrf})
        assert honest.status in (302, 303)  # the same request without the forgery is accepted
        assert conn.execute("SELECT count(*) FROM skiplock.web_sessions WHERE revoked_at IS NULL").fetchone()[0] == 0


def test_behind_one_proxy_its_headers_are_believed_and_nothing_more(subprocess_env, personas, conn):
    with procfile_gunicorn(subprocess_env, proxy_count=1) as port:
        assert request(port, "GET", "/login", {"X-Forwarded-Proto": "https"}).getheader(HSTS) == "max-age=31536000"
        assert request(port, "GET", "/login").getheader(HSTS) is None
        # The proxy appends the value it saw; what the client wrote before it is not believed.
        assert request(port, "GET", "/login", {"X-Forwarded-Proto": "https, http"}).getheader(HSTS) is None
        # Only the forwarded headers ProxyFix applies: X-Forwarded-Ssl is no proxy's header here.
        assert request(port, "GET", "/login", {"X-Forwarded-Ssl": "on"}).getheader(HSTS) is None
        moved = request(port, "GET", "/evil/login", {"SCRIPT_NAME": "/evil"})
        assert moved.status == 400 or 'action="/evil/' not in moved.text, "SCRIPT_NAME from a header was believed"

        status, _cookie, _csrf = sign_in(port, {"X-Forwarded-For": "198.51.100.1, 203.0.113.9"})
        assert status == 302
        assert conn.execute("SELECT ip FROM skiplock.web_sessions").fetchone()[0] == "203.0.113.9"


def test_a_bad_proxy_count_stops_gunicorn_before_any_worker_starts(subprocess_env):
    line = next(entry for entry in (ROOT / "Procfile").read_text().splitlines() if entry.startswith("web:"))
    env = {**subprocess_env, "SKIPLOCK_WEB_SECRET_KEY": "k", "SKIPLOCK_WEB_PROXY_COUNT": "-1"}
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    done = subprocess.run([gunicorn, *shlex.split(line.split(":", 1)[1])[1:], "--bind", f"127.0.0.1:{free_port()}"],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode != 0 and "web.proxy_count" in done.stderr
    assert "Booting worker" not in done.stderr  # the master read the config, not a worker
