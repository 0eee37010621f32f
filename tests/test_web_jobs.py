"""The jobs browser, exports, job detail, redaction and single-job actions, end state in the DB."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.browse import JobFilter, count_jobs, list_jobs
from console.users import start_session
from tests.web_fixtures import CSRF


@pytest.fixture
def jobs(conn):
    """12 jobs: 5 pending in mail (one due later), 2 running, 3 failed (2 share an error), 2 completed."""
    ids: dict[str, list[int]] = {"pending": [], "running": [], "failed": [], "completed": []}
    for i in range(5):
        run_at = datetime.now(UTC) + timedelta(hours=1) if i == 4 else None
        ids["pending"].append(q.enqueue(conn, "send_mail", {"to": f"u{i}@example.com", "password": "hunter2", "n": i},
                                        queue="mail", run_at=run_at))
    for i in range(7):
        q.enqueue(conn, "charge", {"customer": i, "card": {"card_number": "4111"}}, queue="billing", max_attempts=1)
    claimed = q.claim(conn, "w1", queues=["billing"], limit=7, lease=60)
    for job in claimed[:3]:
        error = ValueError(f"card declined for customer {job.payload['customer']}") if job.payload["customer"] < 2 else KeyError("x")
        q.fail(conn, job, error)
        ids["failed"].append(job.id)
    for job in claimed[3:5]:
        q.complete(conn, job)
        ids["completed"].append(job.id)
    ids["running"] = [j.id for j in claimed[5:]]
    return ids


def test_filters_pick_the_right_jobs(conn, jobs):
    def ids(**args):
        return {r["id"] for r in list_jobs(conn, JobFilter.parse(args), limit=100).rows}

    assert ids(state="failed") == set(jobs["failed"])
    assert ids(state="pending", queue="mail") == set(jobs["pending"])
    assert ids(queue="billing") == set(jobs["failed"] + jobs["completed"] + jobs["running"])
    assert ids(kind="send_mail", state="running") == set()
    assert ids(payload='{"n": 3}') == {jobs["pending"][3]}
    assert ids(payload='{"card": {"card_number": "4111"}}') == set(jobs["failed"] + jobs["completed"] + jobs["running"])
    assert ids(id=str(jobs["running"][0])) == {jobs["running"][0]}
    fingerprint = conn.execute("SELECT error_fingerprint FROM skiplock.jobs WHERE id = %s", (jobs["failed"][0],)).fetchone()[0]
    assert ids(state="failed", fingerprint=fingerprint) == set(jobs["failed"][:2])
    assert ids(since="1h") == {j for group in jobs.values() for j in group}
    assert ids(until="1h") == set()
    assert ids(state="failed", since="1h") == set(jobs["failed"])


def test_keyset_pages_cover_every_job_once_in_each_order(conn, jobs):
    for state in (None, "pending", "running", "failed", "completed"):
        f = JobFilter.parse({"state": state or ""})
        seen, after = [], None
        for _ in range(100):  # a cursor that never ends fails the test instead of hanging it
            page = list_jobs(conn, f, after=after, limit=2)
            seen += [r["id"] for r in page.rows]
            if not page.next_cursor:
                break
            after = page.next_cursor
        else:
            pytest.fail("the pages never ended")
        expected = [j for group in jobs.values() for j in group] if state is None else jobs[state]
        assert sorted(seen) == sorted(expected), state
        assert len(seen) == len(set(seen)), state


def test_counts_are_capped_and_labelled(conn, jobs):
    capped = count_jobs(conn, JobFilter(), cap=5)
    assert (capped.n, capped.capped, capped.label()) == (5, True, "5+")
    exact = count_jobs(conn, JobFilter(state="failed"), cap=5)
    assert (exact.n, exact.capped, exact.label()) == (3, False, "3")


def test_filters_without_an_index_look_at_a_window_and_search_further(conn):
    """A kind that only the oldest job has: each page looks at `window` jobs, says so, and
    its cursor continues after them until the match is found."""
    rare = q.enqueue(conn, "rare", {})
    q.enqueue_many(conn, [{"kind": "common"} for _ in range(10)])
    f = JobFilter.parse({"kind": "rare"})
    first = list_jobs(conn, f, limit=2, window=4)
    assert first.rows == [] and first.searched == 4 and first.next_cursor
    pages, after, found = 0, None, []
    for _ in range(100):  # a cursor that never ends fails the test instead of hanging it
        page = list_jobs(conn, f, after=after, limit=2, window=4)
        found += [r["id"] for r in page.rows]
        pages += 1
        if not page.next_cursor:
            break
        after = page.next_cursor
    else:
        pytest.fail("the pages never ended")
    assert found == [rare] and pages == 3
    windowed = count_jobs(conn, f, cap=2, window=4)
    assert (windowed.n, windowed.capped) == (0, False) and windowed.window == 4  # window is raised to cap + 1 = 3 -> 4
    assert "looked at" in windowed.label()
    assert count_jobs(conn, f, cap=2, window=100).label() == "1"
    assert count_jobs(conn, JobFilter(), cap=5, window=3).label() == "5+"  # no row filter: no window


def test_export_walks_past_windows(conn):
    from contextlib import contextmanager

    from console.browse import export_jobs

    rare = q.enqueue(conn, "rare", {})
    q.enqueue_many(conn, [{"kind": "common"} for _ in range(10)])

    @contextmanager
    def factory():
        yield conn

    rows = list(export_jobs(factory, JobFilter(kind="rare"), limit=10, batch=2, window=3))
    assert [r["id"] for r in rows] == [rare]
    capped = list(export_jobs(factory, JobFilter(kind="rare"), limit=10, batch=2, window=3, max_scanned=3))
    assert capped == []


def test_time_range_on_all_states_uses_an_id_range(conn):
    """The since/until of completed/any jobs is turned into an id range by binary search."""
    for hours in (30, 20, 10, 5, 1):
        job_id = q.enqueue(conn, "old", {})
        conn.execute("UPDATE skiplock.jobs SET created_at = now() - make_interval(hours => %s) WHERE id = %s", (hours, job_id))
    got = [r["id"] for r in list_jobs(conn, JobFilter.parse({"since": "12h", "until": "2h"}), limit=50).rows]
    created = dict(conn.execute("SELECT id, round(extract(epoch FROM now() - created_at) / 3600) FROM skiplock.jobs").fetchall())
    assert sorted(created[i] for i in got) == [5, 10]


@pytest.mark.parametrize("args, message", [
    ({"state": "exploded"}, "state"),
    ({"id": "abc"}, "id"),
    ({"payload": "{not json"}, "payload: not valid JSON"),
    ({"payload": "[1, 2]"}, "JSON object"),
    ({"since": "yesterday-ish"}, "since"),
    ({"since": "1h", "until": "2h"}, "since must be before until"),
    ({"limit": "0"}, "limit"),
    ({"after": "garbage!!"}, "after"),
])
def test_bad_filters_get_400_with_a_message(client_as, jobs, args, message):
    client = client_as("viewer")
    page = client.get("/jobs", query_string=args)
    assert page.status_code == 400, page.data[:300]
    assert message.encode() in page.data
    api = client.get("/api/v1/jobs", query_string=args)
    assert api.status_code == 400 and message in api.get_json()["error"]


def test_jobs_page_and_api_show_the_filtered_set(client_as, jobs):
    client = client_as("viewer")
    page = client.get("/jobs?state=failed")
    assert page.status_code == 200
    assert b'hx-get="/jobs/_count?state=failed"' in page.data  # the count comes on its own
    count = client.get("/jobs/_count?state=failed")
    assert b"3 jobs match" in count.data and b"<html" not in count.data
    for job_id in jobs["failed"]:
        assert f'href="/jobs/{job_id}"'.encode() in page.data
    data = client.get("/api/v1/jobs?state=pending&queue=mail&limit=2").get_json()
    assert data["count"] == {"n": 5, "capped": False, "window": None, "label": "5"}
    assert len(data["jobs"]) == 2 and data["next"]
    second = client.get("/api/v1/jobs", query_string={"state": "pending", "queue": "mail", "limit": 2, "after": data["next"]}).get_json()
    assert not {j["id"] for j in data["jobs"]} & {j["id"] for j in second["jobs"]}


def test_viewers_see_redacted_payloads_and_operators_full(client_as, jobs):
    job_id = jobs["pending"][0]
    viewer = client_as("viewer").get(f"/api/v1/jobs/{job_id}").get_json()
    assert viewer["job"]["payload"]["password"] == "[redacted]" and viewer["redacted"] is True
    assert viewer["job"]["payload"]["to"] == "u0@example.com"
    operator = client_as("operator").get(f"/api/v1/jobs/{job_id}").get_json()
    assert operator["job"]["payload"]["password"] == "hunter2"
    html = client_as("viewer").get(f"/jobs/{job_id}").data
    assert b"hunter2" not in html and b"[redacted]" in html
    listing = client_as("viewer").get("/jobs?queue=billing").data
    assert b"4111" not in listing
    # Viewers cannot probe redacted values with a containment filter.
    probe = client_as("viewer").get("/api/v1/jobs", query_string={"payload": '{"password": "hunter2"}'})
    assert probe.status_code == 403 and "redacted" in probe.get_json()["error"]
    assert client_as("operator").get("/api/v1/jobs", query_string={"payload": '{"password": "hunter2"}'}).get_json()["count"]["n"] == 5


def test_redaction_hook_runs_for_everyone(web_settings, dsn, conn, personas, jobs):
    from console.web import create_app

    app = create_app({**web_settings, "web.redact_hook": "tests.test_web_jobs:mask_emails"})
    try:
        client = app.test_client()
        with client.session_transaction() as session:
            session["sid"] = start_session(conn, "operator")
            session["csrf"] = CSRF
        payload = client.get(f"/api/v1/jobs/{jobs['pending'][0]}").get_json()["job"]["payload"]
        assert payload["to"] == "***@example.com" and payload["password"] == "hunter2"
    finally:
        app.extensions["skiplock"].close()


def mask_emails(payload, user):
    if isinstance(payload, dict) and "to" in payload:
        return {**payload, "to": "***@" + payload["to"].split("@")[1]}
    return payload


def test_export_csv_and_json_of_the_filtered_set(client_as, jobs):
    client = client_as("viewer")
    response = client.get("/jobs/export.csv?queue=mail")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert sorted(int(r["id"]) for r in rows) == sorted(jobs["pending"])
    assert all("hunter2" not in r["payload"] for r in rows)
    data = json.loads(client.get("/api/v1/jobs/export.json?state=failed").get_data(as_text=True))
    assert sorted(r["id"] for r in data) == sorted(jobs["failed"])
    limited = json.loads(client.get("/jobs/export.json?limit=2").get_data(as_text=True))
    assert len(limited) == 2
    assert client.get("/jobs/export.xml").status_code == 400
    assert client.get("/jobs/export.csv?limit=-1").status_code == 400


def test_job_detail_shows_timeline_errors_and_allowed_actions(client_as, jobs):
    failed = jobs["failed"][0]
    page = client_as("operator").get(f"/jobs/{failed}")
    assert page.status_code == 200
    assert b"card declined for customer" in page.data and b"ValueError" in page.data
    assert b"dead letter" in page.data
    assert f'action="/jobs/{failed}/replay"'.encode() in page.data
    assert f'action="/jobs/{failed}/purge"'.encode() in page.data
    viewer = client_as("viewer").get(f"/jobs/{failed}")
    assert b'action="/jobs/' not in viewer.data
    assert client_as("viewer").get("/jobs/999999").status_code == 404


def test_operator_replays_and_purges_a_dead_letter(client_as, jobs, conn):
    client = client_as("operator")
    replayed, purged = jobs["failed"][0], jobs["failed"][1]
    response = client.post(f"/jobs/{replayed}/replay", data={"csrf_token": CSRF, "reason": "card service fixed"})
    assert response.status_code == 302
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (replayed,)).fetchone()[0] == "pending"
    # Replaying again: the job is no longer a dead letter.
    again = client.post(f"/api/v1/jobs/{replayed}/replay", headers={"X-CSRF-Token": CSRF})
    assert again.status_code == 409 and "pending" in again.get_json()["error"]
    assert client.post(f"/jobs/{purged}/purge", data={"csrf_token": CSRF, "reason": "junk"}).status_code == 302
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (purged,)).fetchone()[0] == 0
    audit = conn.execute("SELECT actor, action, reason, rows FROM skiplock.audit_log WHERE action IN ('replay', 'purge') ORDER BY id").fetchall()
    assert ("operator", "replay", "card service fixed", 1) in audit
    assert any(a[0] == "operator" and a[1] == "purge" for a in audit)
    timeline = client.get(f"/api/v1/jobs/{replayed}").get_json()["timeline"]
    assert any(e["event"] == "replay" for e in timeline)


def test_cancel_and_run_now_on_pending_jobs(client_as, jobs, conn):
    client = client_as("operator")
    later = jobs["pending"][4]
    assert client.post(f"/api/v1/jobs/{later}/run_now", headers={"X-CSRF-Token": CSRF}).status_code == 200
    assert conn.execute("SELECT run_at <= now() FROM skiplock.jobs WHERE id = %s", (later,)).fetchone()[0]
    assert client.post(f"/api/v1/jobs/{later}/run_now", headers={"X-CSRF-Token": CSRF}).status_code == 409
    cancel = client.post(f"/api/v1/jobs/{later}/cancel", data={"reason": "duplicate"}, headers={"X-CSRF-Token": CSRF})
    assert cancel.status_code == 200
    row = conn.execute("SELECT status, last_error FROM skiplock.jobs WHERE id = %s", (later,)).fetchone()
    assert row == ("failed", "cancelled by operator: duplicate")
    assert client.post(f"/api/v1/jobs/{jobs['running'][0]}/cancel", headers={"X-CSRF-Token": CSRF}).status_code == 409
    assert client.post(f"/api/v1/jobs/{later}/explode", headers={"X-CSRF-Token": CSRF}).status_code == 404


def test_viewers_and_forged_posts_cannot_act(client_as, jobs, conn):
    failed = jobs["failed"][0]
    assert client_as("viewer").post(f"/jobs/{failed}/purge", data={"csrf_token": CSRF}).status_code == 403
    assert client_as("operator").post(f"/jobs/{failed}/purge").status_code == 403  # no CSRF token
    assert client_as(None).post(f"/jobs/{failed}/purge", data={"csrf_token": CSRF}).status_code == 401
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (failed,)).fetchone()[0] == "failed"


def test_api_token_acts_without_csrf(web_app, personas, jobs, conn):
    from console.users import create_token

    token = create_token(conn, "operator", "script")
    failed = jobs["failed"][2]
    response = web_app.test_client().post(f"/api/v1/jobs/{failed}/replay", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.data
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (failed,)).fetchone()[0] == "pending"
    viewer_token = create_token(conn, "viewer", "script")
    refused = web_app.test_client().post(f"/api/v1/jobs/{jobs['failed'][0]}/purge", headers={"Authorization": f"Bearer {viewer_token}"})
    assert refused.status_code == 403
