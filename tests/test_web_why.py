"""The why answer's faces (console/web/why.py): the job page, the queue page and the alert page
show it with its evidence and links, the fragment refreshes it, and the API returns the same
answer. The reasons themselves are tested in tests/test_why.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console import maintenance as m
from console import queue as q
from tests.alert_links_data import fire_default


def _live_worker(conn, queues=None):
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, kinds) "
                 "VALUES ('w-web', 'h', 1, %s, 2, '{noop}')", (queues,))


def test_the_job_page_answers_why_with_the_pause_its_author_and_reason(client_as, conn):
    _live_worker(conn)
    job = q.enqueue(conn, "noop", queue="mail")
    m.pause_queue(conn, "mail", actor="alice", reason="INC-7: relay down")
    html = client_as("viewer").get(f"/jobs/{job}").get_data(as_text=True)
    panel = html[html.index('id="why"'):]
    assert 'data-why-code="paused"' in panel
    assert "by alice" in panel and "INC-7: relay down" in panel
    assert 'href="/audit?action=pause"' in panel and 'href="/queues/mail"' in panel
    assert f'hx-get="/jobs/{job}/_why"' in panel
    assert html.index('id="why"') < html.index('id="job-actions"')  # the answer first


def test_the_fragment_and_the_api_give_the_same_answer(client_as, conn):
    _live_worker(conn)
    later = datetime.now(UTC) + timedelta(hours=1)
    job = q.enqueue(conn, "noop", queue="mail", run_at=later)
    client = client_as("viewer")
    fragment = client.get(f"/jobs/{job}/_why").get_data(as_text=True)
    assert fragment.lstrip().startswith("<section") and 'data-why-code="scheduled"' in fragment
    data = client.get(f"/api/v1/jobs/{job}/why").get_json()
    assert (data["subject"], data["state"], data["code"], data["blocked"], data["available"]) == (
        "job", "pending", "scheduled", True, True)
    assert data["verdict"] in fragment
    assert data["reasons"][0]["evidence"]["run_at"]
    assert client.get("/api/v1/jobs/987654321/why").status_code == 404
    assert client.get("/jobs/987654321/_why").status_code == 404


def test_the_queue_page_and_api_answer_for_the_queue(client_as, conn):
    q.enqueue(conn, "noop", queue="mail")  # no worker at all
    client = client_as("viewer")
    html = client.get("/queues/mail").get_data(as_text=True)
    assert 'data-why-code="no_worker"' in html and "Why isn't queue mail moving?" in html
    assert 'href="/workers"' in html[html.index('id="why"'):]
    data = client.get("/api/v1/queues/mail/why").get_json()
    assert (data["subject"], data["state"], data["code"]) == ("queue", "waiting", "no_worker")
    assert data["figures"]["eligible"] == 1 and data["job"]["kind"] == "noop"
    assert client.get("/api/v1/queues/nothing-here/why").get_json()["code"] == "empty"
    assert client.get("/queues/a%20b/_why").status_code == 200  # any name, encoded


def test_the_queue_age_alert_page_loads_the_answer_and_links_to_it(client_as, conn):
    q.enqueue(conn, "noop", queue="search")
    alert_id = fire_default(conn, "queue_age", {"queue": "search"}, 420)
    client = client_as("viewer")
    html = client.get(f"/alerts/{alert_id}").get_data(as_text=True)
    assert 'hx-get="/queues/search/_why"' in html
    assert 'href="/queues/search#why"' in html[html.index('id="look-here"'):]
    assert client.get(f"/api/v1/alerts/{alert_id}").get_json()["alert"]["why_queue"] == "search"
    dead = fire_default(conn, "dead_letter_growth", {"queue": "search"}, 500)
    assert "/_why" not in client.get(f"/alerts/{dead}").get_data(as_text=True)


def test_signed_out_visitors_get_no_answer(client_as, conn):
    job = q.enqueue(conn, "noop", queue="mail")
    anonymous = client_as(None)
    assert anonymous.get(f"/api/v1/jobs/{job}/why").status_code == 401
    assert anonymous.get("/api/v1/queues/mail/why").status_code == 401
    assert anonymous.get(f"/jobs/{job}/_why").status_code in (302, 401)


def test_a_viewer_sees_the_error_in_the_evidence_redacted(client_as, conn):
    q.enqueue(conn, "charge", {"customer": 7}, queue="billing", max_attempts=1)
    [job] = q.claim(conn, "w-1", queues=["billing"])
    q.fail(conn, job, ValueError("gateway refused token=SEKRET-42"))
    for client in (client_as("viewer"),):
        data = client.get(f"/api/v1/jobs/{job.id}/why").get_json()
        assert "SEKRET-42" not in str(data) and data["code"] == "finished"
        assert "SEKRET-42" not in client.get(f"/jobs/{job.id}/_why").get_data(as_text=True)
    operator = client_as("operator").get(f"/api/v1/jobs/{job.id}/why").get_json()
    assert "SEKRET-42" in operator["reasons"][0]["evidence"]["last_error"]
