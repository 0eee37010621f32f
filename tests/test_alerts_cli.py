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
