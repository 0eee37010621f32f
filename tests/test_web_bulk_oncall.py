"""Bulk operations from the console (issue 17): the confirm form's rate and purge-to-archive,
the previewed sample beside it, and resuming a cancelled operation (page and API), which keeps
the confirmed preview's bound. Real PostgreSQL, the test client with CSRF."""

from __future__ import annotations

import pytest

from console import audit
from console.maintenance import bulk
from tests.oncall_data import make_dead_letters
from tests.test_web_deadletters import confirm_form, one_more_dead_letter, statuses, wait_done
from tests.web_fixtures import CSRF


@pytest.fixture
def dead(conn):
    return make_dead_letters(conn)


def preview_html(client, action: str, **selection) -> str:
    resp = client.post("/deadletters/preview", data={"csrf_token": CSRF, "action": action, **selection})
    assert resp.status_code == 200
    return resp.get_data(as_text=True)


def test_the_confirm_form_shows_the_sample_beside_it_with_rate_and_archive_choices(conn, dead, client_as):
    client = client_as("operator")
    html = preview_html(client, "purge", queue="billing")
    grid = html.split('class="confirm-grid"')[1]
    sample, form = grid.split('action="/deadletters/operations"')
    for job_id in dead["card"]:
        assert f">{job_id}</a>" in sample  # every previewed id, beside the form
    assert "charge_card" in sample and "card declined for customer 1000" in sample  # kind and error, in clear
    assert 'name="rate"' in form and 'name="to_archive"' in form
    replay = preview_html(client, "replay", queue="billing")
    assert 'name="rate"' in replay and 'name="to_archive"' not in replay  # only a purge can archive


def test_purge_to_the_archive_at_a_chosen_rate_from_the_form(conn, dead, client_as):
    client = client_as("operator")
    fields = confirm_form(preview_html(client, "purge", queue="billing"))
    resp = client.post("/deadletters/operations", data={**fields, "reason": "gateway test data", "rate": "250",
                                                        "to_archive": "1"})
    assert resp.status_code == 303
    op = wait_done(client, int(resp.headers["Location"].rstrip("/").split("/")[-1]))
    assert (op["state"], op["done"], op["purge_mode"], op["rate"]) == ("done", 3, "archive", 250.0)
    archived = conn.execute("SELECT id, purged, purged_by FROM skiplock.jobs_archive WHERE id = ANY(%s) ORDER BY id",
                            (dead["card"],)).fetchall()
    assert archived == [(i, True, "operator") for i in sorted(dead["card"])]
    assert statuses(conn, dead["card"]) == {}


def test_the_api_purges_to_the_archive_with_to_archive(conn, dead, client_as):
    client = client_as("operator")
    preview = client.post("/api/v1/deadletters/preview", data={"csrf_token": CSRF, "action": "purge",
                                                              "queue": "billing"}).get_json()
    resp = client.post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "purge", "queue": "billing", "reason": "test run", "to_archive": "true",
        **preview["confirm"]})
    assert resp.status_code == 201 and resp.get_json()["purge_mode"] == "archive"
    wait_done(client, resp.get_json()["id"])
    assert conn.execute("SELECT count(*) FROM skiplock.jobs_archive WHERE purged").fetchone()[0] == 3


@pytest.mark.parametrize(("extra", "message"), [
    ({"rate": "0"}, "rate: rows per second must be greater than 0"),
    ({"rate": "-5"}, "rate: rows per second must be greater than 0"),
    ({"rate": "1e9"}, "at most 100,000"),
    ({"rate": "nan"}, "rate: rows per second must be greater than 0"),
    ({"rate": "fast"}, "rate: 'fast' is not a number"),
    ({"to_archive": "maybe"}, "to_archive: 'maybe' is not true or false"),
])
def test_a_bad_rate_or_archive_flag_is_refused_with_nothing_started(conn, dead, client_as, extra, message):
    client = client_as("operator")
    preview = client.post("/api/v1/deadletters/preview", data={"csrf_token": CSRF, "action": "purge",
                                                              "queue": "billing"}).get_json()
    resp = client.post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "purge", "queue": "billing", "reason": "test run", **preview["confirm"], **extra})
    assert resp.status_code == 400 and message in resp.get_json()["error"]
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0


def test_a_replay_cannot_go_to_the_archive(conn, dead, client_as):
    resp = client_as("operator").post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "replay", "queue": "billing", "reason": "test run", "to_archive": "1"})
    assert resp.status_code == 400 and "only a purge can go to the archive" in resp.get_json()["error"]


def cancelled_replay_of_mail(conn, client, monkeypatch) -> int:
    """A confirmed replay of the mail queue that nobody runs, then cancelled (so done = 0)."""
    monkeypatch.setattr(bulk, "run_in_thread", lambda *a, **k: None)
    fields = confirm_form(preview_html(client, "replay", queue="mail"))
    resp = client.post("/deadletters/operations", data={**fields, "reason": "SMTP fixed"})
    op_id = int(resp.headers["Location"].rstrip("/").split("/")[-1])
    assert client.post(f"/deadletters/operations/{op_id}/cancel", data={"csrf_token": CSRF}).status_code == 303
    monkeypatch.undo()
    return op_id


def test_resume_through_the_api_keeps_the_preview_bound(conn, dead, client_as, monkeypatch):
    client = client_as("operator")
    op_id = cancelled_replay_of_mail(conn, client, monkeypatch)
    late = one_more_dead_letter(conn)  # matches the selection, but was not previewed
    # as if its transaction had committed late: failed before the preview's time, id above its bound
    conn.execute("UPDATE skiplock.jobs SET finished_at = finished_at - interval '1 hour' WHERE id = %s", (late,))
    no_reason = client.post(f"/api/v1/deadletters/operations/{op_id}/resume", data={"csrf_token": CSRF})
    assert no_reason.status_code == 422 and "reason" in no_reason.get_json()["error"]
    assert client.get(f"/api/v1/deadletters/operations/{op_id}").get_json()["state"] == "cancelled"
    resp = client.post(f"/api/v1/deadletters/operations/{op_id}/resume",
                       data={"csrf_token": CSRF, "reason": "SMTP really fixed now"})
    assert resp.status_code == 200 and resp.get_json()["state"] in ("queued", "running", "done")
    op = wait_done(client, op_id)
    assert (op["state"], op["done"], op["total"]) == ("done", 6, 6)
    assert statuses(conn, dead["smtp"]) == {i: "pending" for i in dead["smtp"]}
    assert statuses(conn, [late]) == {late: "failed"}  # above the preview's max_id: untouched
    [row] = audit.search(conn, action="resume_operation")
    assert (row["actor"], row["reason"], row["target"]) == ("operator", "SMTP really fixed now", f"operation:{op_id}")
    again = client.post(f"/api/v1/deadletters/operations/{op_id}/resume", data={"csrf_token": CSRF, "reason": "test run"})
    assert again.status_code == 409 and "only a cancelled or failed one can be resumed" in again.get_json()["error"]
    missing = client.post("/api/v1/deadletters/operations/99999/resume", data={"csrf_token": CSRF, "reason": "test run"})
    assert missing.status_code == 404


def test_the_operation_page_offers_resume_to_operators_only(conn, dead, client_as, monkeypatch):
    client = client_as("operator")
    op_id = cancelled_replay_of_mail(conn, client, monkeypatch)
    page = client.get(f"/deadletters/operations/{op_id}").get_data(as_text=True)
    assert f'action="/deadletters/operations/{op_id}/resume"' in page and 'name="reason" required' in page
    assert "resume" not in client_as("viewer").get(f"/deadletters/operations/{op_id}").get_data(as_text=True).lower()
    resp = client.post(f"/deadletters/operations/{op_id}/resume", data={"csrf_token": CSRF, "reason": "go on"})
    assert resp.status_code == 303 and resp.headers["Location"].endswith(f"/deadletters/operations/{op_id}")
    assert wait_done(client, op_id)["state"] == "done"
    assert client_as("viewer").post(f"/deadletters/operations/{op_id}/resume",
                                    data={"csrf_token": CSRF, "reason": "test run"}).status_code == 403
