"""Queues (figures, drain estimate, pause/resume), workers (stale highlighted), the audit log,
panels that time out, and the persona matrix over routes with arguments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.browse import Drain, drain_estimate
from console.maintenance import edit_replay
from console.samples import Sample, store
from console.users import has_role
from tests.web_fixtures import CSRF


@pytest.fixture
def busy(conn):
    for i in range(4):
        q.enqueue(conn, "send_mail", {"n": i}, queue="mail")
    q.enqueue(conn, "send_mail", {"n": 9}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    q.enqueue(conn, "charge", {}, queue="billing", max_attempts=1)
    job = q.claim(conn, "w-1", queues=["billing"], lease=60)[0]
    q.fail(conn, job, RuntimeError("boom"))
    q.enqueue(conn, "charge", {}, queue="billing")
    stuck = q.claim(conn, "w-1", queues=["billing"], lease=0.01)[0]
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - interval '1 minute' WHERE id = %s", (stuck.id,))
    conn.execute("UPDATE skiplock.jobs SET created_at = now() - interval '10 minutes', run_at = now() - interval '10 minutes' WHERE queue = 'mail' AND run_at <= now()")
    return stuck.id


def test_queue_figures_and_tab_state(client_as, busy):
    data = client_as("viewer").get("/api/v1/queues").get_json()
    assert data["source"] == "live"
    by_name = {r["queue"]: r for r in data["queues"]}
    assert by_name["mail"]["eligible"] == 4 and by_name["mail"]["scheduled"] == 1
    assert 590 <= by_name["mail"]["age_seconds"] <= 700
    assert by_name["billing"]["failed"] == 1 and by_name["billing"]["stuck"] == 1
    assert data["tab_state"] == "1 stuck"
    page = client_as("viewer").get("/queues")
    assert b'data-tab-state="1 stuck"' in page.data
    assert b"<title>1 stuck \xc2\xb7 Queues \xc2\xb7 Skiplock</title>" in page.data
    fragment = client_as("viewer").get("/queues/_table")
    assert fragment.status_code == 200 and b"<html" not in fragment.data and b'id="queues-table"' in fragment.data
    assert client_as("viewer").get("/queues/nope").status_code == 404


def test_drain_estimate_from_samples():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert drain_estimate([]).state == "unknown"
    assert drain_estimate([(t0, 0.0)]).state == "empty"
    clearing = drain_estimate([(t0, 1200.0), (t0 + timedelta(minutes=10), 600.0)])
    assert clearing.state == "clearing" and clearing.seconds == pytest.approx(600.0)
    assert "clears in about 10 min" in clearing.text
    growing = drain_estimate([(t0, 100.0), (t0 + timedelta(minutes=5), 400.0)])
    assert growing.state == "growing" and "60.0 jobs/min" in growing.text
    assert drain_estimate([(t0, 5.0), (t0 + timedelta(seconds=10), 4.0)]).state == "unknown"  # too short a span
    assert isinstance(drain_estimate([(t0, 5.0), (t0 + timedelta(minutes=2), 5.0)]), Drain)


def test_drain_estimate_reads_the_collectors_samples(client_as, busy, conn):
    now = datetime.now(UTC)
    store(conn, [Sample("queue_depth", {"queue": "mail", "state": "eligible"}, 24.0, now - timedelta(minutes=6)),
                 Sample("queue_depth", {"queue": "mail", "state": "eligible"}, 4.0, now - timedelta(seconds=30))])
    row = {r["queue"]: r for r in client_as("viewer").get("/api/v1/queues").get_json()["queues"]}["mail"]
    assert row["drain"]["state"] == "clearing" and "clears in about" in row["drain"]["text"]


def test_pause_and_resume_are_audited_posts(client_as, busy, conn):
    client = client_as("operator")
    assert client.post("/queues/mail/pause", data={"csrf_token": CSRF, "reason": "mail provider down"}).status_code == 302
    assert conn.execute("SELECT paused, paused_by FROM skiplock.queues WHERE name = 'mail'").fetchone() == (True, "operator")
    page = client.get("/queues/mail")
    assert b"paused" in page.data and b"Resume" in page.data
    # htmx: the table fragment comes back.
    fragment = client.post("/queues/mail/resume", data={"reason": "provider back"},
                           headers={"X-CSRF-Token": CSRF, "HX-Request": "true"})
    assert fragment.status_code == 200 and b'id="queues-table"' in fragment.data and b"<html" not in fragment.data
    assert conn.execute("SELECT paused FROM skiplock.queues WHERE name = 'mail'").fetchone()[0] is False
    api = client.post("/api/v1/queues/billing/pause", data={"reason": "card outage"}, headers={"X-CSRF-Token": CSRF})
    assert api.status_code == 200 and api.get_json()["paused"] is True
    rows = conn.execute("SELECT actor, action, target, reason FROM skiplock.audit_log WHERE action IN ('pause', 'resume') ORDER BY id").fetchall()
    assert rows == [("operator", "pause", "queue:mail", "mail provider down"), ("operator", "resume", "queue:mail", "provider back"),
                    ("operator", "pause", "queue:billing", "card outage")]
    assert client_as("viewer").post("/queues/mail/pause", data={"csrf_token": CSRF}).status_code == 403
    assert client_as("viewer").get("/queues").data.count(b">Pause<") == 0


def test_workers_page_highlights_stale_workers(client_as, conn, busy):
    conn.execute("""INSERT INTO skiplock.workers (id, host, pid, concurrency, last_seen, in_flight, completed, claim_calls, claim_seconds_sum, claim_histogram)
                    VALUES ('fresh-1', 'h', 1, 4, now(), 2, 100, 10, 0.05, '{0,0,0,5,5}'),
                           ('stale-1', 'h', 2, 4, now() - interval '5 minutes', 1, 5, 0, 0, '{}')""")
    data = client_as("viewer").get("/api/v1/workers").get_json()
    by_id = {w["id"]: w for w in data["workers"]}
    assert by_id["stale-1"]["stale"] is True and by_id["fresh-1"]["stale"] is False
    assert by_id["fresh-1"]["claim_p50"] is not None
    # fresh-1's registry row says 2 in flight; the jobs table holds none of its jobs (the one
    # running job is w-1's, a worker with no row): the table wins
    assert (data["live"], data["stale"], data["in_flight"]) == (1, 1, 0)
    assert data["tab_state"] == "1 stale"
    assert len(data["running"]) == 1
    page = client_as("viewer").get("/workers").data
    assert b'class="stale"' in page and b"stale-1" in page


def test_jobs_in_flight_names_what_gone_workers_still_hold(client_as, conn):
    """The figure counts the live workers' jobs; the running jobs below also list those a
    killed worker still holds until the reaper runs, so the figure says how many beside it. A
    live worker's in flight is read from the jobs table, as the list is: its registry row
    (written once per flush) still says 0 just after a claim."""
    conn.execute("""INSERT INTO skiplock.workers (id, host, pid, concurrency, last_seen, in_flight)
                    VALUES ('fresh-1', 'h', 1, 4, now(), 0), ('gone-1', 'h', 2, 4, now() - interval '5 minutes', 2)""")
    # a broker worker's jobs are in its stream, never in the table: its own count stands
    conn.execute("""INSERT INTO skiplock.workers (id, host, pid, concurrency, last_seen, in_flight, backend)
                    VALUES ('broker-1', 'h', 3, 4, now(), 3, 'nats')""")
    conn.execute("""INSERT INTO skiplock.jobs (kind, status, locked_by, locked_at, lease_until, attempts)
                    SELECT 'k', 'running', w, now(), now() + interval '1 minute', 1
                    FROM unnest(ARRAY['fresh-1', 'gone-1', 'gone-1']) AS w""")
    data = client_as("viewer").get("/api/v1/workers").get_json()
    assert (data["in_flight"], data["held_by_gone"], len(data["running"])) == (1 + 3, 2, 3)
    in_flight = {w["id"]: w["in_flight"] for w in data["workers"]}
    assert (in_flight["fresh-1"], in_flight["broker-1"]) == (1, 3)
    page = client_as("viewer").get("/workers/_table").data.decode()
    assert 'data-held-by-gone="2"' in page and "+ 2 held by gone workers" in page
    assert "<dd>4 <span" in page  # the figure: fresh-1's one and broker-1's three


def test_audit_page_filters_and_pages(client_as, conn, web_settings):
    from console import audit

    for i in range(60):
        audit.record(conn, actor="alice" if i % 2 else "bob", action="replay" if i % 3 else "purge", target=f"job:{i + 1}")
    client = client_as("viewer")
    first = client.get("/api/v1/audit?actor=alice").get_json()
    assert len(first["entries"]) == 30 and first["next"] is None
    everything = client.get("/api/v1/audit").get_json()
    assert len(everything["entries"]) == 50 and everything["next"]
    older = client.get(f"/api/v1/audit?before={everything['next']}").get_json()
    assert len(older["entries"]) == 10
    assert client.get("/api/v1/audit?action=purge&actor=bob").get_json()["entries"][0]["action"] == "purge"
    assert client.get("/audit?before=x").status_code == 400
    assert client.get("/audit?since=tomorrow").status_code == 400
    assert b"job:1" in client.get("/audit?actor=bob").data


def test_a_slow_panel_says_not_available_and_the_page_renders(client_as, conn, busy):
    """Hold a lock the workers query needs: its panel times out, the rest of the page renders."""
    from console.db import connect

    with connect(str(conn.info.dsn), autocommit=False) as locker:
        locker.execute("LOCK TABLE skiplock.workers IN ACCESS EXCLUSIVE MODE")
        page = client_as("viewer").get("/workers")
        locker.rollback()
    assert page.status_code == 200
    assert b"Not available" in page.data
    assert b"Running jobs" in page.data


# --- persona matrix over routes with arguments ----------------------------------------------

ROUTES = [
    # (method, rule with {placeholders}, least role, status for a user who has it)
    ("GET", "/jobs/{job_id}", "viewer", 200),
    ("GET", "/api/v1/jobs/{job_id}", "viewer", 200),
    ("GET", "/jobs/export.{fmt}", "viewer", 200),
    ("GET", "/api/v1/jobs/export.{fmt}", "viewer", 200),
    ("GET", "/queues/{name}", "viewer", 200),
    ("GET", "/api/v1/queues/{name}", "viewer", 200),
    ("POST", "/jobs/{job_id}/{action}", "operator", 302),
    ("POST", "/api/v1/jobs/{job_id}/{action}", "operator", 200),
    ("POST", "/queues/{name}/pause", "operator", 302),
    ("POST", "/queues/{name}/enqueue", "operator", 303),
    ("POST", "/api/v1/jobs", "operator", 201),
    ("POST", "/queues/{name}/resume", "operator", 302),
    ("POST", "/api/v1/queues/{name}/pause", "operator", 200),
    ("POST", "/api/v1/queues/{name}/resume", "operator", 200),
    ("POST", "/queues/{name}/limits", "operator", 302),
    ("PUT", "/api/v1/queues/{name}/limits", "operator", 200),
    ("POST", "/logout", "viewer", 302),
    ("POST", "/admin/users", "admin", 302),
    ("POST", "/admin/users/{name}/{action}", "admin", 302),
    ("POST", "/admin/tokens/{token_id}/revoke", "admin", 302),
    # a pid no backend has: the admin passes the role check and is told it has ended (404)
    ("POST", "/health/backends/{pid}/end", "admin", 404),
    ("POST", "/api/v1/health/backends/{pid}/end", "admin", 404),
    # Fix and replay (a failed job): admins only, on every route (tests/test_edit_replay.py: per field).
    ("GET", "/jobs/{job_id}/edit-replay", "admin", 200),
    ("POST", "/jobs/{job_id}/edit-replay/preview", "admin", 200),
    ("POST", "/jobs/{job_id}/edit-replay/apply", "admin", 303),
    ("POST", "/api/v1/jobs/{job_id}/edit-replay/preview", "admin", 200),
    ("POST", "/api/v1/jobs/{job_id}/edit-replay/apply", "admin", 200),
    ("GET", "/timeline", "viewer", 200),
    ("GET", "/timeline.md", "viewer", 200),
    ("GET", "/api/v1/timeline", "viewer", 200),
    # The exit plan; last, and the move to the backend mail has (a no-op): a move to nats would send
    # the jobs the routes above enqueue to the outbox (tests/test_exit_plan_web.py moves for real).
    ("GET", "/queues/{name}/exit-plan", "viewer", 200),
    ("GET", "/api/v1/queues/{name}/exit-plan", "viewer", 200),
    ("POST", "/queues/{name}/move", "operator", 303),
    ("POST", "/api/v1/queues/{name}/move", "operator", 200),
]


@pytest.mark.parametrize("persona", [None, "viewer", "operator", "admin"])
def test_persona_matrix_with_arguments(client_as, conn, persona):
    for method, rule, role, ok in ROUTES:
        job = q.enqueue(conn, "send_mail", {}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
        client = client_as(persona)
        token_id = conn.execute("INSERT INTO skiplock.api_tokens (user_name, token_sha256) VALUES ('viewer', md5(random()::text)) RETURNING id").fetchone()[0] if persona else 1
        action = "enable" if "/admin/" in rule else "run_now"
        url = rule.format(job_id=job, fmt="csv", name="viewer" if "/admin/" in rule else "mail", action=action, token_id=token_id,
                          pid=2**31 - 2)
        data = {"reason": "persona matrix"}  # the actions that need one (console.actions) get one
        if rule == "/admin/users":
            data.update(name="newbie", role="viewer", password="long-enough-pw")
        if rule == "/queues/{name}/enqueue":
            data.update(kind="send_mail")
        if rule.endswith("/limits"):
            data.update(concurrency="2")
        if rule.endswith("/move"):
            data.update(to="postgres")
        if "/backends/" in rule:
            data.update(mode="cancel", backend_start="2026-12-03T09:00:00+00:00")
        if "/edit-replay" in rule:  # a dead letter, and the version its preview would give
            conn.execute("UPDATE skiplock.jobs SET status = 'failed', finished_at = now() WHERE id = %s", (job,))
            data.update(priority="7", version=edit_replay.preview(conn, job, edit_replay.Edit(priority=7),
                                                                  keys=frozenset()).version)
        body = {"kind": "send_mail", "reason": "matrix"} if rule == "/api/v1/jobs" else None
        response = client.open(url, method=method, headers={"X-CSRF-Token": CSRF}, data=None if body else data, json=body)
        response.get_data()  # consume streamed exports
        response.close()
        if persona is None:
            expected = 302 if method == "GET" and not url.startswith("/api/") else 401
        elif not has_role(persona, role):
            expected = 403
        else:
            expected = ok
        assert response.status_code == expected, f"{persona} {method} {url}: {response.data[:200]!r}"
        if expected == 302 and persona is None:
            assert "/login" in response.headers["Location"]


def test_persona_matrix_covers_every_route(web_app):
    """Every route of this helper's blueprints is in the matrix: argument-free GETs in
    test_web_core's, the rest in ROUTES above."""
    import re

    covered = {re.sub(r"\{\w+\}", "X", rule) for _, rule, _, _ in ROUTES}
    mine = ("auth", "core", "api", "jobs", "queues", "workers", "auditlog", "admin", "editreplay", "timeline", "health",
            "exitplan")
    missing = [
        rule.rule for rule in web_app.url_map.iter_rules()
        if rule.endpoint.split(".")[0] in mine and rule.endpoint != "auth.login"
        and not ("GET" in rule.methods and not rule.arguments)
        and re.sub(r"<[^>]+>", "X", rule.rule) not in covered
    ]
    assert missing == [], f"add these routes to ROUTES: {missing}"


def test_admin_manages_users_and_tokens(client_as, conn):
    client = client_as("admin")
    why = {"csrf_token": CSRF, "reason": "carol joins on-call"}
    assert client.post("/admin/users", data={**why, "name": "carol", "role": "operator", "password": "carol-password"}).status_code == 302
    assert conn.execute("SELECT role FROM skiplock.users WHERE name = 'carol'").fetchone()[0] == "operator"
    bad = client.post("/admin/users", data={**why, "name": "dave", "role": "operator"})
    assert bad.status_code == 400 and b"needs a password" in bad.data
    assert client.post("/admin/users", data={**why, "name": "x y", "role": "viewer", "password": "whatever-pw"}).status_code == 400
    page = client.post("/admin/users/carol/token", data={**why, "label": "deploy"})
    assert page.status_code == 200 and b"skl_" in page.data
    token_id = conn.execute("SELECT id FROM skiplock.api_tokens WHERE user_name = 'carol'").fetchone()[0]
    assert client.post(f"/admin/tokens/{token_id}/revoke", data=why).status_code == 302
    assert client.post(f"/admin/tokens/{token_id}/revoke", data=why).status_code == 409
    assert client.post("/admin/users/admin/disable", data=why).status_code == 409
    assert client.post("/admin/users/carol/disable", data=why).status_code == 302
    assert conn.execute("SELECT disabled FROM skiplock.users WHERE name = 'carol'").fetchone()[0] is True
    actions = [r[0] for r in conn.execute("SELECT action FROM skiplock.audit_log ORDER BY id").fetchall()]
    assert actions == ["user_add", "token_create", "token_revoke", "user_disable"]
    listing = client.get("/api/v1/users").get_json()
    assert {u["name"] for u in listing["users"]} >= {"carol", "admin"}
    assert "token_sha256" not in str(listing)
    assert client_as("operator").get("/admin/users").status_code == 403


def test_queue_figures_stop_at_their_caps(conn):
    from console.browse import queue_figures

    q.enqueue_many(conn, [{"kind": "k", "queue": "big"} for _ in range(30)])
    exact = {r["queue"]: r for r in queue_figures(conn)}["big"]
    assert exact["eligible"] == 30 and exact["pending_capped"] is False
    capped = {r["queue"]: r for r in queue_figures(conn, pending_cap=10)}["big"]
    assert capped["eligible"] == 10 and capped["pending_capped"] is True
