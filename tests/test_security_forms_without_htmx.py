"""Issue 26, class 8: every form works without htmx.

Every state-changing route outside /api/ (a form of some page) is posted twice from a fresh
database: once as htmx sends it (`HX-Request: true`, the CSRF token in a header) and once as a
plain browser does (no htmx, the token in the form). Both must do what the form is for (a
probe of the database, or of the receiver, changes) and answer with something a browser can
use: without htmx a redirect to a page that renders, or a whole page; with htmx a 2xx or a
redirect. Never a 4xx for valid input, never a 5xx.

The routes come from the URL map: a new form fails `test_every_form_is_in_the_table` until it
is added to FORMS. Example of what this caught: "Send test" without htmx sent the test, then
answered 500 (the page's template expected `result`, the view passed `test_result`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from console.alerts import evaluate as ev
from console.queue import periodic
from tests.alert_receiver import Receiver
from tests.test_action_reasons import (
    DEST,
    HOLDERS,
    JOBS,
    RULE,
    USERS,
    a_holder,
    a_queue,
    cancelled_operation,
    carol,
    dead,
    firing,
    later_job,
    queued_operation,
    settle,
    ui_destination,
    ui_rule,
)
from tests.web_fixtures import CSRF, PASSWORD

WHY = "INC-1042: form without htmx"


@dataclass
class Form:
    path: str
    fields: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Any], dict[str, Any]] = lambda conn: {}
    probe: str | None = None  # SQL whose answer the action changes
    as_user: str | None = "admin"  # None: an anonymous visitor (the sign-in form)
    changes_nothing: str | None = None  # a preview: this text must be in the answer instead
    # A form that needs a library this table cannot set up (BullMQ under Node.js): the test that
    # posts it with and without htmx instead.
    covered_by: str | None = None


def a_schedule(paused: bool):
    def setup(conn):
        declared = periodic.parse_entries([("#1", {"name": "nightly", "kind": "report", "every": "1h"}, "config")])
        periodic.sync(conn, declared)
        if paused:
            periodic.set_paused(conn, "nightly", True, actor="seed")
        return {}

    return setup


def a_silence(conn):
    row = ev.silence(conn, rule="queue_age", labels={"queue": "mail"}, duration=timedelta(hours=1),
                     reason="seeded silence", actor="seed")
    return {"silence": row["id"]}


def a_pgqueuer(conn):
    """A real PGQueuer schema (its Queries.install, what `pgq install` runs) watched as [[external_queues]] 'legacy' with
    actions = true (web_settings): two jobs held as failed (the state its consumer's
    on_failure="hold" leaves), one queued."""
    from tests import external_workers as w
    from tests.test_external_libraries import run_async, url

    dsn = url(conn.info.dsn)
    run_async(w.pgqueuer_install(dsn))
    run_async(w.pgqueuer_produce(dsn, ["flaky", "flaky", "idle"]))
    conn.execute("UPDATE pgqueuer SET status = 'failed', updated = now() WHERE entrypoint = 'flaky'")
    return {"idle": conn.execute("SELECT id FROM pgqueuer WHERE entrypoint = 'idle'").fetchone()[0]}


def external_operation(state: str):
    def setup(conn):
        ctx = a_pgqueuer(conn)
        op = conn.execute("""INSERT INTO skiplock.external_operations (source, system, action, selection, actor, reason,
                                 state, total, batch_size, keys_digest)
                             VALUES ('legacy', 'pgqueuer', 'replay', %s, 'seed', 'seeded', %s, 1, 10, md5('1'))
                             RETURNING id""", (Jsonb({"queue": "flaky"}), state)).fetchone()[0]
        conn.execute("INSERT INTO skiplock.external_operation_items (operation_id, ord, key) VALUES (%s, 1, '1')", (op,))
        return {**ctx, "op": op}

    return setup


EXTERNAL_FAILED = "SELECT count(*) FROM pgqueuer WHERE status = 'failed'"
EXTERNAL_OPS = "SELECT state FROM skiplock.external_operations"


def a_dead_letter(conn):
    """A failed job and the version a preview of its edit (priority 7) gives (console.maintenance.edit_replay)."""
    from console.maintenance import edit_replay

    ctx = dead(1)(conn)
    return {**ctx, "version": edit_replay.preview(conn, ctx["id"], edit_replay.Edit(priority=7), keys=frozenset()).version}


def receiving_destination(conn):
    """A destination that is a real local receiver (the test starts it)."""
    return {"receiver": True}


FORMS: dict[str, Form] = {
    "admin.revoke": Form("/admin/tokens/{token}/revoke", {"reason": WHY}, carol(token=True), USERS),
    "admin.save_user": Form("/admin/users", {"name": "carol", "role": "viewer", "password": "carol-password",
                                             "reason": WHY}, probe=USERS),
    "admin.user_action": Form("/admin/users/carol/disable", {"reason": WHY}, carol(), USERS),
    "advisor.rerun": Form("/advisor/run", probe="SELECT count(*) FROM skiplock.advisor_snapshots WHERE name = 'report'"),
    "alerts.ack": Form("/alerts/{alert}/ack", {"note": "on it"}, firing, "SELECT acknowledged_by FROM skiplock.alerts"),
    "alerts.save_destination": Form("/alerts/destinations", {**DEST, "reason": WHY},
                                    probe="SELECT count(*) FROM skiplock.alert_destinations"),
    "alerts.delete_destination": Form("/alerts/destinations/ops/delete", {"reason": WHY}, ui_destination,
                                      "SELECT count(*) FROM skiplock.alert_destinations"),
    "alerts.test_destination": Form("/alerts/destinations/rx/test", setup=receiving_destination),
    "alerts.save_rule": Form("/alerts/rules", {**RULE, "reason": WHY}, probe="SELECT count(*) FROM skiplock.alert_rules"),
    "alerts.delete_rule": Form("/alerts/rules/mail_age/delete", {"reason": WHY}, ui_rule,
                               "SELECT count(*) FROM skiplock.alert_rules"),
    "alerts.silence": Form("/alerts/silences", {"rule": "queue_age", "labels": "queue=mail", "duration": "1h",
                                                "reason": WHY}, probe="SELECT count(*) FROM skiplock.alert_silences"),
    "alerts.expire_silence": Form("/alerts/silences/{silence}/expire", setup=a_silence,
                                  probe="SELECT ends_at > now() FROM skiplock.alert_silences"),
    "brokerdead.preview": Form("/deadletters/broker/mail/preview", covered_by="tests/test_nats_deadletters.py::"
                               "test_broker_dead_letter_forms_work_with_and_without_htmx"),
    "brokerdead.start": Form("/deadletters/broker/mail/operations", covered_by="tests/test_nats_deadletters.py::"
                             "test_broker_dead_letter_forms_work_with_and_without_htmx"),
    "deadletters.one": Form("/deadletters/jobs/{id}/replay", setup=dead(1), probe=JOBS),
    "deadletters.start": Form("/deadletters/operations", {"action": "replay", "fingerprint": "SMTPError: timeout",
                                                          "reason": WHY}, dead(3), JOBS),
    "deadletters.cancel": Form("/deadletters/operations/{op}/cancel", setup=queued_operation,
                               probe="SELECT state FROM skiplock.bulk_operations"),
    "deadletters.resume": Form("/deadletters/operations/{op}/resume", {"reason": WHY}, cancelled_operation,
                               "SELECT state FROM skiplock.bulk_operations"),
    "deadletters.group_action": Form("/deadletters/groups/ignore", {"fingerprint": "SMTPError: timeout", "reason": WHY},
                                     dead(1), "SELECT ignored_by FROM skiplock.error_groups"),
    "deadletters.preview": Form("/deadletters/preview", {"action": "replay", "fingerprint": "SMTPError: timeout"},
                                dead(2), changes_nothing='value="2"'),
    "external.preview": Form("/external/legacy/preview", {"action": "replay", "queue": "flaky"}, a_pgqueuer,
                             changes_nothing='data-total="2"'),
    "external.start": Form("/external/legacy/operations", {"action": "replay", "queue": "flaky", "reason": WHY},
                           a_pgqueuer, EXTERNAL_FAILED),
    "external.cancel": Form("/external/operations/{op}/cancel", setup=external_operation("queued"), probe=EXTERNAL_OPS),
    "external.resume": Form("/external/operations/{op}/resume", {"reason": WHY}, external_operation("cancelled"),
                            EXTERNAL_OPS),
    "external.cancel_jobs": Form("/external/legacy/jobs/cancel", {"keys": "{idle}"}, a_pgqueuer,
                                 "SELECT count(*) FROM pgqueuer WHERE entrypoint = 'idle'"),
    "external.pause": Form("/external/bq/queues/flaky/pause", covered_by="tests/test_external_actions_node.py::"
                           "test_bullmq_pause_and_resume_forms_with_and_without_htmx"),
    "external.resume_queue": Form("/external/bq/queues/flaky/resume", covered_by="tests/test_external_actions_node.py::"
                                  "test_bullmq_pause_and_resume_forms_with_and_without_htmx"),
    "health.end_backend": Form("/health/backends/{pid}/end", {"mode": "terminate", "backend_start": "{backend_start}",
                                                              "reason": WHY}, a_holder(False), HOLDERS),
    "editreplay.preview": Form("/jobs/{id}/edit-replay/preview", {"priority": "7"}, a_dead_letter,
                               changes_nothing='id="edit-replay-confirm"'),
    "editreplay.apply": Form("/jobs/{id}/edit-replay/apply", {"priority": "7", "version": "{version}", "reason": WHY},
                             a_dead_letter, JOBS),
    "jobs.act": Form("/jobs/{id}/run_now", setup=later_job, probe="SELECT run_at > now() FROM skiplock.jobs"),
    "maintenance.run": Form("/maintenance/run/reap", probe="SELECT count(*) FROM skiplock.maintenance_runs"),
    "periodic.pause": Form("/periodic/nightly/pause", {"reason": WHY}, a_schedule(False), "SELECT paused FROM skiplock.periodic"),
    "periodic.resume": Form("/periodic/nightly/resume", {"reason": WHY}, a_schedule(True), "SELECT paused FROM skiplock.periodic"),
    "periodic.run": Form("/periodic/nightly/run", {"reason": WHY}, a_schedule(False), "SELECT count(*) FROM skiplock.jobs"),
    "queues.enqueue": Form("/queues/mail/enqueue", {"kind": "send", "payload": '{"to": "a@example.com"}', "reason": WHY},
                           a_queue(False), JOBS),
    "queues.set_limits": Form("/queues/mail/limits", {"concurrency": "2", "reason": WHY}, a_queue(False),
                              "SELECT concurrency FROM skiplock.queues"),
    "exitplan.move": Form("/queues/mail/move", {"to": "nats", "reason": WHY}, a_queue(False),
                          "SELECT name, backend FROM skiplock.queues"),
    "queues.pause": Form("/queues/mail/pause", {"reason": WHY}, a_queue(False), "SELECT paused FROM skiplock.queues"),
    "queues.resume": Form("/queues/mail/resume", {"reason": WHY}, a_queue(True), "SELECT paused FROM skiplock.queues"),
    "auth.login": Form("/login", {"name": "viewer", "password": PASSWORD}, as_user=None,
                       probe="SELECT count(*) FROM skiplock.web_sessions WHERE revoked_at IS NULL"),
    "auth.logout": Form("/logout", as_user="viewer",
                        probe="SELECT count(*) FROM skiplock.web_sessions WHERE revoked_at IS NULL"),
}


def form_endpoints(app) -> set[str]:
    return {rule.endpoint for rule in app.url_map.iter_rules()
            if not rule.rule.startswith("/api/") and set(rule.methods or ()) & {"POST", "PUT", "PATCH", "DELETE"}}


@pytest.fixture
def web_settings(web_settings, tmp_path, monkeypatch):
    config = tmp_path / "skiplock.toml"  # the external queue the external.* forms act on
    config.write_text('[[external_queues]]\nname = "legacy"\nsystem = "pgqueuer"\nactions = true\n')
    monkeypatch.setenv("SKIPLOCK_CONFIG", str(config))
    return {**web_settings, "alerts.allow_private_destinations": True}  # the test destination is on loopback


def test_every_form_is_in_the_table(web_app):
    assert form_endpoints(web_app) == set(FORMS)


def _usable(response, client, htmx: bool) -> str | None:
    """What is wrong with the answer, or None."""
    status = response.status_code
    body = response.get_data(as_text=True)
    if status >= 400:
        return f"{status}: {body[:300]}"
    if 300 <= status < 400:
        landing = client.get(response.headers["Location"], follow_redirects=True)
        landing.get_data()
        return None if landing.status_code == 200 else f"redirected to a {landing.status_code}"
    if not htmx and not body.lstrip().lower().startswith("<!doctype html"):
        return f"a plain POST got a fragment, not a page: {body[:120]!r}"
    return None


def _filled(value: Any, ctx: dict[str, Any]) -> Any:
    """A field that is exactly "{name}" takes the setup's value (the id of a job it made); any
    other field is posted as written (a JSON payload's braces are not a placeholder)."""
    if isinstance(value, str) and value.startswith("{") and value.endswith("}") and value[1:-1] in ctx:
        return str(ctx[value[1:-1]])
    return value


@pytest.mark.parametrize("htmx", [False, True], ids=["without-htmx", "with-htmx"])
# The forms `covered_by` another test are not generated here (a skip fails under CI=true).
@pytest.mark.parametrize("endpoint", sorted(name for name, form in FORMS.items() if not form.covered_by))
def test_every_form_works_with_and_without_htmx(web_app, client_as, conn, endpoint, htmx):
    form = FORMS[endpoint]
    ctx = form.setup(conn)
    with Receiver() as rx:
        if ctx.get("receiver"):
            conn.execute("INSERT INTO skiplock.alert_destinations (name, kind, url, headers, updated_by) "
                         "VALUES ('rx', 'json', %s, '{}', 'seed')", (rx.url,))
        client = client_as(form.as_user)
        before = conn.execute(form.probe).fetchall() if form.probe else None
        headers = {"HX-Request": "true", "X-CSRF-Token": CSRF} if htmx else {}
        fields = {k: _filled(v, ctx) for k, v in form.fields.items()}
        response = client.post(form.path.format(**ctx), data={"csrf_token": CSRF, **fields}, headers=headers)
        problem = _usable(response, client, htmx)
        assert problem is None, f"{endpoint} {'with' if htmx else 'without'} htmx: {problem}"
        settle(conn)
        if form.probe:
            assert conn.execute(form.probe).fetchall() != before, f"{endpoint}: the form did nothing"
        if form.changes_nothing:
            assert form.changes_nothing in response.get_data(as_text=True)
        if ctx.get("receiver"):
            assert len(rx.requests) == 1, "the test notification was not sent"
            assert "OK" in response.get_data(as_text=True)



def test_a_form_covered_elsewhere_names_a_test_that_exists():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for endpoint, form in FORMS.items():
        if form.covered_by:
            path, name = form.covered_by.split("::")
            assert f"def {name}(" in (root / path).read_text(), f"{endpoint}: {form.covered_by} does not exist"
