"""The advisor's checks against a real PostgreSQL: each fault is provoked for real, must turn
its check to warn/fail with the right evidence, and must go back to ok when undone."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from console import maintenance
from console import queue as q
from console.advisor import run_checks
from console.advisor.checks import FAIL, OK, UNKNOWN, WARN, check_ids
from console.config import load_config
from console.db import connect


def cfg(**advisor):
    return load_config(env={}, overrides={f"advisor.{k}": v for k, v in advisor.items()})


def result(conn, check_id, config=None):
    return run_checks(conn, config or cfg(), only=[check_id]).by_id(check_id)


def evidence(res) -> str:
    return "\n".join([res.summary, *res.evidence])


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_fresh_queue_passes_every_check(conn):
    q.enqueue_many(conn, [q.NewJob("email", {"n": i}) for i in range(20)])
    q.claim(conn, "w1", limit=5)
    report = run_checks(conn, cfg())
    bad = {r.id: (r.status, r.summary) for r in report.results if r.status != OK}
    assert bad == {}
    assert [r.id for r in report.results] == check_ids()
    assert all(r.docs.startswith("docs/advisor.md#") for r in report.results)


def test_dropping_the_claim_index_fails_the_plan_check_and_recreating_it_passes(conn):
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(20)])
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    res = result(conn, "claim-plan")
    assert res.status == FAIL
    assert "no index matches the claim" in res.summary
    assert "Sort" in evidence(res) or "Seq Scan" in evidence(res)
    assert "CREATE INDEX CONCURRENTLY jobs_claim_idx" in res.remedy

    conn.execute("CREATE INDEX jobs_claim_idx ON skiplock.jobs (priority DESC, run_at, id) "
                 "INCLUDE (queue) WHERE status = 'pending'")
    res = result(conn, "claim-plan")
    assert res.status == OK
    assert "jobs_claim_idx" in res.summary


def test_a_claim_index_without_the_partial_predicate_is_a_warning(conn):
    conn.execute("DROP INDEX skiplock.jobs_claim_idx")
    conn.execute("CREATE INDEX jobs_claim_full_idx ON skiplock.jobs (priority DESC, run_at, id)")
    res = result(conn, "claim-plan")
    assert res.status == WARN
    assert "jobs_claim_full_idx" in res.summary and "finished rows" in res.summary


def test_an_unused_extra_index_on_the_hot_table_warns(conn):
    conn.execute("CREATE INDEX jobs_kind_idx ON skiplock.jobs (kind)")
    res = result(conn, "unused-indexes")
    assert res.status == WARN
    assert "jobs_kind_idx" in res.summary
    assert "0 scans" in evidence(res)
    conn.execute("DROP INDEX skiplock.jobs_kind_idx")
    assert result(conn, "unused-indexes").status == OK


def test_a_plain_for_update_claimer_waiting_behind_a_claim_is_a_convoy(conn, dsn):
    q.enqueue_many(conn, [q.NewJob("email", {"n": i}) for i in range(5)])
    holder = connect(dsn, application_name="good-worker", autocommit=False)
    legacy = connect(dsn, application_name="legacy-claimer", autocommit=False)
    try:
        # a normal SKIP LOCKED claim whose transaction is still open holds the head row
        held = holder.execute("SELECT id FROM skiplock.jobs WHERE status = 'pending' "
                              "ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()[0]
        legacy_pid = legacy.info.backend_pid
        done = threading.Event()

        def plain_claim():
            legacy.execute("SELECT id FROM skiplock.jobs WHERE status = 'pending' "
                           "ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE")
            done.set()

        thread = threading.Thread(target=plain_claim, daemon=True)
        thread.start()
        wait_until(lambda: conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                        (legacy_pid,)).fetchone()[0] == "Lock", what="the plain claimer to wait")
        res = result(conn, "row-lock-waits")
        assert res.status == FAIL
        assert "legacy-claimer" in res.summary
        text = evidence(res)
        assert f"pid {legacy_pid} [legacy-claimer]" in text
        assert "FOR UPDATE" in text
        assert f"blocked by pid {holder.info.backend_pid} [good-worker]" in text
        assert res.data["plain_for_update"] == [legacy_pid]

        holder.commit()  # the claim commits: the convoy moves on
        thread.join(5)
        assert done.is_set()
        legacy.commit()
        assert held
        assert result(conn, "row-lock-waits").status == OK
    finally:
        holder.close()
        legacy.close()


def test_a_session_idle_in_transaction_on_the_jobs_table_warns_then_fails(conn, dsn):
    q.enqueue(conn, "report", {})
    config = cfg(idle_in_transaction_warn=0.3, idle_in_transaction_fail=1.5, xmin_horizon_warn=0.3)
    idle = connect(dsn, application_name="nightly-report", autocommit=False)
    try:
        idle.execute("SELECT id FROM skiplock.jobs WHERE status = 'pending' LIMIT 1 FOR UPDATE SKIP LOCKED")
        pid = idle.info.backend_pid
        time.sleep(0.5)
        res = result(conn, "long-transactions", config)
        assert res.status == WARN
        assert f"pid {pid} [nightly-report]" in evidence(res)
        assert "idle in transaction" in evidence(res)
        # the same session pins the xmin horizon (it holds a transaction id): vacuum is blocked
        horizon = result(conn, "xmin-horizon", config)
        assert horizon.status == WARN
        assert f"session {pid} nightly-report" in evidence(horizon)
        time.sleep(1.1)
        assert result(conn, "long-transactions", config).status == FAIL
        idle.rollback()
        assert result(conn, "long-transactions", config).status == OK
        assert result(conn, "xmin-horizon", config).status == OK
    finally:
        idle.close()


def test_a_foreign_key_into_jobs_warns_and_share_locked_rows_fail(conn, dsn):
    job_id = q.enqueue(conn, "charge", {})
    conn.execute("CREATE TABLE public.job_events (id serial PRIMARY KEY, job_id bigint REFERENCES skiplock.jobs (id))")
    res = result(conn, "fk-into-jobs")
    assert res.status == WARN
    assert "job_events_job_id_fkey" in res.summary
    assert "public.job_events" in evidence(res) or "job_events" in evidence(res)

    result(conn, "multixact")  # first reading of the MultiXact counter
    writers = [connect(dsn, application_name=f"event-writer-{i}", autocommit=False) for i in range(2)]
    try:
        for writer in writers:  # each insert takes FOR KEY SHARE on the same job row
            writer.execute("INSERT INTO public.job_events (job_id) VALUES (%s)", (job_id,))
        time.sleep(1.1)
        res = result(conn, "fk-into-jobs")
        assert res.status == FAIL
        text = evidence(res)
        assert "event-writer-0" in text and "event-writer-1" in text
        assert sorted(res.data["share_lockers"]) == sorted(w.info.backend_pid for w in writers)
        mx = result(conn, "multixact")
        assert mx.data["consumed_since_last_check"] >= 1  # two lockers of one row make a MultiXact
        assert "since the last check" in evidence(mx)
    finally:
        for writer in writers:
            writer.rollback()
            writer.close()
    conn.execute("DROP TABLE public.job_events")
    assert result(conn, "fk-into-jobs").status == OK


def test_an_absurd_max_attempts_fails_the_retry_cap_check(conn):
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(3)])
    poison = q.enqueue(conn, "poison", {}, max_attempts=1_000_000)
    res = result(conn, "retry-caps")
    assert res.status == FAIL
    assert "1,000,000" in res.summary
    assert f"kind poison on queue default allow up to 1,000,000 attempts (e.g. job {poison})" in evidence(res)
    conn.execute("UPDATE skiplock.jobs SET max_attempts = 30 WHERE id = %s", (poison,))
    assert result(conn, "retry-caps").status == WARN
    conn.execute("UPDATE skiplock.jobs SET max_attempts = 5 WHERE id = %s", (poison,))
    assert result(conn, "retry-caps").status == OK


def insert_finished(conn, status, n, age="30 days"):
    conn.execute(
        "INSERT INTO skiplock.jobs (kind, status, attempts, finished_at, created_at) "
        "SELECT 'old', %s, 1, now() - %s::interval, now() - %s::interval FROM generate_series(1, %s)",
        (status, age, age, n),
    )


def test_old_completed_rows_in_the_hot_table_warn_then_fail(conn):
    config = cfg(completed_rows_warn=500)
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(10)])
    insert_finished(conn, "completed", 200, "1 minute")  # recent: within the archival age
    assert result(conn, "completed-rows", config).status == OK
    insert_finished(conn, "completed", 800)
    res = result(conn, "completed-rows", config)
    assert res.status == WARN
    assert res.data["old_completed"] == 800 and res.data["exact"]
    assert "800 completed row(s) finished more than 75 min ago (maintenance.archive_after 60 min" in evidence(res)
    insert_finished(conn, "completed", 4500)
    res = result(conn, "completed-rows", config)
    assert res.status == FAIL
    assert "archival has never run on this database" in evidence(res)
    run = maintenance.archive_completed(conn, older_than=timedelta(hours=1), pause_ms=0)
    assert run.rows == 5300
    res = result(conn, "completed-rows", config)
    assert res.status == OK
    # "0 s ago" on a quiet machine; seconds later on a loaded one (the run above is what counts)
    assert re.search(r"last archival run: \d+ s ago by scheduler, ok, 5,300 rows", evidence(res)), evidence(res)


def test_a_hot_table_that_is_mostly_recent_history_warns_and_names_complete_into_archive(conn):
    """Archival keeps up (nothing is late) but the completed rows not yet due to move are most
    of the table: the advisor says so and names the two ways out."""
    config = cfg(completed_rows_warn=50)
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(100)])
    insert_finished(conn, "completed", 400, "1 minute")  # under ten times the warning: fine
    assert result(conn, "completed-rows", config).status == OK
    insert_finished(conn, "completed", 200, "1 minute")
    conn.execute("ANALYZE skiplock.jobs")
    res = result(conn, "completed-rows", config)
    assert res.status == WARN, res.summary
    assert res.data["old_completed"] == 0
    assert "within 75 min): archival keeps up, but the table is mostly history" in res.summary
    assert "600 completed rows within the archival age" in evidence(res)
    assert "worker.complete_into_archive = true" in res.remedy
    # Pending work outnumbers the history: fine again.
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(1000)])
    conn.execute("ANALYZE skiplock.jobs")
    assert result(conn, "completed-rows", config).status == OK


def test_the_archival_age_follows_the_maintenance_config(conn):
    insert_finished(conn, "completed", 50, "2 hours")
    week = load_config(env={}, overrides={"advisor.completed_rows_warn": 10, "maintenance.archive_after": "7d"})
    assert result(conn, "completed-rows", week).status == OK
    hour = load_config(env={}, overrides={"advisor.completed_rows_warn": 10, "maintenance.archive_after": "1h"})
    res = result(conn, "completed-rows", hour)
    assert res.status == WARN and res.data["old_completed"] == 50


def test_expired_leases_warn_then_fail_when_the_reaper_does_not_come(conn):
    q.enqueue(conn, "slow", {})
    [job] = q.claim(conn, "dead-worker", limit=1, lease=0.2)
    assert result(conn, "stuck-leases").status == OK
    time.sleep(0.4)
    res = result(conn, "stuck-leases")
    assert res.status == WARN
    assert f"job {job.id} (slow on default), attempt 1, held by dead-worker" in evidence(res)
    res = result(conn, "stuck-leases", cfg(stuck_lease_grace=0.1))
    assert res.status == FAIL
    assert "the reaper is not rescuing them" in res.summary
    assert "no live scheduler leader; the scheduler has not run its reap job on this database" in evidence(res)
    maintenance.reap(conn)
    res = result(conn, "stuck-leases", cfg(stuck_lease_grace=0.1))
    assert res.status == OK
    assert "last reaper run: 0 s ago by scheduler, ok, 1 rescued" in evidence(res)


def test_lease_shorter_than_the_p99_runtime_fails(conn):
    from console.histogram import BOUNDS_MS

    counts = [0] * len(BOUNDS_MS)
    counts[BOUNDS_MS.index(100)] = 900  # most jobs take under 100 ms
    counts[BOUNDS_MS.index(60_000)] = 100  # a tenth take 30-60 s
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, concurrency, runtime_histogram) "
                 "VALUES ('w1', 'h', 1, 4, %s)", (counts,))
    assert result(conn, "lease-vs-runtime", load_config(env={}, overrides={"worker.lease": 600})).status == OK
    res = result(conn, "lease-vs-runtime", load_config(env={}, overrides={"worker.lease": 90}))
    assert res.status == WARN
    res = result(conn, "lease-vs-runtime", load_config(env={}, overrides={"worker.lease": 30}))
    assert res.status == FAIL
    assert "longer than the lease (30 s)" in res.summary


def test_a_retry_hot_loop_is_found_in_the_error_history(conn):
    job_id = q.enqueue(conn, "flaky", {}, max_attempts=10)
    for _ in range(4):
        [job] = q.claim(conn, "w1", limit=1)
        q.fail(conn, job, RuntimeError("boom"), backoff_base=0.0001, backoff_cap=0.0001)
    res = result(conn, "retry-hot-loops")
    assert res.status == WARN
    assert f"job {job_id} (flaky on default, pending): 3 retries" in evidence(res)


def test_an_old_dead_letter_set_is_a_graveyard(conn):
    insert_finished(conn, "failed", 3, "1 hour")
    assert result(conn, "dead-letters").status == OK
    insert_finished(conn, "failed", 2, "10 days")
    res = result(conn, "dead-letters")
    assert res.status == WARN
    assert "the oldest dead letter is 10 days old (5 in all)" in res.summary
    insert_finished(conn, "failed", 1, "40 days")
    assert result(conn, "dead-letters").status == FAIL


def test_disabled_autovacuum_on_the_jobs_table_fails(conn):
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false)")
    res = result(conn, "autovacuum-settings")
    assert res.status == FAIL
    assert "autovacuum_enabled=false" in evidence(res)
    conn.execute("ALTER TABLE skiplock.jobs RESET (autovacuum_enabled)")
    assert result(conn, "autovacuum-settings").status == OK
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_vacuum_threshold = 200000)")
    res = result(conn, "autovacuum-settings")
    assert res.status == WARN and "200,000 dead rows" in res.summary
    conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_vacuum_threshold = 5000)")
    assert result(conn, "autovacuum-settings").status == OK


def test_a_table_lock_degrades_checks_to_not_available_and_the_rest_still_run(conn, dsn):
    locker = connect(dsn, application_name="migration", autocommit=False)
    try:
        locker.execute("LOCK TABLE skiplock.jobs IN ACCESS EXCLUSIVE MODE")
        report = run_checks(conn, cfg(), timeout_ms=300)
        statuses = {r.id: r.status for r in report.results}
        assert statuses["retry-caps"] == UNKNOWN
        assert "not available" in report.by_id("retry-caps").summary
        assert statuses["connections"] == OK and statuses["notify-queue"] == OK
    finally:
        locker.rollback()
        locker.close()


def test_unknown_check_names_are_refused(conn):
    from console.advisor import UnknownCheck

    with pytest.raises(UnknownCheck, match="claim-plna"):
        run_checks(conn, cfg(), only=["claim-plna"])


def test_checks_leave_no_transaction_open(conn):
    run_checks(conn, cfg())
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_every_check_is_explained_in_docs_advisor():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "advisor.md").read_text(encoding="utf-8")
    missing = [check_id for check_id in check_ids() if f"\n### {check_id}\n" not in text]
    assert not missing, f"add a '### <id>' section to docs/advisor.md for: {missing}"


def claims(conn, n):
    for _ in range(n):
        for job in q.claim(conn, "w1", limit=1):
            q.complete(conn, job)


def test_buffers_per_claim_rise_over_dead_index_entries_and_recover_after_vacuum(conn, dsn):
    config = cfg(claim_min_calls=20)
    q.enqueue_many(conn, [q.NewJob("email") for _ in range(200)])
    claims(conn, 20)
    first = result(conn, "claim-buffers", config)
    assert first.status == OK and first.data["baseline"] is None  # the first figure starts the baseline
    for _ in range(4):  # a baseline of five measurements (advisor.claim_baseline_min) before it may fail
        claims(conn, 20)
        steady = result(conn, "claim-buffers", config)
        assert steady.status == OK and steady.data["baseline"] is not None
    assert steady.data["baseline_measurements"] == 4

    holder = connect(dsn, application_name="long-report", autocommit=False)
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM skiplock.queues")  # takes the snapshot: vacuum cannot clean past it
        # 10,000 jobs at the head of the claim index leave it without being claimed: dead entries
        conn.execute("INSERT INTO skiplock.jobs (kind, priority) SELECT 'bulk', 5 FROM generate_series(1, 10000)")
        conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() WHERE kind = 'bulk'")
        claims(conn, 20)
        slow = result(conn, "claim-buffers", config)
        assert slow.status == FAIL, slow.data
        assert "x the buffers of its baseline" in slow.summary
        # the holder is seconds old, under advisor.xmin_horizon_warn: not named as the cause, and
        # the evidence says what the horizon and dead-rows checks see
        assert "with no known cause" in slow.summary and "cause" not in slow.data
        assert "long-report" in evidence(slow) and "dead rows; autovacuum starts at" in evidence(slow)
        assert "xmin-horizon" in slow.remedy
    finally:
        holder.rollback()
        holder.close()
    # Recovered once a vacuum has removed the dead entries (this VACUUM, or autovacuum: the
    # cluster's naptime is 1 s). A vacuum removes nothing while another backend of this database
    # still holds a snapshot from before the bulk update (an autovacuum worker's ANALYZE of the
    # 10,000 new rows, started before the holder went): on a loaded machine a single VACUUM was
    # seen to leave the figure at `warn`. So vacuum and measure again until it recovers, within a
    # deadline, and say what held the horizon if it never does.
    deadline = time.monotonic() + 30
    while True:
        conn.execute("VACUUM skiplock.jobs")
        q.enqueue_many(conn, [q.NewJob("email") for _ in range(20)])  # each round claims rows, as the baseline's did
        claims(conn, 20)
        after = result(conn, "claim-buffers", config)
        if after.status == OK or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    backends = conn.execute(
        "SELECT pid, backend_type, state, backend_xmin::text, left(query, 80) FROM pg_stat_activity"
        " WHERE datname = current_database() AND backend_xmin IS NOT NULL").fetchall()
    assert after.status == OK, (after.summary, after.data, backends)


def test_plain_row_locking_is_told_apart_from_skip_locked():
    from console.advisor.checks import waits_for_rows

    assert waits_for_rows("SELECT id FROM skiplock.jobs ORDER BY id LIMIT 1 FOR UPDATE")
    assert waits_for_rows("select * from skiplock.jobs where id = 1 for no key update of jobs")
    assert waits_for_rows("SELECT 1 FROM skiplock.jobs FOR SHARE")
    assert not waits_for_rows("SELECT id FROM skiplock.jobs LIMIT 1 FOR UPDATE OF j SKIP LOCKED")
    assert not waits_for_rows("SELECT id FROM skiplock.jobs FOR UPDATE NOWAIT")
    assert not waits_for_rows("UPDATE skiplock.jobs SET status = 'completed' WHERE id = 1")
