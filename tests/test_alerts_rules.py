"""Rule and destination validation: from the config file, from the UI (same messages), and the
precedence defaults < UI < file."""

from __future__ import annotations

import pytest

from console import audit
from console.alerts import rules as r
from console.alerts.defaults import DEFAULT_NAMES, DEFAULT_RULES
from console.config import load_config

GOOD = {"name": "mail_age", "metric": "queue_age_seconds", "labels": {"queue": "mail"}, "op": ">",
        "threshold": 60, "for": "2m", "severity": "critical", "runbook": "https://runbooks.example/mail"}


def test_a_good_rule_parses_with_durations_and_selector():
    rule = r.parse_rule(GOOD)
    assert rule.for_seconds == 120 and rule.labels == {"queue": "mail"} and rule.threshold == 60.0
    assert rule.describe() == 'queue_age_seconds{queue="mail"} > 60 for 2m'
    assert rule.matches({"queue": "mail"}) and not rule.matches({"queue": "sms"})
    assert r.parse_rule({**GOOD, "labels": "queue=mail"}).labels == {"queue": "mail"}


@pytest.mark.parametrize("change, message", [
    ({"metric": "queue_agee"}, "unknown metric 'queue_agee'"),
    ({"threshold": "lots"}, "threshold 'lots' is not a number"),
    ({"threshold": float("nan")}, "not a finite number"),
    ({"threshold": None}, "threshold is required"),
    ({"op": "=="}, "op '==' must be one of"),
    ({"labels": {"queu": "mail"}}, "has no label 'queu'"),
    ({"labels": "queue"}, "label selector 'queue' is not key=value"),
    ({"labels": {"queue": ""}}, "non-empty string value"),
    ({"for": "ten minutes"}, "is not a duration"),
    ({"severity": "urgent"}, "severity 'urgent'"),
    ({"runbook": "ftp://x"}, "runbook must be an http:// or https:// URL or a site path (scheme ftp: is not allowed)"),
    ({"runbook": "docs/alerts.md#mail_age"}, None),  # a site path: allowed
    ({"runbook": "https://"}, "runbook must be an http:// or https:// URL with a host"),
    ({"name": "Bad Name"}, "name must be lower-case"),
    ({"colour": "red"}, "unknown field(s) colour"),
    ({"clear": 90}, "clear 90 must be on the healthy side of threshold 60"),
    ({"when": {"metric": "queue_depth", "op": ">"}}, "when: threshold is required"),
])
def test_bad_rules_are_refused_naming_rule_and_field(change, message):
    record = {**GOOD, **change}
    if message is None:
        r.parse_rule(record)
        return
    with pytest.raises(r.RuleError) as info:
        r.parse_rule(record, where="(in the test)")
    assert message in str(info.value)
    assert str(info.value).startswith(f"alert rule {record['name']!r} (in the test)")


@pytest.mark.parametrize("change, message", [
    ({"url": "not a url"}, "url must not contain spaces"),
    ({"url": "ftp://hooks.example/x"}, "must be an http:// or https:// URL"),
    ({"url": "http://host:99999/x"}, "url is not a valid URL"),
    ({"kind": "teams"}, "kind 'teams' must be one of"),
    ({"kind": "pagerduty", "secret": None}, "routing key"),
    ({"headers": {"Bad Header": "x"}}, "not a valid HTTP header name"),
    ({"headers": {"X-Skiplock-Signature": "forged"}}, "cannot be overridden"),
    ({"headers": {"X-Team": "a\r\nInjected: 1"}}, "one-line string"),
])
def test_bad_destinations_are_refused(change, message):
    record = {"name": "ops", "url": "https://hooks.example/ops", "kind": "json", "secret": "s3cret", **change}
    with pytest.raises(r.RuleError, match="webhook 'ops'") as info:
        r.parse_destination(record)
    assert message in str(info.value)


def test_destination_never_shows_its_secret_or_slack_path():
    slack = r.parse_destination({"name": "chat", "kind": "slack", "url": "https://hooks.slack.example/services/T0/B0/XyZsecret"})
    assert "XyZsecret" not in slack.display_url() and "XyZsecret" not in repr(slack)
    assert "XyZsecret" not in str(slack.public())
    signed = r.parse_destination({"name": "ops", "url": "https://h.example/x?token=abc123", "secret": "topsecret",
                                  "headers": {"Authorization": "Bearer tok-999"}})
    public = str(signed.public())
    assert "topsecret" not in public and "tok-999" not in public and "abc123" not in public
    assert signed.public()["has_secret"] is True
    assert signed.redact("failed for https://h.example/x?token=abc123 with topsecret") == "failed for *** with ***"


@pytest.mark.parametrize("runbook", [
    "javascript:alert(document.domain)", "JavaScript:alert(1)", "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)", "//evil.example/runbook", "/\\evil.example", "java\tscript:alert(1)",
    "https://wiki.example/a b",
])
def test_runbook_links_are_http_urls_or_site_paths(runbook):
    """A runbook is an href in the console and in every webhook: no script, no other site by //."""
    with pytest.raises(r.RuleError, match=r"alert rule 'mail_age': runbook (must|is)"):
        r.parse_rule({**GOOD, "runbook": runbook})
    for fine in ("https://wiki.example/queue-age#mail", "http://intranet/runbooks/1", "/runbooks/queue-age",
                 "docs/alerts.md#queue_age_seconds"):
        assert r.parse_rule({**GOOD, "runbook": fine}).runbook == fine


def test_every_default_rule_has_a_runbook_section():
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "alerts.md").read_text()
    assert len(DEFAULT_RULES) >= 14 and all(rule.enabled for rule in DEFAULT_RULES)
    for rule in DEFAULT_RULES:
        assert rule.runbook == f"docs/alerts.md#{rule.name}"
        assert f"\n## {rule.name}\n" in docs, f"docs/alerts.md lacks a section for {rule.name}"


def _config(tmp_path, text):
    path = tmp_path / "skiplock.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_config_file_rules_and_webhooks_load_and_validate(tmp_path):
    config = _config(tmp_path, """
[alerts]
repeat_interval = 600

[[webhooks]]
name = "ops"
url = "https://hooks.example/ops"
kind = "json"
secret = "s3cret"
headers = { "X-Team" = "queue" }

[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
op = ">"
threshold = 30
for = "1m"
webhooks = ["ops"]
""")
    assert config.alerts.repeat_interval == 600
    r.check_config(config)
    loaded = r.load(None, config)
    assert loaded.rules["queue_age"].threshold == 30 and loaded.rules["queue_age"].source == "file"
    assert loaded.rules["stuck_leases"].source == "default"
    assert set(DEFAULT_NAMES) <= set(loaded.rules)
    assert loaded.destinations["ops"].headers == {"X-Team": "queue"}


def test_config_file_errors_name_the_rule(tmp_path):
    config = _config(tmp_path, """
[[alerts.rules]]
name = "typo"
metric = "queue_age_secs"
op = ">"
threshold = 1
""")
    with pytest.raises(r.RuleError, match=r"alert rule 'typo' \(\[\[alerts.rules\]\] #1 in the config file\): unknown metric"):
        r.check_config(config)
    config = _config(tmp_path, """
[[alerts.rules]]
name = "to_nowhere"
metric = "queue_age_seconds"
op = ">"
threshold = 1
webhooks = ["pager"]
""")
    with pytest.raises(r.RuleError, match="webhooks pager not defined"):
        r.check_config(config)
    config = _config(tmp_path, """
[[webhooks]]
name = "ops"
url = "hooks.example/ops"
""")
    with pytest.raises(r.RuleError, match="webhook 'ops'.*http:// or https://"):
        r.check_config(config)


def test_ui_rules_are_validated_audited_and_the_file_wins(conn, tmp_path):
    config = _config(tmp_path, """
[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
op = ">"
threshold = 30
""")
    with pytest.raises(r.RuleError, match="unknown metric"):
        r.save_rule(conn, {**GOOD, "metric": "nope"}, actor="alice", config=config)
    with pytest.raises(r.RuleError, match="defined in the config file"):
        r.save_rule(conn, {**GOOD, "name": "queue_age"}, actor="alice", config=config)
    saved = r.save_rule(conn, {**GOOD, "threshold": "90"}, actor="alice", config=config)
    assert saved.threshold == 90 and saved.source == "ui"
    # A UI rule that a later config file shadows: the file's version is in force, the UI is told.
    conn.execute("""INSERT INTO skiplock.alert_rules (name, metric, op, threshold, updated_by)
                    VALUES ('queue_age', 'queue_age_seconds', '>', 5, 'bob')""")
    loaded = r.load(conn, config)
    assert loaded.rules["queue_age"].threshold == 30 and loaded.rules["queue_age"].source == "file"
    assert loaded.shadowed_rules == {"queue_age"}
    assert loaded.rules["mail_age"].threshold == 90
    # A UI override of a default replaces it.
    r.save_rule(conn, {"name": "stuck_leases", "metric": "stuck_leases", "op": ">", "threshold": 3}, actor="alice")
    assert r.load(conn, config).rules["stuck_leases"].threshold == 3
    actions = [row["action"] for row in audit.search(conn, actor="alice")]
    assert actions.count("alert_rule_save") == 2
    assert r.delete_rule(conn, "mail_age", actor="alice") and "mail_age" not in r.load(conn, config).rules


def test_ui_destination_keeps_its_secret_when_the_form_leaves_it_blank(conn):
    r.save_destination(conn, {"name": "ops", "url": "https://hooks.example/a", "secret": "first-secret"}, actor="alice")
    r.save_destination(conn, {"name": "ops", "url": "https://hooks.example/b", "secret": ""}, actor="alice")
    dest = r.load(conn, None).destinations["ops"]
    assert dest.url.endswith("/b") and dest.secret == "first-secret"
    rows = audit.search(conn, action="alert_destination_save")
    assert rows and all("first-secret" not in str(row) for row in rows)
