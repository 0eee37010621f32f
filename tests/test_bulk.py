"""Bulk replay and purge: preview-exact totals, batches, progress, cancel, resume, audit."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from console import audit
from console import queue as q
from console.db import connect
from console.maintenance import (
    InvalidSelection,
    InvalidSettings,
    NothingMatches,
    OperationState,
    Previewed,
    PreviewMismatch,
    Selection,
    bulk,
    cancel,
    preview,
    progress,
    resume,
    resume_abandoned,
    run,
    start,
)
from tests.maintenance_data import add_completed, add_failed, live_and_archived_ids, replay_entries
from tests.workers import wait_for


def statuses(conn):
    return dict(conn.execute("SELECT status, count(*) FROM skiplock.jobs GROUP BY status").fetchall())


def test_replay_returns_dead_letters_to_pending_with_a_fresh_budget_and_history(conn, dsn):
    ids = add_failed(conn, 30, queue="mail")
    other = add_failed(conn, 5, queue="billing")
    op_id = start(conn, "replay", {"queue": "mail"}, actor="alice", reason="SMTP fixed", batch_size=7)
    assert progress(conn, op_id)["state"] == "queued" and progress(conn, op_id)["total"] == 30

    with connect(dsn) as listener:
        listener.execute("LISTEN skiplock_jobs")
        final = run(dsn, op_id)
        woke = {n.payload for n in listener.notifies(timeout=0.5, stop_after=1)}

    assert (final["state"], final["done"], final["total"], final["batches"], final["percent"]) == ("done", 30, 30, 5, 100.0)
    assert woke == {"mail"}
    rows = conn.execute(
        "SELECT status, attempts, finished_at, run_at <= now(), locked_by, errors->-1 FROM skiplock.jobs WHERE id = ANY(%s)",
        (ids,)).fetchall()
    for status, attempts, finished_at, due, locked_by, entry in rows:
        assert (status, attempts, finished_at, due, locked_by) == ("pending", 0, None, True, None)
        assert entry["message"] == "replayed by alice" and entry["operation"] == op_id and entry["reason"] == "SMTP fixed"
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND status = 'failed'", (other,)).fetchone()[0] == 5
    # the replayed jobs run again: a worker can claim them
    assert len(q.claim(conn, "w", queues=["mail"], limit=100)) == 30
    log = audit.search(conn, action="replay")
    assert [(r["outcome"], r["rows"]) for r in log] == [("ok", 30), ("started", 30)]
    assert log[0]["selection"] == {"queue": "mail"} and log[0]["reason"] == "SMTP fixed"


def test_purge_deletes_or_moves_to_the_archive_marked_purged(conn, dsn):
    a = add_failed(conn, 10, queue="a")
    b = add_failed(conn, 10, queue="b")
    keep = add_completed(conn, 3)
    run(dsn, start(conn, "purge", {"queue": "a"}, actor="alice", batch_size=4))
    run(dsn, start(conn, "purge", {"queue": "b"}, actor="bob", batch_size=4, purge_mode="archive"))
    live, archived = live_and_archived_ids(conn)
    assert live == sorted(keep)
    assert archived == sorted(b)
    marks = conn.execute("SELECT DISTINCT purged, purged_by, purged_at IS NOT NULL, status FROM skiplock.jobs_archive").fetchall()
    assert marks == [(True, "bob", True, "failed")]
    assert not set(a) & set(archived)
    assert [r["rows"] for r in audit.search(conn, action="purge") if r["outcome"] == "ok"] == [10, 10]


def test_nothing_matching_and_bad_requests_are_refused_with_nothing_written(conn):
    add_failed(conn, 3, queue="mail")
    pending = q.enqueue(conn, "x", {})
    with pytest.raises(NothingMatches, match="queue = 'nowhere'"):
        start(conn, "replay", {"queue": "nowhere"}, actor="alice")
    with pytest.raises(NothingMatches):
        start(conn, "purge", {"ids": [pending]}, actor="alice")  # not a dead letter
    with pytest.raises(InvalidSelection):
        start(conn, "replay", {}, actor="alice")
    with pytest.raises(InvalidSelection, match="impossible"):
        start(conn, "replay", {"failed_since": "2026-01-02", "failed_before": "2026-01-01"}, actor="alice")
    with pytest.raises(InvalidSettings, match="batch size"):
        start(conn, "replay", {"queue": "mail"}, actor="alice", batch_size=0)
    with pytest.raises(InvalidSettings, match="rate"):
        start(conn, "replay", {"queue": "mail"}, actor="alice", rate=-5)
    with pytest.raises(InvalidSettings, match="action"):
        start(conn, "requeue", {"queue": "mail"}, actor="alice")
    with pytest.raises(InvalidSettings, match="purge mode"):
        start(conn, "purge", {"queue": "mail"}, actor="alice", purge_mode="shred")
    assert conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0
    assert audit.search(conn) == []
    assert statuses(conn) == {"failed": 3, "pending": 1}
    with pytest.raises(OperationState):
        progress(conn, 999)
    with pytest.raises(OperationState):
        cancel(conn, 999, actor="alice")


def test_replay_of_10000_cancelled_halfway_then_resumed_replays_each_job_once(conn, dsn):
    ids = add_failed(conn, 10_000)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=500, rate=8000)
    # The runner waits after the batch that reaches 5000 until the cancel is in: the test
    # checks the cancel, not a race between the runner's speed and the machine's load.
    halfway_reached, go_on = threading.Event(), threading.Event()
    replayed = 0

    def on_batch(rows: int, _ms: float) -> None:
        nonlocal replayed
        replayed += rows
        if replayed >= 5000 and not halfway_reached.is_set():
            halfway_reached.set()
            go_on.wait(60)

    thread = bulk.run_in_thread(dsn, op_id, on_batch=on_batch)
    assert halfway_reached.wait(120), "the replay never got halfway"
    cancel(conn, op_id, actor="bob", reason="wrong group")
    go_on.set()
    thread.join(60)
    assert not thread.is_alive()
    halfway = progress(conn, op_id)
    assert halfway["state"] == "cancelled" and halfway["cancelled_by"] == "bob"
    assert halfway["done"] == 5000
    assert statuses(conn) == {"pending": halfway["done"], "failed": 10_000 - halfway["done"]}

    resume(conn, op_id, actor="bob", reason="it was the right group after all")
    final = run(dsn, op_id)

    assert (final["state"], final["done"]) == ("done", 10_000)
    assert statuses(conn) == {"pending": 10_000}
    entries = replay_entries(conn, op_id)
    assert sorted(entries) == sorted(ids)
    assert set(entries.values()) == {1}  # each job replayed exactly once
    outcomes = [r["outcome"] for r in audit.search(conn, action="replay")]
    assert outcomes == ["ok", "cancelled", "started"]
    assert [r["actor"] for r in audit.search(conn, action="cancel")] == ["bob"]


def test_a_stopped_runner_leaves_the_operation_resumable_and_a_job_failing_again_is_not_replayed_twice(conn, dsn):
    ids = add_failed(conn, 40)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=10, rate=100)
    stop = threading.Event()
    # The stop arrives right after the first batch (as a shutdown would, between batches).
    thread = threading.Thread(target=run, args=(dsn, op_id), kwargs={"stop": stop, "on_batch": lambda *_: stop.set()})
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    mid = progress(conn, op_id)
    assert mid["state"] == "running" and mid["done"] == 10
    # the replayed jobs run and fail again: they are dead letters newer than the snapshot
    conn.execute("UPDATE skiplock.jobs SET status = 'failed', finished_at = now() WHERE status = 'pending'")

    assert resume_abandoned(dsn, min_age=timedelta(0)) == [op_id]

    assert progress(conn, op_id)["state"] == "done" and progress(conn, op_id)["done"] == 40
    entries = replay_entries(conn, op_id)
    assert sorted(entries) == sorted(ids) and set(entries.values()) == {1}
    assert statuses(conn) == {"pending": 40 - mid["done"], "failed": mid["done"]}


def test_only_one_runner_works_an_operation(conn, dsn):
    add_failed(conn, 30)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=5, rate=100)
    results = []
    threads = [threading.Thread(target=lambda: results.append(run(dsn, op_id))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert progress(conn, op_id)["done"] == 30
    assert set(replay_entries(conn, op_id).values()) == {1}
    assert len(results) == 2 and "done" in [r["state"] for r in results]  # the other returned at once


def test_cancel_of_an_unattended_operation_closes_it_and_it_cannot_be_cancelled_twice(conn, dsn):
    add_failed(conn, 5)
    op_id = start(conn, "purge", {"all": True}, actor="alice")
    assert cancel(conn, op_id, actor="bob")["state"] == "cancelled"
    assert run(dsn, op_id)["state"] == "cancelled"  # nothing happens
    assert statuses(conn) == {"failed": 5}
    with pytest.raises(OperationState, match="already ended"):
        cancel(conn, op_id, actor="bob")
    with pytest.raises(OperationState, match="only a cancelled or failed"):
        resume(conn, start(conn, "purge", {"all": True}, actor="alice"), actor="bob")


def test_ids_selection_replays_exactly_those(conn, dsn):
    ids = add_failed(conn, 10)
    final = bulk.replay(dsn, Selection(ids=(ids[2], ids[5])), actor="alice")
    assert final["done"] == 2
    assert sorted(r[0] for r in conn.execute("SELECT id FROM skiplock.jobs WHERE status = 'pending'")) == [ids[2], ids[5]]


def test_recent_operations_lists_progress(conn, dsn):
    add_failed(conn, 3)
    op_id = start(conn, "replay", {"all": True}, actor="alice")
    [op] = bulk.recent(conn)
    assert op["id"] == op_id and op["active"] and op["percent"] == 0.0


@pytest.mark.slow
def test_archival_reaping_and_replay_while_workers_claim_and_complete_lose_and_duplicate_nothing(conn, dsn, subprocess_env):
    from console.maintenance import NothingMatches, archive_completed, reap
    from tests.workers import EXECUTIONS_TABLE, WorkerProcs

    conn.execute(EXECUTIONS_TABLE)
    workers = WorkerProcs(subprocess_env)
    enqueued = q.enqueue_many(conn, [q.NewJob("record", {"i": i}) for i in range(200)])
    enqueued += q.enqueue_many(conn, [q.NewJob("doomed", {"order": i}, max_attempts=1) for i in range(30)])
    try:
        for _ in range(2):
            workers.start("--concurrency", "4")
        replays = 0
        deadline = time.monotonic() + 180  # generous: a loaded 2-core machine
        for round_ in range(400):
            if round_ < 4:  # keep a stream coming while maintenance runs
                enqueued += q.enqueue_many(conn, [q.NewJob("record", {"r": round_, "i": i}) for i in range(50)])
            archive_completed(conn, older_than=timedelta(0), batch_size=25, pause_ms=0)
            reap(conn, batch_size=10)
            try:
                replays += bulk.replay(dsn, {"kind": "doomed"}, actor="test", batch_size=15)["done"]
            except NothingMatches:
                pass
            done = conn.execute("SELECT count(*) FROM public.executions").fetchone()[0]
            if round_ >= 4 and done >= 400 and replays >= 60:
                break
            assert time.monotonic() < deadline, "the workers did not finish in time"
            time.sleep(0.05)
        wait_for(lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status IN ('pending', 'running')").fetchone()[0] == 0,
                 what="the queue to drain")
        archive_completed(conn, older_than=timedelta(0), batch_size=100, pause_ms=0)
    finally:
        workers.stop_all()

    live, archived = live_and_archived_ids(conn)
    assert len(set(archived)) == len(archived), "an id is twice in the archive"
    assert not set(live) & set(archived), "a job is both live and archived"
    assert sorted(live + archived) == sorted(enqueued), "a job was lost"
    records = [i for i in enqueued if i not in set(live)]
    runs_per_job = dict(conn.execute("SELECT job_id, count(*) FROM public.executions GROUP BY job_id").fetchall())
    assert sorted(runs_per_job) == sorted(records) and set(runs_per_job.values()) == {1}, "a job ran twice"
    assert replays >= 60 and {r[0] for r in conn.execute("SELECT DISTINCT status FROM skiplock.jobs")} == {"failed"}


def test_a_cancel_does_not_wait_for_a_long_throttle_pause(conn, dsn):
    add_failed(conn, 20)
    op_id = start(conn, "replay", {"all": True}, actor="alice", batch_size=10, rate=0.5)  # 20 s per batch
    thread = bulk.run_in_thread(dsn, op_id)
    wait_for(lambda: progress(conn, op_id)["done"] >= 10, timeout=60, interval=0.02, what="the first batch")
    t0 = time.monotonic()
    cancel(conn, op_id, actor="bob")
    thread.join(30)
    # The pause is 20 s; a cancel that waited for it would take that long (generous for a
    # loaded machine, still well under the pause).
    assert not thread.is_alive() and time.monotonic() - t0 < 12
    assert progress(conn, op_id)["state"] == "cancelled" and progress(conn, op_id)["done"] == 10


def test_resume_abandoned_leaves_a_fresh_queued_operation_to_its_creator(conn, dsn):
    add_failed(conn, 5)
    op_id = start(conn, "replay", {"all": True}, actor="alice")
    assert resume_abandoned(dsn) == []  # created a moment ago: its creator is about to run it
    assert progress(conn, op_id)["state"] == "queued"
    assert resume_abandoned(dsn, min_age=timedelta(0)) == [op_id]
    assert progress(conn, op_id)["state"] == "done"


# --- bound to the preview -------------------------------------------------------------------

def nothing_started(conn) -> bool:
    return conn.execute("SELECT count(*) FROM skiplock.bulk_operations").fetchone()[0] == 0 and audit.search(conn) == []


def test_a_new_dead_letter_after_the_preview_refuses_the_start(conn):
    add_failed(conn, 5, queue="mail")
    seen = preview(conn, {"queue": "mail"}).bound()
    assert seen.total == 5
    add_failed(conn, 1, queue="mail", age=timedelta(0))  # fails between the preview and the click
    with pytest.raises(PreviewMismatch, match="now matches 6 jobs, you previewed 5: preview again"):
        start(conn, "purge", {"queue": "mail"}, actor="alice", preview=seen)
    assert nothing_started(conn) and statuses(conn) == {"failed": 6}


def test_a_wrong_count_another_selection_or_other_jobs_are_refused(conn):
    ids = add_failed(conn, 5, queue="mail")
    seen = preview(conn, {"queue": "mail"}).bound()
    wrong = Previewed(4, seen.max_id, seen.previewed_at, seen.selection_hash)
    with pytest.raises(PreviewMismatch, match="now matches 5 jobs, you previewed 4"):
        start(conn, "purge", {"queue": "mail"}, actor="alice", preview=wrong)
    with pytest.raises(PreviewMismatch, match="not the one that was previewed"):
        start(conn, "purge", {"queue": "billing"}, actor="alice", preview=seen)
    # same count, other jobs: one previewed job was replayed, one new failure took its place
    conn.execute("UPDATE skiplock.jobs SET status = 'pending', finished_at = NULL WHERE id = %s", (ids[0],))
    add_failed(conn, 1, queue="mail", age=timedelta(0))
    with pytest.raises(PreviewMismatch, match="others took their place"):
        start(conn, "purge", {"queue": "mail"}, actor="alice", preview=seen)
    assert nothing_started(conn)


def test_a_start_bound_to_its_preview_touches_exactly_the_previewed_jobs_even_when_resumed(conn, dsn):
    ids = add_failed(conn, 12, queue="mail")
    seen = preview(conn, {"queue": "mail"}, sample=3)
    assert seen.max_id == max(ids) and len(seen.selection_hash) == 64 and len(seen.sample) == 3
    op_id = start(conn, "replay", {"queue": "mail"}, actor="alice", batch_size=5, preview=seen.bound())
    op = progress(conn, op_id)
    assert (op["total"], op["max_id"], op["previewed_total"]) == (12, max(ids), 12)
    cancel(conn, op_id, actor="alice")
    # A failure whose transaction committed late: it failed before the preview's time, but the
    # preview could not see it. Its id is above the bound, so no run of this operation touches it.
    late = add_failed(conn, 1, queue="mail", age=timedelta(hours=1))
    resume(conn, op_id, actor="alice")
    final = run(dsn, op_id)
    assert (final["state"], final["done"]) == ("done", 12)
    assert sorted(i for i, n in replay_entries(conn, op_id).items() if n) == sorted(ids)
    assert conn.execute("SELECT status FROM skiplock.jobs WHERE id = %s", (late[0],)).fetchone()[0] == "failed"
    started = [r for r in audit.search(conn, action="replay") if r["outcome"] == "started"][0]
    assert started["detail"]["max_id"] == max(ids) and started["detail"]["previewed"] is True


def test_previewed_fields_round_trip_and_name_what_is_missing(conn):
    add_failed(conn, 2)
    seen = preview(conn, {"all": True}).bound()
    assert Previewed.from_fields({k: str(v) for k, v in seen.as_fields().items()}) == seen
    assert Previewed.from_fields({}) is None
    with pytest.raises(InvalidSelection, match="missing max_id, previewed_at, selection_hash"):
        Previewed.from_fields({"expected": "2"})
    with pytest.raises(InvalidSelection, match="expected"):
        Previewed.from_fields({**seen.as_fields(), "expected": "two"})
