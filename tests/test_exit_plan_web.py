"""The exit plan and the move in the console and the API (issue 32; docs/exit-plan.md):
GET /queues/<name>/exit-plan, POST /queues/<name>/move, GET /api/v1/queues/<name>/exit-plan and
POST /api/v1/queues/<name>/move, on a real PostgreSQL through Flask's test client. The model and
the move are console.exitplan's (tests/test_exit_plan.py tests them from the command line); here:
the page shows that model, the form is an operator's, the move is audited as the CLI audits it,
and bad input is refused before anything changes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from console import queue as q
from console import users as users_mod
from console.cli import main
from console.queue import broker
from tests.maintenance_data import add_failed
from tests.test_advisor_verdict import healthy, history
from tests.web_fixtures import CSRF

REASON = "INC-88: mail outgrew PostgreSQL (advisor verdict)"


def moves(conn) -> list[tuple]:
    return conn.execute("SELECT actor, target, reason, selection, rows, detail FROM skiplock.audit_log "
                        "WHERE action = 'move queue' ORDER BY id").fetchall()


def backend(conn, queue: str = "mail") -> str:
    return broker.backend_of(conn, queue)


@pytest.fixture
def mail(conn):
    """Queue mail on PostgreSQL: three due jobs (one of them running), one for later, one dead letter."""
    for _ in range(3):
        q.enqueue(conn, "send", {}, queue="mail")
    q.enqueue(conn, "send", {}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    q.claim(conn, "w1", queues=["mail"])
    add_failed(conn, 1, queue="mail")


def text(response) -> str:
    return re.sub(r"\s+", " ", response.get_data(as_text=True))


def test_a_viewer_reads_the_plan_the_cli_prints_without_the_move_form(dsn, conn, mail, client_as):
    history(conn, 48, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, lambda x: 0.004 + 0.1 * x),
                               ({"queue": "mail", "source": "probe", "quantile": "last"}, lambda x: 0.003 + 0.05 * x)],
    ))
    viewer = client_as("viewer")
    assert 'href="/queues/mail/exit-plan"' in text(viewer.get("/queues/mail"))  # linked from the queue page
    page = viewer.get("/queues/mail/exit-plan")
    assert page.status_code == 200
    html = text(page)
    assert 'id="exit-plan-backend">postgres<' in html
    assert 'data-verdict="outgrowing PostgreSQL"' in html and "plan the move" in html
    assert ("Claim latency of queue mail alone: claim latency of queue mail went from 11.3 ms to 44.7 ms" in html)
    assert 'data-signal="claim-latency"' in html and 'data-signal="queue-claim-latency"' not in html
    for figure in ("<dt>Pending</dt><dd>2</dd>", "<dt>Scheduled</dt><dd>1</dd>", "<dt>Running</dt><dd>1</dd>",
                   "<dt>Dead letters</dt><dd>1</dd>", "<dt>Outbox unsent</dt><dd>0</dd>"):
        assert figure in html, figure
    steps = re.findall(r'data-step="(\d)" data-state="([^"]+)"', html)
    assert [n for n, _ in steps] == [str(n) for n in range(1, 9)]
    assert [s for _, s in steps][3:] == ["to do", "check", "to do", "to do", "if needed"]
    assert "skiplock queues move mail --to nats --reason" in html and "skiplock worker --backend nats --queues mail" in html
    assert 'id="move-form"' not in html and "/queues/mail/move" not in html

    # The API answers the CLI's JSON (the same model; the same machine finds the same tools).
    api = viewer.get("/api/v1/queues/mail/exit-plan")
    assert api.status_code == 200
    plan = api.get_json()
    cli = json.loads(CliRunner().invoke(main, ["--dsn", dsn, "exit-plan", "mail", "--json"], env={},
                                        catch_exceptions=False).output)
    assert set(plan) == set(cli)
    for key in ("queue", "backend", "steps", "dual_run", "advice"):
        assert plan[key] == cli[key], key
    assert plan["verdict"]["label"] == cli["verdict"]["label"] == "outgrowing PostgreSQL"
    assert [(s["id"], s["scope"], s["level"]) for s in plan["signals"]] == [
        (s["id"], s["scope"], s["level"]) for s in cli["signals"]]
    assert moves(conn) == []  # reading changed nothing


def test_counts_past_the_claim_index_window_are_shown_as_lower_bounds(conn, client_as, monkeypatch):
    from console import browse, exitplan

    figures = browse.queue_figures
    monkeypatch.setattr(exitplan.browse, "queue_figures", lambda c: figures(c, pending_cap=2))
    for _ in range(3):
        q.enqueue(conn, "send", {}, queue="mail")
    html = text(client_as("viewer").get("/queues/mail/exit-plan"))
    assert "<dt>Pending</dt><dd>2+</dd>" in html and "<dt>Scheduled</dt><dd>0+</dd>" in html
    api = client_as("viewer").get("/api/v1/queues/mail/exit-plan").get_json()
    assert api["dual_run"]["jobs"]["capped"] is True and api["dual_run"]["jobs"]["pending"] == 2


def test_an_operator_moves_the_queue_with_a_reason_audited_as_the_cli_does(conn, mail, client_as):
    operator = client_as("operator")
    form = text(operator.get("/queues/mail/exit-plan"))
    assert 'id="move-form"' in form and 'name="to" value="nats"' in form and "Move to NATS" in form
    assert f'name="csrf_token" value="{CSRF}"' in form

    moved = operator.post("/queues/mail/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON})
    assert moved.status_code == 303 and moved.headers["Location"].endswith("/queues/mail/exit-plan")
    assert backend(conn) == "nats"
    ((who, target, reason, selection, rows, detail),) = moves(conn)
    assert (who, target, reason, selection, rows) == ("operator", "queue:mail", REASON, {"queue": "mail"}, 1)
    assert (detail["before"], detail["after"]) == ("postgres", "nats")
    assert detail["left"] == {"jobs": {"pending": 2, "scheduled": 1, "running": 1, "failed": 1, "capped": False},
                              "outbox_unsent": 0}
    landing = text(operator.get("/queues/mail/exit-plan"))
    assert "Queue &#39;mail&#39; moved to nats (was: postgres)" in landing
    assert "Left on PostgreSQL (skiplock.jobs): 2 pending, 1 scheduled, 1 running" in landing
    assert 'id="exit-plan-backend">nats<' in landing and 'name="to" value="postgres"' in landing
    assert "Move back to PostgreSQL" in landing
    assert q.enqueue(conn, "send", {}, queue="mail") and conn.execute(
        "SELECT count(*) FROM skiplock.outbox WHERE queue = 'mail'").fetchone()[0] == 1  # new jobs: the outbox

    # A move to the backend it has: said, and nothing written.
    again = operator.post("/queues/mail/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON})
    assert again.status_code == 303 and len(moves(conn)) == 1
    assert "already served by nats: nothing changed (no audit row)" in text(operator.get("/queues/mail/exit-plan"))

    back = operator.post("/queues/mail/move", data={"csrf_token": CSRF, "to": "postgres", "reason": "rolled back"})
    assert back.status_code == 303 and backend(conn) == "postgres"
    assert [(m[2], m[5]["after"]) for m in moves(conn)] == [(REASON, "nats"), ("rolled back", "postgres")]
    assert "Left for the broker: 1 unsent outbox rows" in text(operator.get("/queues/mail/exit-plan"))


def test_a_move_without_csrf_or_by_a_viewer_is_refused_and_changes_nothing(conn, mail, client_as):
    no_csrf = client_as("operator").post("/queues/mail/move", data={"to": "nats", "reason": REASON})
    assert no_csrf.status_code == 403 and b"CSRF" in no_csrf.data
    viewer = client_as("viewer").post("/queues/mail/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON})
    assert viewer.status_code == 403
    anonymous = client_as(None).post("/queues/mail/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON})
    assert anonymous.status_code in (302, 401, 403)
    assert backend(conn) == "postgres" and moves(conn) == []


@pytest.mark.parametrize(("fields", "status", "says"), [
    ({"to": "nats", "reason": ""}, 422, "reason: required to move a queue"),
    ({"to": "nats", "reason": " \u200b "}, 422, "reason: required to move a queue"),
    ({"to": "nats"}, 422, "reason: required to move a queue"),
    ({"to": "kafka", "reason": REASON}, 400, "to: must be one of postgres, nats"),
    ({"reason": REASON}, 400, "to: required"),
])
def test_a_bad_move_form_comes_back_with_its_message_and_changes_nothing(conn, mail, client_as, fields, status, says):
    answer = client_as("operator").post("/queues/mail/move", data={"csrf_token": CSRF, **fields})
    assert answer.status_code == status, answer.data[:300]
    html = text(answer)
    assert 'id="move-error"' in html and says in html, html[-2000:]
    assert 'id="move-form"' in html  # the form again, as typed
    assert backend(conn) == "postgres" and moves(conn) == []


def test_a_queue_name_a_broker_cannot_carry_is_refused(conn, client_as):
    q.enqueue(conn, "send", {}, queue="mail.eu")
    answer = client_as("operator").post("/queues/mail.eu/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON})
    assert answer.status_code == 400 and "cannot be served by a broker" in text(answer)
    assert backend(conn, "mail.eu") == "postgres" and moves(conn) == []


def test_an_unknown_queue_is_a_404_naming_the_nearest_everywhere(conn, mail, client_as, personas):
    operator = client_as("operator")
    token = {"Authorization": f"Bearer {users_mod.create_token(conn, 'operator', 'ci')}"}
    for answer in (operator.get("/queues/mial/exit-plan"),
                   operator.post("/queues/mial/move", data={"csrf_token": CSRF, "to": "nats", "reason": REASON}),
                   operator.get("/api/v1/queues/mial/exit-plan", headers=token),
                   operator.post("/api/v1/queues/mial/move", data={"to": "nats", "reason": REASON}, headers=token)):
        assert answer.status_code == 404, answer.data[:300]
        assert "there is no queue &#39;mial&#39;" in text(answer) or "there is no queue 'mial'" in text(answer)
        assert "did you mean" in text(answer)
    assert backend(conn, "mial") == "postgres" and moves(conn) == []


def test_the_api_moves_with_an_operator_token_and_refuses_bad_moves(conn, mail, client_as, personas):
    client = client_as(None)
    operator = {"Authorization": f"Bearer {users_mod.create_token(conn, 'operator', 'deploy-bot')}"}
    viewer = {"Authorization": f"Bearer {users_mod.create_token(conn, 'viewer', 'dash')}"}
    url = "/api/v1/queues/mail/move"

    for body, status, says in (({"to": "nats"}, 422, "reason"), ({"to": "nats", "reason": "\u200b"}, 422, "reason"),
                               ({"to": "kafka", "reason": REASON}, 400, "to: must be one of"),
                               ({"reason": REASON}, 400, "to: required"), ({"to": 5, "reason": REASON}, 400, "to:"),
                               ([1], 400, "JSON object")):
        bad = client.post(url, json=body, headers=operator)
        assert bad.status_code == status and says in bad.get_json()["error"], (body, bad.get_json())
    assert client.post(url, json={"to": "nats", "reason": REASON}, headers=viewer).status_code == 403
    assert client.post(url, json={"to": "nats", "reason": REASON}, headers={"X-CSRF-Token": CSRF}).status_code == 401
    assert backend(conn) == "postgres" and moves(conn) == []

    moved = client.post(url, json={"to": "nats", "reason": REASON}, headers=operator)
    assert moved.status_code == 200, moved.data
    body = moved.get_json()
    assert (body["queue"], body["before"], body["after"], body["changed"]) == ("mail", "postgres", "nats", True)
    assert body["dual_run"]["backend"] == "nats" and body["dual_run"]["left"] == 4
    assert backend(conn) == "nats"
    ((who, target, reason, _, rows, detail),) = moves(conn)
    assert (who, target, reason, rows, detail["after"]) == ("operator (token deploy-bot)", "queue:mail", REASON, 1, "nats")

    again = client.post(url, data={"to": "nats", "reason": REASON}, headers=operator)  # a form body too
    assert again.status_code == 200 and again.get_json()["changed"] is False and len(moves(conn)) == 1
    plan = client.get("/api/v1/queues/mail/exit-plan", headers=viewer).get_json()
    assert plan["backend"] == "nats" and plan["steps"][5]["state"] == "done"


@pytest.mark.browser
def test_an_operator_moves_a_queue_from_its_page_in_the_browser(page, live_server, personas, conn, mail):
    """Chromium: queue page -> Exit plan -> Move to NATS (the confirmation dismissed once, then
    accepted); the end state is checked in the database."""
    from tests.test_web_browser import sign_in

    sign_in(page, live_server, "operator", "/queues/mail")
    page.locator("#exit-plan-link").click()
    page.wait_for_load_state()
    form = page.locator("#move-form")
    form.locator("input[name=reason]").fill(REASON)
    page.once("dialog", lambda dialog: dialog.dismiss())
    form.locator("button[type=submit]").click()
    assert backend(conn) == "postgres" and moves(conn) == []  # dismissed: nothing sent
    page.once("dialog", lambda dialog: dialog.accept())
    form.locator("button[type=submit]").click()
    page.wait_for_selector("[data-flash]")
    assert "moved to nats (was: postgres)" in page.locator("[data-flash]").inner_text()
    assert page.locator("#exit-plan-backend").inner_text() == "nats"
    assert backend(conn) == "nats" and [m[2] for m in moves(conn)] == [REASON]
