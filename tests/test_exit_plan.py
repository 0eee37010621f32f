"""The exit plan's command line (issue 32, item 3; docs/exit-plan.md): `skiplock exit-plan QUEUE`
and `skiplock queues move QUEUE --to nats|postgres | --status`, on a real PostgreSQL. No broker is
needed: the move only routes new jobs, and the plan reads PostgreSQL (tests/test_nats_broker.py
runs the relay and the broker worker against a real nats-server).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from console import exitplan
from console import queue as q
from console.cli import main
from console.db import connect
from console.queue import broker
from console.sqlfiles import query
from tests.maintenance_data import add_failed
from tests.nats_helpers import set_backend
from tests.test_advisor_verdict import healthy, history

REASON = "INC-88: mail outgrew PostgreSQL (advisor verdict)"


def cli(dsn: str, *args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["--dsn", dsn, *args], env=env or {}, catch_exceptions=False)


def moves(conn) -> list[tuple]:
    return conn.execute("SELECT target, reason, detail FROM skiplock.audit_log WHERE action = 'move queue' ORDER BY id"
                        ).fetchall()


def jobs_of_mail(conn) -> None:
    """Two due jobs, one for later, one running and one dead letter in queue mail (PostgreSQL)."""
    for _ in range(3):
        q.enqueue(conn, "send", {}, queue="mail")
    q.enqueue(conn, "send", {}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    (job,) = q.claim(conn, "w1", queues=["mail"])
    add_failed(conn, 1, queue="mail")
    return job


def test_the_plan_shows_the_verdict_its_signals_by_scope_and_the_steps_of_a_postgres_queue(dsn, conn):
    history(conn, 48, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, lambda x: 0.004 + 0.1 * x),
                               ({"queue": "mail", "source": "probe", "quantile": "last"}, lambda x: 0.003 + 0.05 * x)],
    ))
    jobs_of_mail(conn)
    result = cli(dsn, "exit-plan", "mail")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Backend now: postgres" in out
    assert "The advisor's verdict: outgrowing PostgreSQL" in out and "plan the move" in out
    database, own = out.split("Signals of the whole database (every queue of it together):")[1].split(
        "Signal of queue mail alone:")
    assert "[OUTGROWING] Claim latency growing: claim latency went from" in database
    assert "Autovacuum falling behind" in database and "of queue mail" not in database
    assert "[OUTGROWING] Claim latency of queue mail: claim latency of queue mail went from 11.3 ms to 44.7 ms" in own
    assert "skiplock.jobs: 2 pending, 1 scheduled, 1 running (0 stuck); dead letters: 1" in out
    steps = out.split("Steps:")[1]
    for line in ("Install the NATS client", "pip install 'skiplock[nats]'", "nats-server -js -sd /var/lib/nats",
                 "4. [to do]     Start the relay", "         skiplock relay",
                 "skiplock worker --backend nats --queues mail --tasks YOUR.TASKS",
                 "6. [to do]     Move the queue", "skiplock queues move mail --to nats --reason",
                 "7. [to do]     Watch the drain", "skiplock queues move mail --status",
                 "8. [if needed] Roll back: new jobs return to skiplock.jobs", "skiplock queues move mail --to postgres --reason"):
        assert line in steps, (line, steps)

    plan = json.loads(cli(dsn, "exit-plan", "mail", "--json").output)
    assert plan["queue"] == "mail" and plan["backend"] == "postgres"
    assert plan["verdict"]["label"] == "outgrowing PostgreSQL"
    scopes = {s["id"]: s["scope"] for s in plan["signals"]}
    assert scopes.pop("queue-claim-latency") == "queue" and set(scopes.values()) == {"database"}
    assert {s["id"] for s in plan["signals"] if s["level"] == "outgrowing"} == {"claim-latency", "queue-claim-latency"}
    jobs = plan["dual_run"]["jobs"]
    assert (jobs["pending"], jobs["scheduled"], jobs["running"], jobs["failed"]) == (2, 1, 1, 1)
    assert [s["number"] for s in plan["steps"]] == list(range(1, 9))
    assert [s["state"] for s in plan["steps"]][3:] == ["to do", "check", "to do", "to do", "if needed"]


def test_a_plan_without_the_outgrowing_verdict_says_to_fix_first_and_unknown_queues_are_named(dsn, conn):
    q.enqueue(conn, "send", {}, queue="mail")
    result = cli(dsn, "exit-plan", "mail")
    assert result.exit_code == 0, result.output
    assert "The advisor's verdict: not enough history" in result.output
    assert "not \"outgrowing PostgreSQL\": fix what `skiplock check`" in result.output
    assert "no probe samples of queue mail yet" in result.output
    for args in (["exit-plan", "mial"], ["queues", "move", "mial", "--status"],
                 ["queues", "move", "mial", "--to", "nats", "--reason", REASON]):
        bad = cli(dsn, *args)
        assert bad.exit_code == 2, (args, bad.output)
        assert "there is no queue 'mial'" in bad.output and "did you mean 'mail'" in bad.output, bad.output
    assert broker.backend_of(conn, "mial") == "postgres" and moves(conn) == []
    created = cli(dsn, "queues", "move", "mial", "--to", "nats", "--reason", REASON, "--create")
    assert created.exit_code == 0 and broker.backend_of(conn, "mial") == "nats", created.output


def test_moving_to_nats_leaves_a_watched_dual_run_window_and_marks_the_steps_done(dsn, conn):
    job = jobs_of_mail(conn)
    moved = cli(dsn, "queues", "move", "mail", "--to", "nats", "--reason", REASON)
    assert moved.exit_code == 0, moved.output
    assert "queue 'mail': moved to nats (was: postgres); new jobs go to the outbox" in moved.output
    assert ("Left on PostgreSQL (skiplock.jobs): 2 pending, 1 scheduled, 1 running: keep the PostgreSQL workers"
            in moved.output)
    assert "1 dead letter stays in skiplock.jobs, replayable" in moved.output
    assert "watch the drain: skiplock queues move mail --status" in moved.output
    assert broker.backend_of(conn, "mail") == "nats"
    ((target, reason, detail),) = moves(conn)
    assert (target, reason, detail["before"], detail["after"]) == ("queue:mail", REASON, "postgres", "nats")
    assert detail["left"]["jobs"] | {"capped": False} == {"pending": 2, "scheduled": 1, "running": 1, "failed": 1,
                                                          "capped": False}
    assert q.enqueue(conn, "send", {}, queue="mail") and conn.execute(
        "SELECT count(*) FROM skiplock.outbox WHERE queue = 'mail'").fetchone()[0] == 1  # new jobs: the outbox

    again = cli(dsn, "queues", "move", "mail", "--to", "nats", "--reason", REASON)
    assert again.exit_code == 0 and "already served by nats: nothing changed (no audit row)" in again.output
    assert len(moves(conn)) == 1

    # the relay's leader lock held by a session of its own, the broker's address configured
    relay = connect(dsn, application_name="skiplock-relay")
    try:
        assert relay.execute(query("broker", "relay_lock")).fetchone()[0] is True
        env = {"SKIPLOCK_BROKER_NATS_URL": "nats://alice:secret@nats.internal:4222"}
        plan = json.loads(cli(dsn, "exit-plan", "mail", "--json", env=env).output)
        text = cli(dsn, "exit-plan", "mail", env=env).output
    finally:
        relay.close()
    states = [s["state"] for s in plan["steps"]]
    assert states[2:] == ["done", "done", "check", "done", "to do", "if needed"], plan["steps"]
    assert f"running: pid {plan['steps'][3]['note'].split('pid ')[1].split(' ')[0]} (skiplock-relay)" in text
    assert "in force: nats://****@nats.internal:4222" in text and "secret" not in text
    assert plan["dual_run"]["drained"] is False and plan["dual_run"]["left"] == 4

    # the PostgreSQL workers finish what was left: the drain is complete
    q.complete(conn, job)
    for other in q.claim(conn, "w1", queues=["mail"], limit=10):
        q.complete(conn, other)
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE queue = 'mail' AND status = 'pending'")
    for other in q.claim(conn, "w1", queues=["mail"], limit=10):
        q.complete(conn, other)
    status = cli(dsn, "queues", "move", "mail", "--status")
    assert status.exit_code == 0, status.output
    assert "backend nats" in status.output and "outbox: 1 unsent" in status.output
    assert "Drained: no pending, scheduled or running job of this queue is left in skiplock.jobs." in status.output
    plan = json.loads(cli(dsn, "exit-plan", "mail", "--json").output)
    assert plan["steps"][6]["state"] == "done" and plan["dual_run"]["drained"] is True
    assert len(moves(conn)) == 1  # --status and exit-plan changed nothing


def test_moving_back_to_postgres_says_what_the_relay_still_publishes(dsn, conn):
    set_backend(dsn, "mail")
    for _ in range(3):
        q.enqueue(conn, "send", {}, queue="mail")
    q.enqueue(conn, "send", {}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    conn.execute("UPDATE skiplock.outbox SET sent_at = now() WHERE id = (SELECT min(id) FROM skiplock.outbox)")
    back = cli(dsn, "queues", "move", "mail", "--to", "postgres", "--reason", "back: the broker cluster is rebuilt")
    assert back.exit_code == 0, back.output
    assert "moved to postgres (was: nats); new jobs go to skiplock.jobs" in back.output
    assert ("Left for the broker: 3 unsent outbox rows (1 of them wait for their run_at), which `skiplock relay` "
            "still publishes") in back.output
    ((_, _, detail),) = moves(conn)
    assert detail["left"]["outbox_unsent"] == 3 and detail["after"] == "postgres"
    q.enqueue(conn, "send", {}, queue="mail")
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE queue = 'mail'").fetchone()[0] == 1
    state = json.loads(cli(dsn, "queues", "move", "mail", "--status", "--json").output)
    assert (state["backend"], state["old_side"], state["left"], state["drained"]) == ("postgres", "nats", 3, False)
    conn.execute("UPDATE skiplock.outbox SET sent_at = now()")
    state = json.loads(cli(dsn, "queues", "move", "mail", "--status", "--json").output)
    assert state["drained"] is True and "`skiplock queues move mail --status` (which asks the broker)" in state["text"]


def test_bad_moves_are_refused_before_anything_changes(dsn, conn):
    q.enqueue(conn, "send", {}, queue="mail.eu")
    q.enqueue(conn, "send", {}, queue="mail")
    for args, says in ((["mail.eu", "--to", "nats", "--reason", REASON], "cannot be served by a broker"),
                       (["mail", "--to", "nats"], "--reason"),
                       (["mail", "--to", "nats", "--status", "--reason", REASON], "either --to"),
                       (["mail"], "either --to"),
                       (["mail", "--to", "kafka", "--reason", REASON], "'kafka' is not one of")):
        bad = cli(dsn, "queues", "move", *args)
        assert bad.exit_code == 2 and says in bad.output, (args, bad.output)
    assert broker.backend_of(conn, "mail") == broker.backend_of(conn, "mail.eu") == "postgres"
    assert moves(conn) == []
    # `queues backend` keeps its own action, and writes every time (as before)
    for _ in range(2):
        assert cli(dsn, "queues", "backend", "mail", "nats", "--reason", REASON).exit_code == 0
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE action = 'set backend'").fetchone()[0] == 2


def test_the_relay_leader_is_read_from_pg_locks(dsn, conn):
    assert exitplan.relay_leaders(conn) == []
    other = connect(dsn, application_name="not-the-relay")
    try:
        other.execute("SELECT pg_advisory_lock(hashtext('skiplock'), hashtext('other'))")  # not the relay's key
        assert exitplan.relay_leaders(conn) == []
        other.execute(query("broker", "relay_lock"))
        assert [r["application_name"] for r in exitplan.relay_leaders(conn)] == ["not-the-relay"]
    finally:
        other.close()


def test_the_plan_takes_this_machines_tools_as_found(conn):
    q.enqueue(conn, "send", {}, queue="mail")
    missing = exitplan.plan(conn, "mail", client_installed=False, server_path=None)
    found = exitplan.plan(conn, "mail", client_installed=True, server_path="/usr/sbin/nats-server")
    assert [s.state for s in missing.steps[:3]] == ["to do", "check", "check"]
    assert [s.state for s in found.steps[:2]] == ["done", "done"] and "/usr/sbin/nats-server" in found.steps[1].note


def test_a_drain_hidden_beyond_the_claim_index_window_is_not_called_complete(dsn, conn, monkeypatch):
    from console import browse

    figures = browse.queue_figures
    monkeypatch.setattr(exitplan.browse, "queue_figures", lambda c: figures(c, pending_cap=2))
    for _ in range(2):
        q.enqueue(conn, "send", {}, queue="reports", priority=5)  # the head of the claim index
    q.enqueue(conn, "send", {}, queue="mail")  # beyond the window of 2
    set_backend(dsn, "mail")
    state = exitplan.dual_run(conn, "mail")
    assert state["drained"] is None and state["jobs"]["capped"] is True
    assert "the drain cannot be confirmed yet" in state["text"]
    assert exitplan.plan(conn, "mail").steps[6].state == "to do"


def test_a_tasks_module_in_the_current_directory_that_the_command_cannot_import_is_named_with_the_fix(
        tmp_path, monkeypatch):
    """docs/exit-plan.md's `skiplock worker --backend nats --queues mail --tasks YOUR.TASKS`, with
    the tasks module beside the user: the `skiplock` command does not import from the current
    directory (only `python -m` adds it), and the refusal says so."""
    import sys

    (tmp_path / "walk_tasks_here.py").write_text("import console\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    result = CliRunner().invoke(main, ["worker", "--backend", "nats", "--queues", "mail", "--tasks",
                                       "walk_tasks_here"])
    assert result.exit_code == 2
    assert "walk_tasks_here is in the current directory" in result.output and "PYTHONPATH=." in result.output
    elsewhere = CliRunner().invoke(main, ["worker", "--tasks", "no_such_tasks_module_anywhere"])
    assert elsewhere.exit_code == 2 and "current directory" not in elsewhere.output
