"""Enqueue and act from the console: POST /api/v1/jobs, the queue page's form, retry now,
cancel, and "cancel requested" observed by a handler in a real worker process; each audited,
end state checked in the database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from console import audit
from console import queue as q
from tests.web_fixtures import CSRF
from tests.workers import EXECUTIONS_TABLE, WorkerProcs, wait_for

H = {"X-CSRF-Token": CSRF}


def job_row(conn, job_id):
    return conn.execute("SELECT queue, kind, payload, priority, run_at, idempotency_key, max_attempts, status "
                        "FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()


# --- POST /api/v1/jobs ------------------------------------------------------------------------

def test_api_enqueue_creates_the_job_and_audits_the_reason(client_as, conn):
    client = client_as("operator")
    run_at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    answer = client.post("/api/v1/jobs", headers=H, json={
        "kind": "send_mail", "queue": "mail", "payload": {"to": "a@example.com"}, "priority": 5,
        "run_at": run_at.isoformat(), "idempotency_key": "mail-1", "max_attempts": 3, "reason": "customer asked again"})
    assert answer.status_code == 201, answer.get_json()
    body = answer.get_json()
    assert body["created"] is True and body["queue"] == "mail" and body["kind"] == "send_mail"
    assert job_row(conn, body["id"]) == ("mail", "send_mail", {"to": "a@example.com"}, 5, run_at, "mail-1", 3, "pending")
    [row] = audit.search(conn, action="enqueue")
    assert (row["actor"], row["target"], row["reason"], row["rows"]) == ("operator", f"job:{body['id']}", "customer asked again", 1)
    assert row["detail"]["kind"] == "send_mail" and row["detail"]["created"] is True

    again = client.post("/api/v1/jobs", headers=H, json={"kind": "send_mail", "idempotency_key": "mail-1", "reason": "twice"})
    assert again.status_code == 201
    assert again.get_json() == {"id": body["id"], "created": False, "queue": "default", "kind": "send_mail"}
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1
    assert [r["rows"] for r in audit.search(conn, action="enqueue")] == [0, 1]  # newest first


def test_api_enqueue_defaults_and_uniqueness_window(client_as, conn):
    client = client_as("operator")
    answer = client.post("/api/v1/jobs", headers=H, json={"kind": "noop", "reason": "test", "idempotency_key": "k",
                                                          "unique_for": 600})
    assert answer.status_code == 201
    job_id = answer.get_json()["id"]
    queue, _, payload, priority, _, _, max_attempts, _ = job_row(conn, job_id)
    assert (queue, payload, priority, max_attempts) == ("default", {}, 0, 5)
    conn.execute("DELETE FROM skiplock.jobs")  # gone from the hot table: only the window answers
    again = client.post("/api/v1/jobs", headers=H, json={"kind": "noop", "reason": "test", "idempotency_key": "k",
                                                         "unique_for": 600})
    assert again.get_json()["id"] == job_id and again.get_json()["created"] is False


@pytest.mark.parametrize(("body", "field"), [
    ({"reason": "test run"}, "kind"),
    ({"kind": "", "reason": "test run"}, "kind"),
    ({"kind": 7, "reason": "test run"}, "kind"),
    ({"kind": "k"}, "reason"),
    ({"kind": "k", "reason": "test run", "priority": 40000}, "priority"),
    ({"kind": "k", "reason": "test run", "priority": "high"}, "priority"),
    ({"kind": "k", "reason": "test run", "priority": True}, "priority"),
    ({"kind": "k", "reason": "test run", "max_attempts": 0}, "max_attempts"),
    ({"kind": "k", "reason": "test run", "run_at": "tomorrow"}, "run_at"),
    ({"kind": "k", "reason": "test run", "run_at": 12}, "run_at"),
    ({"kind": "k", "reason": "test run", "queue": "q" * 201}, "queue"),
    ({"kind": "k", "reason": "test run", "unique_for": 60}, "idempotency_key"),
    ({"kind": "k", "reason": "test run", "unique_for": 0, "idempotency_key": "x"}, "unique_for"),
    ({"kind": "k", "reason": "test run", "colour": "red"}, "colour"),
])
def test_api_enqueue_refuses_bad_fields_naming_the_field(client_as, conn, body, field):
    answer = client_as("operator").post("/api/v1/jobs", headers=H, json=body)
    assert answer.status_code == 400
    assert answer.get_json()["error"].startswith(f"{field}:"), answer.get_json()
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    assert audit.search(conn, action="enqueue") == []


def test_api_enqueue_refuses_a_body_that_is_not_a_json_object(client_as):
    client = client_as("operator")
    assert client.post("/api/v1/jobs", headers=H, json=[1, 2]).status_code == 400
    assert client.post("/api/v1/jobs", headers=H, data={"kind": "k", "reason": "test run"}).status_code == 400


def test_api_enqueue_needs_an_operator_and_a_csrf_token(client_as, conn):
    body = {"kind": "k", "reason": "test run"}
    assert client_as("viewer").post("/api/v1/jobs", headers=H, json=body).status_code == 403
    assert client_as(None).post("/api/v1/jobs", headers=H, json=body).status_code in (401, 403)
    assert client_as("operator").post("/api/v1/jobs", json=body).status_code == 403  # no CSRF token
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0


# --- the queue page's form --------------------------------------------------------------------

def test_queue_page_form_enqueues_with_csrf_and_audits(client_as, conn):
    q.enqueue(conn, "noop", {}, queue="mail")
    client = client_as("operator")
    page = client.get("/queues/mail").get_data(as_text=True)
    assert 'action="/queues/mail/enqueue"' in page and "data-json-editor" in page
    assert re.search(r'<script src="[^"]*/static/enqueue\.js"', page)
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)  # no inline script (CSP: script-src 'self')
    assert "Enqueue a job" not in client_as("viewer").get("/queues/mail").get_data(as_text=True)

    form = {"csrf_token": CSRF, "kind": "send_mail", "payload": '{"to": "b@example.com"}', "priority": "2",
            "run_at": "", "idempotency_key": "", "max_attempts": "", "unique_for": "", "reason": "resend"}
    answer = client.post("/queues/mail/enqueue", data=form)
    assert answer.status_code == 303
    job_id = int(answer.headers["Location"].rsplit("/", 1)[1])
    assert job_row(conn, job_id)[:4] == ("mail", "send_mail", {"to": "b@example.com"}, 2)
    [row] = audit.search(conn, action="enqueue")
    assert (row["actor"], row["reason"], row["target"]) == ("operator", "resend", f"job:{job_id}")

    assert client.post("/queues/mail/enqueue", data={**form, "csrf_token": "wrong"}).status_code == 403
    assert client_as("viewer").post("/queues/mail/enqueue", data=form).status_code == 403


def test_queue_page_form_shows_a_bad_payload_with_what_was_typed(client_as, conn):
    q.enqueue(conn, "noop", {}, queue="mail")
    answer = client_as("operator").post("/queues/mail/enqueue", data={
        "csrf_token": CSRF, "kind": "send_mail", "payload": '{"to": ', "reason": "resend"})
    assert answer.status_code == 400
    html = answer.get_data(as_text=True)
    assert "payload: not valid JSON" in html
    assert 'value="send_mail"' in html and "{&#34;to&#34;: </textarea>" in html
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'send_mail'").fetchone()[0] == 0


# --- retry now, cancel ------------------------------------------------------------------------

def test_retry_now_makes_a_retrying_job_eligible_and_is_audited(client_as, conn):
    job_id = q.enqueue(conn, "flaky", {}, max_attempts=3)
    [job] = q.claim(conn, "w1")
    assert q.fail(conn, job, RuntimeError("boom"), backoff_base=3600, backoff_cap=3600) == "pending"
    assert conn.execute("SELECT run_at > now() + interval '10 minutes' FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]
    client = client_as("operator")
    assert "run_now" in client.get(f"/api/v1/jobs/{job_id}").get_json()["allowed"]

    answer = client.post(f"/jobs/{job_id}/run_now", data={"csrf_token": CSRF, "reason": "fixed upstream"})

    assert answer.status_code == 302
    assert [j.id for j in q.claim(conn, "w2")] == [job_id]  # eligible now
    [row] = audit.search(conn, action="run_now")
    assert (row["actor"], row["reason"], row["target"]) == ("operator", "fixed upstream", f"job:{job_id}")


def test_cancel_of_a_scheduled_job_makes_a_replayable_dead_letter_and_is_audited(client_as, conn):
    job_id = q.enqueue(conn, "report", {}, run_at=datetime.now(UTC) + timedelta(days=1))
    answer = client_as("operator").post(f"/api/v1/jobs/{job_id}/cancel", headers=H, data={"reason": "not needed"})
    assert answer.status_code == 200
    status, fingerprint, errors = conn.execute(
        "SELECT status, error_fingerprint, errors FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()
    assert (status, fingerprint, errors[-1]["error_class"]) == ("failed", "Cancelled", "Cancelled")
    assert audit.search(conn, action="cancel")[0]["reason"] == "not needed"
    assert "replay" in client_as("operator").get(f"/api/v1/jobs/{job_id}").get_json()["allowed"]


def test_request_cancel_applies_only_to_running_jobs(client_as, conn):
    job_id = q.enqueue(conn, "report", {})
    client = client_as("operator")
    answer = client.post(f"/api/v1/jobs/{job_id}/request_cancel", headers=H)
    assert answer.status_code == 409 and "running" in answer.get_json()["error"]
    assert client_as("viewer").post(f"/api/v1/jobs/{job_id}/request_cancel", headers=H).status_code == 403
    assert audit.search(conn, action="request_cancel") == []


# --- cancel requested, observed by a real worker ----------------------------------------------

@pytest.fixture
def workers(subprocess_env, conn):
    conn.execute(EXECUTIONS_TABLE)
    procs = WorkerProcs(subprocess_env)
    yield procs
    procs.stop_all()


def test_a_running_handler_observes_the_cancel_request_and_the_job_ends_cancelled(client_as, conn, workers):
    job_id = q.enqueue(conn, "cancellable", {"timeout": 60}, max_attempts=5)
    proc = workers.start("--lease", "1.5")  # heartbeat every 0.5 s
    wait_for(lambda: conn.execute("SELECT count(*) FROM public.executions").fetchone()[0], timeout=30,
             what="the worker to start the job")
    client = client_as("operator")
    assert "request_cancel" in client.get(f"/api/v1/jobs/{job_id}").get_json()["allowed"]

    answer = client.post(f"/jobs/{job_id}/request_cancel", data={"csrf_token": CSRF, "reason": "runaway export"})
    assert answer.status_code == 302

    detail = client.get(f"/api/v1/jobs/{job_id}").get_json()
    if detail["job"]["status"] == "running":
        assert detail["cancel_requested"] is True and "request_cancel" not in detail["allowed"]
        assert 'id="cancel-requested"' in client.get(f"/jobs/{job_id}").get_data(as_text=True)
    wait_for(lambda: q.get_job(conn, job_id)["status"] == "failed", timeout=20, what="the handler to stop")
    job = q.get_job(conn, job_id)
    assert job["attempts"] == 1 and job["errors"][-1]["error_class"] == "Cancelled"  # not retried
    assert job["last_error"].startswith("Cancelled: job")
    assert conn.execute("SELECT count(*) FROM public.executions").fetchone()[0] == 1
    [row] = audit.search(conn, action="request_cancel")
    assert (row["actor"], row["reason"], row["target"]) == ("operator", "runaway export", f"job:{job_id}")
    assert row["detail"]["attempt"] == 1
    assert workers.stop(proc)[0] == 0


def test_an_old_cancel_request_does_not_cancel_a_later_claim(conn):
    job_id = q.enqueue(conn, "cancellable", {})
    [job] = q.claim(conn, "w1", lease=60)
    assert q.request_cancel(conn, job_id) is not None
    assert q.heartbeat(conn, job) and job.cancel_requested()
    q.release(conn, [job])  # the run ends another way (worker shutdown)
    [again] = q.claim(conn, "w2", lease=60)
    assert q.heartbeat(conn, again) and not again.cancel_requested()


def test_a_handler_that_fails_after_a_cancel_request_is_not_retried(conn, workers):
    job_id = q.enqueue(conn, "cancellable", {"timeout": 60, "crash_on_cancel": True}, max_attempts=5)
    proc = workers.start("--lease", "1.5")
    wait_for(lambda: conn.execute("SELECT count(*) FROM public.executions").fetchone()[0], timeout=30,
             what="the worker to start the job")
    assert q.request_cancel(conn, job_id) is not None
    wait_for(lambda: q.get_job(conn, job_id)["status"] == "failed", timeout=20, what="the handler to stop")
    job = q.get_job(conn, job_id)
    assert job["attempts"] == 1 and job["errors"][-1]["error_class"] == "RuntimeError"
    assert workers.stop(proc)[0] == 0


# --- the JSON editor in a real browser --------------------------------------------------------

def test_the_form_refuses_invalid_json_in_the_browser_then_enqueues(page, live_server, personas, conn):
    from tests.test_web_browser import sign_in

    q.enqueue(conn, "noop", {}, queue="mail")
    page.goto(live_server + "/queues/mail")
    sign_in(page, live_server, "operator", "/queues/mail")
    page.fill("#enqueue input[name=kind]", "send_mail")
    page.fill("#enqueue input[name=reason]", "browser test")
    page.fill("#enqueue textarea[name=payload]", '{"to": ')
    page.locator("[data-json-status]", has_text="not valid JSON").wait_for(timeout=5000)
    page.click("#enqueue button[type=submit]")
    page.wait_for_timeout(300)
    assert page.url.endswith("/queues/mail")  # the browser did not send it
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'send_mail'").fetchone()[0] == 0

    page.fill("#enqueue textarea[name=payload]", '{"to": "c@example.com"}')
    page.locator("[data-json-status]", has_text="Valid JSON.").wait_for(timeout=5000)
    page.click("#enqueue button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/\d+$"), timeout=10000)
    job_id = int(page.url.rsplit("/", 1)[1])
    assert job_row(conn, job_id)[:3] == ("mail", "send_mail", {"to": "c@example.com"})
    assert audit.search(conn, action="enqueue")[0]["reason"] == "browser test"
