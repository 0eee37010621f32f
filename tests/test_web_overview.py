"""The overview page: verdict, figures, queues, windows, fragments, JSON twin, personas."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console import samples
from console.samples import Sample
from console.web.overview import Latest, sample_verdict
from tests.oncall_data import store_history

PAGES = ["/overview", "/overview/_verdict", "/overview/_figures", "/overview/_queues", "/overview/queue/billing/_charts"]


def test_anonymous_is_sent_to_login_and_every_role_sees_it(client_as):
    assert client_as(None).get("/api/v1/overview").status_code == 401
    for url in PAGES:
        anon = client_as(None).get(url)
        assert anon.status_code == 302 and "/login" in anon.headers["Location"]
        for role in ("viewer", "operator", "admin"):
            resp = client_as(role).get(url)
            assert resp.status_code == 200, (role, url)
            assert resp.headers["Cache-Control"] == "no-store"


def test_bad_window_is_a_400_naming_the_choices(client_as):
    for url in PAGES + ["/api/v1/overview", "/api/v1/overview/queue/billing"]:
        resp = client_as("viewer").get(url + "?window=3d")
        assert resp.status_code == 400, url
        assert "1h, 6h, 24h, 7d" in resp.get_data(as_text=True)


def test_no_samples_says_so_instead_of_guessing(client_as):
    html = client_as("viewer").get("/overview").get_data(as_text=True)
    assert 'data-verdict="unknown"' in html
    assert "is `skiplock scheduler` running?" in html
    assert html.count("No data yet") == 7  # every chart says so


def test_failing_queue_makes_the_verdict_failing_and_leads_the_queues_table(conn, client_as):
    store_history(conn, failing="billing")
    client = client_as("viewer")
    html = client.get("/overview").get_data(as_text=True)
    assert 'data-verdict="failing"' in html
    assert "queue billing: the oldest job has waited" in html
    assert "<title>FAILING · Overview · Skiplock</title>" in html
    # the failing queue comes first in the table, highlighted, with a link to its dead letters
    rows = html.split('data-queue="')[1:]
    assert rows[0].startswith("billing")
    assert "No data yet" not in html
    data = client.get("/api/v1/overview?window=6h").get_json()
    assert data["verdict"]["state"] == "failing" and "samples" in data["verdict"]["source"]
    figures = {f["key"]: f for f in data["figures"]}
    assert set(figures) == {"depth", "age", "throughput", "failures", "claim", "dead_letters", "dead_tuples"}
    assert figures["age"]["level"] == "bad"
    assert figures["claim"]["level"] == "good"
    assert figures["depth"]["unit"] == "jobs"
    assert len(figures["depth"]["series"]) == 3  # split by queue
    # an hour of minute samples in a 6 h window: reduced to 3-minute buckets (120 per window)
    assert 20 <= len(figures["depth"]["series"][0]["points"]) <= 22
    hour = client.get("/api/v1/overview?window=1h").get_json()
    assert len(next(f for f in hour["figures"] if f["key"] == "depth")["series"][0]["points"]) in (60, 61)
    assert data["queues"][0]["queue"] == "billing" and data["queues"][0]["level"] == "bad"


def test_healthy_history_is_healthy(conn, client_as):
    store_history(conn, failing=None)
    data = client_as("viewer").get("/api/v1/overview").get_json()
    assert data["verdict"] == {**data["verdict"], "state": "healthy", "reasons": []}


def test_stale_samples_degrade_a_healthy_verdict(conn, client_as):
    store_history(conn, failing=None, minutes=10, now=datetime.now(UTC) - timedelta(minutes=8))
    v = client_as("viewer").get("/api/v1/overview").get_json()["verdict"]
    assert v["state"] == "degraded"
    assert "old: is `skiplock scheduler` running?" in v["reasons"][0]


def test_fragments_carry_their_own_polling_and_only_their_part(conn, client_as):
    store_history(conn)
    client = client_as("viewer")
    verdict = client.get("/overview/_verdict?window=24h").get_data(as_text=True)
    assert 'hx-get="/overview/_verdict?window=24h"' in verdict and "data-poll" in verdict
    assert 'data-tab-state="FAILING"' in verdict
    assert "<html" not in verdict and "data-figure" not in verdict
    figures = client.get("/overview/_figures?window=7d").get_data(as_text=True)
    assert figures.count("<svg") == 7 and "data-verdict" not in figures
    queue = client.get("/overview/queue/billing/_charts?window=6h").get_data(as_text=True)
    assert queue.count("<svg") == 3 and 'hx-get="/overview/queue/billing/_charts?window=6h"' in queue
    api = client.get("/api/v1/overview/queue/billing").get_json()
    depth = api["figures"][0]
    assert depth["key"] == "depth"
    assert {s["label"] for s in depth["series"]} == {"eligible", "scheduled", "running", "failed"}
    from console import queue as q

    q.enqueue(conn, "charge_card", {}, queue="billing")
    assert 'hx-get="/overview/queue/billing/_charts"' in client.get("/queues/billing").get_data(as_text=True)
    page = client.get("/overview?window=24h").get_data(as_text=True)
    for frag in ("_verdict", "_figures", "_queues"):
        assert f'hx-get="/overview/{frag}?window=24h"' in page


def test_a_timed_out_panel_says_not_available_and_the_page_renders(conn, client_as, monkeypatch):
    store_history(conn)
    from console.web import overview

    def slow(conn_, latest, **kwargs):
        conn_.execute("SELECT pg_sleep(2)")

    monkeypatch.setattr(overview, "queues_data", slow)
    monkeypatch.setattr("console.web.database.timeout_ms", lambda: 200)
    resp = client_as("viewer").get("/overview")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200
    assert "Not available: the query took longer than 200 ms" in html
    assert 'data-verdict="failing"' in html


def test_sample_verdict_rules():
    now = datetime.now(UTC)
    ok = Latest([Sample("queue_age_seconds", {"queue": "a"}, 3, now),
                 Sample("throughput", {"outcome": "completed"}, 10, now),
                 Sample("throughput", {"outcome": "failed"}, 0.1, now)])
    assert sample_verdict(ok) == ("healthy", [])
    slowish = Latest(ok.rows + [Sample("queue_age_seconds", {"queue": "b"}, 90, now)])
    state, reasons = sample_verdict(slowish)
    assert state == "degraded" and reasons == ["queue b: the oldest job has waited 1 min 30 s"]
    no_workers = Latest(ok.rows + [Sample("workers_live", {}, 0, now),
                                   Sample("queue_depth", {"queue": "a", "state": "eligible"}, 12, now)])
    assert sample_verdict(no_workers) == ("failing", ["no live workers and 12 jobs waiting"])
    failing = Latest([Sample("throughput", {"outcome": "completed"}, 1, now),
                      Sample("throughput", {"outcome": "failed"}, 3, now)])
    assert sample_verdict(failing) == ("failing", ["75.0 % of finished jobs are failing"])


def test_dead_rows_count_only_when_autovacuum_is_behind():
    """A small table is mostly dead rows after each archiver batch; that alone is not news. The
    autovacuum_behind rule (dead rows past the threshold, no vacuum running) is, as a warning."""
    now = datetime.now(UTC)

    def table(dead, threshold, behind, removed_nothing=0.0):
        return Latest([Sample("table_dead_ratio", {"table": "jobs"}, 0.9, now),
                       Sample("table_dead_tuples", {"table": "jobs"}, dead, now),
                       Sample("table_autovacuum_threshold", {"table": "jobs"}, threshold, now),
                       Sample("table_autovacuum_behind", {"table": "jobs"}, behind, now),
                       Sample("vacuum_removed_nothing", {"table": "jobs"}, removed_nothing, now)])

    assert sample_verdict(table(dead=421, threshold=50, behind=0)) == ("healthy", [])
    assert sample_verdict(table(dead=90_000, threshold=5000, behind=1)) == (
        "degraded", ["90 k dead rows in the jobs table, past its autovacuum threshold of 5,000, "
                     "and no vacuum is running"])
    # Vacuum ran and removed nothing: the cause is the horizon, not autovacuum (seen in the demo,
    # where the banner said "no vacuum is running" beside a vacuum that had just run).
    assert sample_verdict(table(dead=7_325, threshold=5000, behind=1, removed_nothing=1.0)) == (
        "degraded", ["7,325 dead rows in the jobs table, past its autovacuum threshold of 5,000, "
                     "and vacuum ran but removed none of them: something holds the xmin horizon"])


def test_overview_is_in_the_openapi_document(client_as):
    doc = client_as("viewer").get("/api/v1/openapi.json").get_json()
    op = doc["paths"]["/api/v1/overview"]["get"]
    assert [p["name"] for p in op["parameters"]] == ["window"]
    assert op["parameters"][0]["schema"]["enum"] == ["1h", "6h", "24h", "7d"]


def test_home_redirects_to_the_overview(client_as):
    resp = client_as("viewer").get("/")
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/overview")


def test_samples_store_roundtrip_used_by_the_page(conn):
    store_history(conn, minutes=2)
    assert {s.metric for s in samples.latest(conn)} >= {"queue_depth", "throughput", "table_dead_tuples"}


def test_firing_alerts_lead_the_verdict_and_silenced_ones_do_not(conn, client_as):
    store_history(conn, failing=None, minutes=3)
    conn.execute("""INSERT INTO skiplock.alerts (rule, labels, state, value, fired_at)
                    VALUES ('workers_zero', '{}', 'firing', 0, now() - interval '3 minutes')""")
    client = client_as("viewer")
    data = client.get("/api/v1/overview").get_json()
    assert data["verdict"]["state"] == "failing" and data["verdict"]["source"].startswith("alerts")
    assert [a["rule"] for a in data["alerts"]] == ["workers_zero"]
    html = client.get("/overview").get_data(as_text=True)
    assert 'id="firing-alerts"' in html and "critical" in html
    conn.execute("""INSERT INTO skiplock.alert_silences (rule, labels, ends_at, created_by, reason)
                    VALUES ('workers_zero', '{}', now() + interval '1 hour', 'operator', 'deploy')""")
    assert client.get("/api/v1/overview").get_json()["verdict"]["state"] == "healthy"


def test_the_failures_card_says_over_which_window_its_ratio_is(conn, client_as):
    """The card's headline is the last collection interval's rate, often 0 between two failures;
    its note is the share over the rate window. Without the window the two read as a
    contradiction ("0 jobs/s", "1.4 % of finished jobs")."""
    store_history(conn, failing=None, minutes=3)
    samples.store(conn, [Sample("failure_ratio", {}, 0.014, datetime.now(UTC))])
    figures = {f["key"]: f for f in client_as("viewer").get("/api/v1/overview").get_json()["figures"]}
    assert figures["failures"]["note"] == "1.4 % of finished jobs in the last 15 min"
