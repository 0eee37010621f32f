"""Helpers for tests that run real `skiplock worker` processes against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from console.db import DatabaseError, connect

ROOT = Path(__file__).resolve().parent.parent

# Short intervals so fault tests finish in seconds; each test can override them.
FAST_SETTINGS = {
    "SKIPLOCK_WORKER_POLL_INTERVAL": "0.2",
    "SKIPLOCK_WORKER_FLUSH_INTERVAL": "0.5",
    "SKIPLOCK_WORKER_SHUTDOWN_GRACE": "5",
    "SKIPLOCK_QUEUE_BACKOFF_BASE": "0.05",
    "SKIPLOCK_QUEUE_BACKOFF_CAP": "0.2",
}

EXECUTIONS_TABLE = """
CREATE TABLE IF NOT EXISTS public.executions (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker_pid integer     NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def cli(env: dict[str, str], *args: str, timeout: float = 60, cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess:
    """Run `skiplock ARGS` as a child process and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "console", *args],
        env=env, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
    )


class WorkerProcs:
    """Starts `skiplock worker` processes and makes sure none outlives the test."""

    def __init__(self, env: dict[str, str]):
        self.env = {**env, **FAST_SETTINGS}
        self.procs: list[subprocess.Popen] = []

    def start(self, *extra: str, env: dict[str, str] | None = None, tasks: str = "tests.sample_tasks") -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "console", "worker", "--tasks", tasks, *extra],
            env={**self.env, **(env or {})}, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 20) -> tuple[int, str]:
        """SIGTERM, wait, and return (exit code, stderr). A process still running `timeout`
        seconds after its SIGTERM fails the test with the end of its log (killed first)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"{proc.args} still ran {timeout:g} s after its SIGTERM; the end of its log:\n"
                                 f"{(err or '')[-6000:]}") from None
        return proc.returncode, err

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass


def stop_processes(procs, timeout: float = 15) -> None:
    """SIGTERM every process still running, wait for each, SIGKILL the ones that do not stop in
    `timeout` seconds (a test's `finally`: nothing it started outlives it)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def wait_for(predicate: Callable[[], object], *, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def scalar(dsn: str, sql: str, params=None):
    """One value from a fresh connection (survives a server restart between calls)."""
    try:
        with connect(dsn) as conn:
            return conn.execute(sql, params).fetchone()[0]
    except (psycopg.OperationalError, DatabaseError):
        return None
