"""The console's paper cuts of a first incident (issue 33 item 6), each fixed with a test that
failed before: search by payload value and in the archive, the jobs filter and the job page on
archived jobs, the limits form that keeps what was typed, placeholders that say something
true, purges that say where the jobs went, the operations list, an audit log a person can
read, and a favicon."""

from __future__ import annotations

import html as html_lib
import json
import re
from datetime import UTC, datetime, timedelta

from console import maintenance as m
from console import queue as q
from console.queue import limits
from tests.maintenance_data import add_completed, add_failed
from tests.web_fixtures import CSRF


def archive(conn, ids: list[int]) -> None:
    """Move completed jobs to the archive as the archiver does."""
    m.archive_completed(conn, older_than=timedelta(seconds=0), actor="scheduler")
    found = {r[0] for r in conn.execute("SELECT id FROM skiplock.jobs_archive")}
    assert set(ids) <= found


# --- search ------------------------------------------------------------------------------------

def test_search_finds_a_payload_value_in_the_jobs_and_the_archive(client_as, conn):
    live = q.enqueue(conn, "invoice", {"customer": {"id": 4411, "name": "acme"}}, queue="billing")
    old = add_completed(conn, 2, queue="billing", kind="invoice")
    conn.execute("UPDATE skiplock.jobs SET payload = '{\"customer\": {\"name\": \"acme\"}}' WHERE id = %s", (old[0],))
    archive(conn, old)
    client = client_as("operator")
    data = client.get("/api/v1/search", query_string={"q": "acme"}).get_json()
    found = {x["label"]: _args(x["filter_url"]) for x in data["matches"] if x["type"] == "payload"}
    payload = json.dumps({"customer": {"name": "acme"}}, separators=(",", ":"))
    assert found[f"job {live}"] == {"payload": payload}
    assert found[f"job {old[0]}"] == {"payload": payload, "archived": "1"}
    numeric = client.get("/api/v1/search", query_string={"q": "4411"}).get_json()
    assert [x["label"] for x in numeric["matches"] if x["type"] == "payload"] == [f"job {live}"]
    page = client.get("/search", query_string={"q": "acme"}).get_data(as_text=True)
    assert "Jobs whose payload holds it" in page and "all jobs with this value" in page
    # the filter it links to finds the archived one
    archived = client.get("/api/v1/jobs", query_string={"payload": payload, "archived": "1"}).get_json()
    assert [j["id"] for j in archived["jobs"]] == [old[0]]


def _args(url: str) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlsplit

    assert urlsplit(url).path == "/jobs"
    return dict(parse_qsl(urlsplit(url).query))


def test_a_viewer_cannot_find_a_redacted_value(client_as, conn):
    q.enqueue(conn, "login", {"password": "hunter2", "user": "bob"}, queue="auth")
    viewer = client_as("viewer")
    assert [x for x in viewer.get("/api/v1/search", query_string={"q": "hunter2"}).get_json()["matches"]
            if x["type"] == "payload"] == []
    assert [x["type"] for x in viewer.get("/api/v1/search", query_string={"q": "bob"}).get_json()["matches"]] == ["payload"]
    operator = client_as("operator")
    assert [x["type"] for x in operator.get("/api/v1/search", query_string={"q": "hunter2"}).get_json()["matches"]] == ["payload"]


def test_nothing_matches_offers_the_jobs_filter_and_the_archive(client_as, conn):
    page = client_as("viewer").get("/search", query_string={"q": "no-such-thing"}).get_data(as_text=True)
    assert 'id="nothing-matches"' in page
    assert 'href="/jobs" data-filter-link' in page and 'href="/jobs?archived=1"' in page


# --- the archive in the jobs filter and on the job page ----------------------------------------

def test_the_jobs_filter_reaches_archived_jobs_and_refuses_what_the_archive_cannot_hold(client_as, conn):
    ids = add_completed(conn, 3, queue="mail", kind="send")
    add_completed(conn, 2, queue="billing", kind="charge")
    archive(conn, ids)
    client = client_as("viewer")
    data = client.get("/api/v1/jobs", query_string={"archived": "1", "queue": "mail"}).get_json()
    assert sorted(j["id"] for j in data["jobs"]) == sorted(ids)
    assert data["count"]["n"] == 3
    page = client.get("/jobs", query_string={"archived": "1"}).get_data(as_text=True)
    assert "the archive, latest finished first" in page and 'name="archived" value="1" checked' in page
    refused = client.get("/api/v1/jobs", query_string={"archived": "1", "state": "pending"})
    assert refused.status_code == 400 and "archived" in refused.get_json()["error"]
    assert client.get("/api/v1/jobs", query_string={"archived": "1", "state": "completed"}).get_json()["count"]["n"] == 5


def test_an_archived_job_page_says_an_archived_job(client_as, conn):
    ids = add_completed(conn, 1)
    archive(conn, ids)
    page = client_as("operator").get(f"/jobs/{ids[0]}").get_data(as_text=True)
    assert "No action applies to an archived job" in page and "a archived" not in page


# --- forms -------------------------------------------------------------------------------------

def test_the_limits_form_requires_a_reason_and_keeps_what_was_typed(client_as, conn):
    q.enqueue(conn, "send", queue="mail")
    client = client_as("operator")
    page = client.get("/queues/mail").get_data(as_text=True)
    form = page[page.index('id="limits-form"'):page.index("</form>", page.index('id="limits-form"'))]
    assert re.search(r'<input name="reason" required', form)
    answer = client.post("/queues/mail/limits", data={"csrf_token": CSRF, "concurrency": "3", "rate": "20/m"})
    assert answer.status_code == 422
    body = answer.get_data(as_text=True)
    assert 'id="limits-error"' in body and "reason" in body
    assert 'value="3"' in body and 'value="20/m"' in body and 'id="why"' in body
    assert limits.limits_of(conn, "mail")["concurrency"] is None
    bad = client.post("/queues/mail/limits", data={"csrf_token": CSRF, "rate": "fast", "reason": "INC-3"})
    assert bad.status_code == 400 and 'value="fast"' in bad.get_data(as_text=True)
    ok = client.post("/queues/mail/limits", data={"csrf_token": CSRF, "concurrency": "3", "reason": "INC-3"})
    assert ok.status_code == 302 and limits.limits_of(conn, "mail")["concurrency"] == 3


def test_the_enqueue_forms_run_at_example_is_in_the_future(client_as, conn):
    q.enqueue(conn, "send", queue="mail")
    page = client_as("operator").get("/queues/mail").get_data(as_text=True)
    example = re.search(r'name="run_at"[^>]*placeholder="now, or ([0-9T:-]+)"', page).group(1)
    when = datetime.fromisoformat(example).replace(tzinfo=UTC)
    assert datetime.now(UTC) < when < datetime.now(UTC) + timedelta(hours=2)


# --- operations and the audit log --------------------------------------------------------------

def _purge_to_archive(conn, dsn, n=2):
    add_failed(conn, n, fingerprint="KeyError: <str>", queue="mail")
    return m.purge(dsn, {"fingerprint": "KeyError: <str>"}, actor="alice", reason="INC-4: junk", mode="archive")


def test_a_purge_to_the_archive_says_where_the_jobs_went(client_as, conn, dsn):
    op = _purge_to_archive(conn, dsn)
    page = client_as("viewer").get(f"/deadletters/operations/{op['id']}").get_data(as_text=True)
    assert "2 jobs purged to the archive" in page and 'href="/jobs?archived=1&amp;state=failed"' in page
    assert "fingerprint = &#39;KeyError: &lt;str&gt;&#39;" in page  # the selection, in words
    api = client_as("viewer").get(f"/api/v1/deadletters/operations/{op['id']}").get_json()
    assert (api["what"], api["outcome"].startswith("2 jobs purged to the archive")) == ("purge to the archive", True)


def test_the_operations_list_names_selection_progress_who_and_why(client_as, conn, dsn):
    op = _purge_to_archive(conn, dsn)
    ids = add_failed(conn, 1, queue="billing")
    m.replay(dsn, {"ids": ids}, actor="bob")
    page = client_as("viewer").get("/deadletters/operations").get_data(as_text=True)
    row = page[page.index(f'id="operation-{op["id"]}"'):]
    row = row[:row.index("</tr>")]
    assert "purge to the archive" in row and "KeyError: &lt;str&gt;" in row and "alice" in row and "INC-4: junk" in row
    assert "2 / 2" in row
    assert "id in (" in page and "bob" in page
    assert 'href="/deadletters/operations"' in client_as("viewer").get("/deadletters").get_data(as_text=True)


def test_the_audit_log_reads_as_text_and_links_its_targets(client_as, conn, dsn):
    op = _purge_to_archive(conn, dsn)
    page = client_as("viewer").get("/audit").get_data(as_text=True)
    assert "\\u003c" not in page and "\\u0027" not in page  # no JSON escapes
    assert "fingerprint KeyError: &lt;str&gt;" in page
    assert f'href="/deadletters/operations/{op["id"]}" data-target-link' in page
    entries = client_as("viewer").get("/api/v1/audit").get_json()["entries"]
    assert any(e["target_path"] == f"/deadletters/operations/{op['id']}" for e in entries)
    assert html_lib.unescape("KeyError: &lt;str&gt;") == "KeyError: <str>"


# --- the favicon -------------------------------------------------------------------------------

def test_every_page_links_a_favicon_that_is_served(client_as, conn):
    client = client_as("viewer")
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.mimetype == "image/svg+xml" and b"<svg" in icon.data
    page = client.get("/queues").get_data(as_text=True)
    assert re.search(r'<link rel="icon"[^>]*href="/static/favicon\.svg"', page)
    assert client_as(None).get("/favicon.ico").status_code == 200  # before sign-in too
