"""The limits' faces: `skiplock queues set/show` (a real child process), the API's
PUT /api/v1/queues/{name}/limits, and the queue page's form — each audited, each refusing bad
input with a message that names the field, and the queues list and page showing the usage.
"""

from __future__ import annotations

import json

import pytest

from console import queue as q
from console.queue import limits
from tests.web_fixtures import CSRF
from tests.workers import cli


def audit_rows(conn):
    return conn.execute("SELECT actor, action, target, reason, detail->'after' FROM skiplock.audit_log"
                        " WHERE action LIKE '%%limits' ORDER BY id").fetchall()


# --- CLI ------------------------------------------------------------------------------------

def test_cli_set_show_clear(subprocess_env, conn):
    done = cli(subprocess_env, "queues", "set", "mail", "--concurrency", "2", "--rate", "30/m", "--reason", "quota")
    assert done.returncode == 0, done.stderr
    assert "concurrency 2, rate 30/m (burst 1)" in done.stdout
    shown = cli(subprocess_env, "queues", "show")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("mail"))
    assert line.split()[:5] == ["mail", "2", "0", "30/m", "1"]
    as_json = json.loads(cli(subprocess_env, "queues", "show", "--json").stdout)
    assert as_json["queues"][0]["concurrency"] == 2 and as_json["kinds"] == []
    cleared = cli(subprocess_env, "queues", "set", "mail", "--clear", "--reason", "done")
    assert cleared.returncode == 0 and "no limits" in cleared.stdout
    assert "no limits" in cli(subprocess_env, "queues", "show").stdout
    rows = audit_rows(conn)
    assert [(r[1], r[2], r[3]) for r in rows] == [("set limits", "queue:mail", "quota"), ("clear limits", "queue:mail", "done")]
    assert rows[0][0].startswith("cli:")


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "0"], "concurrency: must be at least 1"),
    (["--concurrency", "-3"], "concurrency: must be at least 1"),
    (["--concurrency", "two"], "concurrency: 'two' is not a whole number"),
    (["--rate", "10/h"], "rate: '10/h' is not a rate"),
    (["--rate", "0/s"], "rate: must be at least 1"),
    ([], "nothing to set"),
])
def test_cli_refuses_bad_limits(subprocess_env, conn, args, message):
    done = cli(subprocess_env, "queues", "set", "mail", *args, "--reason", "testing bad input")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert audit_rows(conn) == [] and limits.queue_limits(conn) == []


# --- API ------------------------------------------------------------------------------------

def test_api_sets_and_clears_audited(client_as, conn):
    client = client_as("operator")
    put = client.put("/api/v1/queues/mail/limits", json={"concurrency": 3, "rate": "5/s", "reason": "provider quota"},
                     headers={"X-CSRF-Token": CSRF})
    assert put.status_code == 200, put.data
    assert put.get_json() == {"ok": True, "queue": "mail", "before": {"concurrency": None, "rate": None, "burst": None,
                                                                        "group_concurrency": None},
                              "after": {"concurrency": 3, "rate": "5/s", "burst": 5.0, "group_concurrency": None}}
    # The queue exists now (no jobs yet) and shows its limits and usage.
    row = client.get("/api/v1/queues/mail").get_json()["queue"]
    assert row["limits"] == {"concurrency": 3, "rate": "5/s", "burst": 5.0, "running": 0, "tokens": 5.0}
    form = client.put("/api/v1/queues/mail/limits", data={"clear": "true", "rate": "10/m", "csrf_token": CSRF,
                                                                  "reason": "quota changed"})
    assert form.status_code == 200 and form.get_json()["after"] == {"concurrency": None, "rate": "10/m", "burst": 1.0,
                                                                    "group_concurrency": None}
    rows = audit_rows(conn)
    assert [(r[0], r[1], r[3]) for r in rows] == [("operator", "set limits", "provider quota"), ("operator", "set limits", "quota changed")]


@pytest.mark.parametrize(("body", "message"), [
    ({"concurrency": 0}, "concurrency: must be at least 1"),
    ({"concurrency": -1}, "concurrency: must be at least 1"),
    ({"concurrency": "lots"}, "not a whole number"),
    ({"concurrency": [2]}, "concurrency: must be a whole number"),
    ({"rate": "5 per second"}, "is not a rate"),
    ({"rate": 5}, "rate: must be a string"),
    ({"clear": "maybe"}, "clear: must be true or false"),
    ({}, "nothing to set"),
    ([1], "must be a JSON object"),
])
def test_api_refuses_bad_limits(client_as, conn, body, message):
    if isinstance(body, dict):
        body = {**body, "reason": "testing bad input"}  # a reason, so the limits themselves are judged
    answer = client_as("operator").put("/api/v1/queues/mail/limits", json=body, headers={"X-CSRF-Token": CSRF})
    assert answer.status_code == 400, answer.data
    assert message in answer.get_json()["error"]
    assert audit_rows(conn) == []


def test_api_limits_need_an_operator(client_as, conn):
    assert client_as("viewer").put("/api/v1/queues/mail/limits", json={"concurrency": 1},
                                   headers={"X-CSRF-Token": CSRF}).status_code == 403
    assert client_as("operator").put("/api/v1/queues/mail/limits", json={"concurrency": 1}).status_code == 403  # no CSRF
    assert client_as(None).put("/api/v1/queues/mail/limits", json={"concurrency": 1},
                               headers={"X-CSRF-Token": CSRF}).status_code == 401
    assert limits.queue_limits(conn) == []


# --- the pages ------------------------------------------------------------------------------

def test_queue_page_form_sets_limits_and_pages_show_usage(client_as, conn):
    with conn.transaction():
        for _ in range(3):
            q.enqueue(conn, "noop", {}, queue="mail")
    client = client_as("operator")
    page = client.get("/queues/mail")
    assert b'id="limits-form"' in page.data and b"No limits" in page.data
    posted = client.post("/queues/mail/limits", data={"csrf_token": CSRF, "concurrency": "2", "rate": "",
                                                      "reason": "slow provider"})
    assert posted.status_code == 302
    limits.claim_from_queue(conn, "mail", "w1", limit=10)
    page = client.get("/queues/mail").data.decode()
    assert "2/2 running" in page and "at no instant do more than 2" in page
    assert "2/2 running" in client.get("/queues").data.decode()
    bad = client.post("/queues/mail/limits", data={"csrf_token": CSRF, "concurrency": "0", "reason": "test run"})
    assert bad.status_code == 400 and b"concurrency: must be at least 1" in bad.data
    assert [(r[0], r[1], r[3]) for r in audit_rows(conn)] == [("operator", "set limits", "slow provider")]
    # A viewer sees the limits but not the form, and may not post it.
    viewer = client_as("viewer")
    assert b'id="limits-form"' not in viewer.get("/queues/mail").data
    assert viewer.post("/queues/mail/limits", data={"csrf_token": CSRF, "concurrency": "5"}).status_code == 403


@pytest.mark.browser
def test_operator_sets_and_clears_limits_in_the_browser(page, live_server, personas, conn):
    """Chromium: the queue page's form sets a concurrency and a rate, then clears them; the end
    state and the audit rows are checked in the database."""
    from tests.test_web_browser import sign_in

    with conn.transaction():
        q.enqueue(conn, "noop", {}, queue="mail")
    sign_in(page, live_server, "operator", "/queues/mail")
    form = page.locator("#limits-form")
    form.locator("input[name=concurrency]").fill("2")
    form.locator("input[name=rate]").fill("30/m")
    form.locator("input[name=reason]").fill("provider quota")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "0/2 running" in page.locator("#queue-limits").inner_text()
    assert limits.limits_of(conn, "mail") == {"concurrency": 2, "rate": "30/m", "burst": 1.0, "group_concurrency": None}
    form = page.locator("#limits-form")
    form.locator("input[name=clear]").check()
    form.locator("input[name=reason]").fill("quota lifted")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "No limits" in page.locator("#queue-limits").inner_text()
    assert limits.queue_limits(conn) == []
    assert [(r[1], r[3]) for r in audit_rows(conn)] == [("set limits", "provider quota"), ("clear limits", "quota lifted")]
