"""Replay and purge of a broker queue's dead letters (issue 32, item 4; docs/exit-plan.md, "Dead
letters of a broker queue"): console.maintenance.brokerdlq from the command line
(`skiplock replay/purge --queue Q`, which picks the queue's backend) and from the console's page
/deadletters/broker/<queue>, against a private nats-server (tests/nats_helpers.py).

The dead letters are published straight to the queue's dead-letter stream in the broker worker's
own format (the relay's job plus attempts, last_error, error, failed_at), not by a worker failing
them: a test needs a second, not a worker run to exhaustion.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from click.testing import CliRunner

from console.cli import main
from console.maintenance import brokerdlq
from console.queue import broker
from tests import nats_helpers
from tests.nats_helpers import _run, read_all, rows, set_backend, stream_messages
from tests.web_fixtures import CSRF

nats_server = nats_helpers.nats_server
procs = nats_helpers.procs
runs_table = nats_helpers.runs_table

QUEUE = "mail"
REASON = "INC-77: SMTP credentials rotated in deploy 412"


def _dead_body(job_id: int, kind: str) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"id": job_id, "queue": QUEUE, "kind": kind, "payload": {"to": f"user{job_id}@example.com"},
            "priority": 0, "run_at": now, "max_attempts": 3, "idempotency_key": None, "headers": None,
            "group": None, "created_at": now, "attempts": 3, "last_error": "RuntimeError: SMTP timeout",
            "error": {"error_class": "RuntimeError", "message": "SMTP timeout", "traceback": None},
            "failed_at": now}


async def _load_dead(nats_url: str, jobs: dict[int, str], secret: bool = False) -> None:
    import nats

    from console.queue.broker.relay import ensure_streams

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, QUEUE, 120.0)
        for job_id, kind in jobs.items():
            body = _dead_body(job_id, kind)
            if secret:  # what a viewer must not read: a redacted key in the payload and the error
                body.update(payload={"password": f"hunter{job_id}"}, last_error=f"RuntimeError: password=hunter{job_id}")
            await js.publish(broker.dead_subject(QUEUE), json.dumps(body).encode(),
                             headers={broker.MSG_ID: f"{uuid.uuid4()}:dead", broker.JOB_ID: str(job_id)})
    finally:
        await nc.close()


def load_dead(nats_url: str, jobs: dict[int, str], secret: bool = False) -> None:
    _run(_load_dead(nats_url, jobs, secret))


def dead_ids(nats_url: str) -> list[int]:
    return sorted(m["data"]["id"] for m in read_all(nats_url, broker.dead_stream(QUEUE), broker.dead_subject(QUEUE)))


def cli(dsn: str, nats_url: str, *args: str):
    return CliRunner().invoke(main, ["--dsn", dsn, *args], env={"SKIPLOCK_BROKER_NATS_URL": nats_url},
                              catch_exceptions=False)


def audit_rows(dsn: str, action: str) -> list[tuple]:
    return rows(dsn, "SELECT outcome, rows, reason, target, detail->>'backend' FROM skiplock.audit_log "
                     "WHERE action = %s ORDER BY id", (action,))


def wait_for(what: str, check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)


@pytest.mark.slow  # 4.5-6.6 s: a worker process started and run
def test_cli_replay_republishes_the_selected_dead_letters_and_each_runs_once_with_fresh_attempts(procs, nats_server):
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {101: "record", 102: "record", 103: "record", 104: "always_fails"})
    result = cli(dsn, nats_server, "replay", "--queue", QUEUE, "--kind", "record", "--reason", REASON)
    assert result.exit_code == 0, result.output
    assert "3 dead letters to replay" in result.output and "3 of 3 dead letters replayed" in result.output
    assert dead_ids(nats_server) == [104]  # the other kind is left where it is
    assert stream_messages(nats_server, broker.stream(QUEUE)) == 3
    procs.worker(QUEUE)
    done = wait_for("the replayed jobs ran", lambda: (r := rows(dsn, "SELECT job_id, attempt FROM public.nats_runs "
                                                                  "WHERE what = 'done' ORDER BY job_id")) and len(r) >= 3 and r)
    wait_for("the job stream drained", lambda: stream_messages(nats_server, broker.stream(QUEUE)) == 0)
    time.sleep(0.3)  # a duplicate would be delivered at once: the stream held each job once
    assert rows(dsn, "SELECT job_id, attempt FROM public.nats_runs WHERE what = 'done' ORDER BY job_id") == done
    assert done == [(101, 1), (102, 1), (103, 1)]  # each once, attempts counted afresh
    assert audit_rows(dsn, "replay") == [("started", 3, REASON, f"queue:{QUEUE}", "nats"),
                                         ("ok", 3, REASON, f"queue:{QUEUE}", "nats")]


def test_a_replay_interrupted_between_publish_and_delete_loses_nothing_and_runs_again_without_duplicates(
        dsn, conn, nats_server, monkeypatch):
    from nats.js.manager import JetStreamManager

    set_backend(dsn, QUEUE)
    load_dead(nats_server, {201: "record", 202: "record"})

    async def lost(self, stream_name, seq):  # the broker stored the jobs, then went away
        raise TimeoutError("no answer")

    with monkeypatch.context() as patch:
        patch.setattr(JetStreamManager, "delete_msg", lost)
        with pytest.raises(brokerdlq.BrokerUnavailable):
            brokerdlq.run(conn, nats_server, "replay", {"queue": QUEUE}, actor="test", reason=REASON, timeout=2.0)
    # In both streams, never in neither.
    assert dead_ids(nats_server) == [201, 202]
    assert stream_messages(nats_server, broker.stream(QUEUE)) == 2
    assert [r[:2] for r in audit_rows(dsn, "replay")] == [("started", 2), ("error", 0)]
    # Run again: the same Nats-Msg-Id, so JetStream stores no second copy; the dead letters go.
    done = brokerdlq.run(conn, nats_server, "replay", {"queue": QUEUE}, actor="test", reason=REASON)
    assert (done.done, done.total) == (2, 2)
    assert dead_ids(nats_server) == []
    assert stream_messages(nats_server, broker.stream(QUEUE)) == 2
    jobs = read_all(nats_server, broker.stream(QUEUE), broker.subject(QUEUE))
    assert sorted(j["data"]["id"] for j in jobs) == [201, 202]
    assert all("attempts" not in j["data"] and "last_error" not in j["data"] for j in jobs)


def test_cli_purge_needs_a_reason_previews_on_dry_run_and_deletes_what_it_selects(dsn, nats_server):
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {301: "record", 302: "record", 303: "record"})
    refused = cli(dsn, nats_server, "purge", "--queue", QUEUE)
    assert refused.exit_code == 2 and "reason" in refused.output
    dry = cli(dsn, nats_server, "purge", "--queue", QUEUE, "--dry-run")
    assert dry.exit_code == 0 and "3 dead letters to purge" in dry.output and "nothing changed" in dry.output
    for bad in (["--to-archive"], ["--group", "RuntimeError"]):
        out = cli(dsn, nats_server, "purge", "--queue", QUEUE, *bad, "--reason", REASON)
        assert out.exit_code == 2, out.output
    assert dead_ids(nats_server) == [301, 302, 303]
    assert audit_rows(dsn, "purge") == []
    done = cli(dsn, nats_server, "purge", "--queue", QUEUE, "--id", "301,303", "--reason", REASON)
    assert done.exit_code == 0, done.output
    assert dead_ids(nats_server) == [302]
    assert stream_messages(nats_server, broker.stream(QUEUE)) == 0  # a purge publishes nothing
    assert audit_rows(dsn, "purge") == [("started", 2, REASON, f"queue:{QUEUE}", "nats"),
                                        ("ok", 2, REASON, f"queue:{QUEUE}", "nats")]


@pytest.fixture
def web_settings(web_settings, nats_server):
    return {**web_settings, "broker.nats_url": nats_server}


def _confirm_fields(page: str) -> dict[str, str]:
    import re

    return dict(re.findall(r'<input type="hidden" name="(expected|max_seq|selection_hash|selection)" value="([^"]*)"',
                           page))


def _unescape(fields: dict[str, str]) -> dict[str, str]:
    import html

    return {k: html.unescape(v) for k, v in fields.items()}


def test_the_console_lists_previews_and_purges_a_broker_queues_dead_letters_for_operators_only(
        dsn, nats_server, client_as):
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {401: "record", 402: "record", 403: "record"})
    viewer, operator = client_as("viewer"), client_as("operator")
    page = viewer.get(f"/deadletters/broker/{QUEUE}")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert text.count("data-seq=") == 3 and "RuntimeError: SMTP timeout" in text
    assert 'name="ids"' not in text  # no forms for a viewer
    assert f'href="/deadletters/broker/{QUEUE}"' in viewer.get("/deadletters").get_data(as_text=True)
    assert viewer.post(f"/deadletters/broker/{QUEUE}/preview", data={"csrf_token": CSRF, "action": "purge"}
                       ).status_code == 403
    assert viewer.post(f"/deadletters/broker/{QUEUE}/operations", data={"csrf_token": CSRF, "action": "purge",
                       "reason": REASON}).status_code == 403
    assert operator.post(f"/deadletters/broker/{QUEUE}/preview", data={"action": "purge"}).status_code == 403  # CSRF
    preview = operator.post(f"/deadletters/broker/{QUEUE}/preview", data={"csrf_token": CSRF, "action": "purge"})
    assert preview.status_code == 200 and 'data-total="3"' in preview.get_data(as_text=True)
    fields = _unescape(_confirm_fields(preview.get_data(as_text=True)))
    assert set(fields) == {"expected", "max_seq", "selection_hash", "selection"}
    form = {"csrf_token": CSRF, "action": "purge", **fields}
    no_reason = operator.post(f"/deadletters/broker/{QUEUE}/operations", data=form)
    assert no_reason.status_code == 422, no_reason.get_data(as_text=True)[:300]
    assert operator.post(f"/deadletters/broker/{QUEUE}/operations",
                         data={**form, "expected": "", "reason": REASON}).status_code == 400  # a purge confirms a preview
    assert dead_ids(nats_server) == [401, 402, 403] and audit_rows(dsn, "purge") == []
    done = operator.post(f"/deadletters/broker/{QUEUE}/operations", data={**form, "reason": REASON})
    assert done.status_code == 200 and 'data-done="3"' in done.get_data(as_text=True)
    assert dead_ids(nats_server) == []
    assert audit_rows(dsn, "purge") == [("started", 3, REASON, f"queue:{QUEUE}", "nats"),
                                        ("ok", 3, REASON, f"queue:{QUEUE}", "nats")]
    assert client_as("viewer").get("/deadletters/broker/nope-queue").status_code == 404


def test_a_start_is_refused_when_the_dead_letters_changed_since_the_preview(dsn, conn, nats_server, client_as):
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {501: "record", 502: "record"})
    operator = client_as("operator")
    preview = operator.post(f"/deadletters/broker/{QUEUE}/preview", data={"csrf_token": CSRF, "action": "replay"})
    fields = _unescape(_confirm_fields(preview.get_data(as_text=True)))
    brokerdlq.run(conn, nats_server, "purge", {"queue": QUEUE, "ids": [501]}, actor="someone else", reason=REASON)
    load_dead(nats_server, {503: "record"})  # a new one: past the preview's bound, never touched
    stale = operator.post(f"/deadletters/broker/{QUEUE}/operations",
                          data={"csrf_token": CSRF, "action": "replay", "reason": REASON, **fields})
    assert stale.status_code == 409, stale.get_data(as_text=True)[:300]
    assert dead_ids(nats_server) == [502, 503] and stream_messages(nats_server, broker.stream(QUEUE)) == 0


def test_broker_dead_letter_forms_work_with_and_without_htmx(dsn, nats_server, client_as):
    """tests/test_security_forms_without_htmx.py's check for brokerdead.preview and .start."""
    set_backend(dsn, QUEUE)
    operator = client_as("operator")
    for htmx in (False, True):
        load_dead(nats_server, {601: "record"})
        headers = {"HX-Request": "true", "X-CSRF-Token": CSRF} if htmx else {}
        preview = operator.post(f"/deadletters/broker/{QUEUE}/preview", data={"csrf_token": CSRF, "action": "replay"},
                                headers=headers)
        body = preview.get_data(as_text=True)
        assert preview.status_code == 200 and 'data-total="1"' in body
        assert body.lstrip().lower().startswith("<!doctype html") != htmx
        fields = _unescape(_confirm_fields(body))
        done = operator.post(f"/deadletters/broker/{QUEUE}/operations", headers=headers,
                             data={"csrf_token": CSRF, "action": "replay", "reason": REASON, **fields})
        body = done.get_data(as_text=True)
        assert done.status_code == 200 and 'data-done="1"' in body, body[:300]
        assert body.lstrip().lower().startswith("<!doctype html") != htmx
        assert dead_ids(nats_server) == []


@pytest.mark.slow  # about 6 s: a worker process started, run and stopped
def test_a_broker_worker_registers_on_the_workers_page_with_a_nats_badge_and_says_when_it_stopped(
        procs, nats_server, client_as):
    """Item 2: `skiplock worker --backend nats` writes its row to skiplock.workers (migration 031)."""
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {701: "record"})
    with psycopg.connect(dsn, autocommit=True) as conn:  # one job to run, through a replay (no relay needed)
        brokerdlq.run(conn, nats_server, "replay", {"queue": QUEUE, "ids": [701]}, actor="test", reason=None)
    worker = procs.worker(QUEUE, SKIPLOCK_WORKER_FLUSH_INTERVAL="0.2")
    row = wait_for("the worker's row with its completed job", lambda: (r := rows(
        dsn, "SELECT id, backend, queues, completed, claimed, stopped_at FROM skiplock.workers")) and r[0][3] == 1 and r)
    [(worker_id, backend, queues, completed, claimed, stopped_at)] = row
    assert (backend, queues, completed, claimed, stopped_at) == ("nats", [QUEUE], 1, 1, None)
    page = client_as("viewer").get("/workers").get_data(as_text=True)
    assert f"<code>{worker_id}</code> <span class=\"badge backend\" data-backend=\"nats\"" in page
    # "Why isn't this job running?" reads PostgreSQL workers only: a broker worker claims nothing there.
    from console.sqlfiles import query

    assert rows(dsn, query("why", "workers")) == []
    from console import exitplan

    with psycopg.connect(dsn, autocommit=True) as conn:  # the exit plan's step 5 sees it
        step = exitplan.plan(conn, QUEUE, client_installed=True, server_path=None).steps[4]
    assert (step.state, worker_id in step.note) == ("done", True), step
    worker.terminate()
    worker.wait(timeout=15)
    assert worker.returncode == 0, procs.log("worker")
    assert rows(dsn, "SELECT stopped_at IS NOT NULL FROM skiplock.workers") == [(True,)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert exitplan.broker_workers(conn, QUEUE) == []


# --- /api/v1/deadletters/broker/<queue>: the JSON mirror of the page -----------------------------

def _bearer(conn, role: str) -> dict[str, str]:
    from console import users as users_mod

    return {"Authorization": f"Bearer {users_mod.create_token(conn, role, 'api-test')}"}


def test_the_api_lists_previews_replays_and_purges_a_broker_queues_dead_letters_like_postgres_ones(
        dsn, conn, nats_server, web_app, client_as, personas):
    set_backend(dsn, QUEUE)
    load_dead(nats_server, {801: "record", 802: "record", 803: "other"}, secret=True)
    api = web_app.test_client()
    viewer, operator = _bearer(conn, "viewer"), _bearer(conn, "operator")
    base = f"/api/v1/deadletters/broker/{QUEUE}"

    listed = api.get(base, headers=viewer)
    assert listed.status_code == 200, listed.get_data(as_text=True)[:300]
    body = listed.get_json()
    assert [r["id"] for r in body["rows"]] == [801, 802, 803] and body["stream_total"] == 3
    assert body["stream"] == broker.dead_stream(QUEUE) and body["next"] is None
    # Viewers see the error text and payload redacted, operators in full (the page's rule).
    assert "hunter" not in json.dumps(body["rows"]) and body["rows"][0]["payload"] == {"password": "[redacted]"}
    full = api.get(base, headers=operator).get_json()["rows"][0]
    assert full["last_error"] == "RuntimeError: password=hunter801" and full["payload"] == {"password": "hunter801"}
    assert api.get(f"{base}?after=x", headers=viewer).status_code == 400
    assert api.get(f"{base}?after=1", headers=viewer).get_json()["rows"][0]["id"] == 802

    # Viewers may not act; a session needs its CSRF token, a bearer token does not.
    assert api.post(f"{base}/preview", headers=viewer, data={"action": "purge"}).status_code == 403
    assert api.post(f"{base}/operations", headers=viewer, data={"action": "replay", "ids": "801"}).status_code == 403
    assert client_as("operator").post(f"{base}/preview", data={"action": "purge"}).status_code == 403

    # Purge: preview, then the start bound to it, with a reason.
    preview = api.post(f"{base}/preview", headers=operator, data={"action": "purge", "kind": "other"})
    assert preview.status_code == 200, preview.get_data(as_text=True)[:300]
    p = preview.get_json()
    assert (p["total"], [r["id"] for r in p["sample"]]) == (1, [803])
    form = {"action": "purge", "kind": "other", **{k: str(v) for k, v in p["confirm"].items()}}
    no_reason = api.post(f"{base}/operations", headers=operator, data=form)
    assert no_reason.status_code == 422 and "reason" in no_reason.get_json()["error"]
    unbound = api.post(f"{base}/operations", headers=operator, data={"action": "purge", "kind": "other",
                                                                      "reason": REASON})
    assert unbound.status_code == 400 and "preview" in unbound.get_json()["error"]
    assert dead_ids(nats_server) == [801, 802, 803]
    purged = api.post(f"{base}/operations", headers=operator, data={**form, "reason": REASON})
    assert purged.status_code == 200, purged.get_data(as_text=True)[:300]
    assert purged.get_json()["result"]["done"] == 1 and dead_ids(nats_server) == [801, 802]

    # Replay of two needs a reason (422), then republishes them to the job stream.
    assert api.post(f"{base}/operations", headers=operator, data={"action": "replay"}).status_code == 422
    replayed = api.post(f"{base}/operations", headers=operator, data={"action": "replay", "reason": REASON})
    assert replayed.status_code == 200 and replayed.get_json()["result"]["done"] == 2
    assert dead_ids(nats_server) == [] and stream_messages(nats_server, broker.stream(QUEUE)) == 2
    assert [r[:2] for r in audit_rows(dsn, "replay")] == [("started", 2), ("ok", 2)]
    assert [r[:2] for r in audit_rows(dsn, "purge")] == [("started", 1), ("ok", 1)]
    assert "(token api-test)" in rows(dsn, "SELECT actor FROM skiplock.audit_log WHERE action = 'purge'")[0][0]

    # A PostgreSQL queue with no dead-letter stream, or a name no stream can have: 404.
    assert api.get("/api/v1/deadletters/broker/billing", headers=viewer).status_code == 404
    assert api.get("/api/v1/deadletters/broker/no.such", headers=viewer).status_code == 404
    assert api.post("/api/v1/deadletters/broker/billing/preview", headers=operator,
                    data={"action": "replay"}).status_code == 404

    # The broker gone: 503 naming it, for the list and both actions.
    nats_helpers.stop_server(nats_server)
    for answer in (api.get(base, headers=viewer),
                   api.post(f"{base}/preview", headers=operator, data={"action": "replay"}),
                   api.post(f"{base}/operations", headers=operator, data={"action": "replay", "reason": REASON})):
        assert answer.status_code == 503, answer.get_data(as_text=True)[:300]
        assert "broker did not answer" in answer.get_json()["error"]


def test_the_broker_dead_letter_api_is_in_the_openapi_document(web_app):
    from console.web.api import openapi_document

    paths = openapi_document(web_app)["paths"]
    base = "/api/v1/deadletters/broker/{name}"
    assert set(paths[base]) == {"get"} and set(paths[f"{base}/preview"]) == {"post"}
    start = paths[f"{base}/operations"]["post"]
    assert {"400", "401", "403", "404", "409", "422", "503"} <= set(start["responses"])
    assert "Role: operator" in start["description"]
