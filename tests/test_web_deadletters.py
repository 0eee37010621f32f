"""Dead letters pages: groups, lists, preview, bulk replay/purge in a background thread,
progress with 286, cancel, single-job actions; personas, CSRF, bad input; end state in the DB."""

from __future__ import annotations

import html as html_lib
import json
import re
import time

import pytest

from console import audit
from console import queue as q
from tests.oncall_data import make_dead_letters, wait_audited
from tests.web_fixtures import CSRF


@pytest.fixture
def dead(conn):
    return make_dead_letters(conn)


def fingerprint_of(conn, job_id: int) -> str:
    return conn.execute("SELECT error_fingerprint FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]


def statuses(conn, ids) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM skiplock.jobs WHERE id = ANY(%s)", (list(ids),)).fetchall())


def confirm_form(html: str) -> dict[str, str]:
    """The hidden fields of the confirm form (the preview it carries back to the start)."""
    form = html.split('action="/deadletters/operations"')[1].split("</form>")[0]
    return {name: html_lib.unescape(value)
            for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)}


def one_more_dead_letter(conn, queue: str = "mail") -> int:
    """A job of `queue` fails for good now (between a preview and its confirmation)."""
    q.enqueue(conn, "send_mail", {"to": "late@example.com"}, queue=queue, max_attempts=1)
    [job] = q.claim(conn, "w-late", queues=[queue], limit=1, lease=60)
    q.fail(conn, job, TimeoutError("SMTP server smtp.example.com timed out after 30 s"))
    return job.id


def wait_done(client, op_id: int, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        op = client.get(f"/api/v1/deadletters/operations/{op_id}").get_json()
        if not op["active"]:
            return op
        time.sleep(0.1)
    raise AssertionError(f"operation {op_id} still running after {timeout} s")


def test_groups_by_fingerprint_with_counts_and_kinds(conn, dead, client_as):
    data = client_as("viewer").get("/api/v1/deadletters").get_json()
    groups = {g["kinds"][0]: g for g in data["groups"]}
    assert groups["send_mail"]["count"] == 6 and groups["send_mail"]["queues"] == ["mail"]
    assert groups["charge_card"]["count"] == 3
    assert data["groups"][0]["kinds"] == ["send_mail"]  # largest first
    html = client_as("viewer").get("/deadletters").get_data(as_text=True)
    assert "SMTP server smtp.example.com timed out" in html


def test_viewer_sees_no_action_buttons_operator_does(conn, dead, client_as):
    fp = fingerprint_of(conn, dead["smtp"][0])
    for url in ("/deadletters", f"/deadletters/jobs?fingerprint={fp}"):
        viewer = client_as("viewer").get(url).get_data(as_text=True)
        operator = client_as("operator").get(url).get_data(as_text=True)
        for marker in ('name="action"', "formaction=", 'name="ids"', "/deadletters/preview"):
            assert marker not in viewer, (url, marker)
        assert 'name="action" value="replay"' in operator and 'name="action" value="purge"' in operator, url


def test_empty_state_says_so_plainly(client_as):
    html = client_as("viewer").get("/deadletters").get_data(as_text=True)
    assert "No dead letters" in html


def test_jobs_list_filters_and_counts(conn, dead, client_as):
    fp = fingerprint_of(conn, dead["card"][0])
    data = client_as("viewer").get(f"/api/v1/deadletters/jobs?fingerprint={fp}").get_json()
    assert {j["id"] for j in data["jobs"]} == set(dead["card"])
    assert data["total"] == 3 and "payload" not in data["jobs"][0]
    data = client_as("viewer").get("/api/v1/deadletters/jobs?queue=mail").get_json()
    assert data["total"] == 6
    everything = client_as("viewer").get("/api/v1/deadletters/jobs").get_json()
    assert everything["total"] == 9


def test_bad_input_is_400_with_a_message(conn, dead, client_as):
    viewer = client_as("viewer")
    assert viewer.get("/deadletters/jobs?failed_since=yesterday").status_code == 400
    assert viewer.get("/deadletters/jobs?before=garbage").status_code == 400
    assert viewer.get("/api/v1/deadletters/jobs?payload=%7Bnot").status_code == 400
    op = client_as("operator")
    post = lambda url, **data: op.post(url, data={"csrf_token": CSRF, **data})  # noqa: E731
    r = post("/deadletters/preview", action="explode", fingerprint="x")
    assert r.status_code == 400 and "action" in r.get_data(as_text=True)
    r = post("/deadletters/preview", action="replay")
    assert r.status_code == 400 and "nothing selected" in r.get_data(as_text=True)
    r = post("/deadletters/preview", action="replay", ids="abc")
    assert r.status_code == 400
    r = post("/deadletters/preview", action="replay", selection='{"colour": "red"}')
    assert r.status_code == 400 and "unknown filter" in r.get_data(as_text=True)
    r = post("/deadletters/operations", action="replay", selection='{"queue": "mail"}')
    assert r.status_code == 422 and "reason" in r.get_data(as_text=True)  # console.actions: replay_many
    r = post("/deadletters/operations", action="replay", selection='{"queue": "nope"}', reason="test run")
    assert r.status_code == 400 and "nothing to replay" in r.get_data(as_text=True)
    assert op.get("/deadletters/operations/999999").status_code == 404
    assert post("/deadletters/operations/999999/cancel").status_code == 404
    assert post(f"/deadletters/jobs/{dead['smtp'][0]}/explode").status_code == 404


def test_roles_and_csrf_on_every_action(conn, dead, client_as):
    job = dead["smtp"][0]
    actions = [
        ("/deadletters/preview", {"action": "replay", "ids": str(job)}),
        ("/deadletters/operations", {"action": "replay", "ids": str(job), "reason": "test run"}),
        (f"/deadletters/jobs/{job}/replay", {}),
        ("/api/v1/deadletters/preview", {"action": "replay", "ids": str(job)}),
    ]
    for url, data in actions:
        assert client_as(None).post(url, data={"csrf_token": CSRF, **data}).status_code in (401, 302), url
        assert client_as("viewer").post(url, data={"csrf_token": CSRF, **data}).status_code == 403, url
        # an operator without the CSRF token (a forged cross-site POST) is refused too
        forged = client_as("operator").post(url, data=data)
        assert forged.status_code == 403 and "CSRF" in forged.get_data(as_text=True), url
    assert statuses(conn, [job]) == {job: "failed"}
    assert client_as("viewer").get("/deadletters/operations/1").status_code == 404


def test_preview_then_replay_a_group_in_the_background(conn, dead, client_as):
    client = client_as("operator")
    fp = fingerprint_of(conn, dead["smtp"][0])
    html = client.post("/deadletters/preview", data={"csrf_token": CSRF, "action": "replay", "fingerprint": fp}).get_data(as_text=True)
    assert 'data-total="6"' in html and "Replay exactly 6 jobs?" in html
    fields = confirm_form(html)
    assert json.loads(fields["selection"]) == {"fingerprint": fp}
    assert fields["expected"] == "6" and fields["max_id"] == str(max(dead["smtp"]))
    assert fields["previewed_at"] and len(fields["selection_hash"]) == 64  # the form carries the preview
    resp = client.post("/deadletters/operations", data={**fields, "reason": "SMTP password fixed"})
    assert resp.status_code == 303
    op_id = int(resp.headers["Location"].rstrip("/").split("/")[-1])
    op = wait_done(client, op_id)
    assert (op["state"], op["done"], op["total"]) == ("done", 6, 6)
    assert statuses(conn, dead["smtp"]) == {i: "pending" for i in dead["smtp"]}
    assert statuses(conn, dead["card"]) == {i: "failed" for i in dead["card"]}
    rows = wait_audited(conn, "replay")
    assert {(r["outcome"], r["rows"], r["reason"], r["actor"]) for r in rows} == {
        ("started", 6, "SMTP password fixed", "operator"), ("ok", 6, "SMTP password fixed", "operator")}
    # the finished operation's fragment stops the polling with 286 and has no poll trigger
    frag = client.get(f"/deadletters/operations/{op_id}/_progress")
    assert frag.status_code == 286
    assert "hx-trigger" not in frag.get_data(as_text=True) and "they are pending again" in frag.get_data(as_text=True)


def test_a_dead_letter_arriving_after_the_preview_refuses_the_start_until_previewed_again(conn, dead, client_as):
    client = client_as("operator")
    html = client.post("/deadletters/preview", data={"csrf_token": CSRF, "action": "purge", "queue": "mail"}).get_data(as_text=True)
    fields = confirm_form(html)
    late = one_more_dead_letter(conn)
    resp = client.post("/deadletters/operations", data={**fields, "reason": "test data"})
    assert resp.status_code == 409
    assert "the selection now matches 7 jobs, you previewed 6: preview again" in resp.get_data(as_text=True)
    assert statuses(conn, [*dead["smtp"], late]) == {i: "failed" for i in [*dead["smtp"], late]}
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0
    # previewed again, the start goes through and purges exactly the 7 jobs now shown
    html = client.post("/deadletters/preview", data={"csrf_token": CSRF, "action": "purge", "queue": "mail"}).get_data(as_text=True)
    resp = client.post("/deadletters/operations", data={**confirm_form(html), "reason": "test data"})
    assert resp.status_code == 303
    op = wait_done(client, int(resp.headers["Location"].rstrip("/").split("/")[-1]))
    assert (op["state"], op["done"]) == ("done", 7)
    assert statuses(conn, [*dead["smtp"], late, *dead["card"]]) == {i: "failed" for i in dead["card"]}


def test_the_api_refuses_a_purge_without_its_preview_or_with_another_count(conn, dead, client_as):
    client = client_as("operator")
    post = lambda **data: client.post("/api/v1/deadletters/operations", data={"csrf_token": CSRF, **data})  # noqa: E731
    refused = post(action="purge", selection='{"all": true}', reason="clean up")
    assert refused.status_code == 400
    assert "missing expected, max_id, previewed_at, selection_hash" in refused.get_json()["error"]
    partial = post(action="purge", selection='{"all": true}', reason="clean up", expected="9")
    assert partial.status_code == 400 and "missing max_id, previewed_at, selection_hash" in partial.get_json()["error"]
    preview = client.post("/api/v1/deadletters/preview", data={"csrf_token": CSRF, "action": "purge",
                                                              "selection": '{"all": true}'}).get_json()
    confirm = preview["confirm"]
    assert confirm["expected"] == 9 and confirm["max_id"] == max(dead["smtp"] + dead["card"])
    wrong = post(action="purge", selection='{"all": true}', reason="clean up", **{**confirm, "expected": "8"})
    assert wrong.status_code == 409 and "now matches 9 jobs, you previewed 8: preview again" in wrong.get_json()["error"]
    other = post(action="purge", selection='{"queue": "mail"}', reason="clean up", **confirm)
    assert other.status_code == 409 and "not the one that was previewed" in other.get_json()["error"]
    one_more_dead_letter(conn, "billing")
    late = post(action="purge", selection='{"all": true}', reason="clean up", **confirm)
    assert late.status_code == 409 and "now matches 10 jobs, you previewed 9" in late.get_json()["error"]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0] == 10
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0


def test_a_replay_confirmed_through_the_api_touches_exactly_the_previewed_jobs(conn, dead, client_as):
    client = client_as("operator")
    preview = client.post("/api/v1/deadletters/preview", data={"csrf_token": CSRF, "action": "replay",
                                                              "queue": "billing"}).get_json()
    resp = client.post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "replay", "queue": "billing", "reason": "card gateway back", **preview["confirm"]})
    assert resp.status_code == 201 and resp.get_json()["max_id"] == max(dead["card"])
    op = wait_done(client, resp.get_json()["id"])
    assert (op["state"], op["done"], op["previewed_total"]) == ("done", 3, 3)
    assert statuses(conn, dead["card"]) == {i: "pending" for i in dead["card"]}
    assert statuses(conn, dead["smtp"]) == {i: "failed" for i in dead["smtp"]}


def test_purge_selected_ids_via_the_api(conn, dead, client_as):
    client = client_as("operator")
    chosen = dead["card"][:2]
    preview = client.post("/api/v1/deadletters/preview", data={
        "csrf_token": CSRF, "action": "purge", "ids": [str(i) for i in chosen]}).get_json()
    assert preview["total"] == 2 and {r["id"] for r in preview["sample"]} == set(chosen)
    resp = client.post("/api/v1/deadletters/operations", data={
        "csrf_token": CSRF, "action": "purge", "ids": [str(i) for i in chosen], "reason": "test data", **preview["confirm"]})
    assert resp.status_code == 201
    op = wait_done(client, resp.get_json()["id"])
    assert op["state"] == "done"
    left = conn.execute("SELECT id FROM skiplock.jobs WHERE id = ANY(%s)", (dead["card"],)).fetchall()
    assert [r[0] for r in left] == [dead["card"][2]]


def test_running_operation_polls_and_can_be_cancelled(conn, dead, client_as, monkeypatch):
    from console.maintenance import bulk

    monkeypatch.setattr(bulk, "run_in_thread", lambda *a, **k: None)  # nobody runs it: stays queued
    client = client_as("operator")
    resp = client.post("/deadletters/operations", data={
        "csrf_token": CSRF, "action": "replay", "selection": '{"queue": "mail"}', "reason": "test run"},
        headers={"HX-Request": "true"})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200 and 'hx-trigger="poll" data-poll="1000"' in html and "Cancel" in html
    op_id = int(html.split('id="op-')[1].split('"')[0])
    assert client.get(f"/deadletters/operations/{op_id}/_progress").status_code == 200
    viewer_page = client_as("viewer").get(f"/deadletters/operations/{op_id}").get_data(as_text=True)
    assert "Cancel" not in viewer_page
    cancelled = client.post(f"/deadletters/operations/{op_id}/cancel", data={"csrf_token": CSRF})
    assert cancelled.status_code == 303
    assert client.get(f"/api/v1/deadletters/operations/{op_id}").get_json()["state"] == "cancelled"
    assert client.post(f"/deadletters/operations/{op_id}/cancel", data={"csrf_token": CSRF}).status_code == 409
    assert statuses(conn, dead["smtp"]) == {i: "failed" for i in dead["smtp"]}
    assert audit.search(conn, action="cancel")[0]["actor"] == "operator"


def test_one_click_replay_and_purge_of_one_job(conn, dead, client_as):
    client = client_as("operator")
    a, b = dead["smtp"][:2]
    resp = client.post(f"/deadletters/jobs/{a}/replay", data={"csrf_token": CSRF, "next": "/deadletters/jobs?queue=mail"})
    assert resp.status_code == 303 and resp.headers["Location"].endswith("/deadletters/jobs?queue=mail")
    assert client.post(f"/deadletters/jobs/{b}/purge", data={"csrf_token": CSRF, "reason": "junk",
                                                            "next": "https://evil.example/"}).headers["Location"].endswith("/deadletters")
    assert statuses(conn, [a, b]) == {a: "pending"}
    assert client.post(f"/deadletters/jobs/{a}/replay", data={"csrf_token": CSRF}).status_code == 409
    assert {r["action"] for r in audit.search(conn, actor="operator")} >= {"replay", "purge"}


def test_routes_are_in_the_openapi_document(client_as):
    paths = client_as("viewer").get("/api/v1/openapi.json").get_json()["paths"]
    for path in ("/api/v1/deadletters", "/api/v1/deadletters/jobs", "/api/v1/deadletters/preview",
                 "/api/v1/deadletters/operations", "/api/v1/deadletters/operations/{op_id}",
                 "/api/v1/deadletters/operations/{op_id}/cancel", "/api/v1/deadletters/jobs/{job_id}/{action}"):
        assert path in paths, path
