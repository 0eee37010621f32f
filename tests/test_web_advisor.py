"""The advisor page and /api/v1/advisor: every check with its state and evidence, the verdict,
provoked faults shown as failures, roles, and bad input as a 400."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.advisor import report as stored_run
from console.samples import Sample, store
from tests.web_fixtures import CSRF


def test_the_page_lists_every_check_and_the_verdict(client_as, conn):
    q.enqueue(conn, "email", {})
    page = client_as("viewer").get("/advisor")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="ok"' in html
    assert 'data-check="wal-replicas"' in html
    assert 'data-verdict="not enough history"' in html
    assert "no samples stored yet" in html
    assert page.headers["Cache-Control"] == "no-store"
    assert "<details>" in html  # a passing check's evidence is folded away...
    linked = client_as("viewer").get("/advisor?check=claim-plan").get_data(as_text=True)  # ...unless linked to
    row = linked[linked.index('data-check="claim-plan" data-status="ok"'):]
    row = row[:row.index("</tr>")]
    assert "<details open>" in row and "check-evidence" in row


def test_a_dropped_claim_index_shows_as_a_failure_with_evidence_and_remedy(client_as, conn):
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    html = client_as("viewer").get("/advisor").get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="fail"' in html
    assert "no index matches the claim" in html
    assert "CREATE INDEX CONCURRENTLY jobs_claim_idx" in html
    assert "<title>1 failing" in html
    fragment = client_as("viewer").get("/advisor/_checks").get_data(as_text=True)
    assert fragment.startswith('<div id="advisor-checks"') and 'data-status="fail"' in fragment


def test_the_api_mirrors_the_page(client_as, conn):
    conn.execute("INSERT INTO skiplock.jobs (kind, max_attempts) VALUES ('poison', 1000000)")
    data = client_as("viewer").get("/api/v1/advisor").get_json()
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["retry-caps"]["status"] == "fail"
    assert any("kind poison" in line for line in by_id["retry-caps"]["evidence"])
    assert by_id["retry-caps"]["docs"] == "docs/advisor.md#retry-caps"
    assert data["worst"] == "fail" and data["counts"]["fail"] >= 1
    assert data["verdict"]["label"] == "not enough history"
    only = client_as("viewer").get("/api/v1/advisor?check=retry-caps,notify-queue").get_json()
    assert [c["id"] for c in only["checks"]] == ["retry-caps", "notify-queue"]


def test_the_verdict_on_the_page_follows_the_stored_history(client_as, conn):
    now = datetime.now(UTC)
    rows = []
    for i in range(49):
        at = now - timedelta(hours=48 - i)
        rows.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": "p95"}, 0.003 + 0.002 * i, at))
        rows.append(Sample("table_autovacuum_behind", {"table": "jobs"}, 1.0 if i > 20 else 0.0, at))
    store(conn, rows)
    data = client_as("viewer").get("/api/v1/advisor").get_json()["verdict"]
    assert data["label"] == "outgrowing PostgreSQL"
    html = client_as("viewer").get("/advisor").get_data(as_text=True)
    assert 'data-verdict="outgrowing PostgreSQL"' in html
    assert 'data-signal="claim-latency"' in html and "claim latency went from" in html


def test_the_page_states_the_minimums_and_names_a_known_cause_instead_of_outgrowing(client_as, conn):
    """Twenty minutes of history: the verdict says so as "N of M", and the signal's row names the
    operator's replay that came just before the claims grew dearer, with its fix."""
    now = datetime.now(UTC)
    labels = {"queue": "all", "source": "workers", "quantile": "p95"}
    store(conn, [Sample("claim_latency_seconds", labels, 0.004 if i < 40 else 0.04, now - timedelta(seconds=15 * (80 - i)))
                 for i in range(81)])
    conn.execute("INSERT INTO skiplock.audit_log (at, actor, action, target, rows) "
                 "VALUES (now() - interval '11 minutes', 'alice', 'replay', 'operation:7', 20000)")
    html = client_as("viewer").get("/advisor").get_data(as_text=True)
    assert 'data-verdict="not enough history"' in html
    assert "Not enough history yet (20 min of 1 h of samples)" in html
    minimums = html[html.index('id="advisor-minimums"'):]
    assert "needs 6 h and 6 sampling points of the signal&#39;s own history" in minimums[:minimums.index("</p>")]
    assert "This history: 20 min." in minimums[:minimums.index("</p>")]
    row = html[html.index('data-signal="claim-latency"'):]
    row = row[:row.index("</tr>")]
    assert 'data-cause="operator-change"' in row and "known cause" in row
    assert "Known cause:</strong> an operator&#39;s change shortly before: alice ran &#39;replay&#39; on operation:7" in row
    assert "(81 sampling points over 20 min)" in row
    verdict = client_as("viewer").get("/api/v1/advisor").get_json()["verdict"]
    assert verdict["minimums"]["outgrowing_s"] == 6 * 3600 and verdict["minimums"]["outgrowing_points"] == 6
    [latency] = [s for s in verdict["signals"] if s["id"] == "claim-latency"]
    assert latency["level"] == "watch" and latency["cause"]["kind"] == "operator-change" and "held" not in latency


def test_an_unknown_check_is_a_400_and_anonymous_visitors_are_sent_to_sign_in(client_as):
    bad = client_as("viewer").get("/api/v1/advisor?check=claim-plna")
    assert bad.status_code == 400
    assert "unknown check claim-plna" in bad.get_json()["error"]
    assert client_as("viewer").get("/advisor?check=nope").status_code == 400
    assert client_as(None).get("/advisor").status_code in (302, 401)
    assert client_as(None).get("/api/v1/advisor").status_code == 401


@pytest.mark.browser
def test_in_the_browser_a_fixed_fault_turns_green_without_a_reload(page, live_server, personas, conn, web_app):
    from tests.test_web_browser import shot, sign_in

    q.enqueue(conn, "email", {})
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    scheduler_cycle(web_app, conn)
    sign_in(page, live_server, "viewer", "/advisor")
    row = page.locator('tr[data-check="claim-plan"]')
    assert row.get_attribute("data-status") == "fail"
    assert "no index matches the claim" in row.inner_text()
    assert page.title().startswith("1 failing")
    assert page.locator("[data-verdict]").inner_text() == "Not enough history"
    shot(page, "advisor")
    conn.execute("CREATE INDEX jobs_claim_idx ON skiplock.jobs (priority DESC, run_at, id) "
                 "INCLUDE (queue) WHERE status = 'pending'")
    # The scheduler stores a new run every collection cycle; the next poll shows it.
    scheduler_cycle(web_app, conn)
    page.wait_for_selector('tr[data-check="claim-plan"][data-status="ok"]', timeout=15_000)  # the fragment polls
    assert not page.title().startswith("1 failing")
    assert "1 failing" not in page.title()
    assert "Re-run checks" not in page.content()  # a viewer has no button


@pytest.mark.browser
def test_in_the_browser_an_operator_re_runs_the_checks_with_the_button(page, live_server, personas, conn, web_app):
    from tests.test_web_browser import sign_in

    q.enqueue(conn, "email", {})
    scheduler_cycle(web_app, conn)
    sign_in(page, live_server, "operator", "/advisor")
    assert page.locator('tr[data-check="claim-plan"]').get_attribute("data-status") == "ok"
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    page.wait_for_timeout(1500)  # a few polls: they show the stored run, still green
    assert page.locator('tr[data-check="claim-plan"]').get_attribute("data-status") == "ok"
    page.click("#advisor-rerun")
    page.wait_for_selector('tr[data-check="claim-plan"][data-status="fail"]', timeout=15_000)
    assert "re-run by operator" in page.locator("#advisor-checked").inner_text()


def scheduler_cycle(web_app, conn):
    """What the scheduler's `advisor` job does every collection cycle: run and store."""
    stored_run.refresh(conn, web_app.extensions["skiplock"].config)


def test_pages_show_the_stored_run_and_only_the_scheduler_or_an_operator_stores_one(client_as, conn, web_app):
    q.enqueue(conn, "email", {})
    viewer = client_as("viewer")
    # No run stored yet: the page runs the checks for itself, in a transaction it rolls back.
    html = viewer.get("/advisor").get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="ok"' in html and "no run is stored yet" in html
    assert conn.execute("SELECT count(*) FROM skiplock.advisor_snapshots").fetchone()[0] == 0
    # The scheduler's cycle stores one; polls show it, not a new run.
    scheduler_cycle(web_app, conn)
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    fragment = viewer.get("/advisor/_checks").get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="ok"' in fragment  # the stored run, not a new one
    assert "s ago (the scheduler's run)" in fragment and "the checks cost" in fragment
    stored = conn.execute("SELECT data FROM skiplock.advisor_snapshots WHERE name = 'report'").fetchone()[0]
    assert stored["duration_ms"] > 0 and len(stored["report"]["checks"]) >= 10
    api = viewer.get("/api/v1/advisor").get_json()
    assert api["checked"]["duration_ms"] == stored["duration_ms"] and api["checked"]["age_s"] >= 0
    assert api["checked"]["stored"] is True and api["checked"]["stale"] is False
    # A viewer may not force a run; an operator may, with a POST; a GET never runs them.
    assert viewer.post("/advisor/run", headers={"X-CSRF-Token": CSRF}).status_code == 403
    assert viewer.post("/api/v1/advisor/run", headers={"X-CSRF-Token": CSRF}).status_code == 403
    operator = client_as("operator")
    refused = operator.get("/api/v1/advisor?fresh=1")
    assert refused.status_code == 400 and "POST /api/v1/advisor/run" in refused.get_json()["error"]
    done = operator.post("/advisor/run", headers={"X-CSRF-Token": CSRF, "HX-Request": "true"})
    assert done.status_code == 200
    html = done.get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="fail"' in html and "re-run by operator" in html
    assert 'data-check="claim-plan" data-status="fail"' in viewer.get("/advisor").get_data(as_text=True)
    # Fixed, and the run ages: polls keep showing it (flagged once two cycles old) until a cycle stores a new one.
    conn.execute("CREATE INDEX jobs_claim_idx ON skiplock.jobs (priority DESC, run_at, id) "
                 "INCLUDE (queue) WHERE status = 'pending'")
    conn.execute("UPDATE skiplock.advisor_snapshots SET taken_at = now() - interval '1 hour' WHERE name = 'report'")
    fragment = viewer.get("/advisor/_checks").get_data(as_text=True)
    assert 'data-check="claim-plan" data-status="fail"' in fragment and "data-stale" in fragment
    scheduler_cycle(web_app, conn)
    assert 'data-check="claim-plan" data-status="ok"' in viewer.get("/advisor/_checks").get_data(as_text=True)
    api = operator.post("/api/v1/advisor/run", headers={"X-CSRF-Token": CSRF}, query_string={"check": "claim-plan"})
    assert api.status_code == 200 and [c["id"] for c in api.get_json()["checks"]] == ["claim-plan"]
    assert api.get_json()["checked"]["checked_by"] == "operator"
