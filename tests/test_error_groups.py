"""What changed in the dead letters (issue 33 item 2a): the errorgroups collector remembers every
error group and says which is new (never seen) or regressed (back after a quiet period), the
default rule new_error_group fires on it with a look-here link to the group's jobs, and an
operator may ignore a group (audited; it never alerts) from the page, the API and the CLI.
On a real PostgreSQL; the dead letters are real rows (console.queue.fail, or written straight
into the table with a finished_at in the past for "seen two days ago")."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from click.testing import CliRunner

from console import errorgroups
from console import queue as q
from console.alerts import evaluate as ev
from console.alerts.defaults import DEFAULT_RULES
from console.alerts.rules import RuleSet
from console.cli import main
from console.collectors import Options, collector_connection
from console.sqlfiles import query
from tests.collector_helpers import cycle
from tests.maintenance_data import add_failed
from tests.web_fixtures import CSRF

RULE = next(r for r in DEFAULT_RULES if r.name == "new_error_group")
FP = "DoNotRetry: CardDeclined: card <n> declined"  # the class, then the message without values


def dead_letter(conn, message: str, *, queue: str = "payments", kind: str = "charge") -> int:
    """One job that fails for good now, as a worker would fail it."""
    job_id = q.enqueue(conn, kind, {"n": 1}, queue=queue, max_attempts=1)
    (job,) = [j for j in q.claim(conn, "w", queues=[queue], limit=10) if j.id == job_id]
    q.fail(conn, job, q.DoNotRetry(message), retry=False)
    return job_id


def changes(report) -> dict[str, tuple[str, float | None]]:
    return {s.labels["fingerprint"]: (s.labels["change"], s.value) for s in report.samples if s.metric == "error_group_new"}


def test_a_new_group_is_reported_with_its_count_and_remembered(dsn, conn):
    first = cycle(dsn)  # nothing yet: the collector's first cycle
    assert not first.errors and changes(first) == {}
    dead_letter(conn, "CardDeclined: card 4242 declined")
    second = cycle(dsn)
    assert changes(second) == {FP: ("new", 1.0)}
    dead_letter(conn, "CardDeclined: card 1111 declined", queue="refunds", kind="refund")
    third = cycle(dsn)
    assert changes(third) == {FP: ("new", 2.0)}  # the same change, counted on: no second "new"
    group = errorgroups.get(conn, FP)
    assert group["change"] == "new" and group["kinds"] == ["charge", "refund"] and group["queues"] == ["payments", "refunds"]
    assert group["example"] == "DoNotRetry: CardDeclined: card 1111 declined" and group["first_seen"] < group["last_seen"]
    assert third.details["error_groups"]["changed"][0]["fingerprint"] == FP


def test_a_group_back_after_the_quiet_period_is_regressed(dsn, conn):
    add_failed(conn, 3, fingerprint=FP, age=timedelta(days=2))  # last seen two days ago
    cycle(dsn)
    assert errorgroups.get(conn, FP) is None  # too old for this cycle: remembered when it fails again
    dead_letter(conn, "CardDeclined: card 4242 declined")
    report = cycle(dsn)
    assert changes(report) == {FP: ("regressed", 1.0)}  # the three old ones came before the change
    group = errorgroups.get(conn, FP)
    assert group["change"] == "regressed" and group["previous_seen"] < group["change_at"] - timedelta(days=1)
    assert group["first_seen"] == group["previous_seen"] - timedelta(milliseconds=2)  # the oldest of the three


def test_a_group_that_keeps_failing_is_no_change_and_a_change_ends_after_its_time(dsn, conn):
    add_failed(conn, 3, fingerprint=FP, age=timedelta(hours=1))  # seen an hour ago: within the quiet period
    cycle(dsn)
    dead_letter(conn, "CardDeclined: card 4242 declined")
    assert changes(cycle(dsn)) == {}
    assert errorgroups.get(conn, FP)["change"] is None
    # A new group is reported for error_group_new_for, then no more (its alert resolves).
    dead_letter(conn, "KeyError: 'customer_id'")
    short = replace(Options(), error_group_new_for=1.5)
    assert changes(cycle(dsn, short)) == {"DoNotRetry: KeyError: <str>": ("new", 1.0)}
    time.sleep(2)
    dead_letter(conn, "KeyError: 'customer_id'")  # it keeps failing: not new again
    assert changes(cycle(dsn, short)) == {}


def test_a_dead_letter_committed_late_is_still_seen(dsn, conn):
    cycle(dsn)
    dead_letter(conn, "CardDeclined: card 4242 declined")
    # As if it committed after the cycle that should have read it: 30 s before the last cycle.
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '30 seconds' WHERE status = 'failed'")
    conn.execute("UPDATE skiplock.collector_state SET taken_at = now() WHERE name = 'errorgroups'")
    assert changes(cycle(dsn)) == {FP: ("new", 1.0)}


def test_an_ignored_group_is_never_reported(dsn, conn):
    cycle(dsn)
    dead_letter(conn, "CardDeclined: card 4242 declined")
    assert changes(cycle(dsn)) == {FP: ("new", 1.0)}
    errorgroups.ignore(conn, FP, actor="alice", reason="INC-7: the issuer is down, known")
    assert changes(cycle(dsn)) == {}
    errorgroups.unignore(conn, FP, actor="alice", reason="issuer back: tell us again")
    assert changes(cycle(dsn)) == {FP: ("new", 1.0)}  # still within its time as new


def test_the_label_hides_configured_secret_keys(dsn, conn):
    cycle(dsn)
    dead_letter(conn, "Refused: account=acme-4 is closed")  # a key only this deployment calls secret
    opts = replace(Options(), secret_keys=Options().secret_keys | {"account"})
    assert list(changes(cycle(dsn, opts))) == ["DoNotRetry: Refused: account=[redacted] is closed"]


def test_the_collector_reads_through_the_dead_letter_indexes(dsn, conn):
    add_failed(conn, 50, fingerprint=FP)
    conn.execute("VACUUM ANALYZE skiplock.jobs")
    with collector_connection(dsn, Options()) as collector:
        recent = "\n".join(r[0] for r in collector.execute(
            "EXPLAIN " + query("error_groups", "recent_failures"), {"since": "2000-01-01", "cap": 10, "groups": 5}))
        earlier = "\n".join(r[0] for r in collector.execute(
            "EXPLAIN " + query("error_groups", "earlier_dead_letters"), {"fingerprint": FP, "before": "2100-01-01"}))
    assert "jobs_failed_idx" in recent and "Seq Scan on jobs" not in recent, recent
    assert "jobs_failed_groups_idx" in earlier and "Seq Scan on jobs" not in earlier, earlier


# --- the alert ------------------------------------------------------------------------------------

def test_the_default_rule_fires_on_a_new_group_and_links_to_its_jobs(dsn, conn):
    cycle(dsn)
    job = dead_letter(conn, "CardDeclined: card 4242 declined")
    cycle(dsn)
    report = ev.evaluate(conn, RuleSet(rules={RULE.name: RULE}, destinations={}))
    (fired,) = [t for t in report.transitions if t.kind == "firing"]
    assert fired.labels == {"fingerprint": FP, "change": "new"} and fired.value == 1
    alert = ev.active_alerts(conn, RuleSet(rules={RULE.name: RULE}, destinations={}))[0]
    assert alert["summary"] == f"1 dead letter(s) of a new error group: {FP}"
    assert alert["look_here"][0]["path"] == "/deadletters/jobs?fingerprint=DoNotRetry%3A+CardDeclined%3A+card+%3Cn%3E+declined"
    assert job


# --- ignore and unignore ---------------------------------------------------------------------------

def test_ignore_and_unignore_are_audited_and_refuse_what_cannot_be(conn):
    with pytest.raises(errorgroups.GroupNotFound, match="no dead letter has that fingerprint"):
        errorgroups.ignore(conn, FP, actor="alice", reason="nothing to ignore")
    add_failed(conn, 2, fingerprint=FP)
    row = errorgroups.ignore(conn, FP, actor="alice", reason="INC-7: known")  # remembered from its dead letters
    assert row["ignored_by"] == "alice" and row["first_seen"] is not None
    with pytest.raises(errorgroups.GroupState, match="already ignored"):
        errorgroups.ignore(conn, FP, actor="bob", reason="again")
    errorgroups.unignore(conn, FP, actor="bob", reason="fixed in 4.2")
    with pytest.raises(errorgroups.GroupState, match="is not ignored"):
        errorgroups.unignore(conn, FP, actor="bob", reason="again")
    audit = conn.execute("SELECT actor, action, reason, selection, rows FROM skiplock.audit_log ORDER BY id").fetchall()
    assert audit == [("alice", "error_group_ignore", "INC-7: known", {"fingerprint": FP}, 1),
                     ("bob", "error_group_unignore", "fixed in 4.2", {"fingerprint": FP}, 1)]


def test_the_pages_show_the_state_and_viewers_cannot_ignore(client_as, conn):
    add_failed(conn, 2, fingerprint=FP)
    conn.execute("UPDATE skiplock.jobs SET last_error = 'CardDeclined: token=tok_live_42 declined'")
    viewer, operator = client_as("viewer"), client_as("operator")
    form = {"csrf_token": CSRF, "fingerprint": FP, "reason": "INC-7: the issuer is down"}
    assert viewer.post("/deadletters/groups/ignore", data=form).status_code == 403
    assert viewer.post("/api/v1/deadletters/groups/ignore", data=form).status_code == 403
    no_csrf = operator.post("/deadletters/groups/ignore", data={k: v for k, v in form.items() if k != "csrf_token"})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.get_data(as_text=True)
    assert conn.execute("SELECT count(*) FROM skiplock.error_groups").fetchone()[0] == 0
    r = operator.post("/deadletters/groups/ignore", data={**form, "next": "/deadletters?queue=default"})
    assert r.status_code == 303 and r.headers["Location"].endswith("/deadletters?queue=default")
    groups = viewer.get("/api/v1/deadletters").get_json()["groups"]
    assert [(g["state"], g["ignored_by"], g["ignore_reason"]) for g in groups] == [
        ("ignored", "operator", "INC-7: the issuer is down")]
    page = viewer.get(f"/deadletters/jobs?fingerprint={FP}").get_data(as_text=True)
    assert 'id="error-group" data-group-state="ignored"' in page and "INC-7: the issuer is down" in page
    assert "tok_live_42" not in page and "token=[redacted]" in page  # the example, as error text
    assert "data-ignore-group" not in page  # no button for a viewer
    assert "data-ignore-group" in operator.get(f"/deadletters/jobs?fingerprint={FP}").get_data(as_text=True)
    api = viewer.get(f"/api/v1/deadletters/jobs?fingerprint={FP}").get_json()
    assert api["group"]["state"] == "ignored" and "tok_live_42" not in api["group"]["example"]
    # Twice is a conflict; an unknown group is a 404; a missing fingerprint a 400.
    again = operator.post("/api/v1/deadletters/groups/ignore", json={"fingerprint": FP, "reason": "again, please"},
                          headers={"X-CSRF-Token": CSRF})
    assert again.status_code == 409 and "already ignored" in again.get_json()["error"]
    unknown = operator.post("/api/v1/deadletters/groups/unignore", data={**form, "fingerprint": "Nope: <n>"})
    assert unknown.status_code == 404
    assert operator.post("/api/v1/deadletters/groups/ignore", data={"csrf_token": CSRF, "reason": "why not"}).status_code == 400
    back = operator.post("/api/v1/deadletters/groups/unignore", json={"fingerprint": FP, "reason": "fixed in 4.2"},
                         headers={"X-CSRF-Token": CSRF})
    assert back.status_code == 200 and back.get_json()["state"] is None


def test_the_cli_ignores_and_names_the_nearest_group(dsn, conn):
    add_failed(conn, 2, fingerprint=FP)
    runner = CliRunner()
    typo = runner.invoke(main, ["--dsn", dsn, "groups", "ignore", "DoNotRetry: CardDeclined: card declined", "--reason", "INC-7"])
    assert typo.exit_code == 2 and repr(FP) in typo.output, typo.output
    done = runner.invoke(main, ["--dsn", dsn, "groups", "ignore", FP, "--reason", "INC-7: known"])
    assert done.exit_code == 0 and "ignored" in done.output, done.output
    listed = runner.invoke(main, ["--dsn", dsn, "groups", "list"])
    assert "ignored by cli:" in listed.output, listed.output
    assert errorgroups.get(conn, FP)["ignore_reason"] == "INC-7: known"


def test_the_alert_page_and_the_webhook_show_the_group_with_its_secrets_hidden(dsn, conn, client_as):
    from console.alerts.rules import parse_destination

    cycle(dsn)
    job = dead_letter(conn, "CardDeclined: card 4242 declined, token=tok_live_42")
    cycle(dsn)
    rules = RuleSet(rules={RULE.name: RULE}, destinations={"ops": parse_destination({"name": "ops", "url": "https://hooks.example/ops"})})
    ev.evaluate(conn, rules)
    alert_id, document = conn.execute("SELECT alert_id, notification FROM skiplock.alert_outbox").fetchone()
    group = document["alert"]["error_group"]
    assert group["change"] == "new" and group["kinds"] == ["charge"] and group["queues"] == ["payments"]
    assert group["example"] == "DoNotRetry: CardDeclined: card 4242 declined, token=[redacted]"
    assert group["example_job"] == job and group["first_seen"] and not group["ignored"]
    page = client_as("viewer").get(f"/alerts/{alert_id}").get_data(as_text=True)
    assert 'id="error-group" data-group-change="new"' in page and "payments" in page and "tok_live_42" not in page
    assert "data-ignore-group" not in page
    operator = client_as("operator")
    assert "data-ignore-group" in operator.get(f"/alerts/{alert_id}").get_data(as_text=True)
    (fingerprint,) = conn.execute("SELECT error_fingerprint FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()
    assert "tok_live_42" not in fingerprint  # fingerprints hide the default secret keys
    r = operator.post("/deadletters/groups/ignore", data={"csrf_token": CSRF, "fingerprint": fingerprint,
                                                          "reason": "INC-7: the issuer", "next": f"/alerts/{alert_id}"})
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/alerts/{alert_id}")
    cycle(dsn)
    ev.evaluate(conn, rules)  # the ignored group's series is gone: its alert resolves
    assert conn.execute("SELECT state FROM skiplock.alerts WHERE id = %s", (alert_id,)).fetchone()[0] == "ok"
