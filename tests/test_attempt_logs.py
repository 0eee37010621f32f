"""Per-attempt logs (issue 33 item 3): the `logging` records a handler emits while it runs are
kept with its attempt, bounded and redacted, by real `skiplock worker` processes against a real
PostgreSQL; shown on the job page, in the dead letters' sample and the JSON API; archived with
the job and removed with it; the migration applies on a database that already has jobs.

Handlers are in tests/logging_tasks.py (threads) and tests/logging_async_tasks.py (the loop).
"""

from __future__ import annotations

import dataclasses
import html
import json
from datetime import timedelta

import pytest
from psycopg.rows import dict_row

from console import db
from console import queue as q
from console.db import connect, migrate, migration_files
from console.maintenance import apply_retention, archive_completed, bulk
from tests.workers import WorkerProcs, wait_for

pytestmark = pytest.mark.slow

TASKS = "tests.logging_tasks"
ASYNC_TASKS = "tests.logging_async_tasks"


@pytest.fixture
def web_settings(web_settings):
    """The console hides one more key than the worker's defaults (the viewers' test below)."""
    return {**web_settings, "web.redact_keys": "password,secret,token,api_key,authorization,customer_email"}


@pytest.fixture
def workers(subprocess_env):
    procs = WorkerProcs(subprocess_env)
    yield procs
    procs.stop_all()


def finished(conn, ids: list[int]) -> bool:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND status IN ('completed', 'failed')",
                        (ids,)).fetchone()[0] == len(ids)


def run(conn, workers, jobs: list[q.NewJob], *args: str, tasks: str = TASKS, env: dict | None = None) -> list[int]:
    """Enqueue `jobs`, run one worker until each is completed or failed, stop it cleanly."""
    ids = q.enqueue_many(conn, jobs)
    proc = workers.start(*args, tasks=tasks, env=env)
    wait_for(lambda: finished(conn, ids), timeout=60, what="the jobs to finish")
    code, err = workers.stop(proc)
    assert code == 0, err
    return ids


def logs_of(conn, job_id: int) -> list[dict] | None:
    return conn.execute("SELECT attempt_logs FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0]


def messages(entry: dict) -> list[str]:
    return [r["message"] for r in entry["records"]]


def test_a_handler_that_logs_then_fails_keeps_its_records_with_each_failed_attempt(conn, workers, client_as):
    [job_id] = run(conn, workers, [q.NewJob("log_then_fail", {"order": 42}, max_attempts=2)])
    row = q.get_job(conn, job_id)
    assert row["status"] == "failed" and len(row["errors"]) == 2
    entries = logs_of(conn, job_id)
    assert [(e["attempt"], e["outcome"], e["dropped"]) for e in entries] == [(1, "failed", 0), (2, "failed", 0)]
    for attempt, entry in enumerate(entries, start=1):
        assert messages(entry) == ["charging order 42", f"card declined on attempt {attempt}"]
        assert [(r["level"], r["logger"]) for r in entry["records"]] == [("INFO", "shop.billing"), ("WARNING", "shop.billing")]
        assert entry["records"][0]["extra"] == {"order": 42}
        assert entry["worker"] == row["errors"][attempt - 1]["worker"]
    # The worker's own lines (claims, "attempt failed") are not the job's.
    assert not any("skiplock" in r["logger"] for e in entries for r in e["records"])

    page = html.unescape(client_as("viewer").get(f"/jobs/{job_id}").get_data(as_text=True))
    section = page.split('id="attempt-logs"')[1].split("</section>")[0]
    assert "Attempt 2 · failed · 2 records" in section and "Attempt 1 · failed" in section
    assert "card declined on attempt 2" in section and "shop.billing" in section and "WARNING" in section

    api = client_as("viewer").get(f"/api/v1/jobs/{job_id}").get_json()
    assert [messages(e) for e in api["job"]["attempt_logs"]] == [messages(e) for e in entries]

    # The dead letters of its group show why the newest failed, in its handler's words.
    dead = client_as("viewer").get("/api/v1/deadletters/jobs", query_string={"kind": "log_then_fail"}).get_json()
    assert dead["sample"]["job"] == job_id
    assert messages(dead["sample"]["logs"]) == ["charging order 42", "card declined on attempt 2"]
    page = html.unescape(client_as("viewer").get("/deadletters/jobs", query_string={"kind": "log_then_fail"}).get_data(as_text=True))
    sample = page.split('id="sample-logs"')[1].split("</section>")[0]
    assert f"job {job_id}" in sample and "card declined on attempt 2" in sample


def test_a_handler_that_logs_then_succeeds_keeps_the_records_of_both_attempts(conn, workers, client_as):
    flaky, silent = run(conn, workers, [q.NewJob("log_then_succeed", {"order": 7, "fail_first": 1}, max_attempts=3),
                                        q.NewJob("silent", {})])
    assert q.get_job(conn, flaky)["status"] == "completed"
    first, second = logs_of(conn, flaky)
    assert (first["attempt"], first["outcome"], messages(first)) == (1, "failed", ["attempt 1 of order 7"])
    assert (second["attempt"], second["outcome"], messages(second)) == (2, "completed", ["attempt 2 of order 7", "order 7 shipped"])
    # A handler that logs nothing stores nothing, and its page says so.
    assert q.get_job(conn, silent)["status"] == "completed" and logs_of(conn, silent) is None
    page = client_as("viewer").get(f"/jobs/{silent}").get_data(as_text=True)
    assert "No log records captured" in page.split('id="attempt-logs"')[1]


def test_the_bounds_hold_and_say_what_was_dropped(conn, workers, client_as):
    env = {"SKIPLOCK_WORKER_LOG_RECORDS": "10", "SKIPLOCK_WORKER_LOG_MESSAGE_CHARS": "100"}
    [job_id] = run(conn, workers, [q.NewJob("log_flood", {"n": 500, "long": 5000}, max_attempts=1)], env=env)
    [entry] = logs_of(conn, job_id)
    # The first half of the records and the last half, the 491 between them counted.
    assert len(entry["records"]) == 10 and entry["dropped"] == 491 and entry["dropped_after"] == 5
    assert messages(entry)[:5] == [f"line {i}" for i in range(5)]
    assert messages(entry)[5:9] == [f"line {i}" for i in range(496, 500)]
    last = messages(entry)[9]
    assert last.startswith("the last words: xxx") and last.endswith("… [4,916 more characters]") and len(last) < 130
    page = html.unescape(client_as("viewer").get(f"/jobs/{job_id}").get_data(as_text=True))
    section = page.split('id="attempt-logs"')[1].split("</section>")[0]
    assert "… 491 more records dropped" in section
    # the gap is where the records were dropped: after line 4, before line 496
    assert section.index("line 4<") < section.index("491 more records dropped") < section.index("line 496<")

    # The characters of an attempt are bounded too, whatever the count allows.
    env = {"SKIPLOCK_WORKER_LOG_RECORDS": "1000", "SKIPLOCK_WORKER_LOG_ATTEMPT_CHARS": "300"}
    [job_id] = run(conn, workers, [q.NewJob("log_flood", {"n": 200}, max_attempts=1)], env=env)
    [entry] = logs_of(conn, job_id)
    assert sum(len(m) for m in messages(entry)) <= 300
    assert entry["dropped"] == 201 - len(entry["records"]) > 150
    assert messages(entry)[0] == "line 0" and messages(entry)[-1] == "the last words: "


def test_a_secret_in_a_message_or_in_extra_is_never_stored_nor_shown_in_clear(conn, workers, client_as):
    [job_id] = run(conn, workers, [q.NewJob("log_secret", {"user": "ada"}, max_attempts=1)])
    stored = json.dumps(logs_of(conn, job_id))
    for secret in ("hunter2", "tok-abc123", "zzz-secret", "s3cr3t", "Bearer-xyz-987"):
        assert secret not in stored, f"{secret} stored in clear: {stored}"
    [entry] = logs_of(conn, job_id)
    first, second = entry["records"]
    assert first["message"] == "logging in with password=[redacted] for ada"
    assert first["extra"] == {"token": "[redacted]", "note": "api_key=[redacted]", "nested": {"secret": "[redacted]", "ok": 1}}
    assert second["message"] == "upstream said no (token=[redacted])"
    assert "ConnectionError" in second["exc"] and "authorization: [redacted]" in second["exc"]
    for role in ("viewer", "operator"):
        page = client_as(role).get(f"/jobs/{job_id}").get_data(as_text=True)
        assert "logging in with password=[redacted] for ada" in html.unescape(page)
        api = json.dumps(client_as(role).get(f"/api/v1/jobs/{job_id}").get_json())
        for secret in ("hunter2", "tok-abc123", "zzz-secret", "s3cr3t", "Bearer-xyz-987"):
            assert secret not in page and secret not in api


def test_viewers_see_stored_records_redacted_again_with_the_consoles_keys(conn, client_as):
    # A worker whose config did not name web.redact_keys stored `customer_email` in clear: the
    # console hides it from viewers (its own keys), operators see the record as stored.
    job_id = q.enqueue(conn, "legacy", {}, max_attempts=1)
    [job] = q.claim(conn, "w-old", limit=1)
    entry = {"attempt": 1, "worker": "w-old", "at": "2026-01-01T00:00:00.000+00:00", "outcome": "failed", "dropped": 0,
             "records": [{"at": "2026-01-01T00:00:00.000+00:00", "level": "INFO", "logger": "crm",
                          "message": "mailing customer_email=ada@example.com", "extra": {"customer_email": "ada@example.com"}}]}
    assert q.fail(conn, job, RuntimeError("bounced"), logs=entry) == "failed"
    viewer = json.dumps(client_as("viewer").get(f"/api/v1/jobs/{job_id}").get_json()["job"]["attempt_logs"])
    assert "ada@example.com" not in viewer and "customer_email=[redacted]" in viewer
    assert "ada@example.com" not in client_as("viewer").get(f"/jobs/{job_id}").get_data(as_text=True)
    operator = client_as("operator").get(f"/api/v1/jobs/{job_id}").get_json()["job"]["attempt_logs"]
    assert operator[0]["records"][0]["message"] == "mailing customer_email=ada@example.com"


@pytest.mark.parametrize("tasks, kind", [(TASKS, "log_turns"), (ASYNC_TASKS, "a_log_turns")], ids=["threads", "asyncio"])
def test_two_jobs_running_at_once_in_one_worker_keep_their_own_records(conn, workers, tasks, kind):
    # The two jobs take turns (a barrier after every record), so their records interleave in
    # time in one process: on two handler threads, or as two tasks on the one event loop.
    ids = run(conn, workers, [q.NewJob(kind, {"tag": "alpha"}, max_attempts=1),
                              q.NewJob(kind, {"tag": "beta", "fail": True}, max_attempts=1)],
              "--concurrency", "2", "--batch-size", "2", tasks=tasks)
    alpha, beta = (logs_of(conn, job_id)[0] for job_id in ids)
    assert (alpha["outcome"], beta["outcome"]) == ("completed", "failed")
    assert messages(alpha) == [f"alpha record {i}" for i in range(5)]
    expected_beta = [f"beta record {i}" for i in range(5)] + (["beta gives up"] if kind == "a_log_turns" else [])
    assert messages(beta) == expected_beta
    # they did run at once: each one's records span the other's
    assert alpha["records"][0]["at"] <= beta["records"][1]["at"] and beta["records"][0]["at"] <= alpha["records"][1]["at"]
    # one worker ran both
    assert len({alpha["worker"], beta["worker"]}) == 1


def test_capture_off_stores_nothing_and_completes_as_before(conn, workers):
    [job_id] = run(conn, workers, [q.NewJob("log_then_succeed", {"order": 1})], env={"SKIPLOCK_WORKER_LOG_RECORDS": "0"})
    assert q.get_job(conn, job_id)["status"] == "completed" and logs_of(conn, job_id) is None


def test_the_archive_keeps_the_records_and_purge_and_retention_remove_them(conn, dsn, workers, client_as):
    done, dead, deleted = run(conn, workers, [q.NewJob("log_then_succeed", {"order": 1}),
                                              q.NewJob("log_then_fail", {"order": 2}, max_attempts=1),
                                              q.NewJob("log_then_fail", {"order": 3}, max_attempts=1)])
    before = {job_id: logs_of(conn, job_id) for job_id in (done, dead, deleted)}
    assert all(before.values())
    conn.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '10 days' WHERE id = %s", (done,))
    archive_completed(conn, older_than=timedelta(hours=1), pause_ms=0)
    bulk.purge(dsn, {"ids": [dead]}, actor="alice", reason="keep in the archive", mode="archive")
    bulk.purge(dsn, {"ids": [deleted]}, actor="alice", reason="gone for good", mode="delete")

    archived = dict(conn.execute("SELECT id, attempt_logs FROM skiplock.jobs_archive").fetchall())
    assert archived == {done: before[done], dead: before[dead]}
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s)", ([done, dead, deleted],)).fetchone()[0] == 0
    # An archived job's page still shows why it failed.
    page = html.unescape(client_as("viewer").get(f"/jobs/{dead}").get_data(as_text=True))
    assert "charging order 2" in page.split('id="attempt-logs"')[1]

    # Retention drops the old day's partition: the records go with their row, nothing is left.
    apply_retention(conn, retention=timedelta(days=5), pause_ms=0)
    assert dict(conn.execute("SELECT id, attempt_logs FROM skiplock.jobs_archive").fetchall()) == {dead: before[dead]}
    # The records live only in the jobs' rows: no table of their own to leave orphans in.
    holders = conn.execute("SELECT table_name FROM information_schema.columns WHERE table_schema = 'skiplock'"
                           " AND column_name = 'attempt_logs' ORDER BY 1").fetchall()
    assert {t for (t,) in holders} <= {"jobs", "jobs_archive"} | {t for (t,) in holders if t.startswith("jobs_archive_")}


def test_the_migration_applies_on_a_database_with_jobs_held_across_it(make_database, monkeypatch):
    dsn = make_database(template=None)
    shipped = db.migration_files
    monkeypatch.setattr("console.db.migration_files", lambda *a: [f for f in shipped(*a) if f[0] < 23])
    with connect(dsn) as conn:
        migrate(conn)
        # Enqueued and claimed as a release of that schema would (this release's statements name
        # columns later migrations add, such as 025's group_key).
        failed, held = (r[0] for r in conn.execute(
            "INSERT INTO skiplock.jobs (queue, kind, payload, max_attempts) "
            "SELECT 'default', 'old', jsonb_build_object('i', i), 1 FROM generate_series(0, 1) AS i RETURNING id"))
        fields = [f.name for f in dataclasses.fields(q.Job) if f.name not in ("headers", "extra")]
        with conn.cursor(row_factory=dict_row) as cur:
            claimed = {row["id"]: q.Job(**{k: row[k] for k in fields}) for row in cur.execute(
                "UPDATE skiplock.jobs SET status = 'running', attempts = 1, locked_by = 'w-before', "
                "locked_at = now(), lease_until = now() + interval '60 seconds' WHERE id = ANY(%s) RETURNING *",
                ([failed, held],))}
        # failed by the previous release's statement (no attempt_logs column yet)
        conn.execute("UPDATE skiplock.jobs SET status = 'failed', finished_at = now(), lease_until = NULL,"
                     " last_error = 'RuntimeError: old', errors = '[{\"attempt\": 1, \"message\": \"old\"}]' WHERE id = %s",
                     (failed,))
    monkeypatch.setattr("console.db.migration_files", shipped)
    with connect(dsn) as conn:
        assert migrate(conn) == [f"{v:03d}_{name}" for v, name, _ in migration_files() if v >= 23]
        assert logs_of(conn, failed) is None and q.get_job(conn, failed)["errors"] == [{"attempt": 1, "message": "old"}]
        # A job claimed before the migration fails after it, with its records.
        entry = {"attempt": 1, "worker": "w-before", "at": "2026-01-01T00:00:00.000+00:00", "outcome": "failed",
                 "dropped": 0, "records": [{"at": "2026-01-01T00:00:00.000+00:00", "level": "INFO", "logger": "app", "message": "hello"}]}
        assert q.fail(conn, claimed[held], RuntimeError("after"), logs=entry) == "failed"
        assert logs_of(conn, held) == [entry]


def test_the_capture_adds_to_the_applications_logging_and_changes_nothing_of_it():
    # In-process, no worker: the application's own handler still gets every record, in clear
    # and at its level; the root logger's level is untouched; outside a job nothing is kept.
    import logging

    from console.queue import joblogs

    seen: list[str] = []

    class Mine(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    root, mine = logging.getLogger(), Mine()
    level, handlers = root.level, list(root.handlers)
    root.addHandler(mine)
    joblogs.install()
    try:
        assert root.level == level and root.handlers == [*handlers, mine, joblogs._handler]
        slot = joblogs.slot_for(joblogs.LogLimits(records=5))
        logging.getLogger("app").warning("before password=one")
        slot.active = True
        logging.getLogger("app").warning("during password=two")
        capture = slot.take()
        logging.getLogger("app").warning("after password=three")
        assert [r["message"] for r in capture.records] == ["during password=[redacted]"]
        assert seen == ["before password=one", "during password=two", "after password=three"]
        assert slot.capture is None and not slot.active
    finally:
        joblogs.uninstall()
        root.removeHandler(mine)
    assert root.handlers == handlers


def test_an_application_without_logging_config_still_gets_the_last_resort(capsys):
    # No handler anywhere: logging prints WARNING and above to stderr (logging.lastResort).
    # The capture's handler on the root logger must not silence that, in a job or out of one.
    import logging

    from console.queue import joblogs

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = []
    joblogs.install()
    try:
        slot = joblogs.slot_for(joblogs.LogLimits(records=5))
        logging.getLogger("bare").warning("outside a job")
        slot.active = True
        logging.getLogger("bare").warning("inside a job")
        logging.getLogger("bare").info("not printed: below the last resort's level")
        capture = slot.take()
    finally:
        joblogs.uninstall()
        root.handlers[:] = saved
    assert capsys.readouterr().err.splitlines() == ["outside a job", "inside a job"]
    assert [r["message"] for r in capture.records] == ["inside a job"]

