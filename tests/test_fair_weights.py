"""Weighted round-robin between the groups of a fair queue (issue 31, item 3; docs/queue.md,
"Fair queues"; migration 028) against a real PostgreSQL.

A group of weight w gets w turns for every turn of a weight-1 group when they compete; the
per-group cap stays the queue's group_concurrency. Weights are set through
console.queue.limits.set_limits (audited, reason required), the CLI's `--group-weight` and the
API's `group_weights`; bad input is refused naming the field.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from console import queue as q
from console.queue import limits
from tests.test_fair_queues import claim, fill, groups_of, running_by_group
from tests.web_fixtures import CSRF
from tests.workers import cli


def serve_one_at_a_time(conn, n: int) -> list[str | None]:
    """Claim one job, complete it, n times: the groups served, in order."""
    served: list[str | None] = []
    for _ in range(n):
        (job,) = claim(conn, 1)
        served += groups_of(conn, [job])
        q.complete(conn, job)
    return served


def test_a_weight_3_group_gets_3_turns_for_every_turn_of_a_weight_1_group(conn):
    """Breaking it: with the weight left out of the ORDER BY (visit = turn - 1), A and B alternate
    1:1; with the visit's turns not kept (`fair_turns`), A wins every claim."""
    fill(conn, 60, group="A")
    fill(conn, 60, group="B")
    limits.set_limits(conn, "fair", group_concurrency=100, group_weights={"A": 3}, actor="t", reason="A pays")
    served = serve_one_at_a_time(conn, 40)
    assert served == ["A", "A", "A", "B"] * 10
    assert Counter(served) == {"A": 30, "B": 10}
    # Weights removed (weight 1 deletes the row): back to one each, in turn.
    limits.set_limits(conn, "fair", group_weights={"A": 1}, actor="t", reason="A stopped paying")
    assert limits.weights_of(conn, "fair") == {}
    served = serve_one_at_a_time(conn, 20)
    assert Counter(served) == {"A": 10, "B": 10}
    assert all(a != b for a, b in zip(served, served[1:], strict=False)), served


def test_weights_among_three_groups_and_the_null_group(conn):
    """Weights 2, 1, 1 and the NULL group (weight 1): in every round of 5 claims A gets 2 and each
    other group 1."""
    for name in ("A", "B", "C"):
        fill(conn, 30, group=name)
    fill(conn, 30)
    limits.set_limits(conn, "fair", group_concurrency=100, group_weights={"A": 2}, actor="t", reason="weights test")
    served = serve_one_at_a_time(conn, 25)
    for start in range(0, 25, 5):
        assert Counter(served[start:start + 5]) == {"A": 2, "B": 1, "C": 1, None: 1}, served


def test_one_batch_claim_follows_the_weights(conn):
    """One claim of 8 with weights A=3, B=1 (nothing running): 6 of A, 2 of B, interleaved by
    visits (A A A B A A A B)."""
    fill(conn, 20, group="A")
    fill(conn, 20, group="B")
    limits.set_limits(conn, "fair", group_concurrency=100, group_weights={"A": 3}, actor="t", reason="weights test")
    assert Counter(groups_of(conn, claim(conn, 8))) == {"A": 6, "B": 2}


def test_a_weight_never_lifts_the_group_cap(conn):
    """group_concurrency 2 and weight 10: A runs at most 2, and the rest of the room goes to B."""
    fill(conn, 20, group="A")
    fill(conn, 20, group="B")
    limits.set_limits(conn, "fair", group_concurrency=2, group_weights={"A": 10}, actor="t", reason="weights test")
    assert len(claim(conn, 100)) == 4
    assert running_by_group(conn) == {"A": 2, "B": 2}
    assert claim(conn, 100) == []


def test_a_weight_count_left_by_an_earlier_release_is_ignored(conn):
    """An earlier release's worker moves fair_cursor without fair_turns: the count, kept for
    another group, is read as a full visit (the unweighted rotation), never as a head start."""
    fill(conn, 10, group="A")
    fill(conn, 10, group="B")
    limits.set_limits(conn, "fair", group_concurrency=100, group_weights={"A": 3}, actor="t", reason="weights test")
    conn.execute("UPDATE skiplock.queues SET fair_cursor = 'B', fair_turns = 0, fair_turns_of = 'A' WHERE name = 'fair'")
    assert serve_one_at_a_time(conn, 4) == ["A", "A", "A", "B"]


def test_set_weights_audited_shown_and_cleared(conn):
    result = limits.set_limits(conn, "fair", group_concurrency=4, group_weights={"tenant-42": 3, "other": "2"},
                               actor="alice", reason="paying tenants")
    assert result["group_weights"] == {"before": {}, "after": {"other": 2, "tenant-42": 3}}
    # A group not named keeps its weight.
    limits.set_limits(conn, "fair", group_weights={"other": 1}, actor="alice", reason="other stopped paying")
    assert limits.weights_of(conn, "fair") == {"tenant-42": 3}
    rows = conn.execute("SELECT actor, action, target, reason, detail->'group_weights' FROM skiplock.audit_log "
                        "ORDER BY id").fetchall()
    assert rows[-2] == ("alice", "set limits", "queue:fair", "paying tenants",
                        {"before": {}, "after": {"other": 2, "tenant-42": 3}})
    assert rows[-1][3] == "other stopped paying"
    assert rows[-1][4] == {"before": {"other": 2, "tenant-42": 3}, "after": {"tenant-42": 3}}
    q.enqueue(conn, "noop", {}, queue="fair", group="tenant-42")
    q.enqueue(conn, "noop", {}, queue="fair")
    shown = {g["group"]: g["weight"] for g in limits.fair_groups(conn, "fair")["groups"]}
    assert shown == {"tenant-42": 3, None: 1}
    # clear lifts every limit: the queue is not fair any more, its weights go too.
    limits.set_limits(conn, "fair", clear=True, actor="bob", reason="done")
    assert limits.weights_of(conn, "fair") == {}


@pytest.mark.parametrize(("weights", "message"), [
    ({"A": 0}, "group_weights: 'A': the weight must be from 1 to 100 (got 0)"),
    ({"A": -2}, "group_weights: 'A': the weight must be from 1 to 100 (got -2)"),
    ({"A": 101}, "group_weights: 'A': the weight must be from 1 to 100 (got 101)"),
    ({"A": 2.5}, "group_weights: 'A': the weight must be a whole number"),
    ({"A": "x"}, "group_weights: 'A': 'x' is not a whole number"),
    ({"A": True}, "group_weights: 'A': the weight must be a whole number"),
    ({"": 2}, "group_weights: a group name must not be empty"),
    ({" ": 2}, "group_weights: a group name must not be empty"),
    (["A"], "group_weights: must be an object"),
])
def test_bad_weights_are_refused_naming_the_problem(conn, weights, message):
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t", reason="weights test")
    with pytest.raises(limits.InvalidLimit, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        limits.set_limits(conn, "fair", group_weights=weights, actor="t", reason="weights test")
    assert limits.weights_of(conn, "fair") == {}


def test_weights_of_a_queue_that_is_not_fair_are_refused(conn):
    with pytest.raises(limits.InvalidLimit, match="group_weights: queue 'plain' is not fair"):
        limits.set_limits(conn, "plain", group_weights={"A": 2}, actor="t", reason="weights test")
    assert limits.weights_of(conn, "plain") == {}


def test_the_cli_sets_weights_and_refuses_bad_ones(subprocess_env, conn):
    done = cli(subprocess_env, "queues", "set", "fair", "--group-concurrency", "2", "--group-weight", "tenant-42=3",
               "--group-weight", "other=2", "--reason", "paying tenants")
    assert done.returncode == 0, done.stderr
    assert "group weights: other=2, tenant-42=3 (was: every group 1)" in done.stdout
    assert limits.weights_of(conn, "fair") == {"other": 2, "tenant-42": 3}
    # The terminal's views of the queue show its fairness and weights (`list` once dropped both).
    listed = cli(subprocess_env, "queues", "list")
    assert listed.returncode == 0, listed.stderr
    assert "fair, 2 per group, weights (other=2, tenant-42=3)" in listed.stdout, listed.stdout
    shown = cli(subprocess_env, "queues", "show", "--json")
    assert [(r["queue"], r["group_concurrency"], r["group_weights"]) for r in json.loads(shown.stdout)["queues"]] == \
        [("fair", 2, {"other": 2, "tenant-42": 3})]
    assert "other=2, tenant-42=3 · " in cli(subprocess_env, "queues", "show").stdout
    for arg, message in [("tenant-42=0", "the weight must be from 1 to 100 (got 0)"),
                         ("tenant-42=-1", "the weight must be from 1 to 100 (got -1)"),
                         ("tenant-42=101", "the weight must be from 1 to 100 (got 101)"),
                         ("tenant-42=1.5", "'1.5' is not a whole number"),
                         ("=3", "a group name must not be empty"),
                         ("tenant-42", "is not GROUP=WEIGHT")]:
        bad = cli(subprocess_env, "queues", "set", "fair", "--group-weight", arg, "--reason", "testing bad input")
        assert bad.returncode == 2 and message in bad.stderr, (arg, bad.stderr)
    no_reason = cli(subprocess_env, "queues", "set", "fair", "--group-weight", "tenant-42=5")
    assert no_reason.returncode == 2, no_reason.stderr
    assert limits.weights_of(conn, "fair") == {"other": 2, "tenant-42": 3}


@pytest.mark.parametrize(("weights", "message"), [({"tenant-42": 0}, "group_weights: 'tenant-42': the weight must be from 1 to 100"),
                                                  ({"tenant-42": 1.5}, "group_weights: 'tenant-42': the weight must be a whole number"),
                                                  ({"": 3}, "group_weights: a group name must not be empty"),
                                                  ("tenant-42=3", "group_weights: must be an object")])
def test_the_api_refuses_bad_weights_with_400(client_as, conn, weights, message):
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t", reason="weights test")
    answer = client_as("operator").put("/api/v1/queues/fair/limits", json={"group_weights": weights, "reason": "testing bad input"},
                                       headers={"X-CSRF-Token": CSRF})
    assert answer.status_code == 400, answer.data
    assert message in answer.get_json()["error"]
    assert limits.weights_of(conn, "fair") == {}


def test_the_api_sets_weights_and_the_page_and_api_show_them(client_as, conn):
    client = client_as("operator")
    q.enqueue(conn, "noop", {}, queue="fair", group="tenant-42")
    put = client.put("/api/v1/queues/fair/limits", json={"group_concurrency": 2, "group_weights": {"tenant-42": 3},
                                                          "reason": "paying tenant"},
                     headers={"X-CSRF-Token": CSRF})
    assert put.status_code == 200, put.data
    assert put.get_json()["group_weights"] == {"before": {}, "after": {"tenant-42": 3}}
    no_reason = client.put("/api/v1/queues/fair/limits", json={"group_weights": {"tenant-42": 4}},
                           headers={"X-CSRF-Token": CSRF})
    assert no_reason.status_code == 422 and limits.weights_of(conn, "fair") == {"tenant-42": 3}
    row = client.get("/api/v1/queues/fair").get_json()["groups"]["groups"][0]
    assert row["group"] == "tenant-42" and row["weight"] == 3
    page = client.get("/queues/fair").get_data(as_text=True)
    assert ">Weight</th>" in page and '<td class="num">3</td>' in page and 'name="group_weights"' in page
    form = client.post("/queues/fair/limits", data={"group_weights": "tenant-42=5, other=2", "reason": "form",
                                                    "csrf_token": CSRF})
    assert form.status_code == 302 and limits.weights_of(conn, "fair") == {"other": 2, "tenant-42": 5}
    bad = client.post("/queues/fair/limits", data={"group_weights": "tenant-42=0", "reason": "testing bad input",
                                                   "csrf_token": CSRF})
    assert bad.status_code == 400 and "group_weights: &#39;tenant-42&#39;: the weight must be from 1 to 100" in bad.get_data(as_text=True)
