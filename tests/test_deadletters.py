"""Dead letters: error groups, selections (validation and matching), previews."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import queue as q
from console.maintenance import InvalidSelection, Selection, groups, list_dead_letters, preview
from console.maintenance.deadletters import selection_query
from tests.maintenance_data import add_completed, add_failed


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def test_groups_count_dead_letters_by_fingerprint(conn):
    add_failed(conn, 7, queue="mail", kind="send", fingerprint="SMTPError: timeout after <n>s")
    add_failed(conn, 3, queue="billing", kind="charge", fingerprint="SMTPError: timeout after <n>s")
    add_failed(conn, 2, queue="billing", kind="charge", fingerprint="KeyError: <str>")
    add_completed(conn, 5)
    found = groups(conn)
    assert [(g["fingerprint"], g["count"]) for g in found] == [
        ("SMTPError: timeout after <n>s", 10), ("KeyError: <str>", 2)]
    smtp = found[0]
    assert smtp["queues"] == ["billing", "mail"] and smtp["kinds"] == ["charge", "send"]
    assert smtp["first_seen"] <= smtp["last_seen"]
    assert smtp["example"].startswith("RuntimeError: boom")
    assert [g["count"] for g in groups(conn, queue="billing")] == [3, 2]


def test_groups_from_real_failures_share_a_fingerprint(conn):
    for order in (17, 4411):
        job_id = q.enqueue(conn, "ship", {"order": order}, max_attempts=1)
        [job] = q.claim(conn, "w", lease=30)
        q.fail(conn, job, RuntimeError(f"order {order} not found at 0x7f3a{order}"))
    [group] = groups(conn)
    assert group["count"] == 2 and group["fingerprint"] == "RuntimeError: order <n> not found at <addr>"
    assert job_id


def test_each_groups_example_is_its_newest_failure_within_the_filter_and_nulls_group_too(conn):
    def failed(fingerprint, error, age_min, queue="mail", kind="send"):
        conn.execute(
            "INSERT INTO skiplock.jobs (queue, kind, status, last_error, error_fingerprint, finished_at, attempts)"
            " VALUES (%s, %s, 'failed', %s, %s, now() - make_interval(mins => %s), 1)",
            (queue, kind, error, fingerprint, age_min))

    failed("F", "F oldest", 30)
    failed("F", "F newest in mail", 10)
    failed("F", "F newest overall", 5, queue="billing", kind="charge")
    failed("G", "G only", 20)
    failed(None, "unfingerprinted old", 40)
    failed(None, "unfingerprinted new", 1)
    by_fp = {g["fingerprint"]: g for g in groups(conn)}
    assert by_fp["F"]["example"] == "F newest overall" and by_fp["F"]["count"] == 3
    assert by_fp["F"]["queues"] == ["billing", "mail"] and by_fp["F"]["kinds"] == ["charge", "send"]
    assert by_fp["G"]["example"] == "G only"
    assert by_fp["(no fingerprint)"]["example"] == "unfingerprinted new" and by_fp["(no fingerprint)"]["count"] == 2
    assert [g["fingerprint"] for g in groups(conn)] == ["F", "(no fingerprint)", "G"]  # largest first, then by name
    mail = {g["fingerprint"]: g for g in groups(conn, queue="mail")}
    assert mail["F"]["example"] == "F newest in mail" and mail["F"]["count"] == 2


def test_groups_aggregate_from_the_fingerprint_index_alone(conn):
    add_failed(conn, 300, queue="mail", kind="send", fingerprint="A")
    add_failed(conn, 200, queue="billing", kind="charge", fingerprint="B")
    add_completed(conn, 500)
    conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    conn.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")  # a table this small is read whole; ask what the indexes can do
    from console.sqlfiles import query

    plan = conn.execute("EXPLAIN (FORMAT JSON) " + query("deadletters", "groups"),
                        {"queue": None, "kind": None, "limit": 100, "offset": 0, "names": 10}).fetchone()[0][0]["Plan"]
    scans = {(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if "Scan" in n["Node Type"]}
    assert ("Index Only Scan", "jobs_failed_groups_idx") in scans, scans
    assert all(name == "jobs_failed_groups_idx" for _, name in scans if name), scans  # not jobs_failed_idx + heap


def test_filters_each_narrow_the_selection_and_only_failed_jobs_match(conn):
    mail = add_failed(conn, 5, queue="mail", kind="send", fingerprint="A")
    bill = add_failed(conn, 4, queue="billing", kind="charge", fingerprint="B", age=timedelta(days=2))
    done = add_completed(conn, 3)
    pending = q.enqueue(conn, "x", {})

    def ids(**filters):
        return sorted(r["id"] for r in list_dead_letters(conn, Selection(**filters), limit=1000))

    assert ids(queue="mail") == sorted(mail)
    assert ids(kind="charge") == sorted(bill)
    assert ids(fingerprint="B") == sorted(bill)
    assert ids(failed_before=datetime.now(UTC) - timedelta(days=1)) == sorted(bill)
    assert ids(failed_since=datetime.now(UTC) - timedelta(days=1)) == sorted(mail)
    assert ids(payload={"order": 2}) == sorted([mail[1], bill[1]])
    assert ids(payload={"tenant": 0}, queue="mail") == [mail[2]]
    # ids of jobs that are not dead letters are ignored, never touched
    assert ids(ids=[mail[0], done[0], pending]) == [mail[0]]
    assert ids(all=True) == sorted(mail + bill)


def test_preview_gives_exact_count_sample_and_the_filter_as_understood(conn):
    add_failed(conn, 25, queue="mail", fingerprint="SMTPError")
    p = preview(conn, {"queue": "mail", "fingerprint": "SMTPError"}, sample=5)
    assert p.total == 25 and len(p.sample) == 5
    assert p.sample[0]["finished_at"] >= p.sample[-1]["finished_at"]  # newest first
    assert p.selection == {"queue": "mail", "fingerprint": "SMTPError"}
    assert "queue = 'mail'" in p.description and "status = failed" in p.description
    empty = preview(conn, {"queue": "nowhere"})
    assert empty.total == 0 and empty.sample == []


def test_list_pages_with_a_keyset(conn):
    ids = add_failed(conn, 12)
    first = list_dead_letters(conn, limit=5)
    second = list_dead_letters(conn, limit=5, before=(first[-1]["finished_at"], first[-1]["id"]))
    seen = [r["id"] for r in first + second]
    assert seen == sorted(ids, reverse=True)[:10]


def test_selection_reads_use_the_failed_index(conn):
    add_failed(conn, 300)
    add_completed(conn, 3000)
    conn.execute("ANALYZE skiplock.jobs")
    sel = Selection(queue="default")
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + selection_query("list_matching"),
                        {**sel.params(), "limit": 50, "before_finished_at": None, "before_id": None}).fetchone()[0][0]["Plan"]
    nodes = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if n.get("Relation Name") == "jobs"]
    assert nodes and all(name == "jobs_failed_idx" for _, name in nodes), nodes


@pytest.mark.parametrize("data, message", [
    ({}, "at least one filter"),
    ({"queue": "mail", "all": True}, "cannot be combined"),
    ({"colour": "red"}, "unknown filter"),
    ({"ids": []}, "empty list"),
    ({"ids": "12"}, "list of job ids"),
    ({"ids": [1, -3]}, "not a job id"),
    ({"ids": [1, "x"]}, "not a job id"),
    ({"queue": ""}, "queue must be"),
    ({"kind": 7}, "kind must be"),
    ({"failed_since": "yesterday"}, "not a date-time"),
    ({"failed_since": "2026-11-30T10:00:00Z", "failed_before": "2026-11-29T10:00:00Z"}, "impossible date range"),
    ({"failed_since": "2026-11-30T10:00:00Z", "failed_before": "2026-11-30T10:00:00Z"}, "impossible date range"),
    ({"payload": "[1, 2]"}, "JSON object"),
    ({"payload": "{not json"}, "not valid JSON"),
    ({"all": "yes"}, "true or false"),
    (["queue", "mail"], "object of filters"),
])
def test_malformed_selections_are_refused(data, message):
    with pytest.raises(InvalidSelection, match=message):
        Selection.from_dict(data)


def test_selection_round_trips_through_json():
    sel = Selection.from_dict({"ids": [3, 1, 3], "failed_since": "2026-11-30T03:00:00", "payload": '{"a": 1}'})
    assert sel.ids == (1, 3)
    assert sel.failed_since.tzinfo is not None  # a time without zone is UTC
    assert Selection.from_dict(sel.to_dict()) == sel
