"""`skiplock reap|archive|retention|replay|purge|pause|resume|dead-letters|operations` against a
real database: in-process through click for the quick cases, as real processes (and kill -9)
for the fault cases."""

from __future__ import annotations

import getpass
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from click.testing import CliRunner

from console import audit
from console import queue as q
from console.cli import main
from tests.maintenance_data import add_completed, add_failed, live_and_archived_ids, replay_entries
from tests.workers import ROOT, cli, wait_for

ACTOR = f"cli:{getpass.getuser()}@{socket.gethostname()}"


@pytest.fixture
def skiplock(dsn):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, ["--dsn", dsn, *args], catch_exceptions=False)

    return invoke


def seen_queue(conn, name: str) -> None:
    """A queue the collectors sampled just now (known to `skiplock pause` without any job)."""
    from datetime import UTC, datetime

    from console import samples

    samples.store(conn, [samples.Sample("queue_depth", {"queue": name, "state": "eligible"}, 0.0, datetime.now(UTC))])


def statuses(conn):
    return dict(conn.execute("SELECT status, count(*) FROM skiplock.jobs GROUP BY status").fetchall())


def test_replay_refuses_to_run_without_a_filter_or_all(conn, skiplock):
    add_failed(conn, 3)
    result = skiplock("replay")
    assert result.exit_code == 2 and "--all" in result.output
    assert statuses(conn) == {"failed": 3}


def test_dry_run_prints_the_preview_and_changes_nothing(conn, skiplock):
    ids = add_failed(conn, 12, queue="mail", fingerprint="SMTPError: timeout")
    add_failed(conn, 4, queue="billing")
    result = skiplock("replay", "--queue", "mail", "--dry-run", "--sample", "3")
    assert result.exit_code == 0, result.output
    assert "12 dead letters to replay" in result.output and "queue = 'mail'" in result.output
    assert f"#{ids[-1]}" in result.output and "... and 9 more" in result.output
    assert "dry run: nothing changed" in result.output
    assert statuses(conn) == {"failed": 16}
    assert audit.search(conn) == []


def test_replay_by_group_runs_to_the_end_and_is_audited(conn, skiplock):
    add_failed(conn, 25, fingerprint="SMTPError: timeout")
    add_failed(conn, 5, fingerprint="KeyError: <str>")
    result = skiplock("replay", "--group", "SMTPError: timeout", "--reason", "SMTP is back", "--batch-size", "10")
    assert result.exit_code == 0, result.output
    assert "done, 25 of 25 jobs" in result.output
    assert statuses(conn) == {"pending": 25, "failed": 5}
    [ok] = [r for r in audit.search(conn, action="replay") if r["outcome"] == "ok"]
    assert (ok["actor"], ok["reason"], ok["rows"], ok["selection"]) == (ACTOR, "SMTP is back", 25, {"fingerprint": "SMTPError: timeout"})


def test_purge_by_ids_and_to_the_archive(conn, skiplock):
    ids = add_failed(conn, 6)
    result = skiplock("purge", "--id", str(ids[0]), "--id", f"{ids[1]},{ids[2]}", "--to-archive", "--reason", "junk")
    assert result.exit_code == 0, result.output
    live, archived = live_and_archived_ids(conn)
    assert archived == sorted(ids[:3]) and live == sorted(ids[3:])
    assert skiplock("purge", "--all", "--reason", "junk").exit_code == 0
    assert live_and_archived_ids(conn) == ([], sorted(ids[:3]))


BAD_INPUT = [
    (["replay", "--queue", "nowhere"], "nothing to replay"),
    (["replay", "--all", "--batch-size", "0"], "batch size"),
    (["replay", "--all", "--rate", "-1"], "--rate"),
    (["purge", "--all", "--rate", "0"], "--rate"),
    (["replay", "--failed-since", "later"], "--failed-since"),
    (["replay", "--failed-since", "1d", "--failed-before", "2d"], "impossible date range"),
    (["replay", "--id", "abc"], "abc"),
    (["replay", "--id", "-4"], "not a job id"),
    (["replay", "--payload", "[1]"], "JSON object"),
    (["replay", "--all", "--queue", "mail"], "cannot be combined"),
    (["archive", "--older-than", "soon"], "not a duration"),
    (["archive", "--batch-size", "0"], "batch size"),
    (["archive", "--rate", "-3"], "--rate"),
    (["reap", "--batch-size", "0"], "batch size"),
    (["pause", " "], "queue name"),
    (["operations", "--cancel", "999"], "no bulk operation"),
]


def test_bad_input_exits_2_with_a_message_and_touches_nothing(conn, skiplock):
    add_failed(conn, 3)
    add_completed(conn, 3)
    for args, message in BAD_INPUT:
        # With a reason, so that each refusal is the bad input's own (a missing reason is refused
        # first, tests/test_action_reasons.py).
        result = skiplock(*args, "--reason", "bad input test")
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert statuses(conn) == {"failed": 3, "completed": 3}
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM skiplock.maintenance_runs").fetchone()[0] == 0
    assert audit.search(conn) == []


def test_archive_reap_retention_pause_resume_and_dead_letters(conn, skiplock):
    add_completed(conn, 40, age=timedelta(hours=3))
    add_completed(conn, 5, age=timedelta(minutes=1))
    result = skiplock("archive", "--older-than", "1h", "--batch-size", "15", "--reason", "tidy")
    assert result.exit_code == 0, result.output
    assert "archived 40 rows in 3 batches" in result.output
    assert len(live_and_archived_ids(conn)[1]) == 40

    q.enqueue(conn, "slow", {})
    q.claim(conn, "w", lease=0.01)
    time.sleep(0.05)
    result = skiplock("reap")
    assert result.exit_code == 0 and "reaped 1 rows" in result.output

    assert skiplock("retention", "--older-than", "1m", "--reason", "disk").exit_code == 0
    assert live_and_archived_ids(conn)[1] == []

    seen_queue(conn, "mail")  # a queue the collectors reported: pause refuses names nobody knows
    assert skiplock("pause", "mail", "--reason", "outage").exit_code == 0
    assert q.paused_queues(conn) == ["mail"]
    assert skiplock("resume", "mail", "--reason", "outage over").exit_code == 0
    assert q.paused_queues(conn) == []

    add_failed(conn, 3, fingerprint="KeyError: <str>", queue="mail")
    result = skiplock("dead-letters")
    assert result.exit_code == 0 and "KeyError: <str>" in result.output and "mail" in result.output

    actions = sorted({(r["action"], r["actor"]) for r in audit.search(conn)})
    assert actions == sorted({("archive", ACTOR), ("reap", ACTOR), ("retention", ACTOR), ("pause", ACTOR), ("resume", ACTOR)})


@pytest.mark.slow
def test_kill_9_of_the_archiver_mid_run_loses_and_duplicates_nothing(conn, subprocess_env):
    enqueued = add_completed(conn, 3000, age=timedelta(hours=2))
    # 200 rows/s: 15 s in all, so the kill lands mid-run even when this test is slow to look.
    proc = subprocess.Popen(
        [sys.executable, "-m", "console", "archive", "--older-than", "0s", "--batch-size", "50", "--rate", "200",
         "--reason", "kill test"],
        env=subprocess_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0] >= 300,
                 timeout=30, interval=0.05, what="the archiver to move some rows")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    live, archived = live_and_archived_ids(conn)
    assert 0 < len(archived) < 3000
    assert sorted(live + archived) == sorted(enqueued) and len(set(archived)) == len(archived)

    result = cli(subprocess_env, "archive", "--older-than", "0s", "--batch-size", "500", "--reason", "finish")
    assert result.returncode == 0, result.stderr

    live, archived = live_and_archived_ids(conn)
    assert live == [] and archived == sorted(enqueued)  # every id exactly once
    outcomes = [r[0] for r in conn.execute("SELECT outcome FROM skiplock.maintenance_runs ORDER BY id")]
    assert outcomes == ["abandoned", "ok"]


@pytest.mark.slow
def test_kill_9_during_a_replay_then_resume_replays_each_job_once(conn, subprocess_env):
    ids = add_failed(conn, 3000)
    # 300 rows/s: 10 s in all, so the kill lands mid-run even when this test is slow to look.
    proc = subprocess.Popen(
        [sys.executable, "-m", "console", "replay", "--all", "--batch-size", "100", "--rate", "300",
         "--reason", "kill test"],
        env=subprocess_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: conn.execute("SELECT coalesce(max(done), 0) FROM skiplock.bulk_operations").fetchone()[0] >= 500,
                 timeout=30, interval=0.05, what="the replay to get going")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    state, done = conn.execute("SELECT state, done FROM skiplock.bulk_operations").fetchone()
    assert state == "running" and 500 <= done < 3000
    assert statuses(conn) == {"pending": done, "failed": 3000 - done}

    result = cli(subprocess_env, "operations", "--resume-abandoned")
    assert result.returncode == 0, result.stderr
    assert "#1" in result.stdout

    assert conn.execute("SELECT state, done FROM skiplock.bulk_operations").fetchone() == ("done", 3000)
    entries = replay_entries(conn, 1)
    assert sorted(entries) == sorted(ids) and set(entries.values()) == {1}


def readme_maintenance_commands() -> list[list[str]]:
    import re
    import shlex

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Dead letters and maintenance from the command line\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md lost its maintenance section"
    block = re.search(r"```sh\n(.*?)```", section.group(1), re.DOTALL).group(1)
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "skiplock"
            commands.append(words[1:])
    return commands


def test_the_readme_maintenance_commands_work(conn, skiplock):
    add_failed(conn, 8, fingerprint="SMTPError: timeout after <n>s")
    add_failed(conn, 3, queue="legacy", age=timedelta(days=40))
    add_completed(conn, 20, age=timedelta(hours=2))
    seen_queue(conn, "mail")  # the README pauses mail: a queue the collectors reported
    commands = readme_maintenance_commands()
    assert len(commands) >= 8
    for args in commands:
        result = skiplock(*args)
        assert result.exit_code == 0, (args, result.output)
    assert statuses(conn) == {"pending": 8}  # replayed; the legacy ones purged; completed archived
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive WHERE purged").fetchone()[0] == 3
    assert q.paused_queues(conn) == []
