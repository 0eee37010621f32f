"""The maintenance page: task summary, recent runs, run-now buttons (operator, CSRF, audited,
end state in the DB), settings with secrets masked."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg

from console import audit
from console import maintenance as m
from console import queue as q
from tests.web_fixtures import CSRF


def test_personas_and_csrf(client_as):
    assert client_as(None).get("/maintenance").status_code == 302
    assert client_as(None).get("/api/v1/maintenance").status_code == 401
    for role in ("viewer", "operator", "admin"):
        assert client_as(role).get("/maintenance").status_code == 200
    viewer_html = client_as("viewer").get("/maintenance").get_data(as_text=True)
    assert "Run reap now" not in viewer_html
    assert "Run reap now" in client_as("operator").get("/maintenance").get_data(as_text=True)
    assert client_as("viewer").post("/maintenance/run/reap", data={"csrf_token": CSRF}).status_code == 403
    forged = client_as("operator").post("/maintenance/run/reap")
    assert forged.status_code == 403 and "CSRF" in forged.get_data(as_text=True)
    assert client_as("operator").post("/maintenance/run/vacuum_everything", data={"csrf_token": CSRF}).status_code == 404


def test_never_run_is_amber_and_settings_mask_secrets(client_as):
    data = client_as("viewer").get("/api/v1/maintenance").get_json()
    assert {t["task"]: t["level"] for t in data["tasks"]} == {"archive": "warn", "retention": "warn", "reap": "warn"}
    settings = {f"{s['section']}.{s['key']}": s for s in data["settings"]}
    assert settings["web.secret_key"]["value"] == "********"
    assert settings["database.dsn"]["value"] == "********"
    html = client_as("viewer").get("/maintenance").get_data(as_text=True)
    assert "test-secret-key" not in html and "never run" in html


def test_run_reap_now_rescues_expired_leases_and_is_audited(conn, client_as):
    job_id = q.enqueue(conn, "x", {}, queue="default")
    q.claim(conn, "dead-worker", limit=1, lease=0.01)
    time.sleep(0.05)
    resp = client_as("operator").post("/maintenance/run/reap", data={"csrf_token": CSRF, "reason": "worker host died"})
    assert resp.status_code == 303
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]
        rows = audit.search(conn, action="reap")
        if status == "pending" and rows:
            break
        time.sleep(0.1)
    assert status == "pending"
    assert (rows[0]["actor"], rows[0]["reason"], rows[0]["rows"]) == ("operator", "worker host died", 1)
    data = client_as("viewer").get("/api/v1/maintenance").get_json()
    reap = next(t for t in data["tasks"] if t["task"] == "reap")
    assert reap["level"] == "good" and reap["last"]["rows"] == 1
    assert data["runs"][0]["task"] == "reap"


def test_run_archive_now_via_the_api(conn, client_as):
    old = q.enqueue(conn, "x", {})
    job = q.claim(conn, "w", limit=1)[0]
    q.complete(conn, job)
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 days' WHERE id = %s", (old,))
    resp = client_as("operator").post("/api/v1/maintenance/run/archive", data={"csrf_token": CSRF, "reason": "disk"})
    assert resp.status_code == 202
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (old,)).fetchone()[0] == 0 and audit.search(conn, action="archive"):
            break
        time.sleep(0.1)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (old,)).fetchone()[0] == 0
    assert m.archived_job(conn, old) is not None
    assert audit.search(conn, action="archive")[0]["actor"] == "operator"


def test_failed_last_run_is_red(conn, client_as):
    from console.maintenance import runs

    run_id = runs.start(conn, "archive", "scheduler")
    runs.finish(conn, run_id, "error", error="QueryCanceled: canceling statement due to statement timeout")
    data = client_as("viewer").get("/api/v1/maintenance").get_json()
    archive = next(t for t in data["tasks"] if t["task"] == "archive")
    assert archive["level"] == "bad" and "statement timeout" in archive["note"]
    assert datetime.fromisoformat(data["runs"][0]["started_at"]) > datetime.now(UTC) - timedelta(minutes=1)


def test_in_the_openapi_document(client_as):
    paths = client_as("viewer").get("/api/v1/openapi.json").get_json()["paths"]
    assert "/api/v1/maintenance" in paths and "/api/v1/maintenance/run/{task}" in paths


def _wait_for_reap_audit(conn, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(audit.search(conn, action="reap")) < count:
        time.sleep(0.05)
    assert len(audit.search(conn, action="reap")) >= count


def test_run_now_refuses_a_second_run_while_one_holds_the_task_lock(dsn, conn, client_as):
    from console.maintenance import runs

    operator = client_as("operator")
    with psycopg.connect(dsn, autocommit=True) as other:  # another web worker, mid-run
        assert runs.try_lock(other, "reap")
        resp = operator.post("/maintenance/run/reap", data={"csrf_token": CSRF})
        assert resp.status_code == 409 and b"reap is already running" in resp.data
        api = operator.post("/api/v1/maintenance/run/reap", headers={"X-CSRF-Token": CSRF})
        assert api.status_code == 409 and "already running" in api.get_json()["error"]
        # another task is not held up
        assert operator.post("/api/v1/maintenance/run/archive", data={"reason": "disk"},
                             headers={"X-CSRF-Token": CSRF}).status_code == 202
        runs.unlock(other, "reap")
    assert audit.search(conn, action="reap") == []
    # without it the run starts, and gives the lock back when it ends: a second run also starts
    assert operator.post("/maintenance/run/reap", data={"csrf_token": CSRF}).status_code == 303
    _wait_for_reap_audit(conn, 1)
    deadline = time.monotonic() + 10
    while True:  # the thread unlocks right after the audit row commits
        resp = operator.post("/api/v1/maintenance/run/reap", headers={"X-CSRF-Token": CSRF})
        if resp.status_code == 202 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert resp.status_code == 202
    _wait_for_reap_audit(conn, 2)


def test_run_now_refuses_while_a_run_of_the_task_is_in_progress_elsewhere(dsn, conn, client_as):
    from console.maintenance import runs

    with psycopg.connect(dsn, autocommit=True) as scheduler:  # e.g. the scheduler, mid-reap
        run_id = runs.start(scheduler, "reap", "scheduler")
        resp = client_as("operator").post("/api/v1/maintenance/run/reap", headers={"X-CSRF-Token": CSRF})
        assert resp.status_code == 409
        assert f"run {run_id} by scheduler" in resp.get_json()["error"]
        runs.finish(scheduler, run_id, "ok")
    assert client_as("operator").post("/api/v1/maintenance/run/reap", headers={"X-CSRF-Token": CSRF}).status_code == 202
    _wait_for_reap_audit(conn, 1)


def test_a_jobs_failures_keep_their_last_message_after_a_success(conn, dsn, client_as):
    """"5 failures" with an empty "last error" was the scheduler panel once the job next ran
    well: the latest failure and when it happened stay beside the count."""
    from console import scheduler
    from console.config import load_config

    leader = scheduler.Scheduler(dsn, load_config(env={}))
    try:
        assert leader.elect()
        conn.execute("ALTER TABLE skiplock.jobs RENAME TO jobs_gone")
        try:
            assert leader.run_job("reap") is False
            assert leader.run_job("reap") is False
        finally:
            conn.execute("ALTER TABLE skiplock.jobs_gone RENAME TO jobs")
        assert leader.run_job("reap") is True
    finally:
        leader.close()
    data = client_as("viewer").get("/api/v1/maintenance").get_json()
    [reap] = [j for j in data["scheduler"]["jobs"] if j["job"] == "reap"]
    assert (reap["runs"], reap["failures"], reap["last_error"]) == (3, 2, None)
    assert reap["last_failure"].startswith("UndefinedTable: relation \"skiplock.jobs\" does not exist")
    assert reap["last_failure_at"] is not None and reap["last_failure_at"] < reap["last_ok_at"]
    html = client_as("viewer").get("/maintenance").get_data(as_text=True)
    row = html[html.index('data-job="reap"'):]
    row = row[:row.index("</tr>")]
    assert "UndefinedTable: relation &#34;skiplock.jobs&#34; does not exist" in row and "fine since" in row
    assert 'class="bad"' not in row  # the last run went well: the failure is history, not red


def test_collector_and_source_errors_show_with_their_messages(conn, dsn, client_as):
    """A cycle counts collector_errors / external_source_errors; the page shows each message and
    when, after the next cycle went well too (a lock on the jobs table, a source's missing table)."""
    from console.collectors import Options
    from console.config import ExternalQueue
    from tests.collector_helpers import cycle

    source = ExternalQueue(name="app", system="table", table="public.app_jobs", pending="true")
    options = Options(external=(source,), lock_timeout_ms=100)
    with psycopg.connect(dsn) as ddl:  # VACUUM FULL, a migration: the queue collector times out on the lock
        ddl.execute("LOCK TABLE skiplock.jobs IN ACCESS EXCLUSIVE MODE")
        failed = cycle(dsn, options)
    assert failed.collectors["queue"]["error"] and failed.details["external_sources"]["app"]["error"]
    conn.execute("CREATE TABLE public.app_jobs (id bigint)")
    assert not cycle(dsn, options).details["external_sources"]["app"]["error"]

    data = client_as("viewer").get("/api/v1/maintenance").get_json()["collectors"]
    rows = {(r["kind"], r["name"]): r for r in data}
    queue, app = rows[("collector", "queue")], rows[("external", "app")]
    assert (queue["cycles"], queue["errors"], queue["failing_now"]) == (2, 1, False)
    assert "lock timeout" in queue["last_error"] and queue["last_error_at"]
    assert (app["cycles"], app["errors"], app["failing_now"]) == (2, 1, False)
    assert "public.app_jobs does not exist" in app["last_error"]
    assert rows[("collector", "wal")]["errors"] == 0 and rows[("collector", "wal")]["last_error"] is None
    html = client_as("viewer").get("/maintenance").get_data(as_text=True)
    panel = html[html.index('id="collectors"'):]
    panel = panel[:panel.index("</section>")]
    queue_row = panel[panel.index('data-collector="collector:queue"'):]
    assert "lock timeout" in queue_row[:queue_row.index("</tr>")] and 'class="warn"' in panel
    assert "public.app_jobs does not exist" in panel


def test_a_failed_bulk_operation_shows_its_error_in_the_list_redacted_for_viewers(conn, client_as):
    conn.execute("""INSERT INTO skiplock.bulk_operations (action, selection, actor, reason, state, snapshot_at, total,
                                                          done, batch_size, error)
                    VALUES ('replay', '{"queue": "billing"}', 'alice', 'card fix', 'failed', now(), 40, 12, 10,
                            'QueryCanceled: while replaying a job with token=abc123')""")
    viewer = client_as("viewer").get("/maintenance").get_data(as_text=True)
    ops = viewer[viewer.index('id="operations"'):]
    assert "QueryCanceled: while replaying a job with token=[redacted]" in ops and "abc123" not in viewer
    operator = client_as("operator").get("/maintenance").get_data(as_text=True)
    assert "token=abc123" in operator[operator.index('id="operations"'):]
    api = client_as("viewer").get("/api/v1/maintenance").get_json()["operations"]
    assert api[0]["error"] == "QueryCanceled: while replaying a job with token=[redacted]"
