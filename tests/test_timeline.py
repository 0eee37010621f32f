"""The incident timeline (issue 33, item 2) on a real PostgreSQL: an alert fires and resolves
over real samples, an operator pauses a queue through the console, a scheduler dies and its
replacement takes the lead, a real worker process is killed and another exits cleanly, a session
holds the xmin horizon and another waits on its row lock while collections run, an error group
appears; each shows once, in order, in the window, with its link, and what happened outside the
window does not. The Markdown postmortem draft has its sections and rows; viewers read both
redacted; bad parameters are 400s; a cap says how many more; a slow kind says "not available".
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from console import queue as q
from console import samples, scheduler, timeline
from console.alerts import evaluate as ev
from console.alerts.rules import RuleSet
from console.config import load_config
from console.db import connect
from console.maintenance import pause_queue, start
from console.samples import Sample
from tests.alert_links_data import DEFAULTS, fire_default
from tests.collector_helpers import cycle
from tests.oncall_data import make_dead_letters
from tests.web_fixtures import CSRF
from tests.workers import WorkerProcs, cli, wait_for

SESSION = "SESSION-SEKRET-77"


@pytest.fixture
def web_settings(web_settings):
    # A killed worker is lost after a second of silence (the worker processes flush every 0.5 s).
    return {**web_settings, "web.stale_worker_after": 1.0, "worker.flush_interval": 0.3,
            "web.redact_keys": "password,token,session_id"}


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def evaluate(conn, name: str) -> None:
    """Evaluate the default rule `name` (with `for` = 0) over the newest collection, as the
    scheduler does after each cycle."""
    rule = replace(DEFAULTS[name], for_seconds=0.0, guard=None)
    ev.evaluate(conn, RuleSet(rules={name: rule}, destinations={}), ev.AlertSettings(), now=db_now(conn))


def api(client, **args):
    response = client.get("/api/v1/timeline", query_string=args)
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return response.get_json()


@pytest.fixture
def incident(dsn, conn, client_as, subprocess_env):
    """Everything an on-call engineer would want on the axis, between `since` and `until`."""
    cycle(dsn)  # the first collection starts the error groups' watch
    now = db_now(conn)
    since = now - timedelta(minutes=5)
    # Autovacuum on jobs: a run seen before the window (absent), one inside it (20 s before the sample).
    vac = {"table": "jobs", "kind": "autovacuum"}
    samples.store(conn, [Sample("table_vacuum_count", vac, 5.0, since - timedelta(minutes=3)),
                         Sample("table_vacuum_count", vac, 6.0, since - timedelta(minutes=2)),
                         Sample("table_vacuum_count", vac, 6.0, now - timedelta(seconds=60)),
                         Sample("table_vacuum_count", vac, 7.0, now - timedelta(seconds=1)),
                         Sample("table_last_autovacuum_age_seconds", {"table": "jobs"}, 20.0, now - timedelta(seconds=1))])
    # A replica's lag crosses 60 s (the default replica_lag rule's threshold) and comes back.
    lag = {"standby": "replica-1", "client": "10.0.0.2"}
    samples.store(conn, [Sample("replica_lag_seconds", lag, 5.0, now - timedelta(seconds=50)),
                         Sample("replica_lag_seconds", lag, 120.0, now - timedelta(seconds=45)),
                         Sample("replica_lag_seconds", lag, 130.0, now - timedelta(seconds=40)),  # still above: no event
                         Sample("replica_lag_seconds", lag, 10.0, now - timedelta(seconds=30))])

    # A scheduler that led for ten minutes and died two minutes ago without saying so (SIGKILL:
    # its session ends, its row stays), and its replacement on the same host, which takes the lead.
    dead = scheduler.Scheduler(dsn, load_config(env={}))
    assert dead.elect() is True
    dead._lock_conn.close()
    dead._lock_conn = None
    conn.execute("UPDATE skiplock.scheduler_nodes SET started_at = now() - interval '10 minutes', "
                 "leader_since = now() - interval '10 minutes', last_seen = now() - interval '2 minutes' WHERE id = %s",
                 (dead.node_id,))
    replacement = scheduler.Scheduler(dsn, load_config(env={}))
    assert replacement.elect() is True

    # The alert fires; the operator pauses the queue through the console; the alert resolves.
    # Mail has waited seven minutes: a collection sees it, and queue_age fires over that.
    mail_job = q.enqueue(conn, "send_mail", {"to": "a@example.com"}, queue="mail")
    conn.execute("UPDATE skiplock.jobs SET run_at = now() - interval '7 minutes' WHERE id = %s", (mail_job,))
    cycle(dsn)
    evaluate(conn, "queue_age")
    [(alert_id, state)] = conn.execute("SELECT id, state FROM skiplock.alerts WHERE rule = 'queue_age'").fetchall()
    assert state == "firing"
    operator = client_as("operator")
    assert operator.post("/queues/mail/pause", data={"csrf_token": CSRF, "reason": "INC-7: SMTP relay down"}).status_code == 302
    # A bulk replay whose selection quotes a stored fingerprint holding a session id (viewers: redacted).
    make_dead_letters(conn, smtp=1, card=1, queue_smtp="outbox")
    legacy = f"ValueError: session lost: session_id={SESSION}"
    conn.execute("UPDATE skiplock.jobs SET error_fingerprint = %s WHERE queue = 'billing'", (legacy,))
    start(conn, "replay", {"fingerprint": legacy}, actor="operator", reason="gateway back")

    # Real worker processes: one killed (lost), one that exits cleanly.
    procs = WorkerProcs(subprocess_env)
    try:
        killed = procs.start("--queues", "mail")
        clean = procs.start("--queues", "billing")
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.workers WHERE pid = ANY(%s)",
                                      ([killed.pid, clean.pid],)).fetchone()[0] == 2, timeout=30, what="two workers")
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert procs.stop(clean)[0] == 0
    finally:
        procs.stop_all()

    # Collections: one before, one while a session holds the horizon, one while another waits on its lock.
    cycle(dsn)
    holder = connect(dsn, application_name="skiplock-test-holder", autocommit=False)
    waiter = connect(dsn, application_name="skiplock-test-waiter", autocommit=False)
    job_id = q.enqueue(conn, "noop", queue="other")
    try:
        holder.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", (job_id,))
        holder.execute("INSERT INTO skiplock.queues (name) VALUES ('held')")  # an XID: holds the horizon
        cycle(dsn)

        def blocked():
            try:
                waiter.execute("UPDATE skiplock.jobs SET priority = 5 WHERE id = %s", (job_id,))
                waiter.rollback()
            except psycopg.Error:
                pass

        thread = threading.Thread(target=blocked)
        thread.start()
        wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                      "'skiplock-test-waiter' AND wait_event_type = 'Lock'").fetchone()[0], timeout=10,
                 what="the waiter waiting")
        cycle(dsn)
        holder_pid = holder.info.backend_pid
    finally:
        holder.rollback()
        thread.join(10)
        holder.close()
        waiter.close()
    conn.execute("DELETE FROM skiplock.jobs WHERE id = %s", (mail_job,))  # the mail went out another way
    cycle(dsn)
    evaluate(conn, "queue_age")
    assert conn.execute("SELECT state FROM skiplock.alerts WHERE id = %s", (alert_id,)).fetchone()[0] == "ok"
    time.sleep(1.2)  # the killed worker has been silent longer than web.stale_worker_after
    until = db_now(conn)
    pause_queue(conn, "late", actor="bob", reason="after the window: not on the timeline")
    yield {"since": since, "until": until, "alert_id": alert_id, "killed": killed.pid, "clean": clean.pid,
           "dead": dead.node_id, "replacement": replacement.node_id, "holder": holder_pid}
    replacement.close()
    dead.close()


def test_every_kind_of_event_shows_once_in_order_with_its_link(client_as, incident):
    data = api(client_as("operator"), **{"from": incident["since"].isoformat(), "to": incident["until"].isoformat()})
    events = data["events"]
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    assert all(incident["since"].isoformat() <= e["at"] <= incident["until"].isoformat() for e in events)
    assert data["unavailable"] == {} and data["more"] == {}

    def one(kind, match):
        found = [e for e in events if e["kind"] == kind and match(e)]
        assert len(found) == 1, (kind, found, [e["summary"] for e in events])
        return found[0]

    alert_id = incident["alert_id"]
    fired = one("alert", lambda e: e["data"]["kind"] == "firing")
    resolved = one("alert", lambda e: e["data"]["kind"] == "resolved")
    assert fired["path"] == resolved["path"] == f"/alerts/{alert_id}"
    assert fired["summary"].startswith(f"Alert {alert_id} queue_age queue=mail system=skiplock fired (value 4")
    pause = one("action", lambda e: e["data"]["action"] == "pause")
    assert pause["summary"] == "operator: pause on queue:mail [queue mail] (1 row) — why: INC-7: SMTP relay down"
    assert pause["path"] == f"/audit?before={pause['data']['id'] + 1}"
    replay = one("action", lambda e: e["data"]["action"] == "replay")
    assert SESSION in replay["summary"]  # an operator sees the selection whole
    assert events.index(fired) < events.index(pause) < events.index(resolved)
    assert not [e for e in events if e["kind"] == "action" and e["data"]["target"] == "queue:late"]

    lost = one("scheduler", lambda e: e["data"]["what"] == "lost")
    assert lost["data"]["id"] == incident["dead"] and lost["path"] == "/maintenance#scheduler"
    restart = one("scheduler", lambda e: e["data"]["what"] == "start")
    assert restart["data"]["id"] == incident["replacement"] and restart["data"]["replaced"] == incident["dead"]
    assert "(a restart)" in restart["summary"]
    leader = one("scheduler", lambda e: e["data"]["what"] == "leader")
    assert leader["data"]["id"] == incident["replacement"]
    assert events.index(lost) < events.index(restart)

    for pid in (incident["killed"], incident["clean"]):
        started = one("worker", lambda e, pid=pid: e["data"]["pid"] == pid and e["data"]["what"] == "start")
        assert started["path"] == "/workers#worker-" + started["data"]["id"].replace(":", "%3A")
    gone = one("worker", lambda e: e["data"]["pid"] == incident["killed"] and e["data"]["what"] != "start")
    assert gone["data"]["what"] == "lost" and "lost (" in gone["summary"]
    exited = one("worker", lambda e: e["data"]["pid"] == incident["clean"] and e["data"]["what"] != "start")
    assert exited["data"]["what"] == "stop" and "exited" in exited["summary"]

    vacuum = one("autovacuum", lambda e: True)
    assert vacuum["summary"] == "autovacuum ran on jobs" and vacuum["path"] == "/health#panel-tables"
    held = one("xmin_holder", lambda e: e["data"]["holder_id"] == str(incident["holder"]))
    assert held["data"]["application_name"] == "skiplock-test-holder" and held["path"] == "/health#panel-holders"
    waits = one("lock_wait", lambda e: True)
    assert "jobs" in waits["data"]["relations"] and waits["path"] == "/health#panel-locks"
    assert events.index(held) < events.index(waits)
    above = one("replica_lag", lambda e: e["data"]["direction"] == "above")
    below = one("replica_lag", lambda e: e["data"]["direction"] == "below")
    assert above["summary"].startswith("replica lag above 60 s: 120 s") and events.index(above) < events.index(below)
    group = one("error_group", lambda e: "SMTP" in e["data"]["fingerprint"])
    assert group["summary"].startswith("new error group: TimeoutError") and group["path"].startswith("/deadletters/jobs?fingerprint=")

    # A window that ends before the incident has none of it.
    before = api(client_as("operator"), **{"from": (incident["since"] - timedelta(hours=1)).isoformat(),
                                          "to": (incident["since"] - timedelta(minutes=30)).isoformat()})
    assert before["events"] == []


def test_the_alert_page_links_its_timeline_and_the_window_is_around_the_alert(client_as, incident):
    client = client_as("viewer")
    page = client.get(f"/alerts/{incident['alert_id']}").get_data(as_text=True)
    assert f'href="/timeline?alert={incident["alert_id"]}" data-timeline>Timeline of this incident</a>' in page
    data = api(client, alert=incident["alert_id"])
    assert data["alert"]["id"] == incident["alert_id"]
    fired = [e for e in data["events"] if e["kind"] == "alert" and e["data"]["kind"] == "firing"][0]
    resolved = [e for e in data["events"] if e["kind"] == "alert" and e["data"]["kind"] == "resolved"][0]
    assert data["until"] == resolved["at"]  # it resolved: the window ends there
    assert datetime.fromisoformat(data["since"]) == datetime.fromisoformat(fired["at"]) - timeline.BEFORE_ALERT
    html = client.get(f"/timeline?alert={incident['alert_id']}").get_data(as_text=True)
    assert "Timeline of alert" in html and 'data-event="worker"' in html and f'/timeline.md?alert={incident["alert_id"]}' in html


def test_the_postmortem_draft_has_its_sections_and_rows(client_as, incident, subprocess_env):
    response = client_as("operator").get(f"/timeline.md?alert={incident['alert_id']}")
    assert response.status_code == 200 and response.mimetype == "text/markdown"
    assert f'filename="postmortem-alert-{incident["alert_id"]}.md"' in response.headers["Content-Disposition"]
    text = response.get_data(as_text=True)
    assert text.startswith(f"# Incident: alert {incident['alert_id']} queue_age queue=mail system=skiplock (default)\n")
    for heading in ("## Summary", "## Timeline", "## Impact", "## Root cause", "## Follow-ups"):
        assert f"\n{heading}\n" in text, heading
    summary = text[text.index("## Summary"):text.index("## Timeline")]
    assert f"- Alert {incident['alert_id']} queue_age queue=mail system=skiplock fired " in summary and ", resolved " in summary
    assert "- Actions taken (2):" in summary and "operator: pause on queue:mail [queue mail] (1 row) — why: INC-7: SMTP relay down" in summary
    table = text[text.index("## Timeline"):text.index("## Impact")]
    rows = [line for line in table.splitlines() if line.startswith("| 20")]
    data = api(client_as("operator"), alert=incident["alert_id"])
    assert len(rows) == len(data["events"]) > 10
    assert any(f"[open](http://localhost/alerts/{incident['alert_id']})" in row for row in rows)
    assert any("| Worker |" in row and "lost" in row for row in rows)
    impact = text[text.index("## Impact"):]
    assert "_Who or what was affected" in impact and "- [ ] " in impact
    # The command line prints the same draft (its links made absolute with --console-url).
    env = {**subprocess_env, "SKIPLOCK_WEB_STALE_WORKER_AFTER": "1", "SKIPLOCK_WORKER_FLUSH_INTERVAL": "0.3"}
    out = cli(env, "timeline", "--alert", str(incident["alert_id"]), "--markdown",
              "--console-url", "http://localhost")
    assert out.returncode == 0, out.stderr
    assert out.stdout == text
    lines = cli(env, "timeline", "--alert", str(incident["alert_id"]))
    assert lines.returncode == 0 and "Operator action  operator: pause on queue:mail" in lines.stdout
    missing = cli(subprocess_env, "timeline", "--alert", "4242")
    assert missing.returncode == 2 and "alert 4242 does not exist" in missing.stderr
    backwards = cli(subprocess_env, "timeline", "--from", "1h", "--to", "2h")
    assert backwards.returncode == 2 and "must be before to" in backwards.stderr


def test_viewers_read_the_page_the_draft_and_the_api_redacted(client_as, incident):
    args = f"?from={incident['since'].isoformat()}&to={incident['until'].isoformat()}".replace("+", "%2B")
    viewer, operator = client_as("viewer"), client_as("operator")
    for url in ("/timeline", "/timeline.md", "/api/v1/timeline"):
        shown = viewer.get(url + args)
        assert shown.status_code == 200
        assert SESSION not in shown.get_data(as_text=True), url
        assert SESSION in operator.get(url + args).get_data(as_text=True), url
    [replay] = [e for e in api(viewer, **{"from": incident["since"].isoformat(), "to": incident["until"].isoformat()})["events"]
                if e["kind"] == "action" and e["data"]["action"] == "replay"]
    assert "session_id=[redacted]" in replay["summary"]


@pytest.mark.parametrize(("args", "status", "message"), [
    ({"alert": "abc"}, 400, "alert: 'abc' is not an alert id"),
    ({"alert": "0"}, 400, "alert: '0' is not an alert id"),
    ({"alert": "99999999999999999999999"}, 400, "is not an alert id"),
    ({"alert": "4242"}, 404, "alert 4242 does not exist"),
    ({"from": "tomorrow"}, 400, "from"),
    ({"to": "2026-13-45"}, 400, "to"),
    ({"from": "1h", "to": "2h"}, 400, "must be before to"),
    ({"from": "7d"}, 400, "at most 2 d"),
])
def test_bad_parameters_are_refused_with_the_problem_named(client_as, args, status, message):
    client = client_as("viewer")
    for url in ("/timeline", "/timeline.md", "/api/v1/timeline"):
        response = client.get(url, query_string=args, headers={"Accept": "application/json"})
        assert response.status_code == status, (url, args, response.get_data(as_text=True)[:300])
        assert message in response.get_data(as_text=True), (url, response.get_data(as_text=True)[:300])


def test_each_kind_is_capped_and_says_how_many_more(conn):
    for i in range(5):
        pause_queue(conn, f"q{i}", actor="alice", reason="capped on the timeline")
    now = db_now(conn)
    tl = timeline.build(conn, now - timedelta(minutes=1), now, timeout_ms=2000, cap=3)
    assert [e.data["target"] for e in tl.events] == ["queue:q0", "queue:q1", "queue:q2"]
    assert tl.more == {"action": 2} and tl.counts()["action"] == 5
    assert "2 more operator action event(s) in the window are not listed" in timeline.markdown(tl)


def test_a_slow_kind_is_not_available_and_the_rest_shows(dsn, conn, client_as):
    pause_queue(conn, "mail", actor="alice", reason="shown while the audit log is locked")
    fire_default(conn, "queue_age", {"queue": "mail"}, 420)
    with connect(dsn, autocommit=False) as locker:
        locker.execute("LOCK TABLE skiplock.audit_log IN ACCESS EXCLUSIVE MODE")
        page = client_as("viewer").get("/timeline")
        data = client_as("viewer").get("/api/v1/timeline").get_json()
        locker.rollback()
    assert page.status_code == 200
    assert 'data-unavailable="action"' in page.get_data(as_text=True)
    assert set(data["unavailable"]) == {"action"}
    assert [e["kind"] for e in data["events"]] == ["alert"]


def test_the_draft_keeps_each_row_on_one_line_and_quotes_no_markup():
    at = datetime(2026, 12, 3, 3, 12, tzinfo=UTC)
    tl = timeline.Timeline(since=at - timedelta(minutes=30), until=at + timedelta(minutes=5), database="east", events=[
        timeline.Event(at, "action", {"id": 7, "actor": "alice", "action": "pause", "target": "queue:mail",
                                      "selection": {"queue": "mail"}, "reason": "relay | down\n<script>x</script>",
                                      "rows": 1, "outcome": "ok"}, "/audit?before=8")])
    text = timeline.markdown(tl, base_url="https://console.example")
    [row] = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert row == ("| 2026-12-03 03:12:00 | Operator action | alice: pause on queue:mail [queue mail] (1 row) — why: "
                   "relay \\| down &lt;script&gt;x&lt;/script&gt; | [open](https://console.example/audit?before=8) |")
    assert "<script>" not in text
    assert text.startswith("# Incident on east, 2026-12-03 02:42:00 UTC to 2026-12-03 03:17:00 UTC\n")
    assert "- No alert fired in the window." in text
