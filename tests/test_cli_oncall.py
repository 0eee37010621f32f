"""The command line on a first incident (issue 33 item 6): a typo is refused rather than
obeyed, a group copied from a page finds its fingerprint, and the queues and periodic schedules
can be listed and acted on from the shell."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from console import queue as q
from console.cli import main
from console.queue import limits, periodic
from tests.maintenance_data import add_failed


@pytest.fixture
def skiplock(dsn):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, ["--dsn", dsn, *args], catch_exceptions=False)

    return invoke


def queue_rows(conn) -> list[tuple]:
    return conn.execute("SELECT name, paused FROM skiplock.queues ORDER BY name").fetchall()


# --- pause: a typo is refused ------------------------------------------------------------------

def test_pausing_a_queue_nobody_knows_is_refused_and_names_the_nearest(conn, skiplock):
    q.enqueue(conn, "send", queue="mailer")
    result = skiplock("pause", "mailr", "--reason", "INC-1: relay down")
    assert result.exit_code == 2, result.output
    assert "there is no queue 'mailr'" in result.output and "'mailer'" in result.output
    assert "--create" in result.output
    assert queue_rows(conn) == []  # no phantom queue
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0] == 0
    assert skiplock("resume", "mailr", "--reason", "typo").exit_code == 2
    assert queue_rows(conn) == []


def test_known_queues_pause_and_create_pauses_one_ahead_of_its_first_job(conn, skiplock):
    q.enqueue(conn, "send", queue="mailer")
    assert skiplock("pause", "mailer", "--reason", "INC-1").exit_code == 0
    result = skiplock("pause", "reports", "--create", "--reason", "INC-2: hold the new queue")
    assert result.exit_code == 0 and "a new queue" in result.output
    assert queue_rows(conn) == [("mailer", True), ("reports", True)]
    # Paused before (a row of its own), limits, samples: each makes a queue known.
    assert skiplock("resume", "reports", "--reason", "ready").exit_code == 0
    limits.set_limits(conn, "limited", concurrency=2, actor="alice", reason="quota")
    assert skiplock("pause", "limited", "--reason", "INC-3").exit_code == 0
    from console import samples
    samples.store(conn, [samples.Sample("queue_depth", {"queue": "sampled", "state": "eligible"}, 0.0,
                                        datetime.now(UTC))])
    assert skiplock("pause", "sampled", "--reason", "INC-4").exit_code == 0


def test_the_api_refuses_an_unknown_queue_unless_asked_to_create_it(client_as, conn):
    from tests.web_fixtures import CSRF

    q.enqueue(conn, "send", queue="mailer")
    client = client_as("operator")
    refused = client.post("/api/v1/queues/mailr/pause", data={"reason": "INC-1"}, headers={"X-CSRF-Token": CSRF})
    assert refused.status_code == 404 and "'mailer'" in refused.get_json()["error"]
    assert "create=true" in refused.get_json()["error"]
    assert queue_rows(conn) == []
    made = client.post("/api/v1/queues/reports/pause", data={"reason": "INC-2", "create": "true"},
                       headers={"X-CSRF-Token": CSRF})
    assert made.status_code == 200 and queue_rows(conn) == [("reports", True)]


# --- a group copied from a page ----------------------------------------------------------------

def test_a_group_that_matches_nothing_names_the_nearest_fingerprint(conn, skiplock, client_as):
    from tests.web_fixtures import CSRF

    message = "KeyError: 'customer_identifier_for_billing_account'"
    ids = add_failed(conn, 3, fingerprint="KeyError: <str>")
    conn.execute("UPDATE skiplock.jobs SET last_error = %s WHERE id = ANY(%s)", (message, ids))
    add_failed(conn, 2, fingerprint="SMTPError: timeout")
    # What the page shows is the message; the group is its fingerprint (far from the message
    # as text: the group's example message is what finds it).
    result = skiplock("replay", "--group", message, "--reason", "INC-5: fixed the mapping")
    assert result.exit_code == 2, result.output
    assert "the nearest error group is 'KeyError: <str>'" in result.output
    dry = skiplock("purge", "--group", message, "--dry-run")
    assert dry.exit_code == 0 and "the nearest error group is 'KeyError: <str>'" in dry.output
    api = client_as("operator").post("/api/v1/deadletters/operations", headers={"X-CSRF-Token": CSRF},
                                     data={"action": "replay", "fingerprint": "KeyError: <st>", "reason": "INC-5"})
    assert api.status_code == 400 and "the nearest error group is 'KeyError: <str>'" in api.get_json()["error"]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0] == 5


# --- skiplock queues list ----------------------------------------------------------------------

def test_queues_list_shows_depth_age_dead_letters_limits_and_paused(conn, skiplock):
    for _ in range(3):
        q.enqueue(conn, "send", queue="mailer")
    q.enqueue(conn, "send", queue="mailer", run_at=datetime.now(UTC) + timedelta(hours=1))
    add_failed(conn, 2, queue="mailer")
    limits.set_limits(conn, "mailer", concurrency=4, rate="10/s", actor="alice", reason="relay quota")
    from console import maintenance as m
    m.pause_queue(conn, "billing", actor="bob", reason="INC-8", create=True)
    result = skiplock("queues", "list")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()[1:] if line.strip()}
    assert result.output.splitlines()[0].split()[:6] == ["QUEUE", "ELIGIBLE", "SCHEDULED", "RUNNING", "OLDEST", "DEAD"]
    mailer = lines["mailer"].split()
    assert mailer[1:4] == ["3", "1", "0"] and "2" in mailer and "concurrency 4, rate 10/s" in lines["mailer"]
    assert "paused by bob" in lines["billing"]
    data = json.loads(skiplock("queues", "list", "--json").output)
    row = {r["queue"]: r for r in data["queues"]}["mailer"]
    assert (row["eligible"], row["scheduled"], row["failed"], row["limits"]["concurrency"]) == (3, 1, 2, 4)


# --- skiplock periodic list|pause|resume|run ---------------------------------------------------

@pytest.fixture
def nightly(conn):
    periodic.sync(conn, periodic.parse_entries([("#1", {"name": "nightly", "kind": "report", "every": "1h"}, "config")]))
    return "nightly"


def test_periodic_list_pause_resume_and_run(conn, skiplock, nightly):
    listed = skiplock("periodic", "list")
    assert listed.exit_code == 0 and "nightly" in listed.output and "every 1 h" in listed.output
    assert "active" in listed.output
    paused = skiplock("periodic", "pause", "nightly", "--reason", "INC-9: report DB down")
    assert paused.exit_code == 0 and "paused" in paused.output
    assert conn.execute("SELECT paused FROM skiplock.periodic WHERE name = 'nightly'").fetchone()[0] is True
    audit = conn.execute("SELECT action, reason FROM skiplock.audit_log ORDER BY id").fetchall()
    assert audit == [("periodic_pause", "INC-9: report DB down")]
    assert "paused" in skiplock("periodic", "list").output
    data = json.loads(skiplock("periodic", "list", "--json").output)
    assert data["schedules"][0]["paused"] is True
    assert skiplock("periodic", "resume", "nightly", "--reason", "DB back").exit_code == 0
    run = skiplock("periodic", "run", "nightly", "--reason", "catch up by hand")
    assert run.exit_code == 0 and "job " in run.output
    job_id = int(run.output.split("job ")[1].split()[0])
    assert conn.execute("SELECT kind FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "report"
    missing = skiplock("periodic", "pause", "nightyl", "--reason", "typo")
    assert missing.exit_code == 2 and "nightly" in missing.output


# --- skiplock why ------------------------------------------------------------------------------

def test_why_answers_for_a_job_and_a_queue(conn, skiplock):
    from console import maintenance as m

    job = q.enqueue(conn, "send", queue="mailer")
    m.pause_queue(conn, "mailer", actor="alice", reason="INC-1: relay down")
    result = skiplock("why", str(job))
    assert result.exit_code == 0 and result.output.startswith("Queue mailer is paused (by alice")
    assert "INC-1: relay down" in result.output and "No live worker" in result.output
    data = json.loads(skiplock("why", "--queue", "mailer", "--json").output)
    assert (data["subject"], data["code"], data["job"]["id"]) == ("queue", "paused", job)
    assert skiplock("why", "987654321").exit_code == 2
    assert skiplock("why").exit_code == 2
