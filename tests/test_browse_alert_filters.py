"""The jobs browser's filters that alerts link to: `eligible=1` (pending and due now, claim
order) and `lease=expired` (running past the lease). Validated, bound, and each an index scan."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from console import browse
from console import queue as q
from console.browse import InvalidFilter, JobFilter, count_jobs, list_jobs


@pytest.fixture
def mixed(conn):
    """search: 3 eligible (the oldest at the lowest priority), 1 due in an hour; mail: 1 eligible;
    work: 2 running with expired leases, 1 running with a live lease."""
    now = datetime.now(UTC)
    ids = {"eligible": [], "later": [], "other_queue": [], "expired": [], "live": []}
    ids["eligible"].append(q.enqueue(conn, "index", {"n": 0}, queue="search", run_at=now - timedelta(minutes=9), priority=-1))
    ids["eligible"].append(q.enqueue(conn, "index", {"n": 1}, queue="search", run_at=now - timedelta(minutes=5)))
    ids["eligible"].append(q.enqueue(conn, "index", {"n": 2}, queue="search", run_at=now - timedelta(minutes=1)))
    ids["later"].append(q.enqueue(conn, "index", {"n": 3}, queue="search", run_at=now + timedelta(hours=1)))
    ids["other_queue"].append(q.enqueue(conn, "send", {}, queue="mail", run_at=now - timedelta(minutes=20)))
    for _ in range(3):
        q.enqueue(conn, "crunch", {}, queue="work")
    claimed = q.claim(conn, "w-1", queues=["work"], limit=3, lease=600)
    stuck = claimed[:2]
    conn.execute("UPDATE skiplock.jobs SET lease_until = now() - make_interval(secs => 60 * (2 - n.i)) "
                 "FROM unnest(%s::bigint[]) WITH ORDINALITY AS n(id, i) WHERE jobs.id = n.id",
                 ([j.id for j in stuck],))
    ids["expired"] = [j.id for j in stuck]
    ids["live"] = [claimed[2].id]
    return ids


def ids_of(page) -> list[int]:
    return [r["id"] for r in page.rows]


def test_eligible_lists_due_pending_jobs_of_the_queue_in_claim_order(conn, mixed):
    f = JobFilter.parse({"queue": "search", "eligible": "1"})
    assert f.state == "pending" and f.eligible is True
    page = list_jobs(conn, f)
    # claim order: priority first, then oldest run_at: the priority -1 job comes last
    assert ids_of(page) == [mixed["eligible"][1], mixed["eligible"][2], mixed["eligible"][0]]
    assert count_jobs(conn, f).n == 3
    everywhere = ids_of(list_jobs(conn, JobFilter.parse({"eligible": "1"})))
    assert set(everywhere) == set(mixed["eligible"] + mixed["other_queue"])


def test_expired_lists_running_jobs_past_their_lease_longest_expired_first(conn, mixed):
    f = JobFilter.parse({"lease": "expired"})
    assert f.state == "running"
    assert ids_of(list_jobs(conn, f)) == mixed["expired"]
    assert ids_of(list_jobs(conn, JobFilter.parse({"lease": "expired", "queue": "work", "state": "running"}))) == mixed["expired"]
    assert count_jobs(conn, f).n == 2
    assert ids_of(list_jobs(conn, JobFilter.parse({"lease": "expired", "queue": "search"}))) == []


def test_filters_round_trip_through_query_arguments(conn, mixed):
    f = JobFilter.parse({"queue": "search", "eligible": "1"})
    assert f.as_args() == {"state": "pending", "queue": "search", "eligible": "1"}
    assert JobFilter.parse(f.as_args()) == f
    assert JobFilter.parse({"eligible": "0"}).eligible is None


@pytest.mark.parametrize("args, message", [
    ({"eligible": "1", "state": "running"}, "only pending jobs can be eligible"),
    ({"eligible": "yes please"}, "eligible: 'yes please' is not 1 or 0"),
    ({"lease": "expired", "state": "failed"}, "only running jobs hold a lease"),
    ({"lease": "soon"}, "lease: 'soon' is not a lease filter"),
    ({"eligible": "1", "lease": "expired"}, "eligible and lease cannot be combined"),
])
def test_bad_values_are_refused_with_the_field_named(args, message):
    with pytest.raises(InvalidFilter, match=message):
        JobFilter.parse(args)


@pytest.mark.parametrize("args, message", [
    ("eligible=1&state=failed", "only pending jobs can be eligible"),
    ("lease=forever", "is not a lease filter"),
])
def test_bad_values_get_400_from_the_page_and_the_api(client_as, args, message):
    client = client_as("viewer")
    for url in (f"/jobs?{args}", f"/api/v1/jobs?{args}"):
        response = client.get(url)
        assert response.status_code == 400, url
        assert message in response.get_data(as_text=True)


def test_the_page_and_api_show_only_the_offending_jobs(client_as, mixed):
    client = client_as("viewer")
    body = client.get("/api/v1/jobs?state=running&lease=expired").get_json()
    assert [j["id"] for j in body["jobs"]] == mixed["expired"] and body["count"]["n"] == 2
    html = client.get("/jobs?queue=search&eligible=1").get_data(as_text=True)
    for job_id in mixed["eligible"]:
        assert f">{job_id}</a>" in html
    for job_id in mixed["later"] + mixed["other_queue"] + mixed["live"]:
        assert f">{job_id}</a>" not in html
    assert 'name="eligible" value="1" checked' in html


def _plan(conn, f: JobFilter) -> str:
    plan = browse._PLANS[f.state]
    params = {**browse._params(conn, f), **browse.decode_cursor(None, f.state), "limit": 51, "window": 50_000}
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = conn.execute(browse._compose("jobs_page", plan, first_page=True).as_string(conn).join(
            ["EXPLAIN (FORMAT JSON) ", ""]), params, prepare=False).fetchone()
    return json.dumps(rows[0])


def test_each_filter_reads_its_own_index(conn, mixed):
    conn.execute("ANALYZE skiplock.jobs")
    expired = _plan(conn, JobFilter.parse({"lease": "expired"}))
    assert "jobs_lease_idx" in expired
    assert '"Index Cond": "(lease_until < now())"' in expired  # an index range, not a filter
    eligible = _plan(conn, JobFilter.parse({"eligible": "1", "queue": "search"}))
    assert "jobs_claim_idx" in eligible and '"Index Cond": "(run_at <= now())"' in eligible
