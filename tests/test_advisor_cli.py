"""`skiplock check`: exit codes for cron and CI, and the JSON document, as a real process."""

from __future__ import annotations

import json
import subprocess
import sys


def run_check(subprocess_env, *args):
    return subprocess.run([sys.executable, "-m", "console", "check", *args],
                          env=subprocess_env, capture_output=True, text=True, timeout=60)


def test_check_exits_0_on_a_healthy_database_and_prints_every_check(subprocess_env):
    proc = run_check(subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ok  ] claim-plan:" in proc.stdout
    assert "0 failing" in proc.stdout


def test_check_exits_1_with_json_naming_the_failing_check(subprocess_env, conn):
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    proc = run_check(subprocess_env, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["claim-plan"]["status"] == "fail"
    assert by_id["claim-plan"]["docs"] == "docs/advisor.md#claim-plan"
    assert by_id["claim-plan"]["evidence"] and by_id["claim-plan"]["remedy"]
    assert report["worst"] == "fail" and report["counts"]["fail"] >= 1
    assert by_id["connections"]["status"] == "ok"


def test_text_output_shows_evidence_and_remedy_of_a_failure(subprocess_env, conn):
    conn.execute("INSERT INTO skiplock.jobs (kind, max_attempts) VALUES ('poison', 1000000)")
    proc = run_check(subprocess_env, "--only", "retry-caps")
    assert proc.returncode == 1
    assert "[FAIL] retry-caps" in proc.stdout
    assert "kind poison" in proc.stdout
    assert "what to do:" in proc.stdout and "docs/advisor.md#retry-caps" in proc.stdout


def test_warnings_pass_unless_strict(subprocess_env, conn):
    conn.execute("CREATE INDEX jobs_kind_idx ON skiplock.jobs (kind)")
    assert run_check(subprocess_env, "--only", "unused-indexes").returncode == 0
    assert run_check(subprocess_env, "--only", "unused-indexes", "--strict").returncode == 1


def test_an_unknown_check_is_a_usage_error(subprocess_env):
    proc = run_check(subprocess_env, "--only", "claim-plna")
    assert proc.returncode == 2
    assert "unknown check claim-plna" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unmigrated_database_says_what_to_do(subprocess_env, make_database):
    env = dict(subprocess_env, DATABASE_URL=make_database(template=None))
    proc = run_check(env)
    assert proc.returncode == 1
    assert "skiplock migrate" in proc.stderr
    assert "Traceback" not in proc.stderr
