"""The demo on a first incident (issue 33 item 6): its banner prints the line that points a
shell's `skiplock` at the demo's database and settings, and its handlers stop when an operator
requests a cancel (a real worker process runs them)."""

from __future__ import annotations

import subprocess
import sys

from console import browse
from console import queue as q
from console.demo.orchestrator import Demo, DemoOptions
from tests.workers import wait_for


def test_the_banner_prints_the_line_to_export_for_the_cli(tmp_path):
    printed: list[str] = []
    demo = Demo(DemoOptions(data_dir=tmp_path), out=printed.append)
    demo.dsn = "postgresql://postgres@127.0.0.1:54329/skiplock_demo"
    demo.announce()
    banner = "\n".join(printed)
    line = next(x for x in banner.splitlines() if "export" in x)
    assert f"DATABASE_URL='{demo.dsn}'" in line
    assert f"SKIPLOCK_CONFIG='{tmp_path / 'skiplock.toml'}'" in line
    assert demo.config_path == tmp_path / "skiplock.toml"  # the file the demo's own processes read


def test_a_slow_demo_job_stops_when_an_operator_requests_a_cancel(conn, subprocess_env):
    job = q.enqueue(conn, "reports.build", {"report": "refunds", "customer_id": 9, "ms": 60_000}, queue="reports")
    env = {**subprocess_env, "SKIPLOCK_WORKER_POLL_INTERVAL": "0.1", "SKIPLOCK_WORKER_FLUSH_INTERVAL": "0.5"}
    worker = subprocess.Popen([sys.executable, "-m", "console", "worker", "--tasks", "console.demo.tasks",
                               "--queues", "reports", "--lease", "3"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: conn.execute("SELECT status = 'running' FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0],
                 timeout=30, what="the report to start")
        browse.act_on_job(conn, job, "request_cancel", actor="alice", reason="INC-6: wrong month")
        # The heartbeat (every lease/3 = 1 s) carries the request; the handler stops at once.
        wait_for(lambda: conn.execute("SELECT status = 'failed' FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0],
                 timeout=15, what="the cancelled report to stop")
        last_error, fingerprint = conn.execute("SELECT last_error, error_fingerprint FROM skiplock.jobs WHERE id = %s",
                                               (job,)).fetchone()
        assert last_error.startswith("Cancelled:") and "operator's request" in last_error
    finally:
        worker.terminate()
        worker.wait(timeout=20)
