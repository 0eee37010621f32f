"""The price of a horizon holder and of a lock blocker (issue 33 item 5), and the admin's action
that ends it, against real sessions on a real PostgreSQL: a REPEATABLE READ snapshot held open
while real updates make dead rows, a row lock held in a transaction, a walsender.

The figures are checked against what the test itself did (the updates it made, the samples it
stored), and the action against pg_stat_activity after it (the backend is gone, or its query
was cancelled), the audit log, and the backend it must not touch.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from console import holders, samples
from console import queue as q
from console.db import connect
from console.samples import Sample
from tests.collector_helpers import cycle, eventually, flush_stats
from tests.oncall_data import horizon_rule
from tests.web_fixtures import CSRF

REASON = "INC-88: the forgotten nightly report holds back vacuum"


@contextmanager
def snapshot_holder(dsn: str, app: str = "nightly-report"):
    """A session in a REPEATABLE READ transaction whose snapshot is taken and left open (it
    holds the xmin horizon until it ends)."""
    holder = connect(dsn, application_name=app, autocommit=False)
    try:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM skiplock.jobs").fetchone()
        yield holder
    finally:
        try:
            holder.rollback()
        except psycopg.Error:
            pass  # ended by the test
        holder.close()


def identity(conn, pid: int) -> tuple[datetime, datetime | None]:
    return conn.execute("SELECT backend_start, xact_start FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()


def alive(conn, pid: int) -> bool:
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 1


def audited(conn, action: str) -> list[tuple]:
    return conn.execute("SELECT actor, target, reason, selection, rows, outcome, detail FROM skiplock.audit_log "
                        "WHERE action = %s ORDER BY id", (action,)).fetchall()


def dead_samples(dsn: str) -> dict[str, float]:
    """One cycle of the tables collector, stored: {table: dead tuples}."""
    report = cycle(dsn, only=("tables",))
    return {s.labels["table"]: s.value for s in report.samples if s.metric == "table_dead_tuples"}


# --- the price ----------------------------------------------------------------------------------


def test_the_dead_rows_behind_a_holder_are_the_updates_made_while_it_holds(dsn, conn, client_as):
    for n in range(30):
        q.enqueue(conn, "report", {"n": n}, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    # 12 dead rows in the archive from before the holder (nothing touches them after): they are
    # not its price
    conn.execute("INSERT INTO skiplock.jobs_archive (id, queue, kind, payload, status, priority, run_at, attempts,"
                 " max_attempts, errors, created_at, finished_at) SELECT id, queue, kind, payload, 'completed', priority,"
                 " run_at, attempts, max_attempts, '[]', created_at, now() FROM skiplock.jobs LIMIT 12")
    conn.execute("DELETE FROM skiplock.jobs_archive")
    flush_stats(conn)
    conn.execute("SELECT 1")
    before = eventually(lambda: (d := dead_samples(dsn)).get("jobs_archive") == 12 and d)  # just before the holder
    time.sleep(0.05)
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        _, since = identity(conn, pid)
        for _ in range(3):  # 90 row versions die while the snapshot can still see them
            conn.execute("UPDATE skiplock.jobs SET priority = priority + 1")
        flush_stats(conn)
        conn.execute("SELECT 1")
        eventually(lambda: dead_samples(dsn)["jobs"] >= before["jobs"] + 90)
        time.sleep(0.3)

        cost = holders.price(conn, since)
        assert cost["dead_tuples"]["total"] == 90, cost["dead_tuples"]
        added = {t["table"]: t["added"] for t in cost["dead_tuples"]["tables"]}
        assert added == {"jobs": 90, "jobs_archive": 0}
        [jobs] = [t for t in cost["dead_tuples"]["tables"] if t["table"] == "jobs"]
        assert jobs["before"] == before["jobs"] and jobs["before_at"] <= since
        held = conn.execute("SELECT extract(epoch FROM statement_timestamp() - %s)::float8", (since,)).fetchone()[0]
        assert 0.3 <= cost["held_s"] <= held + 0.05

        # The Database page (and its API) price the holder the vacuum_blocked rule in force reports.
        horizon_rule(conn, 0.2)
        listed = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
        [row] = [h for h in listed if h["pid"] == pid]
        assert row["level"] != "good"
        assert row["price"]["dead_tuples"]["total"] == 90
        assert row["backend"]["backend_start"] == identity(conn, pid)[0].astimezone(UTC).isoformat()
        assert 0.3 <= row["backend"]["idle_s"] <= row["price"]["held_s"]  # idle since its last statement
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f'data-price-pid="{pid}"' in html and "<strong>90</strong> (jobs 90," in html
        assert "end-backend" not in html, "a viewer is offered the admin's form"
        assert f'data-end-pid="{pid}"' in client_as("admin").get("/health").get_data(as_text=True)


def store_cycles(conn, at: list[datetime], completed: float, failed: float, p95: float | None = None,
                 pgss: float | None = None) -> None:
    for when in at:
        rows = [Sample("throughput", {"outcome": "completed"}, completed, when),
                Sample("throughput", {"outcome": "failed"}, failed, when),
                Sample("throughput", {"outcome": "retried"}, 100.0, when),  # not a finished job
                Sample("throughput", {"outcome": "completed", "queue": "x", "external": "pgq"}, 1000.0, when)]
        if p95 is not None:
            rows.append(Sample("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": "p95"}, p95, when))
        if pgss is not None:
            rows.append(Sample("claim_latency_seconds", {"queue": "all", "source": "pg_stat_statements",
                                                         "quantile": "mean"}, pgss, when))
        samples.store(conn, rows)


def test_throughput_and_claim_latency_since_it_started_are_computed_from_the_samples(conn):
    now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
    since = now - timedelta(seconds=120)
    store_cycles(conn, [since - timedelta(seconds=s) for s in (250, 150, 10)], 8.0, 2.0, p95=0.010)
    store_cycles(conn, [since - timedelta(seconds=400)], 50.0, 0.0, p95=9.0)  # outside the 5 min before
    store_cycles(conn, [since + timedelta(seconds=s) for s in (30, 60, 90)], 3.0, 1.0, p95=0.050)
    cost = holders.price(conn, since, now=now)
    assert cost["throughput"]["before"] == pytest.approx(10.0) and cost["throughput"]["now"] == pytest.approx(4.0)
    assert cost["throughput"]["change"] == pytest.approx(-0.6)
    assert cost["claim_latency"]["before"] == pytest.approx(0.010) and cost["claim_latency"]["now"] == pytest.approx(0.050)
    assert cost["claim_latency"]["change"] == pytest.approx(4.0) and cost["claim_latency"]["source"] == "workers p95"
    assert cost["held_s"] == pytest.approx(120.0)


def test_a_fall_in_throughput_with_no_job_waiting_is_the_arrivals_not_the_holder(conn):
    """The rate fell by 60 % since the holder began. With jobs waiting since (a backlog of 40),
    that is lost capacity; with none (the workers finished everything that arrived) it is the
    arrivals' fall, and the price says so instead of charging it to the holder."""
    now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
    since = now - timedelta(seconds=120)
    store_cycles(conn, [since - timedelta(seconds=s) for s in (250, 150, 10)], 8.0, 2.0, p95=0.010)
    after = [since + timedelta(seconds=s) for s in (30, 60, 90)]
    store_cycles(conn, after, 3.0, 1.0, p95=0.050)

    def backlog(waiting: float, at: list[datetime]) -> None:
        for when in at:
            samples.store(conn, [Sample("queue_depth", {"queue": "search", "state": "eligible", "system": "skiplock"},
                                        waiting, when),
                                 Sample("queue_depth", {"queue": "search", "state": "scheduled", "system": "skiplock"},
                                        500.0, when)])  # scheduled for later: not waiting

    backlog(0.0, after)
    kept_up = holders.price(conn, since, now=now)["throughput"]
    assert kept_up["change"] == pytest.approx(-0.6) and kept_up["backlog_now"] == 0.0 and kept_up["kept_up"] is True

    conn.execute("TRUNCATE skiplock.samples")  # its trigger empties samples_totals too
    store_cycles(conn, [since - timedelta(seconds=s) for s in (250, 150, 10)], 8.0, 2.0, p95=0.010)
    store_cycles(conn, after, 3.0, 1.0, p95=0.050)
    backlog(40.0, after)
    starved = holders.price(conn, since, now=now)["throughput"]
    assert starved["backlog_now"] == pytest.approx(40.0) and starved["kept_up"] is False


def test_the_database_page_says_when_the_workers_kept_up_since_the_holder_began(dsn, conn, client_as):
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        _, since = identity(conn, pid)
        for offset, done, waiting in ((-200, 10.0, 3.0), (-100, 10.0, 2.0), (-5, 10.0, 0.0), (0.1, 4.0, 0.0), (0.2, 4.0, 0.0)):
            at = since + timedelta(seconds=offset)
            samples.store(conn, [Sample("throughput", {"outcome": "completed"}, done, at),
                                 Sample("queue_depth", {"queue": "mail", "state": "eligible", "system": "skiplock"},
                                        waiting, at)])
        time.sleep(0.3)
        horizon_rule(conn, 0.2)
        html = client_as("viewer").get("/health").get_data(as_text=True)
        assert f'data-price-pid="{pid}"' in html
        throughput = html.split('data-price="throughput">', 1)[1].split("</dd>", 1)[0]
        assert "(-60 %)" in throughput and "<strong>" not in throughput, throughput
        assert 'data-price="kept-up"' in throughput and "the rate follows the arrivals" in throughput


def test_not_enough_samples_is_said_when_the_history_does_not_reach_back(conn):
    now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
    since = now - timedelta(seconds=100)
    store_cycles(conn, [since - timedelta(seconds=5)], 8.0, 2.0, pgss=0.002)  # one cycle before: not enough
    store_cycles(conn, [since + timedelta(seconds=s) for s in (30, 60)], 3.0, 1.0, pgss=0.004)
    cost = holders.price(conn, since, now=now)
    for figure in ("throughput", "claim_latency"):
        assert cost[figure]["before"] is None and cost[figure]["change"] is None
        assert cost[figure]["note"].startswith("not enough samples: 1 collection cycle in the 5 min before it started")
    assert cost["dead_tuples"]["total"] is None
    assert cost["dead_tuples"]["note"].startswith("not enough samples: no table_dead_tuples sample")
    # a second cycle before it: the pg_stat_statements mean is used (no workers' p95 at all)
    store_cycles(conn, [since - timedelta(seconds=60)], 8.0, 2.0, pgss=0.002)
    latency = holders.price(conn, since, now=now)["claim_latency"]
    assert latency["source"] == "pg_stat_statements mean" and latency["change"] == pytest.approx(1.0)


# --- ending it ----------------------------------------------------------------------------------


def end(client, pid: int, mode: str, backend_start, reason: str | None = REASON, *, api: bool = True, **extra):
    body = {"mode": mode, "backend_start": backend_start if isinstance(backend_start, str) else backend_start.isoformat(),
            **extra}
    if reason is not None:
        body["reason"] = reason
    if api:
        return client.post(f"/api/v1/health/backends/{pid}/end", json=body, headers={"X-CSRF-Token": CSRF})
    return client.post(f"/health/backends/{pid}/end", data={**body, "csrf_token": CSRF}, headers={"HX-Request": "true"})


def test_terminate_ends_that_backend_and_is_audited(dsn, conn, client_as):
    horizon_rule(conn, 0.2)
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        time.sleep(0.3)
        response = end(client_as("admin"), pid, "terminate", started)
        assert response.status_code == 200, response.get_data(as_text=True)
        result = response.get_json()
        assert result["ended"] is True and result["signalled"] is True and "terminated" in result["message"]
        assert not alive(conn, pid)
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")
    [(who, target, reason, selection, rows, outcome, detail)] = audited(conn, "backend_terminate")
    assert (who, target, reason, rows, outcome) == ("admin", f"pid {pid}", REASON, 1, "ok")
    assert selection["pid"] == pid and selection["application_name"] == "nightly-report"
    assert datetime.fromisoformat(selection["backend_start"]) == started
    assert detail["ended"] is True and detail["price"]["held_s"] >= 0.3
    listed = client_as("viewer").get("/api/v1/health").get_json()["holders"]["holders"]
    assert pid not in [h["pid"] for h in listed]
    # the advisor names it among the operator's changes that explain a figure that moved
    from psycopg.rows import dict_row

    from console.advisor import causes

    with conn.cursor(row_factory=dict_row) as cur:
        now = conn.execute("SELECT now()").fetchone()[0]
        [change] = [c for c in causes.operator_changes(cur, now - timedelta(minutes=5), now + timedelta(minutes=1))
                    if c["action"] == "backend_terminate"]
    cause = causes.change_cause(change)
    assert f"ran 'backend_terminate' on pid {pid}" in cause.text and REASON in cause.text
    assert "vacuum can remove the dead rows" in cause.fix


def test_cancel_ends_the_running_query_of_a_snapshot_holder(dsn, conn, client_as):
    """From the page (htmx): the holder's pg_sleep is cancelled, its transaction aborted, and it
    no longer holds the horizon; the refreshed panels say so."""
    with snapshot_holder(dsn, "long-export") as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        failure: list[BaseException] = []

        def sleep():
            try:
                holder.execute("SELECT pg_sleep(30)")
            except psycopg.Error as exc:
                failure.append(exc)

        thread = threading.Thread(target=sleep)
        thread.start()
        eventually(lambda: conn.execute("SELECT state = 'active' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0])
        response = end(client_as("admin"), pid, "cancel", started, api=False)
        thread.join(10)
        assert response.status_code == 200, response.get_data(as_text=True)
        assert len(failure) == 1 and isinstance(failure[0], psycopg.errors.QueryCanceled)
        state, xmin = conn.execute("SELECT state, backend_xmin FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        assert state == "idle in transaction (aborted)" and xmin is None
        html = response.get_data(as_text=True)
        assert 'id="backend-result"' in html and "holds back nothing now" in html and 'id="health-panels"' in html
    [row] = audited(conn, "backend_cancel")
    assert row[2] == REASON and row[4] == 1


def test_cancel_of_an_idle_transaction_says_it_still_holds(dsn, conn, client_as):
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        result = end(client_as("admin"), pid, "cancel", started).get_json()
        assert result["ended"] is False and result["holds_horizon"] is True
        assert "terminate it to end the transaction" in result["message"]
        assert alive(conn, pid)


def test_a_reused_pid_or_a_gone_backend_is_refused(dsn, conn, client_as):
    admin = client_as("admin")
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        # the same pid, another backend_start: the pid was reused by a new backend
        response = end(admin, pid, "terminate", started - timedelta(microseconds=1))
        assert response.status_code == 409 and "now another backend" in response.get_json()["error"]
        response = end(admin, pid, "terminate", started + timedelta(seconds=3))
        assert response.status_code == 409
        assert alive(conn, pid)
    eventually(lambda: not alive(conn, pid))
    response = end(admin, pid, "terminate", started)
    assert response.status_code == 404 and "has ended" in response.get_json()["error"]
    assert audited(conn, "backend_terminate") == []


def test_the_consoles_own_and_replication_sessions_are_refused(dsn, conn, client_as):
    admin = client_as("admin")
    with connect(dsn, application_name="skiplock-web", autocommit=False) as console:
        console.execute("SELECT txid_current()")
        pid = console.info.backend_pid
        response = end(admin, pid, "terminate", identity(conn, pid)[0])
        assert response.status_code == 403 and "the console's own session" in response.get_json()["error"]
        assert alive(conn, pid)
        console.rollback()
    eventually(lambda: not alive(conn, pid))  # closed: not listed below as the pool's
    # the console's pool connections (the request's own among them)
    own = conn.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = 'skiplock-web'"
                       " AND datname = current_database()").fetchall()
    assert own, "the console's pool has a connection"
    for pid, started in own:
        assert end(admin, pid, "cancel", started).status_code == 403
    # a walsender: a replication connection
    with psycopg.connect(dsn, replication="database", autocommit=True) as walsender:
        pid = walsender.info.backend_pid
        kind, started = conn.execute("SELECT backend_type, backend_start FROM pg_stat_activity WHERE pid = %s",
                                     (pid,)).fetchone()
        assert kind == "walsender"
        response = end(admin, pid, "terminate", started)
        assert response.status_code == 403 and "replication (walsender)" in response.get_json()["error"]
        assert alive(conn, pid)
    # a server process: the checkpointer
    pid, started = conn.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()
    assert end(admin, pid, "terminate", started).status_code in (403, 404)  # not of this database: 404
    assert audited(conn, "backend_terminate") == [] and audited(conn, "backend_cancel") == []


def test_roles_reason_and_bad_input(dsn, conn, client_as):
    with snapshot_holder(dsn) as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        for role in ("viewer", "operator"):
            assert end(client_as(role), pid, "terminate", started).status_code == 403
            assert end(client_as(role), pid, "terminate", started, api=False).status_code == 403
        assert end(client_as(None), pid, "terminate", started).status_code == 401
        admin = client_as("admin")
        assert end(admin, pid, "terminate", started, reason=None).status_code == 422
        assert end(admin, pid, "terminate", started, reason="\u200b ").status_code == 422
        for bad in ("yesterday", "", "2026-12-03T09:00:00", "x" * 100, "2026-13-45T99:00:00+00:00"):
            response = end(admin, pid, "terminate", bad)
            assert response.status_code == 400 and "backend_start" in response.get_json()["error"], bad
        for mode in ("kill", "", None, ["terminate"], {"a": 1}):
            response = admin.post(f"/api/v1/health/backends/{pid}/end", json={"mode": mode, "backend_start": started.isoformat(),
                                                                            "reason": REASON}, headers={"X-CSRF-Token": CSRF})
            assert response.status_code == 400 and "mode" in response.get_json()["error"]
        assert admin.post("/api/v1/health/backends/abc/end", json={}, headers={"X-CSRF-Token": CSRF}).status_code == 404
        huge = end(admin, 99_999_999_999, "terminate", started)  # past int4: no backend, not a 500
        assert huge.status_code == 404
        assert end(admin, pid, "terminate", started, reason=["why"]).status_code == 400
        assert admin.post(f"/api/v1/health/backends/{pid}/end", data="[1]", content_type="application/json",
                          headers={"X-CSRF-Token": CSRF}).status_code == 400
        # no CSRF token: refused for a signed-in browser
        response = admin.post(f"/health/backends/{pid}/end", data={"mode": "terminate", "reason": REASON,
                                                                 "backend_start": started.isoformat()})
        assert response.status_code in (400, 403)
        assert alive(conn, pid)
    assert audited(conn, "backend_terminate") == []


def test_a_lock_blocker_is_priced_and_terminated_and_its_waiter_goes_on(dsn, conn, client_as):
    job = q.enqueue(conn, "report", {}, queue="mail")
    blocker = connect(dsn, application_name="migration-script", autocommit=False)
    blocker.execute("UPDATE skiplock.jobs SET priority = 5 WHERE id = %s", (job,))
    done = threading.Event()

    def wait():
        with connect(dsn, application_name="skiplock-worker-1") as waiter:
            waiter.execute("UPDATE skiplock.jobs SET priority = 7 WHERE id = %s", (job,))
        done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        tree = eventually(lambda: client_as("viewer").get("/api/v1/health").get_json()["locks"]["tree"])
        [root] = tree
        assert root["pid"] == blocker.info.backend_pid and root["blocks"][0]["application_name"] == "skiplock-worker-1"
        assert root["price"]["held_s"] >= 0 and root["backend"]["backend_start"]
        html = client_as("admin").get("/health").get_data(as_text=True)
        assert f'data-end-pid="{root["pid"]}"' in html
        response = end(client_as("admin"), root["pid"], "terminate", root["backend"]["backend_start"])
        assert response.status_code == 200 and response.get_json()["ended"] is True
        assert done.wait(10), "the waiter still waits"
        assert conn.execute("SELECT priority FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0] == 7
    finally:
        thread.join(10)
        blocker.close()


def test_refusal_names_why():
    base = {"pid": 7, "backend_type": "client backend", "is_me": False, "console_app": False, "application_name": "app"}
    assert holders.refusal(base) is None
    assert "own session" in holders.refusal(base, own_pids=(7,))
    assert "own session" in holders.refusal({**base, "is_me": True})
    assert "walsender" in holders.refusal({**base, "backend_type": "walsender"})
    assert "autovacuum worker" in holders.refusal({**base, "backend_type": "autovacuum worker"})


def test_the_cli_shows_the_price_and_ends_the_backend_bound_to_its_start(dsn, conn):
    from click.testing import CliRunner

    from console.cli import main

    runner = CliRunner()
    with snapshot_holder(dsn, "cli-holder") as holder:
        pid = holder.info.backend_pid
        started, _ = identity(conn, pid)
        shown = runner.invoke(main, ["--dsn", dsn, "backends", "show", str(pid)])
        assert shown.exit_code == 0, shown.output
        assert f"--backend-start {started.isoformat()}" in shown.output and "held for" in shown.output
        other = (started - timedelta(seconds=1)).isoformat()
        refused = runner.invoke(main, ["--dsn", dsn, "backends", "terminate", str(pid), "--backend-start", other,
                                       "--reason", REASON])
        assert refused.exit_code == 1 and "now another backend" in refused.output and alive(conn, pid)
        bad = runner.invoke(main, ["--dsn", dsn, "backends", "terminate", str(pid), "--backend-start", "soon",
                                   "--reason", REASON])
        assert bad.exit_code == 2 and "backend_start" in bad.output
        done = runner.invoke(main, ["--dsn", dsn, "backends", "terminate", str(pid), "--backend-start",
                                    started.isoformat(), "--reason", REASON])
        assert done.exit_code == 0 and f"pid {pid} terminated" in done.output, done.output
        assert not alive(conn, pid)
    [row] = audited(conn, "backend_terminate")
    assert row[0].startswith("cli:") and row[2] == REASON
