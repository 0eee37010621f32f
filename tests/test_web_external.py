"""The external queue's page and its actions through the web console and the API, on a real
PGQueuer schema (its Queries.install, what `pgq install` runs) in the test's database with its own consumer running.

The faces add nothing to console.external.actions but the rails: an operator's preview is
bound to the start (409 when other jobs match), a purge needs the preview's fields (400), a
replay of several jobs and a purge need a reason (422), a viewer sees the dead letters (error
text redacted) and no action, and the library's own worker runs what the page replayed.
"""

from __future__ import annotations

import sys
import time

import pytest

from console.db import connect
from tests import external_workers as w
from tests.collector_helpers import eventually
from tests.test_external_actions import RUNS, pgqueuer_failed
from tests.test_external_libraries import kill, run_async, scalar, start, url, wait_for_line
from tests.web_fixtures import CSRF

pytestmark = pytest.mark.slow
REASON = "INC-91: the payment provider is back"


def config_file(tmp_path, actions: bool) -> str:
    path = tmp_path / "skiplock.toml"
    path.write_text(f'[[external_queues]]\nname = "legacy"\nsystem = "pgqueuer"\nactions = {str(actions).lower()}\n')
    return str(path)


@pytest.fixture
def web_settings(web_settings, tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_CONFIG", config_file(tmp_path, actions=True))
    return web_settings


@pytest.fixture
def held(dsn, tmp_path):
    """Six flaky PGQueuer jobs held as failed by its running consumer; yields the switch file."""
    run_async(w.pgqueuer_install(url(dsn)))
    with connect(dsn) as c:
        c.execute(RUNS)
    switch = tmp_path / "switch"
    switch.write_text("on")
    run_async(w.pgqueuer_produce(url(dsn), ["flaky"] * 6))
    consumer = start([sys.executable, "-m", "tests.external_workers", "pgqueuer-consume", url(dsn)],
                     {"FLAKY_SWITCH": str(switch)})
    try:
        wait_for_line(consumer, "CONSUMING")
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 6, timeout=60)
        yield switch
    finally:
        kill(consumer)


def post(client, url_: str, **fields):
    return client.post(url_, data={"csrf_token": CSRF, **fields})


def settle(client, op_id: int) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        op = client.get(f"/api/v1/external/operations/{op_id}").get_json()
        if not op["active"]:
            return op
        time.sleep(0.2)
    raise AssertionError(f"operation {op_id} still running after 30 s")


def test_an_operator_replays_a_group_from_the_page_and_its_consumer_runs_it(dsn, held, client_as):
    failed = run_async(pgqueuer_failed(url(dsn)))
    viewer, operator = client_as("viewer"), client_as("operator")
    page = viewer.get("/external/legacy?queue=flaky")
    assert page.status_code == 200
    body = page.get_data(as_text=True)
    assert all(f'data-key="{i}"' in body for i in failed) and "Replay selected" not in body  # a viewer cannot act
    assert "Replay all" in operator.get("/external/legacy?queue=flaky").get_data(as_text=True)

    confirm = post(operator, "/api/v1/external/legacy/preview", action="replay", queue="flaky").get_json()
    assert confirm["total"] == 6 and "PGQueuer's requeue of held jobs" in confirm["how"]
    assert post(operator, "/api/v1/external/legacy/operations", action="replay", queue="flaky",
                **confirm["confirm"]).status_code == 422  # six jobs: a reason is required
    held.unlink()
    started = post(operator, "/api/v1/external/legacy/operations", action="replay", queue="flaky", reason=REASON,
                   **confirm["confirm"])
    assert started.status_code == 201, started.get_data(as_text=True)
    op = settle(operator, started.get_json()["id"])
    assert (op["state"], op["done"], op["skipped"]) == ("done", 6, 0)
    eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 6, timeout=60)
    assert sorted(r[0] for r in connect(dsn).execute("SELECT job_id FROM runs").fetchall()) == failed
    audit = connect(dsn).execute("SELECT actor, action, outcome, target, detail->>'system', detail->>'external' "
                                 "FROM skiplock.audit_log ORDER BY id").fetchall()
    target = f"pgqueuer:legacy/operation:{op['id']}"
    assert audit == [("operator", "replay", "started", target, "pgqueuer", "legacy"),
                     ("operator", "replay", "ok", target, "pgqueuer", "legacy")]
    assert operator.get(f"/external/operations/{op['id']}").status_code == 200


def test_a_purge_needs_its_preview_and_is_refused_when_other_jobs_match(dsn, held, client_as):
    operator = client_as("operator")
    failed = run_async(pgqueuer_failed(url(dsn)))
    assert post(operator, "/api/v1/external/legacy/operations", action="purge", queue="flaky",
                reason=REASON).status_code == 400  # no preview fields
    confirm = post(operator, "/api/v1/external/legacy/preview", action="purge", keys=[str(i) for i in failed[:3]]).get_json()
    assert confirm["total"] == 3
    with connect(dsn) as c:  # one of the previewed jobs is replayed by someone else meanwhile
        c.execute("UPDATE pgqueuer SET status = 'queued', execute_after = now() + interval '1 hour' WHERE id = %s",
                  (failed[0],))
    refused = post(operator, "/api/v1/external/legacy/operations", action="purge", keys=[str(i) for i in failed[:3]],
                   reason=REASON, **confirm["confirm"])
    assert refused.status_code == 409 and "preview again" in refused.get_json()["error"]
    assert run_async(pgqueuer_failed(url(dsn))) == failed[1:]  # nothing purged
    # A form post (the confirm page) follows the same rails and redirects to the progress page.
    confirm = post(operator, "/api/v1/external/legacy/preview", action="purge", keys=[str(i) for i in failed[1:3]]).get_json()
    done = post(operator, "/external/legacy/operations", action="purge", keys=[str(i) for i in failed[1:3]],
                reason=REASON, **confirm["confirm"])
    assert done.status_code == 303 and "/external/operations/" in done.headers["Location"]
    eventually(lambda: run_async(pgqueuer_failed(url(dsn))) == failed[3:], timeout=20)


def test_bad_input_is_a_message_not_a_500(dsn, held, client_as):
    operator = client_as("operator")
    for path, fields, status, words in [
        ("/api/v1/external/nope/preview", {"action": "replay", "all": "1"}, 404, "no external queue 'nope'"),
        ("/api/v1/external/legacy/preview", {"action": "explode", "all": "1"}, 400, "not one of replay, purge"),
        ("/api/v1/external/legacy/preview", {"action": "replay"}, 400, "nothing selected"),
        ("/api/v1/external/legacy/preview", {"action": "replay", "keys": "x'; DROP TABLE pgqueuer"}, 400, "not a pgqueuer job key"),
        ("/api/v1/external/legacy/queues/flaky/pause", {"reason": REASON}, 403, "PGQueuer has no queue pause"),
        ("/api/v1/external/legacy/jobs/cancel", {}, 400, "name at least one waiting job"),
        ("/api/v1/external/operations/987654/cancel", {}, 404, "no external-queue operation 987654"),
        # PostgreSQL refuses NUL in text and bigint stops at 2**63 - 1: both are refused before a query.
        ("/api/v1/external/legacy/preview", {"action": "replay", "queue": "fl\x00aky"}, 400, "queue must be a non-empty"),
        (f"/api/v1/external/operations/{2**63}/cancel", {}, 404, f"no external-queue operation {2**63}"),
    ]:
        response = post(operator, path, **fields)
        assert response.status_code == status, (path, response.get_data(as_text=True))
        assert words in response.get_json()["error"], (path, response.get_json())
    for page, words in [("/external/legacy?queue=fl%00aky", "NUL character"),
                        ("/external/legacy?before=2026-01-01T00:00:00~1%002", "not a cursor"),
                        (f"/api/v1/external/operations/{2**63}", f"no external-queue operation {2**63}")]:
        response = operator.get(page)
        assert response.status_code in (400, 404) and words in response.get_data(as_text=True), (page, response.status_code)
    assert scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 6
