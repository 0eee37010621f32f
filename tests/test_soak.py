"""The soak's short version: every process of a deployment, traffic, on-call users, and faults
(SIGKILL of a worker, of the scheduler leader and of the web console, a PostgreSQL crash, a
webhook receiver answering 500 and hanging) in 42 seconds; nothing may be lost.

bench/soak.py is the real thing (ten minutes by default, figures in docs/reliability.md); this
test runs it small so a change that loses or duplicates jobs under faults fails CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_short_soak_loses_nothing_under_faults(tmp_path):
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("SKIPLOCK_")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.7", "--rate", "30", "--users", "3",
         "--faults", "worker,postgres,scheduler,web,webhook-500,webhook-hang", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    figures = json.loads(out.read_text())
    jobs = figures["jobs"]
    assert jobs["enqueued"] > 500, jobs
    assert jobs["lost"] == 0 and jobs["duplicated_rows"] == 0 and jobs["unfinished"] == 0, jobs
    assert jobs["completed"] + jobs["dead_lettered"] == jobs["enqueued"], jobs
    assert jobs["completed_without_effect"] == 0, jobs
    assert [f["fault"] for f in figures["faults"]] == ["worker", "postgres", "scheduler", "web", "webhook-500", "webhook-hang"]
    assert all(f["recovery_s"] is not None for f in figures["faults"]), figures["faults"]
    assert figures["http_requests"] > 0, "the load generator made no request"
    assert figures["http_pages_served_signed_in"] > 0, "the on-call users never got past the login form"
    assert figures["http_5xx_outside_fault_windows"] == 0, figures["http_failures_by_status"]
