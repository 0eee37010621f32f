"""Fair queues (issue 31, item 3; docs/queue.md, "Fair queues") against a real PostgreSQL.

A job may carry a group key (`enqueue(..., group="tenant-42")`); a queue with
`group_concurrency = N` runs at most N of one group's jobs at once, fleet-wide, and its claim
(sql/limits.sql `claim_queue`, the fair branch) serves the groups round-robin: every group with
room gets one job before any gets a second, and among equally loaded groups the turn goes round
from the group served last (`queues.fair_cursor`). Jobs without a group are one group.

In one process: the group travels through every enqueue path and into the archive; bad input
is refused with the reason; one claim keeps the per-group limit and interleaves the groups; the
rotation reaches every group; a fair claim reads the heads of the groups, not a big group's
backlog. With real `skiplock worker` processes: no instant with more than N of a group running
(sampled, and from the handlers' own spans), every job run exactly once, and the starvation
bound: one tenant's 100,000 jobs ahead of ten tenants' 100 each.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql

from console import queue as q
from console.db import connect
from console.maintenance.archive import archive_completed
from console.queue import limits
from console.queue.protocol import InvalidJob
from console.sqlfiles import query
from tests.web_fixtures import CSRF
from tests.workers import EXECUTIONS_TABLE, cli, wait_for

SPANS_TABLE = """
CREATE TABLE IF NOT EXISTS public.spans (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    queue      text        NOT NULL,
    worker_pid integer     NOT NULL,
    started    timestamptz NOT NULL,
    ended      timestamptz
)
"""


def fill(conn, n: int, *, queue: str = "fair", group: str | None = None, kind: str = "noop", payload=None) -> list[int]:
    with conn.transaction():
        return q.enqueue_many(conn, [q.NewJob(kind, payload or {}, queue=queue, group=group) for _ in range(n)])


def claim(conn, limit: int, *, queue: str = "fair", worker: str = "w"):
    return limits.claim_from_queue(conn, queue, worker, limit=limit)


def groups_of(conn, jobs) -> list[str | None]:
    ids = [j.id for j in jobs]
    rows = dict(conn.execute("SELECT id, group_key FROM skiplock.jobs WHERE id = ANY(%s)", (ids,)).fetchall())
    return [rows[i] for i in ids]


def running_by_group(conn, queue: str = "fair") -> dict[str | None, int]:
    return dict(conn.execute("SELECT group_key, count(*) FROM skiplock.jobs WHERE status = 'running' AND queue = %s"
                             " GROUP BY group_key", (queue,)).fetchall())


# --- input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("group", "message"), [("x" * 201, "at most 200"), ("", "must not be empty"),
                                                ("  ", "must not be empty"), (42, "must be a string")])
def test_a_bad_group_is_refused_with_the_reason(conn, group, message):
    with pytest.raises(InvalidJob, match=message):
        q.enqueue(conn, "noop", {}, queue="fair", group=group)
    with pytest.raises(InvalidJob, match=f"job 2: .*{message}"):
        q.enqueue_many(conn, [q.NewJob("noop"), q.NewJob("noop", group=group)])
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0


def test_a_group_of_200_characters_is_kept(conn):
    job_id = q.enqueue(conn, "noop", {}, queue="fair", group="g" * 200)
    assert conn.execute("SELECT group_key FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "g" * 200


@pytest.mark.parametrize(("value", "message"), [(0, "at least 1"), (-3, "at least 1"), ("x", "not a whole number"),
                                                ("2.5", "not a whole number"), (True, "whole number")])
def test_bad_group_concurrency_is_refused_with_the_reason(conn, value, message):
    with pytest.raises(limits.InvalidLimit, match=f"group_concurrency: .*{message}"):
        limits.set_limits(conn, "fair", group_concurrency=value, actor="t")
    assert limits.limits_of(conn, "fair")["group_concurrency"] is None


def test_the_group_travels_through_every_enqueue_path_and_into_the_archive(conn):
    one = q.enqueue(conn, "noop", {}, queue="fair", group="t1")
    unique = q.enqueue(conn, "noop", {}, queue="fair", group="t2", idempotency_key="k", unique_for=60)
    small = fill(conn, 3, group="t3")  # the multi-row INSERT
    big = fill(conn, q.COPY_THRESHOLD, group="t\\4\tx")  # COPY (escaped)
    none = q.enqueue(conn, "noop", {}, queue="fair")
    rows = dict(conn.execute("SELECT id, group_key FROM skiplock.jobs").fetchall())
    assert rows[one] == "t1" and rows[unique] == "t2" and rows[none] is None
    assert {rows[i] for i in small} == {"t3"} and {rows[i] for i in big} == {"t\\4\tx"}
    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() - interval '1 day'")
    archive_completed(conn, older_than=timedelta(minutes=1))
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    assert conn.execute("SELECT group_key FROM skiplock.jobs_archive WHERE id = %s", (one,)).fetchone()[0] == "t1"


# --- one process: the claim ---------------------------------------------------------------------

def test_set_show_clear_group_concurrency(conn):
    after = limits.set_limits(conn, "fair", group_concurrency="2", actor="alice", reason="tenants")["after"]
    assert after == {"concurrency": None, "rate": None, "burst": None, "group_concurrency": 2}
    # A limit not given keeps its value.
    assert limits.set_limits(conn, "fair", concurrency=5, actor="alice")["after"]["group_concurrency"] == 2
    assert [(r["queue"], r["group_concurrency"]) for r in limits.queue_limits(conn)] == [("fair", 2)]
    assert limits.limited(conn).queues == ["fair"]
    limits.set_limits(conn, "fair", clear=True, actor="bob")
    assert limits.limited(conn).queues == []


def test_the_fast_claim_leaves_a_fair_queue_alone(conn):
    fill(conn, 5, group="a")
    fill(conn, 5, queue="other", group="a")
    limits.set_limits(conn, "fair", group_concurrency=1, actor="t")
    assert {j.queue for j in q.claim(conn, "w", limit=100)} == {"other"}


def test_one_claim_keeps_the_group_limit_and_interleaves_the_groups(conn):
    """Breaking it: without the per-group count (rank <= N - running) the first claim takes 10 of
    "big"; without the (running + rank) order it takes the oldest jobs, all of "big"."""
    fill(conn, 10, group="big")
    for name in ("s1", "s2", "s3"):
        fill(conn, 3, group=name)
    fill(conn, 3)  # no group: one group of its own
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t")
    first = claim(conn, 5)
    assert sorted(groups_of(conn, first), key=str) == sorted(["big", "s1", "s2", "s3", None], key=str), \
        "five claims: one of each group before any group gets a second"
    second = claim(conn, 100)
    assert len(second) == 5 and running_by_group(conn) == {"big": 2, "s1": 2, "s2": 2, "s3": 2, None: 2}
    assert claim(conn, 100) == []  # every group at its limit
    q.complete(conn, next(j for j in first if groups_of(conn, [j]) == ["big"]))
    again = claim(conn, 100)
    assert groups_of(conn, again) == ["big"], "a freed slot of big goes to big, and only one"


def test_the_queue_concurrency_and_the_group_limit_hold_together(conn):
    for name in ("a", "b", "c"):
        fill(conn, 5, group=name)
    limits.set_limits(conn, "fair", group_concurrency=2, concurrency=4, actor="t")
    assert len(claim(conn, 100)) == 4
    assert claim(conn, 100) == []
    assert max(running_by_group(conn).values()) == 2


def test_the_turn_goes_round_every_group(conn):
    """One slot at a time (claim one, complete it): with the groups equally loaded, the turn
    goes round in key order from the group served last, whatever the groups' backlog or age.
    Breaking it: without the rotation (`fair_cursor`) the oldest group wins every turn."""
    fill(conn, 50, group="old")  # the oldest jobs, the biggest backlog
    for name in ("t1", "t2", "t3"):
        fill(conn, 5, group=name)
    fill(conn, 5)  # the NULL group ('' in the rotation: first)
    limits.set_limits(conn, "fair", group_concurrency=1, actor="t")
    served = []
    for _ in range(10):
        (job,) = claim(conn, 1)
        served += groups_of(conn, [job])
        q.complete(conn, job)
    assert served == [None, "old", "t1", "t2", "t3"] * 2


def test_scheduled_jobs_and_limited_kinds_are_left_where_they_belong(conn):
    with conn.transaction():
        q.enqueue(conn, "noop", {}, queue="fair", group="a", run_at=q_future())
    fill(conn, 2, group="a", kind="scarce")
    fill(conn, 2, group="b")
    limits.set_limits(conn, "fair", group_concurrency=5, actor="t")
    limits.declare_kinds(conn, {"scarce": 1}, worker="w")
    assert groups_of(conn, claim(conn, 10)) == ["b", "b"]  # not the scheduled one, not the limited kind
    got = limits.claim_kind(conn, "scarce", "w", limit=10, limited_queues=["fair"])
    assert len(got) == 1 and groups_of(conn, got) == ["a"]


def q_future():
    return datetime.now(UTC) + timedelta(hours=1)


def test_a_fair_claim_reads_the_groups_heads_not_the_backlog(conn):
    """With jobs_group_claim_idx (built by the scheduler while a queue is fair) a claim reads one
    probe per group and the heads it ranks: a few buffers per group, not the 20,000-job group."""
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) SELECT 'fair', 'noop', 'big', "
                 "now() - interval '2 hours' + g * interval '1 microsecond' FROM generate_series(1, 20000) AS g")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key) SELECT 'fair', 'noop', 't' || (g % 20) "
                 "FROM generate_series(1, 200) AS g")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind) SELECT 'default', 'noop' FROM generate_series(1, 20000)")
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t")
    assert "jobs_group_claim_idx" in limits.keep_claim_indexes(conn)
    conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    params = {"queue": "fair", "kind": None, "limit": 10, "worker": "w", "lease": 60.0}
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("limits", "claim_queue"), params).fetchone()[0][0]
    top = plan["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    assert top["Actual Rows"] == 10
    assert buffers < 600, f"a fair claim over 21 groups read {buffers} buffers"
    # The generic plan a worker's connection keeps once psycopg prepares the statement.
    order: list[str] = []

    def number(match):
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    conn.execute("PREPARE fair_claim AS " + re.sub(r"%\((\w+)\)s", number, query("limits", "claim_queue")))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    values = ", ".join(sql.Literal(params[k]).as_string(conn) for k in order)
    with conn.transaction(force_rollback=True):
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE fair_claim({values})").fetchone()[0][0]
    top = plan["Plan"]
    generic = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    assert top["Actual Rows"] == 10 and generic < 600, f"the generic plan read {generic} buffers"


# --- real worker processes ------------------------------------------------------------------------

@pytest.fixture
def db(conn):
    conn.execute(EXECUTIONS_TABLE)
    conn.execute(SPANS_TABLE)
    return conn


class GroupSampler(threading.Thread):
    """The most running jobs of one group of `queue`, sampled every few milliseconds."""

    def __init__(self, dsn: str, queue: str, *, deadline: float = 180):
        super().__init__(daemon=True)
        self.dsn, self.queue = dsn, queue
        self.most = 0
        self.samples = 0
        self._halt = threading.Event()
        self._deadline = time.monotonic() + deadline

    def run(self) -> None:
        with connect(self.dsn) as conn:
            while not self._halt.is_set() and time.monotonic() < self._deadline:
                n = conn.execute("SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM skiplock.jobs"
                                 " WHERE status = 'running' AND queue = %s GROUP BY group_key) AS t",
                                 (self.queue,)).fetchone()[0]
                self.most = max(self.most, n)
                self.samples += 1
                time.sleep(0.005)

    def stop(self) -> int:
        self._halt.set()
        self.join(timeout=10)
        return self.most


def largest_group_overlap(conn, queue: str) -> int:
    """The most spans of one group open at once (each span's start is a candidate instant)."""
    return conn.execute("""
        WITH s AS (SELECT sp.*, j.group_key FROM public.spans AS sp JOIN skiplock.jobs AS j ON j.id = sp.job_id
                   WHERE sp.queue = %s)
        SELECT coalesce(max(n), 0) FROM (
            SELECT (SELECT count(*) FROM s AS o
                    WHERE o.group_key IS NOT DISTINCT FROM s.group_key AND o.started <= s.started
                      AND (o.ended IS NULL OR o.ended > s.started)) AS n
            FROM s) AS t""", (queue,)).fetchone()[0]


@pytest.mark.slow
def test_two_workers_never_run_more_than_n_of_a_group_and_run_every_job_once(db, dsn, workers):
    """Two worker processes with 4 handler threads each (8 slots) against group_concurrency 2:
    without a fleet-wide per-group count a group would run up to 8 at once. Every job completes,
    each exactly once (one span per job, attempt 1). Three groups for eight slots: without the
    per-group count, the least-loaded-first order alone would run three of a group at once."""
    limits.set_limits(db, "fair", group_concurrency=2, actor="test")
    limits.keep_claim_indexes(db)
    # Both workers up before the jobs come: on a loaded machine one process started seconds after
    # the other, which had run every job by then ("both workers took part" failed in a run beside
    # another suite).
    procs = [workers.start("--concurrency", "4") for _ in range(2)]
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.workers WHERE stopped_at IS NULL").fetchone()[0] == 2,
             timeout=60, what="both workers registered")
    sampler = GroupSampler(dsn, "fair")
    sampler.start()
    ids = []
    for name in ("a", "b"):  # three groups with the NULL one: 6 slots of 8, so a missing cap shows
        ids += fill(db, 12, group=name, kind="span", payload={"sleep": 0.1})
    ids += fill(db, 12, kind="span", payload={"sleep": 0.1})  # the NULL group
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE queue = 'fair' AND status = 'completed'")
             .fetchone()[0] == len(ids), timeout=120, what="every fair job completed")
    most = sampler.stop()
    assert sampler.samples > 100, f"only {sampler.samples} samples"
    assert most <= 2, f"{most} jobs of one group ran at once (group_concurrency 2)"
    assert largest_group_overlap(db, "fair") == 2, "the handlers' largest overlap in one group (never more than 2, and used)"
    runs = db.execute("SELECT job_id, count(*), max(attempt) FROM public.spans GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(ids) and {(r[1], r[2]) for r in runs} == {(1, 1)}
    pids = {r[0] for r in db.execute("SELECT DISTINCT worker_pid FROM public.spans").fetchall()}
    assert pids == {p.pid for p in procs}, "both workers took part"
    for proc in procs:
        assert workers.stop(proc)[0] == 0


BIG = 100_000
SMALL_TENANTS = 10
SMALL_EACH = 100


@pytest.mark.slow
def test_a_big_tenant_does_not_starve_the_small_ones(db, dsn, workers):
    """One tenant enqueues 100,000 jobs, then ten others 100 each (all before the workers
    start). group_concurrency 2, two workers with 4 handler threads each.

    The bound: a group's first job waits only for the rank-1 jobs of the groups served before it
    in the rotation: with G groups every group's first job is among the first G claims of the
    queue (here 11; stated below as K = G × group_concurrency = 22 for slack), and within 2 s of
    the first claim. Measured figures are printed (pytest -s)."""
    limits.set_limits(db, "fair", group_concurrency=2, actor="test")
    started = time.monotonic()
    with db.transaction():
        q.enqueue_many(db, [q.NewJob("record", {}, queue="fair", group="big") for _ in range(BIG)])
    enqueue_s = time.monotonic() - started
    small = [f"tenant-{i:02d}" for i in range(SMALL_TENANTS)]
    with db.transaction():
        q.enqueue_many(db, [q.NewJob("record", {}, queue="fair", group=name) for name in small for _ in range(SMALL_EACH)])
    limits.keep_claim_indexes(db)
    db.execute("VACUUM (ANALYZE) skiplock.jobs")
    procs = [workers.start("--concurrency", "4") for _ in range(2)]
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE queue = 'fair' AND status = 'completed'"
                                " AND group_key <> 'big'").fetchone()[0] == SMALL_TENANTS * SMALL_EACH,
             timeout=180, what="every small tenant's jobs completed")
    for proc in procs:
        assert workers.stop(proc)[0] == 0
    # The order of claims: executions are written by the handler; locked_at is the claim's clock.
    claims = db.execute("SELECT j.group_key, extract(epoch FROM j.locked_at)::float8 FROM skiplock.jobs AS j"
                        " WHERE j.queue = 'fair' AND j.locked_at IS NOT NULL ORDER BY j.locked_at, j.id").fetchall()
    first_at = claims[0][1]
    first_claim = {}
    for position, (group, at) in enumerate(claims, start=1):
        first_claim.setdefault(group, (position, at - first_at))
    groups = SMALL_TENANTS + 1
    bound_claims = groups * 2
    worst = max(first_claim[name][0] for name in small)
    worst_s = max(first_claim[name][1] for name in small)
    median_s = statistics.median(first_claim[name][1] for name in small)
    print(f"\nfair starvation: {BIG:,} big jobs enqueued in {enqueue_s:.2f} s; {len(claims):,} claims in all; "
          f"every small tenant's first job among the first {worst} claims (bound {bound_claims}), "
          f"the last one {worst_s * 1000:.0f} ms after the first claim (median {median_s * 1000:.0f} ms)")
    assert worst <= bound_claims, f"a small tenant's first job was claim #{worst} (bound {bound_claims}): {first_claim}"
    assert worst_s < 2.0, f"a small tenant's first job started {worst_s:.2f} s after the first claim"
    # The big tenant kept running too (at most 2 at once, but never starved either).
    assert first_claim["big"][0] <= groups
    assert db.execute("SELECT count(*) FROM public.executions").fetchone()[0] == len(claims)


# --- faces: the API, the form, the CLI -------------------------------------------------------------

@pytest.mark.parametrize(("value", "message"), [(0, "group_concurrency: must be at least 1"),
                                                (-1, "group_concurrency: must be at least 1"),
                                                ("many", "group_concurrency: 'many' is not a whole number"),
                                                ([2], "group_concurrency: must be a whole number")])
def test_the_api_refuses_a_bad_group_concurrency_with_400(client_as, conn, value, message):
    answer = client_as("operator").put("/api/v1/queues/fair/limits", json={"group_concurrency": value, "reason": "testing bad input"},
                                       headers={"X-CSRF-Token": CSRF})
    assert answer.status_code == 400, answer.data
    assert message in answer.get_json()["error"]
    assert limits.queue_limits(conn) == []


def test_the_api_and_the_form_set_group_concurrency(client_as, conn):
    client = client_as("operator")
    put = client.put("/api/v1/queues/fair/limits", json={"group_concurrency": 3, "reason": "tenants"},
                     headers={"X-CSRF-Token": CSRF})
    assert put.status_code == 200 and put.get_json()["after"]["group_concurrency"] == 3
    assert client.get("/api/v1/queues/fair").get_json()["queue"]["limits"]["group_concurrency"] == 3
    page = client.get("/queues/fair").get_data(as_text=True)
    assert "fair: 3 per group" in page and 'name="group_concurrency"' in page
    bad = client.post("/queues/fair/limits", data={"group_concurrency": "0", "reason": "testing bad input", "csrf_token": CSRF})
    assert bad.status_code == 400 and "group_concurrency: must be at least 1" in bad.get_data(as_text=True)
    ok = client.post("/queues/fair/limits", data={"group_concurrency": "5", "reason": "more", "csrf_token": CSRF})
    assert ok.status_code == 302 and limits.limits_of(conn, "fair")["group_concurrency"] == 5
    assert client_as("viewer").put("/api/v1/queues/fair/limits", json={"group_concurrency": 1, "reason": "x"},
                                   headers={"X-CSRF-Token": CSRF}).status_code == 403


def test_the_cli_sets_group_concurrency_and_enqueues_with_a_group(subprocess_env, conn):
    done = cli(subprocess_env, "queues", "set", "fair", "--group-concurrency", "2", "--reason", "tenants")
    assert done.returncode == 0 and "fair, 2 per group" in done.stdout, done.stderr
    bad = cli(subprocess_env, "queues", "set", "fair", "--group-concurrency", "0", "--reason", "testing bad input")
    assert bad.returncode == 2 and "group_concurrency: must be at least 1" in bad.stderr
    job = cli(subprocess_env, "enqueue", "noop", "--queue", "fair", "--group", "tenant-42")
    assert job.returncode == 0, job.stderr
    assert conn.execute("SELECT group_key FROM skiplock.jobs WHERE id = %s", (int(job.stdout),)).fetchone()[0] == "tenant-42"
    long = cli(subprocess_env, "enqueue", "noop", "--queue", "fair", "--group", "x" * 201)
    assert long.returncode == 2 and "at most 200" in long.stderr


# --- see the tenants: the queue page and the API (issue 31, item 4) --------------------------------

def test_the_queue_page_and_api_show_the_top_groups_and_flag_starvation(client_as, conn):
    """Twelve groups: "big" with 50 eligible jobs, ten with 2 each waiting a minute, one
    ("stuck") waiting an hour with nothing running: flagged, the others not. The NULL group shows
    as null. At most 10 rows, by backlog."""
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t")
    limits.keep_claim_indexes(conn)
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) SELECT 'fair', 'noop', 'big', "
                 "now() - interval '70 seconds' FROM generate_series(1, 50)")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) SELECT 'fair', 'noop', 't' || (g % 10), "
                 "now() - interval '60 seconds' FROM generate_series(1, 20) AS g")
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, group_key, run_at) VALUES ('fair', 'noop', 'stuck', now() - interval '1 hour'),"
                 " ('fair', 'noop', NULL, now() - interval '50 seconds')")
    shown = limits.fair_groups(conn, "fair")
    assert shown["groups_seen"] == 13 and len(shown["groups"]) == 10
    assert shown["groups"][0]["group"] == "big" and shown["groups"][0]["eligible"] == 50
    assert [g["group"] for g in shown["starving"]] == ["stuck"]
    assert None in [g["group"] for g in limits.fair_groups(conn, "fair", top=20)["groups"]]
    client = client_as("viewer")
    api = client.get("/api/v1/queues/fair").get_json()
    assert api["groups"]["groups"][0]["group"] == "big" and api["groups"]["starving"][0]["group"] == "stuck"
    page = client.get("/queues/fair").get_data(as_text=True)
    assert 'id="queue-groups"' in page and "Starving: stuck waits" in page
    # An unfair queue has no groups panel.
    q.enqueue(conn, "noop", {}, queue="plain", group="x")
    assert "groups" not in client.get("/api/v1/queues/plain").get_json()


def test_the_groups_panel_degrades_when_it_times_out(client_as, conn, monkeypatch):
    from psycopg.errors import QueryCanceled

    def slow(conn, name, **kw):
        raise QueryCanceled("canceling statement due to statement timeout")
    limits.set_limits(conn, "fair", group_concurrency=2, actor="t")
    q.enqueue(conn, "noop", {}, queue="fair", group="a")
    monkeypatch.setattr(limits, "fair_groups", slow)
    client = client_as("viewer")
    assert "took longer" in client.get("/api/v1/queues/fair").get_json()["groups"]["error"]
    page = client.get("/queues/fair")
    assert page.status_code == 200 and "Groups not available" in page.get_data(as_text=True)


def test_why_says_a_job_waits_for_its_group(conn):
    """"Why isn't this job running?" names the group at its limit (and not for another group)."""
    from console import why

    limits.set_limits(conn, "fair", group_concurrency=1, actor="t")
    waiting = fill(conn, 2, group="t1")[1]
    other = fill(conn, 1, group="t2")[0]
    assert len(claim(conn, 1)) == 1  # t1's first job runs: t1 is at its limit
    reasons = {r.code: r for r in why.why_job(conn, waiting, live_within=60).reasons}
    assert "group_concurrency" in reasons and reasons["group_concurrency"].blocking
    assert "'t1' is at its limit: 1 of 1 running" in reasons["group_concurrency"].title
    assert "group_concurrency" not in {r.code for r in why.why_job(conn, other, live_within=60).reasons}
