"""Issue 26, class 3: caps per operator and per database, on every face.

Thirty bulk replays started with rate=0.0001 used to give thirty threads and thirty idle
PostgreSQL connections, and nothing refused a thirty-first. Now running bulk operations are
capped per database and per actor (console.caps), a throttled runner holds no connection while
it sleeps, and the other things a signed-in user can make the console keep (sessions, tokens,
silences, saved rules and destinations, enqueues, paused queues, exports, webhook tests) have a
cap each. Real PostgreSQL; threads are the console's own (the web starts runners in threads).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from click.testing import CliRunner

from console import audit, periodic
from console.actions import cli_actor
from console.alerts import rules as r
from console.caps import CapReached, Caps
from console.cli import main
from console.config import load_config
from console.maintenance import bulk
from console.maintenance.bulk import cancel, progress, resume, resume_abandoned, start
from console.users import start_session
from tests.maintenance_data import add_failed, replay_entries
from tests.web_fixtures import CSRF, PASSWORD
from tests.workers import wait_for

SLEEPY = 0.0001  # rows per second: a pause of hours after the first batch, as in the report


def bulk_sessions(conn, op_id: int | None = None) -> int:
    """Connections bulk runners hold now (their application_name is skiplock-bulk-<id>)."""
    pattern = "skiplock-bulk-%" if op_id is None else f"skiplock-bulk-{op_id}"
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s "
                        "AND application_name NOT LIKE '%%-poll'", (pattern,)).fetchone()[0]


def bulk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("skiplock-bulk-") and t.is_alive()]


def end_all(conn) -> None:
    """Cancel what is still queued or running, and wait for the runners' threads to end."""
    for (op_id,) in conn.execute("SELECT id FROM skiplock.bulk_operations WHERE state IN ('queued', 'running')").fetchall():
        cancel(conn, op_id, actor="cleanup")
    wait_for(lambda: not bulk_threads(), timeout=30, what="the bulk runners' threads to end")


@pytest.fixture
def web_settings(web_settings):
    """The console's runners replay one row per batch here (one row, then a pause of hours), and
    the other caps are small so a test reaches each in a few requests."""
    return {**web_settings, "maintenance.batch_size": 1, "caps.sessions_per_user": 3, "caps.tokens_per_user": 2,
            "caps.silences": 2, "caps.destinations": 2, "caps.enqueue_per_minute": 3, "caps.paused_queues": 2,
            "caps.exports_per_user": 1, "caps.tests_per_user": 1, "alerts.allow_private_destinations": True}


@pytest.fixture
def sleepy(conn):
    """Makes sure no runner thread outlives the test's database."""
    yield
    end_all(conn)


def started_and_refused(conn) -> tuple[int, int]:
    ops = conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0]
    return ops, len([r for r in audit.search(conn, action="replay") if r["outcome"] == "started"])


# --- bulk operations: the domain -------------------------------------------------------------------

def test_bulk_operations_are_capped_per_actor_and_per_database(conn):
    add_failed(conn, 20)
    caps = Caps(bulk_running=3, bulk_per_actor=2)
    mine = [start(conn, "replay", {"all": True}, actor="alice", caps=caps) for _ in range(2)]
    before = started_and_refused(conn)
    with pytest.raises(CapReached) as third:
        start(conn, "replay", {"all": True}, actor="alice", caps=caps)
    message = str(third.value)
    assert "caps.bulk_per_actor" in message and "'alice'" in message and f"#{mine[0]}, #{mine[1]}" in message
    assert third.value.limit == 2 and third.value.count == 2
    assert started_and_refused(conn) == before  # nothing written, nothing audited
    start(conn, "replay", {"all": True}, actor="bob", caps=caps)  # bob has room: the database has one
    with pytest.raises(CapReached, match=r"caps\.bulk_running"):
        start(conn, "purge", {"all": True}, actor="carol", caps=caps)
    # an ended operation frees its place
    cancel(conn, mine[0], actor="alice")
    assert start(conn, "replay", {"all": True}, actor="carol", caps=caps)
    # the defaults cap even a caller that passes none
    for (op_id,) in conn.execute("SELECT id FROM skiplock.bulk_operations WHERE state = 'queued'").fetchall():
        cancel(conn, op_id, actor="alice")
    with pytest.raises(CapReached, match=r"caps\.bulk_per_actor"):
        for _ in range(Caps().bulk_per_actor + 1):
            start(conn, "replay", {"all": True}, actor="dave")


def test_parallel_starts_cannot_pass_the_cap(conn, dsn):
    from console.db import connect

    add_failed(conn, 10)
    caps = Caps(bulk_running=3, bulk_per_actor=3)
    results: list[str] = []
    go = threading.Barrier(8)

    def one(i: int) -> None:
        with connect(dsn) as own:
            go.wait(30)
            try:
                start(own, "replay", {"all": True}, actor=f"op{i % 2}", caps=caps)
                results.append("started")
            except CapReached:
                results.append("refused")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["refused"] * 5 + ["started"] * 3
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 3


def test_a_resume_counts_against_the_caps_of_the_operations_starter(conn):
    add_failed(conn, 10)
    caps = Caps(bulk_running=5, bulk_per_actor=2)
    first = start(conn, "replay", {"all": True}, actor="alice", caps=caps)
    cancel(conn, first, actor="alice")
    start(conn, "replay", {"all": True}, actor="alice", caps=caps)
    start(conn, "replay", {"all": True}, actor="alice", caps=caps)
    with pytest.raises(CapReached, match=r"caps\.bulk_per_actor"):
        resume(conn, first, actor="bob", reason="try again", caps=caps)
    assert progress(conn, first)["state"] == "cancelled"
    assert audit.search(conn, action="resume_operation") == []


def test_a_throttled_operation_holds_no_connection_while_it_sleeps(conn, dsn, sleepy):
    add_failed(conn, 20)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=5, rate=SLEEPY)
    thread = bulk.run_in_thread(dsn, op_id)
    wait_for(lambda: progress(conn, op_id)["done"] == 5, timeout=60, interval=0.05, what="the first batch")
    wait_for(lambda: bulk_sessions(conn, op_id) == 0, timeout=30, interval=0.05,
             what="the sleeping runner to give its connection back")
    assert thread.is_alive() and progress(conn, op_id)["state"] == "running"
    # the scheduler leaves a sleeping operation to its runner (its pause is hours long); were it
    # to take it over, its own runner would sleep too: the timer stops that one
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)
    timer.start()
    assert resume_abandoned(dsn, min_age=timedelta(0), stop=stop) == []
    timer.cancel()
    assert progress(conn, op_id)["done"] == 5
    # a cancel is not kept waiting for the pause, and is recorded once
    t0 = time.monotonic()
    assert cancel(conn, op_id, actor="bob", reason="too slow")["state"] == "cancelled"
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - t0 < 15
    final = progress(conn, op_id)
    assert (final["state"], final["done"]) == ("cancelled", 5)
    assert [r["outcome"] for r in audit.search(conn, action="replay")] == ["cancelled", "started"]
    wait_for(lambda: bulk_sessions(conn) == 0, timeout=10, interval=0.05, what="every bulk connection to close")


def test_a_sleeper_that_died_is_resumed_after_its_pause_and_touches_each_job_once(conn, dsn):
    ids = add_failed(conn, 10)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=5, rate=2.0)  # 2.5 s pauses
    stop = threading.Event()
    # the process stops while its runner sleeps without a connection (a shutdown, a crash)
    bulk.run(dsn, op_id, stop=stop, on_batch=lambda *_: stop.set())
    mid = progress(conn, op_id)
    assert (mid["state"], mid["done"]) == ("running", 5)
    wait_for(lambda: bulk_sessions(conn, op_id) == 0, timeout=10, interval=0.05, what="the runner's connection to close")
    assert resume_abandoned(dsn, min_age=timedelta(0)) == []  # within its pause and the grace
    conn.execute("UPDATE skiplock.bulk_operations SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (op_id,))
    assert resume_abandoned(dsn, min_age=timedelta(0)) == [op_id]
    final = progress(conn, op_id)
    assert (final["state"], final["done"]) == ("done", 10)
    entries = replay_entries(conn, op_id)
    assert sorted(entries) == sorted(ids) and set(entries.values()) == {1}


# --- bulk operations: the faces ------------------------------------------------------------------

def test_thirty_sleepy_replays_from_the_api_start_two_and_hold_no_connection(conn, client_as, sleepy):
    add_failed(conn, 100)
    client = client_as("operator")
    answers = [client.post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "replay", "queue": "default", "reason": f"attempt {i}", "rate": str(SLEEPY)})
        for i in range(30)]
    codes = [a.status_code for a in answers]
    assert codes[:2] == [201, 201] and codes[2:] == [429] * 28, codes
    refusal = answers[2].get_json()
    assert refusal["status"] == 429 and "caps.bulk_per_actor" in refusal["error"] and "'operator'" in refusal["error"]
    assert len(bulk_threads()) <= 2
    op_ids = [a.get_json()["id"] for a in answers[:2]]
    wait_for(lambda: all(progress(conn, i)["done"] >= 1 or progress(conn, i)["state"] != "running" for i in op_ids),
             timeout=60, what="the first batches")
    wait_for(lambda: bulk_sessions(conn) == 0, timeout=30, interval=0.05, what="the sleeping runners' connections")
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 2


def test_the_form_and_the_resume_route_answer_429_naming_the_cap(conn, client_as, sleepy):
    add_failed(conn, 100, queue="billing")
    client = client_as("operator")
    form = {"csrf_token": CSRF, "action": "replay", "queue": "billing", "reason": "gateway is back", "rate": str(SLEEPY)}
    assert [client.post("/deadletters/operations", data=form).status_code for _ in range(2)] == [303, 303]
    page = client.post("/deadletters/operations", data=form)
    assert page.status_code == 429 and "caps.bulk_per_actor" in page.get_data(as_text=True)
    fragment = client.post("/deadletters/operations", data=form, headers={"HX-Request": "true"})
    assert fragment.status_code == 429 and "the cap is 2" in fragment.get_data(as_text=True)
    # a cancelled operation cannot be resumed past the cap either (page and API)
    other = start(conn, "replay", {"queue": "billing"}, actor="operator", caps=Caps(bulk_per_actor=5))
    cancel(conn, other, actor="operator")
    for url in (f"/deadletters/operations/{other}/resume", f"/api/v1/deadletters/operations/{other}/resume"):
        refused = client.post(url, data={"csrf_token": CSRF, "reason": "once more please"})
        assert refused.status_code == 429 and "caps.bulk_per_actor" in refused.get_data(as_text=True), url
    assert progress(conn, other)["state"] == "cancelled"


def test_the_cli_refuses_with_exit_2_naming_the_cap_before_starting_anything(conn, dsn, tmp_path):
    add_failed(conn, 10)
    config = tmp_path / "skiplock.toml"
    config.write_text("[caps]\nbulk_per_actor = 1\n")
    held = start(conn, "replay", {"all": True}, actor=cli_actor("alice"))  # as the CLI names alice
    result = CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "replay", "--all", "--actor", "alice",
                                       "--reason", "replay everything"], catch_exceptions=False)
    assert result.exit_code == 2 and "caps.bulk_per_actor" in result.output and f"#{held}" in result.output
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 1
    cancel(conn, held, actor="alice")
    resumed = CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "operations", "--resume", str(held),
                                        "--actor", "alice", "--reason", "replay everything"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output  # with room again, the same command works


# --- the other things a signed-in user can make the console keep ---------------------------------

def sign_in(app, name: str = "viewer"):
    client = app.test_client()
    form = client.get("/login").get_data(as_text=True)
    csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
    assert client.post("/login", data={"csrf_token": csrf, "name": name, "password": PASSWORD}).status_code == 302
    return client


def test_signing_in_past_the_cap_ends_the_oldest_session_and_never_refuses(conn, web_app, personas):
    clients = [sign_in(web_app) for _ in range(5)]  # the cap is 3 here
    live = conn.execute("SELECT count(*) FROM skiplock.web_sessions WHERE user_name = 'viewer' AND revoked_at IS NULL")
    assert live.fetchone()[0] == 3
    answers = [c.get("/overview").status_code for c in clients]
    assert answers == [302, 302, 200, 200, 200]  # the two oldest were ended (back to sign-in)
    # the domain applies the default cap to a caller that names none
    for _ in range(Caps().sessions_per_user + 3):
        start_session(conn, "operator", "127.0.0.1", "pytest")
    assert conn.execute("SELECT count(*) FROM skiplock.web_sessions WHERE user_name = 'operator' "
                        "AND revoked_at IS NULL").fetchone()[0] == Caps().sessions_per_user


def test_api_tokens_are_capped_per_user_on_the_admin_page_and_the_cli(conn, dsn, client_as, tmp_path):
    admin = client_as("admin")
    form = {"csrf_token": CSRF, "reason": "a dashboard", "label": "grafana"}
    codes = [admin.post("/admin/users/viewer/token", data=form).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    refused = admin.post("/admin/users/viewer/token", data=form)
    assert "caps.tokens_per_user" in refused.get_data(as_text=True)
    assert conn.execute("SELECT count(*) FROM skiplock.api_tokens").fetchone()[0] == 2
    config = tmp_path / "skiplock.toml"
    config.write_text("[caps]\ntokens_per_user = 2\n")
    cli = CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "users", "token", "viewer",
                                    "--reason", "one more dashboard"], catch_exceptions=False)
    assert cli.exit_code == 2 and "caps.tokens_per_user" in cli.output
    # a revoked or expired token no longer counts
    conn.execute("UPDATE skiplock.api_tokens SET revoked_at = now() WHERE id = (SELECT min(id) FROM skiplock.api_tokens)")
    assert admin.post("/admin/users/viewer/token", data=form).status_code == 200
    conn.execute("UPDATE skiplock.api_tokens SET expires_at = now() - interval '1 s' WHERE revoked_at IS NULL")
    assert admin.post("/admin/users/viewer/token", data=form).status_code == 200


def test_silences_are_capped_on_the_api_the_form_and_the_cli(conn, dsn, client_as, tmp_path):
    client = client_as("operator")
    body = {"labels": {"queue": "billing"}, "duration": "1h", "reason": "gateway maintenance"}
    codes = [client.post("/api/v1/alerts/silences", json=body, headers={"X-CSRF-Token": CSRF}).status_code
             for _ in range(3)]
    assert codes == [201, 201, 429]
    page = client.post("/alerts/silences", data={"csrf_token": CSRF, "labels": "queue=mail", "duration": "1h",
                                                 "reason": "mail maintenance"})
    assert page.status_code == 429 and "caps.silences" in page.get_data(as_text=True)
    config = tmp_path / "skiplock.toml"
    config.write_text("[caps]\nsilences = 2\n")
    cli = CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "alerts", "silence", "--label", "queue=x",
                                    "--for", "1h", "--reason", "x maintenance"], catch_exceptions=False)
    assert cli.exit_code == 2 and "caps.silences" in cli.output
    assert conn.execute("SELECT count(*) FROM skiplock.alert_silences").fetchone()[0] == 2
    conn.execute("UPDATE skiplock.alert_silences SET ends_at = now() WHERE id = (SELECT min(id) FROM skiplock.alert_silences)")
    assert client.post("/api/v1/alerts/silences", json=body, headers={"X-CSRF-Token": CSRF}).status_code == 201


def test_saved_destinations_and_rules_are_capped_but_an_update_always_saves(conn, client_as):
    admin = client_as("admin")

    def save(name: str):
        return admin.post("/api/v1/alerts/destinations", json={"name": name, "url": "https://hooks.example/x",
                                                               "reason": "a new receiver"}, headers={"X-CSRF-Token": CSRF})

    assert [save(n).status_code for n in ("one", "two", "three")] == [201, 201, 429]
    assert "caps.destinations" in save("four").get_json()["error"]
    assert save("one").status_code == 201  # an update of a saved one adds nothing
    held = conn.execute("SELECT count(*) FROM skiplock.alert_rules").fetchone()[0]
    config = load_config(env={}, overrides={"caps.alert_rules": held + 1})
    rule = {"name": "deep_backlog", "metric": "queue_depth", "op": ">", "threshold": 10, "for": "5m"}
    r.save_rule(conn, rule, actor="alice", config=config, reason="a new rule")
    with pytest.raises(CapReached, match=r"caps\.alert_rules"):
        r.save_rule(conn, {**rule, "name": "deeper_backlog"}, actor="alice", config=config, reason="another")
    r.save_rule(conn, {**rule, "threshold": 20}, actor="alice", config=config, reason="an update")


def test_enqueues_from_the_console_are_capped_per_operator_per_minute(conn, client_as):
    client = client_as("operator")

    def api():
        return client.post("/api/v1/jobs", json={"kind": "report", "queue": "ops", "reason": "a manual run"},
                           headers={"X-CSRF-Token": CSRF})

    assert [api().status_code for _ in range(4)] == [201, 201, 201, 429]
    form = client.post("/queues/ops/enqueue", data={"csrf_token": CSRF, "kind": "report", "reason": "a manual run"})
    assert form.status_code == 429 and "caps.enqueue_per_minute" in form.get_data(as_text=True)
    declared = periodic.parse_entries([("#1", {"name": "nightly", "kind": "report", "every": "1h"}, "config")])
    periodic.sync(conn, declared)
    run = client.post("/periodic/nightly/run", data={"csrf_token": CSRF, "reason": "a manual run"})
    assert run.status_code == 429 and "caps.enqueue_per_minute" in run.get_data(as_text=True)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 3
    assert client_as("admin").post("/api/v1/jobs", json={"kind": "report", "reason": "a manual run"},
                                   headers={"X-CSRF-Token": CSRF}).status_code == 201  # another operator's own minute


def test_paused_queues_are_capped_but_pausing_a_paused_one_again_is_fine(conn, client_as, dsn, tmp_path):
    client = client_as("operator")

    def pause(name: str):
        return client.post(f"/api/v1/queues/{name}/pause", data={"csrf_token": CSRF, "reason": "deploying",
                                                                       "create": "true"})

    assert [pause(n).status_code for n in ("a", "b", "c")] == [200, 200, 429]
    assert "caps.paused_queues" in pause("d").get_json()["error"]
    assert pause("a").status_code == 200
    config = tmp_path / "skiplock.toml"
    config.write_text("[caps]\npaused_queues = 2\n")
    cli = CliRunner().invoke(main, ["--dsn", dsn, "--config", str(config), "pause", "e", "--create", "--reason", "deploying"],
                             catch_exceptions=False)
    assert cli.exit_code == 2 and "caps.paused_queues" in cli.output
    assert client.post("/api/v1/queues/b/resume", data={"csrf_token": CSRF, "reason": "deployed"}).status_code == 200
    assert pause("c").status_code == 200


def test_exports_streaming_at_once_are_capped_per_user_and_give_their_place_back(conn, client_as):
    add_failed(conn, 50)
    viewer = client_as("viewer")
    streaming = viewer.get("/api/v1/jobs/export.json", buffered=False)
    assert streaming.status_code == 200
    second = viewer.get("/jobs/export.csv")
    assert second.status_code == 429 and "caps.exports_per_user" in second.get_data(as_text=True)
    assert client_as("operator").get("/api/v1/jobs/export.json").status_code == 200  # another user's own
    streaming.close()
    again = viewer.get("/jobs/export.csv")
    assert again.status_code == 200 and again.get_data(as_text=True).count("\n") == 51
    # a refused filter takes no place
    assert viewer.get("/jobs/export.csv?since=nonsense").status_code == 400
    assert viewer.get("/jobs/export.csv").status_code == 200


def test_webhook_tests_waiting_on_a_receiver_are_capped_per_user(conn, client_as):
    import socket

    admin = client_as("admin")
    with socket.socket() as slow:  # accepts, then says nothing until the test ends
        slow.bind(("127.0.0.1", 0))
        slow.listen()
        url = f"http://127.0.0.1:{slow.getsockname()[1]}/hook"
        assert admin.post("/api/v1/alerts/destinations", json={"name": "slow", "url": url, "reason": "a receiver"},
                          headers={"X-CSRF-Token": CSRF}).status_code == 201
        operator = client_as("operator")
        answers = []
        waiting = threading.Thread(target=lambda: answers.append(operator.post(
            "/api/v1/alerts/destinations/slow/test", headers={"X-CSRF-Token": CSRF}).status_code))
        waiting.start()
        wait_for(lambda: operator.application.extensions["skiplock"].in_flight.held("test", "operator") == 1,
                 timeout=30, interval=0.02, what="the first test to wait on the receiver")
        second = operator.post("/api/v1/alerts/destinations/slow/test", headers={"X-CSRF-Token": CSRF})
        assert second.status_code == 429 and "caps.tests_per_user" in second.get_json()["error"]
        waiting.join(60)
    assert answers == [200]  # the first one's answer: the receiver never replied (ok: false)
    assert operator.application.extensions["skiplock"].in_flight.held("test", "operator") == 0
