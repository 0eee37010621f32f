"""`skiplock serve` and the Procfile's gunicorn line start a console that answers /healthz."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return {"status": response.status, "body": response.read().decode()}
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise AssertionError("the server did not answer /healthz in time")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_skiplock_serve_answers_healthz(subprocess_env):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "console", "serve", "--port", str(port)],
                            env=subprocess_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        answer = wait_healthy(port, proc)
        assert answer["status"] == 200 and '"database":"ok"' in answer["body"].replace(" ", "")
    finally:
        stop(proc)


@pytest.mark.slow
def test_the_procfile_web_line_runs_under_gunicorn(subprocess_env):
    line = next(entry for entry in (ROOT / "Procfile").read_text().splitlines() if entry.startswith("web:"))
    argv = shlex.split(line.split(":", 1)[1])
    assert argv[0] == "gunicorn"
    port = free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    env = {**subprocess_env, "SKIPLOCK_WEB_SECRET_KEY": "procfile-test-key", "SKIPLOCK_WEB_PRODUCTION": "true"}
    proc = subprocess.Popen([gunicorn, *argv[1:], "--bind", f"127.0.0.1:{port}", "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        answer = wait_healthy(port, proc)
        assert answer["status"] == 200
    finally:
        stop(proc)


def test_gunicorn_in_production_mode_refuses_to_start_without_a_secret_key(subprocess_env):
    from console.config import ConfigError
    from console.web import create_app

    with pytest.raises(ConfigError, match="secret_key"):
        create_app({"database.dsn": subprocess_env["DATABASE_URL"], "web.production": True})
