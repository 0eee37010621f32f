"""Every operator action in console.actions.ACTIONS, on every face the table names (CLI, UI,
API): without a reason an action that needs one is refused (CLI exit code 2 naming --reason,
UI and API 422 naming `reason`) and nothing changes; with one it is audited with the actor,
the reason, the selection and the count. Optional ones are accepted without a reason.

The cases are generated from the table: a row added to ACTIONS without a scenario here fails
`test_every_face_of_the_table_has_a_scenario`. docs/maintenance.md's table is the table's
`markdown_table()` (test_the_docs_table_is_the_data).
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from console import errorgroups, samples
from console import maintenance as m
from console import queue as q
from console import users as users_mod
from console.actions import ACTIONS, bulk_action, cli_actor, markdown_table, require_reason
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.cli import main
from console.samples import Sample
from tests.maintenance_data import add_completed, add_failed
from tests.web_fixtures import CSRF

ROOT = Path(__file__).resolve().parent.parent
REASON = "INC-1042: SMTP relay fixed in deploy 412"
TOKEN_LABEL = "ci-bot"
ME = f"cli:{getpass.getuser()}@{socket.gethostname()}"
RULE = {"name": "mail_age", "metric": "queue_age_seconds", "op": ">", "threshold": 60, "for": "0s"}
DEST = {"name": "ops", "url": "https://hooks.example/ops"}


@dataclass
class Call:
    """How one face performs the action. cli: the arguments (after --dsn); web: a function
    (client, ctx, reason or None, headers) -> response, `ok` its success status."""

    cli: list[str] | None = None
    web: Callable[..., Any] | None = None
    ok: int = 200
    rows: int | None = None  # the audit row's count, when the face's selection fixes it
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Scenario:
    setup: Callable[[Any], dict[str, Any]]
    probe: str  # SQL whose answer must not change when the action is refused
    faces: dict[str, Callable[[dict[str, Any]], Call]]


def post(url: str, /, **fields: Any):
    def send(client, ctx, reason, headers):
        data = {k: (v(ctx) if callable(v) else v) for k, v in fields.items()}
        if reason is not None:
            data["reason"] = reason
        return client.post(url.format(**ctx), data=data, headers=headers)

    return send


def json_body(method: str, url: str, /, **fields: Any):
    """Send `fields` (plus the reason, when given) as a JSON body with `method`."""
    def send(client, ctx, reason, headers):
        body = dict(fields)
        if reason is not None:
            body["reason"] = reason
        return client.open(url.format(**ctx), method=method, json=body, headers=headers)

    return send


def post_json(url: str, /, **fields: Any):
    return json_body("POST", url, **fields)


def put_json(url: str, /, **fields: Any):
    return json_body("PUT", url, **fields)


def delete(url: str):
    def send(client, ctx, reason, headers):
        return client.delete(url.format(**ctx), query_string={"reason": reason} if reason else None, headers=headers)

    return send


def bulk_purge_api(client, ctx, reason, headers):
    """The API's purge: preview, then start bound to the preview (docs/maintenance.md)."""
    selection = {"action": "purge", "ids": [str(i) for i in ctx["ids"]]}
    confirm = client.post("/api/v1/deadletters/preview", data=selection, headers=headers).get_json()["confirm"]
    data = {**selection, **{k: str(v) for k, v in confirm.items()}}
    if reason is not None:
        data["reason"] = reason
    return client.post("/api/v1/deadletters/operations", data=data, headers=headers)


# --- set-ups --------------------------------------------------------------------------------

def dead(n: int):
    def setup(conn):
        ids = add_failed(conn, n, fingerprint="SMTPError: timeout")
        return {"ids": ids, "id": ids[0], "id_list": ",".join(map(str, ids))}

    return setup


def fixable(conn):
    """A dead letter and the version a preview of its edit (priority 7) gives (fix and replay)."""
    from console.maintenance import edit_replay

    ctx = dead(1)(conn)
    return {**ctx, "version": edit_replay.preview(conn, ctx["id"], edit_replay.Edit(priority=7), keys=frozenset()).version}


def later_job(conn):
    return {"id": q.enqueue(conn, "report", {}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))}


def queued_operation(conn):
    ids = add_failed(conn, 2)
    return {"op": m.start(conn, "replay", {"ids": ids}, actor="seed", reason="seed")}


def cancelled_operation(conn):
    ids = add_failed(conn, 2)
    op = m.start(conn, "replay", {"ids": ids}, actor="seed", reason="seed")
    m.cancel(conn, op, actor="seed")  # nobody runs it: closed at once
    return {"op": op}


def running_job(conn):
    job_id = q.enqueue(conn, "report", {}, queue="mail")
    (job,) = q.claim(conn, "seed-worker", queues=["mail"])
    assert job.id == job_id
    return {"id": job_id}


HOLDER_APP = "reasons-holder"
HOLDERS = ("SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity "
           "WHERE application_name = 'reasons-holder' AND datname = current_database()")


def a_holder(active: bool):
    """A session holding a REPEATABLE READ snapshot (and, when `active`, running a long query
    in a thread): what backend_cancel and backend_terminate end."""
    def setup(conn):
        import threading

        import psycopg

        holder = psycopg.connect(conn.info.dsn, application_name=HOLDER_APP)
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        if active:
            def sleep():
                try:
                    holder.execute("SELECT pg_sleep(60)")
                except psycopg.Error:
                    pass  # cancelled or terminated: the test's point
            threading.Thread(target=sleep, daemon=True).start()
            deadline = time.monotonic() + 10
            while conn.execute(HOLDERS).fetchone()[1] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        pid = holder.info.backend_pid
        started = conn.execute("SELECT backend_start FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]
        return {"pid": pid, "backend_start": started.isoformat(), "holder": holder}

    return setup


def a_queue(paused: bool):
    def setup(conn):
        q.enqueue(conn, "send", {}, queue="mail")
        if paused:
            q.pause(conn, "mail", actor="seed")
        return {}

    return setup


def completed(conn):
    add_completed(conn, 5, age=timedelta(hours=3))
    return {}


def archived(conn):
    add_completed(conn, 4, age=timedelta(hours=3))
    m.archive_completed(conn, older_than=timedelta(hours=1), actor="scheduler")
    return {}


def firing(conn):
    now = conn.execute("SELECT now()").fetchone()[0]
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, now)])
    rules = r.RuleSet(rules={"queue_age": r.parse_rule({"name": "queue_age", "metric": "queue_age_seconds",
                                                         "op": ">", "threshold": 100, "for": "0s"})}, destinations={})
    ev.evaluate(conn, rules, ev.AlertSettings(), now=now)
    return {"alert": conn.execute("SELECT id FROM skiplock.alerts").fetchone()[0]}


def ui_rule(conn):
    r.save_rule(conn, RULE, actor="seed")
    return {}


def ui_destination(conn):
    conn.execute("INSERT INTO skiplock.alert_destinations (name, kind, url, headers, updated_by) "
                 "VALUES ('ops', 'json', 'https://hooks.example/ops', '{}', 'seed')")
    return {}


def carol(disabled: bool = False, token: bool = False, session: bool = False):
    def setup(conn):
        users_mod.add_user(conn, "carol", "operator", "carol-password")
        if session:
            users_mod.start_session(conn, "carol", "127.0.0.1", "pytest")
        if disabled:
            users_mod.set_disabled(conn, "carol", True)
        ctx: dict[str, Any] = {}
        if token:
            users_mod.create_token(conn, "carol", "deploy")
            ctx["token"] = conn.execute("SELECT max(id) FROM skiplock.api_tokens WHERE user_name = 'carol'").fetchone()[0]
        return ctx

    return setup


def error_group(ignored: bool):
    def setup(conn):
        add_failed(conn, 2, fingerprint="SMTPError: timeout")
        if ignored:
            errorgroups.ignore(conn, "SMTPError: timeout", actor="seed", reason="seed")
        return {}

    return setup


JOBS = "SELECT status, count(*) FROM skiplock.jobs GROUP BY status ORDER BY status"
GROUPS = "SELECT fingerprint, ignored_by FROM skiplock.error_groups ORDER BY fingerprint"
SESSIONS = "SELECT user_name, revoked_at IS NULL FROM skiplock.web_sessions ORDER BY id"
USERS = "SELECT name, role, disabled, (SELECT count(*) FROM skiplock.api_tokens WHERE revoked_at IS NULL) FROM skiplock.users ORDER BY name"

SCENARIOS: dict[str, Scenario] = {
    "replay_many": Scenario(dead(3), JOBS, {
        "cli": lambda c: Call(cli=["replay", "--group", "SMTPError: timeout"], rows=3),
        "ui": lambda c: Call(web=post("/deadletters/operations", action="replay", fingerprint="SMTPError: timeout"), ok=303, rows=3),
        "api": lambda c: Call(web=post("/api/v1/deadletters/operations", action="replay", ids=c["ids"]), ok=201, rows=3),
    }),
    "replay_one": Scenario(dead(1), JOBS, {
        "cli": lambda c: Call(cli=["replay", "--id", str(c["id"])], rows=1),
        "ui": lambda c: Call(web=post("/deadletters/jobs/{id}/replay"), ok=303, rows=1),
        "api": lambda c: Call(web=post("/api/v1/jobs/{id}/replay"), rows=1),
    }),
    "edit_replay": Scenario(fixable, "SELECT status, priority, count(*) FROM skiplock.jobs GROUP BY 1, 2 ORDER BY 1, 2", {
        "cli": lambda c: Call(cli=["replay", "--id", str(c["id"]), "--set-priority", "7", "--yes"], rows=1),
        "ui": lambda c: Call(web=post("/jobs/{id}/edit-replay/apply", priority="7", version=lambda x: x["version"]),
                             ok=303, rows=1),
        "api": lambda c: Call(web=post("/api/v1/jobs/{id}/edit-replay/apply", priority="7",
                                       version=lambda x: x["version"]), rows=1),
    }),
    "run_now": Scenario(later_job, "SELECT run_at > now() FROM skiplock.jobs", {
        "ui": lambda c: Call(web=post("/jobs/{id}/run_now"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/jobs/{id}/run_now"), rows=1),
    }),
    "request_cancel": Scenario(running_job, "SELECT cancel_requested_at IS NULL FROM skiplock.jobs", {
        "ui": lambda c: Call(web=post("/jobs/{id}/request_cancel"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/jobs/{id}/request_cancel"), rows=1),
    }),
    "cancel_job": Scenario(later_job, JOBS, {
        "ui": lambda c: Call(web=post("/jobs/{id}/cancel"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/jobs/{id}/cancel"), rows=1),
    }),
    "purge": Scenario(dead(2), JOBS, {
        "cli": lambda c: Call(cli=["purge", "--id", c["id_list"]], rows=2),
        "ui": lambda c: Call(web=post("/deadletters/jobs/{id}/purge"), ok=303, rows=1),
        "api": lambda c: Call(web=bulk_purge_api, ok=201, rows=2),
    }),
    "operation_cancel": Scenario(queued_operation, "SELECT state FROM skiplock.bulk_operations", {
        "cli": lambda c: Call(cli=["operations", "--cancel", str(c["op"])]),
        "ui": lambda c: Call(web=post("/deadletters/operations/{op}/cancel"), ok=303),
        "api": lambda c: Call(web=post("/api/v1/deadletters/operations/{op}/cancel")),
    }),
    "error_group_ignore": Scenario(error_group(False), GROUPS, {
        "cli": lambda c: Call(cli=["groups", "ignore", "SMTPError: timeout"], rows=1),
        "ui": lambda c: Call(web=post("/deadletters/groups/ignore", fingerprint="SMTPError: timeout"), ok=303, rows=1),
        "api": lambda c: Call(web=post("/api/v1/deadletters/groups/ignore", fingerprint="SMTPError: timeout"), rows=1),
    }),
    "error_group_unignore": Scenario(error_group(True), GROUPS, {
        "cli": lambda c: Call(cli=["groups", "unignore", "SMTPError: timeout"], rows=1),
        "ui": lambda c: Call(web=post("/deadletters/groups/unignore", fingerprint="SMTPError: timeout"), ok=303, rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/deadletters/groups/unignore", fingerprint="SMTPError: timeout"),
                              rows=1),
    }),
    "pause": Scenario(a_queue(False), "SELECT name, paused FROM skiplock.queues", {
        "cli": lambda c: Call(cli=["pause", "mail"], rows=1),
        "ui": lambda c: Call(web=post("/queues/mail/pause"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/queues/mail/pause"), rows=1),
    }),
    "limit_change": Scenario(a_queue(False), "SELECT name, concurrency, rate_count, rate_period FROM skiplock.queues", {
        "cli": lambda c: Call(cli=["queues", "set", "mail", "--concurrency", "2"]),
        "ui": lambda c: Call(web=post("/queues/mail/limits", concurrency="2"), ok=302),
        "api": lambda c: Call(web=put_json("/api/v1/queues/mail/limits", rate="30/m")),
    }),
    "queue_backend": Scenario(a_queue(False), "SELECT name, backend FROM skiplock.queues", {
        "cli": lambda c: Call(cli=["queues", "backend", "mail", "nats"], rows=1),
    }),
    "queue_move": Scenario(a_queue(False), "SELECT name, backend FROM skiplock.queues", {
        "cli": lambda c: Call(cli=["queues", "move", "mail", "--to", "nats"], rows=1),
        "ui": lambda c: Call(web=post("/queues/mail/move", to="nats"), ok=303, rows=1),
        "api": lambda c: Call(web=post("/api/v1/queues/mail/move", to="nats"), rows=1),
    }),
    "resume": Scenario(a_queue(True), "SELECT name, paused FROM skiplock.queues", {
        "cli": lambda c: Call(cli=["resume", "mail"], rows=1),
        "ui": lambda c: Call(web=post("/queues/mail/resume"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/queues/mail/resume"), rows=1),
    }),
    "archive": Scenario(completed, "SELECT (SELECT count(*) FROM skiplock.jobs), (SELECT count(*) FROM skiplock.jobs_archive)", {
        "cli": lambda c: Call(cli=["archive"], rows=5),
        "ui": lambda c: Call(web=post("/maintenance/run/archive"), ok=303, rows=5),
        "api": lambda c: Call(web=post("/api/v1/maintenance/run/archive"), ok=202, rows=5),
    }),
    "retention": Scenario(archived, "SELECT count(*) FROM skiplock.jobs_archive", {
        "cli": lambda c: Call(cli=["retention", "--older-than", "1m"]),
    }),
    "reap": Scenario(lambda conn: {}, JOBS, {
        "cli": lambda c: Call(cli=["reap"], rows=0),
        "ui": lambda c: Call(web=post("/maintenance/run/reap"), ok=303, rows=0),
        "api": lambda c: Call(web=post("/api/v1/maintenance/run/reap"), ok=202, rows=0),
    }),
    "alert_silence": Scenario(lambda conn: {}, "SELECT count(*) FROM skiplock.alert_silences", {
        "cli": lambda c: Call(cli=["alerts", "silence", "--rule", "queue_age", "--label", "queue=mail", "--for", "1h"], rows=1),
        "ui": lambda c: Call(web=post("/alerts/silences", rule="queue_age", labels="queue=mail", duration="1h"), ok=302, rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/alerts/silences", rule="queue_age", labels="queue=mail", duration="1h"),
                              ok=201, rows=1),
    }),
    "alert_acknowledge": Scenario(firing, "SELECT acknowledged_by FROM skiplock.alerts", {
        "cli": lambda c: Call(cli=["alerts", "ack", str(c["alert"])], rows=1),
        "ui": lambda c: Call(web=post("/alerts/{alert}/ack"), ok=302, rows=1),
        "api": lambda c: Call(web=post("/api/v1/alerts/{alert}/ack"), rows=1),
    }),
    "alert_rule_save": Scenario(lambda conn: {}, "SELECT count(*) FROM skiplock.alert_rules", {
        "ui": lambda c: Call(web=post("/alerts/rules", **RULE), ok=302, rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/alerts/rules", **RULE), ok=201, rows=1),
    }),
    "alert_rule_delete": Scenario(ui_rule, "SELECT count(*) FROM skiplock.alert_rules", {
        "ui": lambda c: Call(web=post("/alerts/rules/mail_age/delete"), ok=302, rows=1),
        "api": lambda c: Call(web=delete("/api/v1/alerts/rules/mail_age"), rows=1),
    }),
    "alert_destination_save": Scenario(lambda conn: {}, "SELECT count(*) FROM skiplock.alert_destinations", {
        "ui": lambda c: Call(web=post("/alerts/destinations", **DEST), ok=302, rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/alerts/destinations", **DEST), ok=201, rows=1),
    }),
    "alert_destination_delete": Scenario(ui_destination, "SELECT count(*) FROM skiplock.alert_destinations", {
        "ui": lambda c: Call(web=post("/alerts/destinations/ops/delete"), ok=302, rows=1),
    }),
    "user_add": Scenario(lambda conn: {}, USERS, {
        "cli": lambda c: Call(cli=["users", "add", "carol", "--role", "viewer"], rows=1,
                              env={"SKIPLOCK_PASSWORD": "carol-password"}),
        "ui": lambda c: Call(web=post("/admin/users", name="carol", role="viewer", password="carol-password"), ok=302, rows=1),
    }),
    "user_disable": Scenario(carol(), USERS, {
        "cli": lambda c: Call(cli=["users", "disable", "carol"], rows=1),
        "ui": lambda c: Call(web=post("/admin/users/carol/disable"), ok=302, rows=1),
    }),
    "user_enable": Scenario(carol(disabled=True), USERS, {
        "cli": lambda c: Call(cli=["users", "enable", "carol"], rows=1),
        "ui": lambda c: Call(web=post("/admin/users/carol/enable"), ok=302, rows=1),
    }),
    "token_create": Scenario(carol(), USERS, {
        "cli": lambda c: Call(cli=["users", "token", "carol", "--label", "deploy"], rows=1),
        "ui": lambda c: Call(web=post("/admin/users/carol/token", label="deploy"), ok=200, rows=1),
    }),
    "token_revoke": Scenario(carol(token=True), USERS, {
        "cli": lambda c: Call(cli=["users", "revoke", str(c["token"])], rows=1),
        "ui": lambda c: Call(web=post("/admin/tokens/{token}/revoke"), ok=302, rows=1),
    }),
    "operation_resume": Scenario(cancelled_operation, "SELECT id, state FROM skiplock.bulk_operations", {
        "ui": lambda c: Call(web=post("/deadletters/operations/{op}/resume"), ok=303, rows=2),
        "api": lambda c: Call(web=post("/api/v1/deadletters/operations/{op}/resume"), rows=2),
    }),
    "backend_cancel": Scenario(a_holder(True), HOLDERS, {
        "cli": lambda c: Call(cli=["backends", "cancel", str(c["pid"]), "--backend-start", c["backend_start"]], rows=1),
        "ui": lambda c: Call(web=post("/health/backends/{pid}/end", mode="cancel", backend_start=lambda x: x["backend_start"]),
                             rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/health/backends/{pid}/end", mode="cancel",
                                            backend_start=c["backend_start"]), rows=1),
    }),
    "backend_terminate": Scenario(a_holder(False), HOLDERS, {
        "cli": lambda c: Call(cli=["backends", "terminate", str(c["pid"]), "--backend-start", c["backend_start"]],
                              rows=1),
        "ui": lambda c: Call(web=post("/health/backends/{pid}/end", mode="terminate",
                                      backend_start=lambda x: x["backend_start"]), rows=1),
        "api": lambda c: Call(web=post_json("/api/v1/health/backends/{pid}/end", mode="terminate",
                                            backend_start=c["backend_start"]), rows=1),
    }),
    "sessions_revoke": Scenario(carol(session=True), SESSIONS, {
        "cli": lambda c: Call(cli=["users", "sessions", "carol", "--revoke"], rows=1),
    }),
}

CASES = [(key, face) for key, req in ACTIONS.items() for face in req.faces]
REQUIRED = [(k, f) for k, f in CASES if ACTIONS[k].reason]
OPTIONAL = [(k, f) for k, f in CASES if not ACTIONS[k].reason]


# --- running one face ---------------------------------------------------------------------

def audit_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0]


def settle(conn, key: str | None = None, reason: str | None = None) -> None:
    """Wait (bounded) for what the web started in the background: bulk operations and
    maintenance runs (and, with `key`, the action's audit row), so that no thread outlives the test."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if key is not None and not audited(conn, key, reason):
            time.sleep(0.05)
            continue
        busy = conn.execute(
            "SELECT (SELECT count(*) FROM skiplock.bulk_operations WHERE state IN ('queued', 'running') AND actor <> 'seed')"
            " + (SELECT count(*) FROM skiplock.external_operations WHERE state IN ('queued', 'running'))"
            " + (SELECT count(*) FROM skiplock.maintenance_runs WHERE outcome = 'running')").fetchone()[0]
        if not busy:
            return
        time.sleep(0.05)
    raise AssertionError("background work did not finish within 30 s")


@pytest.fixture
def act(conn, dsn, web_app, personas):
    """act(key, face, ctx, reason, actor=None) -> (call, status or exit code, output)."""
    token = users_mod.create_token(conn, "admin", TOKEN_LABEL)
    runner = CliRunner()  # its stdin is not a terminal: a missing reason is refused, not asked for

    def run(key: str, face: str, ctx: dict[str, Any], reason: str | None, *, actor: str | None = None):
        call = SCENARIOS[key].faces[face](ctx)
        if face == "cli":
            args = ["--dsn", dsn, *call.cli] + (["--reason", reason] if reason else []) + (["--actor", actor] if actor else [])
            result = runner.invoke(main, args, env=call.env, catch_exceptions=False)
            return call, result.exit_code, result.output
        client = web_app.test_client()
        if face == "ui":
            with client.session_transaction() as session:
                session["csrf"] = CSRF
                session["sid"] = users_mod.start_session(conn, "admin", "127.0.0.1", "pytest")
            headers = {"X-CSRF-Token": CSRF}
        else:
            headers = {"Authorization": f"Bearer {token}"}
        response = call.web(client, ctx, reason, headers)
        return call, response.status_code, response.get_data(as_text=True)

    return run


def expected_actor(face: str) -> str:
    return {"cli": ME, "ui": "admin", "api": f"admin (token {TOKEN_LABEL})"}[face]


def audited(conn, key: str, reason: str | None) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT actor, action, reason, selection, rows, outcome FROM skiplock.audit_log "
            "WHERE action = ANY(%s) AND actor <> 'seed' AND reason IS NOT DISTINCT FROM %s ORDER BY id",
            (list(ACTIONS[key].audit), reason)).fetchall()


# --- the tests ---------------------------------------------------------------------------------

def test_every_face_of_the_table_has_a_scenario():
    missing = [(k, f) for k, f in CASES if k not in SCENARIOS or f not in SCENARIOS[k].faces]
    extra = [(k, f) for k, s in SCENARIOS.items() for f in s.faces if (k, f) not in CASES]
    assert missing == [] and extra == [], f"scenarios missing for {missing}; not in the table: {extra}"


# Reasons that say nothing (issue 26, class 4): refused wherever a reason is required, like a
# missing one. Invisible characters a form, a JSON body or a shell passes happily, alone and
# mixed, and reasons too short to say anything.
SAYS_NOTHING = [
    "\u200b",                          # zero-width space
    "\u2800\u2800\u2800\u2800",          # braille pattern blank
    "\u3164\u3164\u3164",                # hangul filler
    "\u115f\u1160\uffa0",                # hangul choseong/jungseong fillers, halfwidth filler
    "\u200d\u200c",                     # ZWJ, ZWNJ
    "\ufeff",                           # BOM
    "\u2060\u180e\u200e\u200f\u00a0\u3000",  # word joiner, Mongolian separator, bidi marks, NBSP, ideographic space
    " \u200b \u2800\u3164 \ufeff\u200d ",   # all of them with spaces
    "x",                                # too short to say anything
    "\u200bok\u2800",                    # two visible characters in invisible padding
]


@pytest.mark.parametrize(("key", "face"), REQUIRED, ids=[f"{k}-{f}" for k, f in REQUIRED])
def test_refused_without_a_reason_then_audited_with_one(conn, act, key, face):
    scenario = SCENARIOS[key]
    ctx = scenario.setup(conn)
    before, before_audit = conn.execute(scenario.probe).fetchall(), audit_count(conn)

    for blank in (None, *SAYS_NOTHING):
        _, status, output = act(key, face, ctx, blank)
        if face == "cli":
            assert status == 2, (blank, output)
            assert "--reason" in output and "Traceback" not in output, (blank, output)
        else:
            assert status == 422, (blank, output[:400])
            assert "reason" in output, (blank, output[:400])
        settle(conn)
        assert conn.execute(scenario.probe).fetchall() == before, f"a refused action changed something ({blank!r})"
        assert audit_count(conn) == before_audit, f"a refused action wrote to the audit log ({blank!r})"

    call, status, output = act(key, face, ctx, REASON)
    assert status == (0 if face == "cli" else call.ok), output[:400]
    settle(conn, key, REASON)
    assert conn.execute(scenario.probe).fetchall() != before, "the action changed nothing"
    rows = audited(conn, key, REASON)
    assert rows, f"no audit row for {ACTIONS[key].audit} with the reason"
    for row in rows:
        assert row["actor"] == expected_actor(face), row
        assert row["selection"], row
        assert row["rows"] is not None, row
        if call.rows is not None:
            assert row["rows"] == call.rows, row


@pytest.mark.parametrize(("key", "face"), OPTIONAL, ids=[f"{k}-{f}" for k, f in OPTIONAL])
def test_optional_reason_is_not_asked_for(conn, act, key, face):
    ctx = SCENARIOS[key].setup(conn)
    call, status, output = act(key, face, ctx, None)
    assert status == (0 if face == "cli" else call.ok), output[:400]
    settle(conn, key, None)
    rows = audited(conn, key, None)
    assert rows and all(row["actor"] == expected_actor(face) for row in rows), rows


# An acknowledgement's reason is its note (`note`, not `reason`): tested on its own below.
REASON_FIELD_OPTIONAL = [(k, f) for k, f in OPTIONAL if k != "alert_acknowledge"]


@pytest.mark.parametrize(("key", "face"), REASON_FIELD_OPTIONAL, ids=[f"{k}-{f}" for k, f in REASON_FIELD_OPTIONAL])
def test_an_optional_reason_that_shows_nothing_is_no_reason_and_a_short_one_is_refused(conn, act, key, face):
    ctx = SCENARIOS[key].setup(conn)
    before_audit = audit_count(conn)
    _, status, output = act(key, face, ctx, "\u200bok")
    assert status == (2 if face == "cli" else 422), output[:400]
    assert "at least 3 visible characters" in output, output[:400]
    assert audit_count(conn) == before_audit
    call, status, output = act(key, face, ctx, " \u200b\u2800\ufeff ")
    assert status == (0 if face == "cli" else call.ok), output[:400]
    settle(conn, key, None)
    rows = audited(conn, key, None)  # recorded without a reason, never with a blank one
    assert rows, "no audit row without a reason"
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE reason IS NOT NULL AND actor <> 'seed'"
                        " AND reason !~ '[[:alnum:][:punct:]]'").fetchone()[0] == 0


def test_an_acknowledgement_note_follows_the_same_rule(conn, act, client_as):
    ctx = SCENARIOS["alert_acknowledge"].setup(conn)
    operator = client_as("operator")
    for url in ("/alerts/{alert}/ack", "/api/v1/alerts/{alert}/ack"):
        r = operator.post(url.format(**ctx), data={"csrf_token": CSRF, "note": "\u200bok"})
        assert r.status_code == 400 and "note: say why in at least 3 visible" in r.get_data(as_text=True), url
    assert conn.execute("SELECT acknowledged_by FROM skiplock.alerts").fetchone()[0] is None
    r = operator.post("/api/v1/alerts/{alert}/ack".format(**ctx), data={"csrf_token": CSRF, "note": "\u2800\u200b"})
    assert r.status_code == 200
    assert conn.execute("SELECT ack_note FROM skiplock.alerts").fetchone()[0] is None
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE action = 'alert_acknowledge'").fetchone()[0] is None


def test_faces_outside_the_table_follow_the_same_rule(conn, client_as):
    """Enqueue (its reason is always required) and the periodic schedules' actions (optional)
    check reasons with the same function."""
    from console.queue import periodic

    operator = client_as("operator")
    for reason in ("\u200b", "\u2800\u3164\ufeff", "x"):
        r = operator.post("/api/v1/jobs", json={"kind": "k", "reason": reason}, headers={"X-CSRF-Token": CSRF})
        assert r.status_code == 400 and "reason:" in r.get_json()["error"], (reason, r.get_json())
        q.enqueue(conn, "k", {}, queue="mail")
        r = operator.post("/queues/mail/enqueue", data={"csrf_token": CSRF, "kind": "k", "reason": reason})
        assert r.status_code == 400 and "reason:" in r.get_data(as_text=True)
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE action = 'enqueue'").fetchone()[0] == 0
    declared = periodic.parse_entries([("#1", {"name": "nightly", "kind": "report", "every": "1h"}, "config")])
    periodic.sync(conn, declared)
    r = operator.post("/periodic/nightly/pause", data={"csrf_token": CSRF, "reason": "\u200bok"})
    assert r.status_code == 400 and "at least 3 visible" in r.get_data(as_text=True)
    assert operator.post("/periodic/nightly/pause", data={"csrf_token": CSRF, "reason": "\u200b\u2800"}).status_code == 302
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE action = 'periodic_pause'").fetchall() == [(None,)]


def test_python_callers_follow_the_same_rule(conn):
    """The fourth face: the domain functions a script calls, and console.audit.record itself."""
    from console import audit
    from console.actions import ReasonSaysNothing, clean_reason
    from console.maintenance.actions import pause_queue

    for blank in SAYS_NOTHING[:-2]:
        assert clean_reason(blank) is None, repr(blank)
    for short in ("x", "ok", "\u200bok\u2800", "e\u0301", "\u3164a\u3164b"):
        with pytest.raises(ReasonSaysNothing, match="at least 3 visible characters"):
            clean_reason(short)
    for fine in ("fix", "  INC-1042  ", "日本語", "!!!", "\U0001f525\U0001f525\U0001f525", "e\u0301e\u0301e\u0301"):
        assert clean_reason(fine) == fine.strip(), repr(fine)
    assert clean_reason("\u200b\u2800fix it\ufeff") == "fix it"  # invisible padding goes, like spaces

    row_id = audit.record(conn, actor="script", action="pause", reason="\u200b\u2800\ufeff")
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE id = %s", (row_id,)).fetchone()[0] is None
    with pytest.raises(ValueError, match="at least 3 visible"):
        audit.record(conn, actor="script", action="pause", reason="ok")
    q.enqueue(conn, "k", {}, queue="mail")
    pause_queue(conn, "mail", actor="script", reason="\u3164\u3164 relay down \u200b")
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE action = 'pause' AND actor = 'script' ORDER BY id"
                        ).fetchall() == [(None,), ("relay down",)]
    ids = add_failed(conn, 2)
    before = audit_count(conn)
    with pytest.raises(ValueError, match="at least 3 visible"):
        m.start(conn, "purge", {"ids": ids}, actor="script", reason="\u200bx")
    assert audit_count(conn) == before
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0
    with pytest.raises(ev.AlertActionError, match="needs a reason"):
        ev.silence(conn, rule=None, labels={}, duration=timedelta(hours=1), reason="\u2800\u2800\u2800", actor="script")
    with pytest.raises(ev.AlertActionError, match="at least 3 visible"):
        ev.silence(conn, rule=None, labels={}, duration=timedelta(hours=1), reason="\u200bno", actor="script")


def test_cli_actor_override_is_recorded_beside_the_os_user(conn, act):
    ctx = SCENARIOS["pause"].setup(conn)
    _, status, output = act("pause", "cli", ctx, "nightly deploy", actor="deploy-bot")
    assert status == 0, output
    actor = conn.execute("SELECT actor FROM skiplock.audit_log WHERE action = 'pause'").fetchone()[0]
    assert actor == f"deploy-bot ({ME})"
    _, status, output = act("pause", "cli", ctx, "x", actor="bad\nname")
    assert status == 2 and "--actor" in output


def test_the_cli_asks_for_a_reason_on_a_terminal(conn, dsn, monkeypatch):
    """On a terminal the CLI asks instead of refusing; an empty answer is asked again."""
    SCENARIOS["pause"].setup(conn)
    monkeypatch.setattr("console.cli.common.interactive", lambda: True)
    result = CliRunner().invoke(main, ["--dsn", dsn, "pause", "mail"], input="\nrelay down\n", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "a reason is required" in result.output
    assert conn.execute("SELECT reason FROM skiplock.audit_log WHERE action = 'pause'").fetchone()[0] == "relay down"


def test_one_job_replay_and_everything_else():
    assert bulk_action("replay", {"ids": [7]}) == "replay_one"
    assert bulk_action("replay", {"ids": [7, 8]}) == "replay_many"
    assert bulk_action("replay", {"ids": [7], "queue": "mail"}) == "replay_many"
    assert bulk_action("replay", {"fingerprint": "x"}) == "replay_many"
    assert bulk_action("purge", {"ids": [7]}) == "purge"
    assert require_reason("replay_one", "  ") is None
    with pytest.raises(ValueError, match="at most 500"):
        require_reason("pause", "x" * 501)
    with pytest.raises(ValueError, match="control characters"):
        require_reason("pause", "relay\x00down")  # PostgreSQL text refuses NUL: a 400, never a 500
    assert require_reason("pause", "relay down\nsince 03:00") == "relay down\nsince 03:00"
    assert cli_actor() == ME


def test_the_docs_table_is_the_data():
    text = (ROOT / "docs" / "maintenance.md").read_text(encoding="utf-8")
    assert markdown_table() in text, ("docs/maintenance.md's table differs from console.actions.ACTIONS; paste "
                                      "`python -c 'from console.actions import markdown_table; print(markdown_table())'`")
