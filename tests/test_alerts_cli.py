"""`skiplock alerts ...` against a real database and a real local receiver."""

from __future__ import annotations

import json

from click.testing import CliRunner

from console.cli import main
from tests.alert_receiver import Receiver


def run(dsn, config, *args):
    return CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "alerts", *args], catch_exceptions=False)


def test_list_test_webhook_and_bad_config(dsn, tmp_path):
    config = tmp_path / "skiplock.toml"
    with Receiver([204, 500]) as receiver:
        config.write_text(f"""
[alerts]
allow_private_destinations = true  # the receiver is on loopback

[[webhooks]]
name = "ops"
url = "{receiver.url}"
secret = "cli-secret-42"

[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
op = ">"
threshold = 30
""")
        listed = run(dsn, config, "list")
        assert listed.exit_code == 0
        assert "queue_age" in listed.output and "file" in listed.output and "none: every rule is ok" in listed.output
        assert "cli-secret-42" not in listed.output
        data = json.loads(run(dsn, config, "list", "--json").output)
        assert {r["name"]: r["source"] for r in data["rules"]}["queue_age"] == "file"
        ok = run(dsn, config, "test-webhook", "ops")
        assert ok.exit_code == 0 and "OK HTTP 204" in ok.output
        failed = run(dsn, config, "test-webhook", "ops")
        assert failed.exit_code == 1 and "FAILED HTTP 500" in failed.output
        missing = run(dsn, config, "test-webhook", "nope")
        assert missing.exit_code == 2 and "no webhook named 'nope'" in missing.output
        log = run(dsn, config, "deliveries")
        assert "test_ok" in log.output and "test_failed" in log.output
    config.write_text("""
[[alerts.rules]]
name = "typo"
metric = "queue_age"
op = ">"
threshold = 1
""")
    bad = run(dsn, config, "list")
    assert bad.exit_code == 2 and "alert rule 'typo'" in bad.output and "unknown metric 'queue_age'" in bad.output


def test_the_receiver_command_prints_verified_notifications(tmp_path):
    """`skiplock alerts receiver` as a real process, sent a real signed notification."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from console.alerts.rules import parse_destination
    from console.alerts.transports import JsonTransport

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "SKIPLOCK_RECEIVER_SECRET": "recv-secret"}
    proc = subprocess.Popen([sys.executable, "-m", "console", "alerts", "receiver", "--port", "0"], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("listening on http://127.0.0.1:")
        url = first.split()[2]
        good = JsonTransport(parse_destination({"name": "r", "url": url, "secret": "recv-secret"}), timeout=5,
                             allow_private=True)  # the receiver is on loopback
        bad = JsonTransport(parse_destination({"name": "r", "url": url, "secret": "wrong"}), timeout=5, allow_private=True)
        assert good.send(good.test_notification()).status == 204
        assert bad.send(bad.test_notification()).status == 204
        lines = [proc.stdout.readline().strip() for _ in range(2)]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert lines[0].startswith("test") and lines[0].endswith("[signature ok]")
    assert lines[1].endswith("[SIGNATURE INVALID]")
