"""The Queues and Alerts pages at width read what they show, not every queue's and alert's rows
(issue 31, target 1: every page p95 < 300 ms at 5,000 queues; docs/benchmarks.md). What they
show must not change: the alerts' pages are the full list's order cut into pages, and the
queues' drain estimates and colours are read for the rows shown only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

import pytest

from console import browse, samples
from console import queue as q
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.config import load_config
from console.samples import Sample


def _name(alert) -> str:
    return " ".join([alert["rule"], *(f"{k}={v}" for k, v in alert["labels"].items())])


@pytest.fixture
def alerts(conn):
    """70 active alerts (and a few ok ones): rules of each severity and one the rule set no longer
    has, firing and pending, ties in state_since (the id breaks them), one silenced."""
    conn.execute("""
        INSERT INTO skiplock.alerts (rule, labels, state, state_since, value)
        SELECT (ARRAY['queue_age', 'stuck_leases', 'gone_rule', 'workers_zero', 'dead_letter_growth'])[1 + i % 5],
               jsonb_build_object('queue', 'q' || lpad(i::text, 3, '0'), 'system', 'skiplock'),
               CASE WHEN i % 3 = 0 THEN 'pending' WHEN i % 11 = 0 THEN 'ok' ELSE 'firing' END,
               date_trunc('second', now()) - make_interval(mins => (i * 7) % 4),
               i
        FROM generate_series(1, 77) AS i""")
    ev.silence(conn, rule=None, labels={"queue": "q012"}, duration=timedelta(hours=1), reason="test",
               actor="tester")
    ruleset = r.load(conn, load_config(env={}))
    return ev.active_alerts(conn, ruleset)  # the whole list, as the page read it before


@pytest.mark.parametrize("args", ["", "page=2&limit=20", "page=4&limit=20", "limit=7&page=3", "page=99",
                                  "q=Q01", "q=q01&limit=3&page=2", "q=stuck_leases%20queue=q0", "q=gone", "q=nothing"])
def test_the_alerts_api_pages_the_full_list_in_its_order(client_as, alerts, args):
    body = client_as("viewer").get(f"/api/v1/alerts?{args}").get_json()
    params = dict(unquote(p).split("=", 1) for p in args.split("&") if p)
    query, page, limit = params.get("q"), int(params.get("page", 1)), int(params.get("limit", 100))
    matching = [a for a in alerts if not query or query.lower() in _name(a).lower()]
    expected = matching[(page - 1) * limit:page * limit]
    assert [a["id"] for a in body["alerts"]] == [a["id"] for a in expected]
    assert (body["total"], body["more"], body["firing"], body["pending"]) == (
        len(matching), len(matching) - len(expected), sum(a["state"] == "firing" for a in alerts),
        sum(a["state"] == "pending" for a in alerts))
    for got, old in zip(body["alerts"], expected, strict=True):
        for key in ("rule", "state", "severity", "summary", "runbook", "condition", "value"):
            assert got[key] == old[key], key
        assert got["silence_id"] == (old["silence"] or {}).get("id")
    assert len(alerts) == 72 and any(a["silence"] for a in alerts)


def test_the_alerts_page_shows_the_same_rows_as_its_api(client_as, alerts):
    viewer = client_as("viewer")
    html = viewer.get("/alerts?page=2&limit=25").get_data(as_text=True)
    api = viewer.get("/api/v1/alerts?page=2&limit=25").get_json()
    shown = [a["labels"]["queue"] for a in api["alerts"]]
    assert shown == [a["labels"]["queue"] for a in alerts[25:50]]
    positions = [html.index(f"queue={name}") if f"queue={name}" in html else html.index(name) for name in shown]
    assert positions == sorted(positions)
    assert f"{len(alerts) - 25:,} more alerts not shown" in html


def test_the_queues_page_reads_backlog_and_colours_for_its_rows_only(client_as, conn, monkeypatch):
    """Each shown queue's drain estimate from its own backlog samples, ending at the live count;
    the queues not shown are not read (at 5,000 queues that read was 15 minutes of every
    queue's samples)."""
    now = datetime.now(UTC)
    for i in range(13):  # twelve minutes of cycles: one queue growing, one clearing, one empty
        samples.store(conn, [
            Sample("queue_depth", {"queue": "growing", "system": "skiplock", "state": "eligible"}, 10.0 + 5 * i),
            Sample("queue_depth", {"queue": "clearing", "system": "skiplock", "state": "eligible"}, 300.0 - 20 * i),
            Sample("queue_depth", {"queue": "empty", "system": "skiplock", "state": "eligible"}, 0.0),
            Sample("dead_letter_growth", {"queue": "clearing", "system": "skiplock"}, 500.0),
        ], at=now - timedelta(minutes=12 - i))
    for _ in range(60):  # the live counts: clearing's jobs have waited longest
        q.enqueue(conn, "k", {}, queue="clearing")
    for _ in range(70):
        q.enqueue(conn, "k", {}, queue="growing")
    asked: list[list[str] | None] = []
    real = browse.backlog_points

    def spy(conn, *args, queues=None, **kwargs):
        asked.append(queues)
        return real(conn, *args, queues=queues, **kwargs)

    monkeypatch.setattr(browse, "backlog_points", spy)
    viewer = client_as("viewer")
    body = viewer.get("/api/v1/queues?limit=2").get_json()
    assert body["total"] == 3 and [row["queue"] for row in body["queues"]] == ["clearing", "growing"]
    assert asked == [["clearing", "growing"]]
    clearing, growing = body["queues"]
    assert clearing["drain"]["state"] == "clearing" and growing["drain"]["state"] == "growing"
    assert clearing["drain"]["net_per_second"] == pytest.approx((60 - 300) / 720, rel=0.02)
    assert growing["drain"]["net_per_second"] == pytest.approx((70 - 10) / 720, rel=0.02)
    assert clearing["dead_letter_growth"] == 500.0 and growing["dead_letter_growth"] is None
    second = viewer.get("/api/v1/queues?limit=2&page=2").get_json()
    assert [row["queue"] for row in second["queues"]] == ["empty"] and second["queues"][0]["drain"]["state"] == "empty"
    assert asked[-1] == ["empty"]


def test_search_reads_the_queue_names_the_queues_page_lists(conn, client_as):
    """Search matched the names of queue_figures' rows (every queue's figures computed to be
    thrown away); it reads the names alone, the same set."""
    from console.maintenance import pause_queue

    for name in ("pending-only", "running-too"):
        q.enqueue(conn, "k", {}, queue=name)
    q.claim(conn, "w-1", queues=["running-too"], lease=60)
    job = q.enqueue(conn, "k", {}, queue="failing", max_attempts=1)
    q.fail(conn, q.claim(conn, "w-1", queues=["failing"], lease=60)[0], RuntimeError("boom"))
    pause_queue(conn, "paused-empty", actor="tester", reason="test", create=True)
    assert job and browse.queue_names(conn) == {r["queue"] for r in browse.queue_figures(conn)} == {
        "pending-only", "running-too", "failing", "paused-empty"}
    assert browse.queue_names(conn, pending_cap=1, failed_cap=0) == \
        {r["queue"] for r in browse.queue_figures(conn, pending_cap=1, failed_cap=0)}
    found = client_as("viewer").get("/api/v1/search?q=ING").get_json()
    assert sorted(m["label"] for m in found["matches"] if m["type"] == "queue") == ["failing", "pending-only", "running-too"]
