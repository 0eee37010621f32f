"""Redaction holds everywhere a viewer looks: payload filters on the dead letters, error text
(last error, error history, timeline, error groups, exports), and the selections and errors of
audit rows and bulk operations, on pages and in the API. Operators and admins see them whole;
the deployer's text hook (web.redact_text_hook) runs for everyone."""

from __future__ import annotations

import json
import re

import pytest

from console import audit
from console import queue as q
from console.config import ConfigError
from console.maintenance import start
from console.users import start_session
from tests.web_fixtures import CSRF

CARD = "4111111111111111"


def card_declined(conn, message: str = f"card declined: card_number={CARD}, retry later") -> int:
    """A dead letter whose payload and error text both carry a card number."""
    q.enqueue(conn, "charge_card", {"card_number": CARD, "customer": 7}, queue="billing", max_attempts=1)
    [job] = q.claim(conn, "w-1", queues=["billing"], limit=1, lease=60)
    try:
        raise ValueError(message)
    except ValueError as exc:  # a real traceback, as a worker records it
        q.fail(conn, job, exc)
    return job.id


def body(response) -> str:
    assert response.status_code == 200, (response.request.path, response.status_code, response.get_data(as_text=True)[:300])
    return response.get_data(as_text=True)


def test_a_viewer_cannot_filter_the_dead_letters_on_a_redacted_key(conn, client_as):
    card_declined(conn)
    probe = {"payload": json.dumps({"card_number": CARD})}
    viewer = client_as("viewer")
    page = viewer.get("/deadletters/jobs", query_string=probe)
    assert page.status_code == 403 and "viewers cannot filter on redacted keys (card_number)" in page.get_data(as_text=True)
    api = viewer.get("/api/v1/deadletters/jobs", query_string=probe)
    assert api.status_code == 403 and "card_number" in api.get_json()["error"]
    # a key that is not redacted is a fine filter; an operator may filter on anything
    assert viewer.get("/api/v1/deadletters/jobs", query_string={"payload": '{"customer": 7}'}).get_json()["total"] == 1
    assert client_as("operator").get("/api/v1/deadletters/jobs", query_string=probe).get_json()["total"] == 1


VIEWS_WITH_ERROR_TEXT = [
    "/deadletters", "/api/v1/deadletters",                          # error groups' examples
    "/deadletters/jobs?queue=billing", "/api/v1/deadletters/jobs?queue=billing",  # last_error
    "/jobs?state=failed", "/api/v1/jobs?state=failed",              # the jobs browser
    "/jobs/{id}", "/api/v1/jobs/{id}",                              # last_error, error history, timeline
    "/jobs/export.csv?state=failed", "/api/v1/jobs/export.json?state=failed",
]


def test_viewers_see_error_text_redacted_on_pages_and_api_operators_in_clear(conn, client_as):
    job_id = card_declined(conn)
    for url in VIEWS_WITH_ERROR_TEXT:
        url = url.format(id=job_id)
        seen = body(client_as("viewer").get(url))
        assert CARD not in seen, url
        assert "card_number=[redacted]" in seen, url
        assert CARD in body(client_as("operator").get(url)), url
        assert CARD in body(client_as("admin").get(url)), url
    detail = client_as("viewer").get(f"/api/v1/jobs/{job_id}").get_json()
    assert detail["job"]["errors"][-1]["message"] == "card declined: card_number=[redacted], retry later"
    assert "card_number=[redacted]" in detail["job"]["errors"][-1]["traceback"]
    assert any("card_number=[redacted]" in e["detail"] for e in detail["timeline"])


def test_audit_and_operation_selections_and_errors_are_redacted_for_viewers(conn, client_as):
    card_declined(conn)
    op_id = start(conn, "replay", {"payload": {"card_number": CARD}}, actor="operator", reason="gateway back")
    conn.execute("UPDATE skiplock.bulk_operations SET state = 'failed', finished_at = now(), error = %s WHERE id = %s",
                 (f"ValueError: gateway refused card_number={CARD}", op_id))
    audit.record(conn, actor="operator", action="replay", target=f"operation:{op_id}", outcome="error",
                 selection={"payload": {"card_number": CARD}}, detail={"error": f"gateway refused card_number={CARD}"})
    views = ["/audit", "/api/v1/audit", "/api/v1/audit?action=replay",
             "/deadletters", "/api/v1/deadletters", "/api/v1/deadletters/operations",
             f"/deadletters/operations/{op_id}", f"/api/v1/deadletters/operations/{op_id}",
             f"/deadletters/operations/{op_id}/_progress"]
    for url in views:
        seen = client_as("viewer").get(url).get_data(as_text=True)
        assert CARD not in seen, url
        assert "[redacted]" in seen, url
    rows = client_as("viewer").get("/api/v1/audit").get_json()["entries"]
    assert {json.dumps(r["selection"]) for r in rows} == {'{"payload": {"card_number": "[redacted]"}}'}
    operator_view = client_as("operator").get("/api/v1/audit").get_json()["entries"]
    assert all(r["selection"]["payload"]["card_number"] == CARD for r in operator_view)
    for url in ("/audit", f"/api/v1/deadletters/operations/{op_id}", f"/deadletters/operations/{op_id}"):
        assert CARD in client_as("operator").get(url).get_data(as_text=True), url


def mask_card_numbers(text, user):
    """A deployment's text hook: a card number without a key in front is still a card number."""
    return re.sub(r"\b\d{13,19}\b", lambda m: "*" * (len(m.group()) - 4) + m.group()[-4:], text)


def test_the_text_hook_runs_for_everyone_and_a_bad_one_refuses_to_start(web_settings, dsn, conn, personas):
    from console.web import create_app

    job_id = card_declined(conn, f"card {CARD} declined")
    app = create_app({**web_settings, "web.redact_text_hook": "tests.test_web_redaction:mask_card_numbers"})
    try:
        for role in ("viewer", "operator"):
            client = app.test_client()
            with client.session_transaction() as session:
                session["sid"] = start_session(conn, role, "127.0.0.1", "pytest")
                session["csrf"] = CSRF
            groups = client.get("/api/v1/deadletters").get_json()["groups"]
            assert groups[0]["example"] == "ValueError: card ************1111 declined", role
            job = client.get(f"/api/v1/jobs/{job_id}").get_json()["job"]
            assert job["errors"][-1]["message"] == "card ************1111 declined", role
            assert CARD not in job["last_error"] + job["errors"][-1]["traceback"], role
    finally:
        app.extensions["skiplock"].close()
    with pytest.raises(ConfigError, match="web.redact_text_hook"):
        create_app({**web_settings, "web.redact_text_hook": "tests.test_web_redaction:no_such_hook"})
