"""Archive round trip, every column (docs/architecture.md "Nothing lost": a job is in the live table or in
the archive). A job that leaves `skiplock.jobs` for `skiplock.jobs_archive` — completed jobs by
the archiver, dead letters by a purge "to the archive" — arrives there column for column.

The column list is read from information_schema, so a column added to `skiplock.jobs` later is
covered without touching this file: if the archive lacks it, or the move forgets to copy it,
or the fixture rows leave it NULL (so its copy would go unchecked), a test here fails and says
which column.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql
from psycopg.rows import dict_row

from console import queue as q
from console.maintenance import archive_completed, bulk


def job_columns(conn) -> list[str]:
    cols = [r[0] for r in conn.execute(
        """
        SELECT column_name FROM information_schema.columns
        WHERE table_schema = 'skiplock' AND table_name = 'jobs'
        ORDER BY ordinal_position
        """
    )]
    assert "id" in cols and "payload" in cols
    return cols


def rows_by_id(conn, table: str, ids: list[int]) -> dict[int, dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        statement = sql.SQL("SELECT * FROM {} WHERE id = ANY(%s)").format(sql.Identifier("skiplock", table))
        rows = cur.execute(statement, (ids,)).fetchall()
    assert len(rows) == len({r["id"] for r in rows}), f"an id appears twice in {table}"
    return {r["id"]: r for r in rows}


def assert_same_columns(conn, originals: dict[int, dict], archived: dict[int, dict]) -> None:
    columns = job_columns(conn)
    assert sorted(archived) == sorted(originals), "a job is missing from the archive"
    for job_id, original in originals.items():
        copy = archived[job_id]
        missing = [c for c in columns if c not in copy]
        assert not missing, f"skiplock.jobs_archive has no column {missing}: archived jobs lose it"
        for column in columns:
            assert copy[column] == original[column], (
                f"job {job_id}: column {column!r} changed on the way to the archive: "
                f"{original[column]!r} -> {copy[column]!r}")


def fill_every_column(conn, job_id: int) -> None:
    """Give the nullable columns a finished job usually leaves empty a value (lease_until), so
    every column of at least one row is non-NULL and its copy is really checked."""
    conn.execute(
        """
        UPDATE skiplock.jobs
        SET lease_until = coalesce(lease_until, locked_at + interval '37 seconds'),
            locked_by = coalesce(locked_by, 'w-fill'),
            locked_at = coalesce(locked_at, now() - interval '2 minutes'),
            idempotency_key = coalesce(idempotency_key, 'fill-' || id),
            last_error = coalesce(last_error, 'RuntimeError: filled'),
            error_fingerprint = coalesce(error_fingerprint, 'RuntimeError: filled'),
            cancel_requested_at = coalesce(cancel_requested_at, now() - interval '90 seconds'),
            group_key = coalesce(group_key, 'tenant-42'),
            headers = coalesce(headers, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
            attempt_logs = coalesce(attempt_logs, '[{"attempt": 1, "worker": "w-fill", "outcome": "failed", "dropped": 0,
                                                     "records": [{"level": "INFO", "logger": "app", "message": "filled"}]}]')
        WHERE id = %s
        """,
        (job_id,),
    )


def assert_no_null_column(conn, row: dict) -> None:
    empty = [c for c in job_columns(conn) if row[c] is None]
    assert not empty, (f"the fixture row leaves {empty} NULL, so its archival is not checked: "
                       "give it a value in fill_every_column()")


def finished_jobs(conn, *, queue: str, final: str, count: int = 3) -> list[int]:
    """Jobs taken through the real protocol: enqueued with a key, a priority, a run_at and a
    payload, failed once (errors, last_error, fingerprint), re-claimed, then completed or dead."""
    run_at = datetime.now(UTC) - timedelta(minutes=5)
    ids = []
    for i in range(count):
        ids.append(q.enqueue(conn, f"kind-{i}", {"i": i, "nested": {"list": [1, "two", None]}, "s": "é"},
                             queue=queue, priority=i - 1, run_at=run_at, idempotency_key=f"{queue}-{i}",
                             max_attempts=2 if final == "failed" else 3))
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE queue = %s", (queue,))
    for job in q.claim(conn, "w-first", queues=[queue], limit=count):
        assert q.fail(conn, job, RuntimeError(f"first attempt of {job.id} failed"), backoff_base=0.001, backoff_cap=0.001) == "pending"
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE queue = %s", (queue,))
    for job in q.claim(conn, "w-second", queues=[queue], limit=count):
        if final == "completed":
            assert q.complete(conn, job)
        else:
            assert q.fail(conn, job, ValueError(f"second attempt of {job.id} failed")) == "failed"
    # finished a while ago, so the archiver's age cutoff (and the purge's snapshot) take them
    conn.execute("UPDATE skiplock.jobs SET finished_at = finished_at - interval '2 hours' WHERE queue = %s", (queue,))
    return ids


def test_completed_jobs_arrive_in_the_archive_column_for_column(conn):
    ids = finished_jobs(conn, queue="mail", final="completed")
    fill_every_column(conn, ids[0])
    originals = rows_by_id(conn, "jobs", ids)
    assert {r["status"] for r in originals.values()} == {"completed"}
    assert_no_null_column(conn, originals[ids[0]])

    result = archive_completed(conn, older_than=timedelta(hours=1), batch_size=2, pause_ms=0)

    assert (result.outcome, result.rows) == ("ok", len(ids))
    assert rows_by_id(conn, "jobs", ids) == {}
    archived = rows_by_id(conn, "jobs_archive", ids)
    assert_same_columns(conn, originals, archived)
    assert all(a["purged"] is False and a["archived_at"] is not None for a in archived.values())


def test_dead_letters_purged_to_the_archive_arrive_column_for_column(conn, dsn):
    ids = finished_jobs(conn, queue="charges", final="failed")
    fill_every_column(conn, ids[0])
    originals = rows_by_id(conn, "jobs", ids)
    assert {r["status"] for r in originals.values()} == {"failed"}
    assert all(len(r["errors"]) == 2 for r in originals.values())
    assert_no_null_column(conn, originals[ids[0]])

    done = bulk.purge(dsn, {"queue": "charges"}, actor="alice", reason="contract test", batch_size=2, mode="archive")

    assert (done["state"], done["done"]) == ("done", len(ids))
    assert rows_by_id(conn, "jobs", ids) == {}
    archived = rows_by_id(conn, "jobs_archive", ids)
    assert_same_columns(conn, originals, archived)
    assert all(a["purged"] is True and a["purged_by"] == "alice" and a["purged_at"] is not None
               for a in archived.values())


def test_a_column_added_to_jobs_is_checked_without_editing_this_file(conn):
    """The guard itself: add a column to the live table only, and the round trip check must
    name it (here the archive lacks it, so the archiver's INSERT still works but loses it)."""
    conn.execute("ALTER TABLE skiplock.jobs ADD COLUMN contract_probe text DEFAULT 'tenant-7'")
    ids = finished_jobs(conn, queue="probe", final="completed", count=1)
    originals = rows_by_id(conn, "jobs", ids)
    archive_completed(conn, older_than=timedelta(hours=1), batch_size=10, pause_ms=0)
    with pytest.raises(AssertionError, match="contract_probe"):
        assert_same_columns(conn, originals, rows_by_id(conn, "jobs_archive", ids))


def test_jobs_completed_into_the_archive_arrive_column_for_column(conn):
    """worker.complete_into_archive: the completing statement moves the running job into the
    archive. Every column arrives as it was, but for what completing changes: status
    'completed', finished_at set, lease_until cleared (as complete_many leaves them)."""
    queue = "into-archive"
    for i in range(3):
        q.enqueue(conn, f"kind-{i}", {"i": i, "nested": {"list": [1, "two", None]}, "s": "é"}, queue=queue,
                  priority=i - 1, idempotency_key=f"{queue}-{i}")
    for job in q.claim(conn, "w-first", queues=[queue], limit=3):
        q.fail(conn, job, RuntimeError(f"first attempt of {job.id} failed"), backoff_base=0.001, backoff_cap=0.001)
    conn.execute("UPDATE skiplock.jobs SET run_at = now() WHERE queue = %s", (queue,))
    jobs = q.claim(conn, "w-second", queues=[queue], limit=3)
    ids = [job.id for job in jobs]
    for filled in (ids[0], ids[2]):  # one row of each statement below
        fill_every_column(conn, filled)
    originals = rows_by_id(conn, "jobs", ids)
    assert {r["status"] for r in originals.values()} == {"running"}
    for filled in (ids[0], ids[2]):
        assert_no_null_column(conn, {**originals[filled], "finished_at": "set by the completion"})

    # The first (every column filled) and the second through complete_many; the third logged,
    # through complete_logged, which appends its attempt's entry to attempt_logs.
    entry = {"attempt": 2, "worker": "w-second", "outcome": "completed", "dropped": 0,
             "records": [{"level": "INFO", "logger": "app", "message": "done"}]}
    assert sorted(q.complete_many(conn, jobs[:2], into_archive=True)) == sorted(ids[:2])
    assert q.complete_logged(conn, jobs[2:], [entry], into_archive=True) == ids[2:]

    assert rows_by_id(conn, "jobs", ids) == {}
    archived = rows_by_id(conn, "jobs_archive", ids)
    for job_id, copy in archived.items():
        assert copy["finished_at"] is not None and copy["finished_at"] >= originals[job_id]["locked_at"]
    expected = {job_id: {**row, "status": "completed", "lease_until": None, "finished_at": archived[job_id]["finished_at"]}
                for job_id, row in originals.items()}
    expected[ids[2]]["attempt_logs"] = [*(originals[ids[2]]["attempt_logs"] or []), entry]
    assert_same_columns(conn, expected, archived)
    assert all(a["purged"] is False and a["archived_at"] is not None for a in archived.values())
