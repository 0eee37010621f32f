"""The Periodic page and its API: schedules listed with last run, next run and missed slots;
pause/resume and run now for operators only, with CSRF, audited; the metrics in /metrics."""

from __future__ import annotations

from playwright.sync_api import expect

from console import collectors
from console.queue import periodic
from tests.web_fixtures import CSRF


def declare(conn):
    declared = periodic.parse_entries([("[[periodic]] #1", {"name": "nightly-report", "kind": "reports.build",
                                        "queue": "reports", "cron": "0 3 * * 1-5", "timezone": "Europe/Berlin"}, "config")])
    periodic.sync(conn, declared)
    periodic.enqueue_due(conn, declared)
    return declared


def test_the_page_and_the_api_show_each_schedule(client_as, conn):
    declare(conn)
    job_id = periodic.run_now(conn, "nightly-report", actor="operator")
    page = client_as("viewer").get("/periodic")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "nightly-report" in html and "weekdays at 03:00 (Europe/Berlin)" in html and "Run now" not in html
    data = client_as("viewer").get("/api/v1/periodic").get_json()
    [row] = data["schedules"]
    assert row["name"] == "nightly-report" and row["schedule"] == "weekdays at 03:00 (Europe/Berlin)"
    assert row["last_run_job_id"] == job_id and row["last_run_status"] == "pending" and row["last_run_manual"] is True
    assert row["next_slot"] is not None and row["missed"] == 0 and row["paused"] is False
    assert "Run now" in client_as("operator").get("/periodic").get_data(as_text=True)


def test_pause_resume_and_run_now_need_an_operator_and_csrf_and_are_audited(client_as, conn):
    declare(conn)
    viewer, operator = client_as("viewer"), client_as("operator")
    assert viewer.post("/periodic/nightly-report/pause", data={"csrf_token": CSRF}).status_code == 403
    assert operator.post("/periodic/nightly-report/pause", data={"reason": "test run"}).status_code == 403  # no CSRF token
    assert conn.execute("SELECT paused FROM skiplock.periodic").fetchone()[0] is False

    answer = operator.post("/periodic/nightly-report/pause", data={"csrf_token": CSRF, "reason": "quarter close"},
                           headers={"HX-Request": "true"})
    assert answer.status_code == 200 and "paused" in answer.get_data(as_text=True)
    assert conn.execute("SELECT paused, paused_by FROM skiplock.periodic").fetchone() == (True, "operator")
    assert operator.post("/periodic/nightly-report/resume", data={"csrf_token": CSRF}).status_code == 302
    assert conn.execute("SELECT paused FROM skiplock.periodic").fetchone()[0] is False
    ran = operator.post("/api/v1/periodic/nightly-report/run", data={"reason": "re-run"}, headers={"X-CSRF-Token": CSRF})
    assert ran.status_code == 201
    job_id = ran.get_json()["job_id"]
    assert conn.execute("SELECT kind, queue FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone() == ("reports.build", "reports")
    audit = conn.execute("SELECT actor, action, target, reason FROM skiplock.audit_log ORDER BY id").fetchall()
    assert audit == [("operator", "periodic_pause", "periodic:nightly-report", "quarter close"),
                     ("operator", "periodic_resume", "periodic:nightly-report", None),
                     ("operator", "periodic_run_now", "periodic:nightly-report", "re-run")]
    missing = operator.post("/api/v1/periodic/nope/pause", headers={"X-CSRF-Token": CSRF})
    assert missing.status_code == 404 and "nope" in missing.get_json()["error"]


def test_metrics_expose_the_late_ratio_and_missed_slots(client_as, conn, dsn):
    declare(conn)
    conn.execute("UPDATE skiplock.periodic SET created_at = now() - interval '10 days', missed = 2")
    collectors.collect_once(dsn)
    body = client_as(None).get("/metrics").get_data(as_text=True)
    assert 'skiplock_periodic_missed_total{database="default",name="nightly-report"} 2.0' in body
    ratio = next(line for line in body.splitlines() if line.startswith('skiplock_periodic_late_ratio{database="default",name="nightly-report"}'))
    assert float(ratio.split()[-1]) > 2  # weekdays: the longest gap is 3 days; 10 days without success
    assert "skiplock_periodic_interval_seconds" in body


def test_screenshot_of_the_periodic_page(live_server, page, conn, personas, tmp_path):
    declare(conn)
    declared = periodic.parse_entries([("#2", {"name": "cleanup", "kind": "cleanup", "every": "10m"}, "config")])
    periodic.sync(conn, [*declare(conn), *declared])
    periodic.enqueue_due(conn, declared)
    periodic.set_paused(conn, "cleanup", True, actor="operator")
    page.goto(f"{live_server}/login")
    page.fill("input[name=name]", "operator")
    page.fill("input[name=password]", "correct horse battery staple")
    page.click("button[type=submit]")
    page.goto(f"{live_server}/periodic")
    page.wait_for_selector("#periodic-table table")
    page.get_by_role("button", name="Run now").first.click()
    # expect() polls from Playwright's side: a string predicate would need eval, which the CSP refuses
    expect(page.locator("#periodic-table")).to_contain_text("by hand", timeout=10000)
    page.screenshot(path=str(tmp_path / "periodic.png"), full_page=True)
    assert conn.execute("SELECT count(*) FROM skiplock.periodic_runs WHERE manual").fetchone()[0] == 1
