#!/usr/bin/env python3
"""Re-run the mutations of docs/reliability.md: break one promise at a time, run the test that
pins it, and report whether the test noticed (killed) or not (survived).

Each mutation is a list of (file, old text, new text) edits. The tree is copied once to a
temporary folder (the work tree itself is never edited); for each mutation the edits are
applied to the copy, the named test runs there with this work tree's .venv python, and the
files are restored. The copy is imported in preference to the editable install (PYTHONPATH and
the working directory point at it; checked before the first run).

    .venv/bin/python scripts/mutations.py              # every mutation
    .venv/bin/python scripts/mutations.py --list       # what they are
    .venv/bin/python scripts/mutations.py --only fence-cac-both --only reap-live
    .venv/bin/python scripts/mutations.py --baseline   # first check the named tests pass unmutated
    .venv/bin/python scripts/mutations.py --only fence-cac-both --tests tests/test_queue.py
                                                       # run other tests against a mutation
    .venv/bin/python scripts/mutations.py --only limit-queue-no-lock --repeat 5
                                                       # a race's test must fail on every run

Each run starts its own private PostgreSQL (tests/conftest.py), so run it on a quiet machine:
the full list takes a few minutes. Exit status 1 when a mutation survived.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
RUN_TIMEOUT = 600  # seconds for one pytest run; a hang is reported, never waited on forever

FENCING = "tests/test_contract_fencing.py"
REAPER = "tests/test_contract_reaper.py"
SIGNATURE = "tests/test_contract_webhook_signature.py"
ARCHIVE = "tests/test_contract_archive.py"
DOORBELL = "tests/test_contract_doorbell.py"
CAUSES = "tests/test_advisor_causes.py"
LOCKS = "tests/test_lock_proofs.py"
EDGES = "tests/test_time_edges.py"
STATES = "tests/test_external_states.py"
VERDICT = "tests/test_advisor_verdict.py"


@dataclass(frozen=True)
class Mutation:
    id: str
    breaks: str  # the promise it breaks, in a few words
    test: str  # pytest node id that must fail
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new); old must occur exactly once


COMPLETE_MANY = """-- name: complete_many
UPDATE skiplock.jobs AS j
SET status = 'completed',
    finished_at = now(),
    lease_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS d (id, attempt)
WHERE j.id = d.id
  AND j.attempts = d.attempt
"""
HEARTBEAT = """-- name: heartbeat
-- Also returns whether an operator asked this claim to stop (console "cancel requested").
UPDATE skiplock.jobs AS j
SET lease_until = now() + make_interval(secs => %(lease)s)
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS d (id, attempt)
WHERE j.id = d.id
  AND j.attempts = d.attempt
"""
RELEASE = """    lease_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS d (id, attempt)
WHERE j.id = d.id
  AND j.attempts = d.attempt
  AND j.locked_by = %(worker)s
  AND j.status = 'running'
RETURNING j.id;

-- name: reap"""
CAC_FENCE = """      AND j.attempts = d.attempt
      AND j.locked_by = %(worker)s
      AND j.status = 'running'
    RETURNING j.id
),"""

QUEUE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('skiplock.queue:' || %(queue)s));"
QUEUE_NO_LOCK = "SELECT hashtext('skiplock.queue:' || %(queue)s);"
# The window's key made unique per job, so two enqueues of one key no longer meet on its row.
UNIQUE_NO_LOCK = (
    ("sql/migrations/014_jobs_console.sql", "    PRIMARY KEY (kind, idempotency_key)\n",
     "    PRIMARY KEY (kind, idempotency_key, job_id)\n"),
    ("sql/queue.sql", "    ON CONFLICT (kind, idempotency_key) DO UPDATE\n",
     "    ON CONFLICT (kind, idempotency_key, job_id) DO UPDATE\n"),
)


def _drop(text: str, line: str) -> str:
    assert line in text
    return text.replace(line, "", 1)


MUTATIONS: tuple[Mutation, ...] = (
    # --- fencing -----------------------------------------------------------------------------
    Mutation("fence-cac-both", "complete_and_claim drops the owner and attempt checks",
             f"{FENCING}::test_a_rescued_jobs_late_completion_through_the_worker_is_refused_and_counted_lost",
             (("sql/queue.sql", CAC_FENCE, _drop(_drop(CAC_FENCE, "      AND j.attempts = d.attempt\n"),
                                                 "      AND j.locked_by = %(worker)s\n")),)),
    Mutation("fence-cac-attempt", "complete_and_claim drops the attempt check",
             f"{FENCING}::test_same_worker_reclaim_complete_and_claim_is_fenced_by_the_attempt",
             (("sql/queue.sql", CAC_FENCE, _drop(CAC_FENCE, "      AND j.attempts = d.attempt\n")),)),
    Mutation("fence-cac-owner", "complete_and_claim drops the owner check",
             f"{FENCING}::test_another_owner_at_the_same_attempt_is_fenced_by_the_owner",
             (("sql/queue.sql", CAC_FENCE, _drop(CAC_FENCE, "      AND j.locked_by = %(worker)s\n")),)),
    Mutation("fence-many-attempt", "complete_many drops the attempt check",
             f"{FENCING}::test_same_worker_reclaim_complete_many_is_fenced_by_the_attempt",
             (("sql/queue.sql", COMPLETE_MANY, _drop(COMPLETE_MANY, "  AND j.attempts = d.attempt\n")),)),
    Mutation("fence-fail-attempt", "fail drops the attempt check",
             f"{FENCING}::test_same_worker_reclaim_fail_is_fenced_by_the_attempt",
             (("sql/queue.sql", "WHERE j.id = %(id)s\n  AND j.attempts = %(attempt)s\n", "WHERE j.id = %(id)s\n"),)),
    Mutation("fence-fail-owner", "fail drops the owner check",
             f"{FENCING}::test_another_owner_at_the_same_attempt_is_fenced_by_the_owner",
             (("sql/queue.sql", "  AND j.attempts = %(attempt)s\n  AND j.locked_by = %(worker)s\n",
               "  AND j.attempts = %(attempt)s\n"),)),
    Mutation("fence-heartbeat-attempt", "heartbeat drops the attempt check",
             f"{FENCING}::test_same_worker_reclaim_heartbeat_and_release_are_fenced_by_the_attempt",
             (("sql/queue.sql", HEARTBEAT, _drop(HEARTBEAT, "  AND j.attempts = d.attempt\n")),)),
    Mutation("fence-release-attempt", "release drops the attempt check",
             f"{FENCING}::test_same_worker_reclaim_heartbeat_and_release_are_fenced_by_the_attempt",
             (("sql/queue.sql", RELEASE, _drop(RELEASE, "  AND j.attempts = d.attempt\n")),)),
    Mutation("worker-lost-uncounted", "the worker does not count a refused completion as lost",
             f"{FENCING}::test_a_rescued_jobs_late_completion_through_the_worker_is_refused_and_counted_lost",
             (("console/queue/worker.py", "self.lost += len(done) - len(completed)", "pass"),)),
    # --- reaper ------------------------------------------------------------------------------
    Mutation("reap-live", "the reaper ignores lease_until (rescues live leases)",
             f"{REAPER}::test_live_leases_are_left_alone",
             (("sql/queue.sql", "    WHERE j.status = 'running'\n      AND j.lease_until < now()\n    ORDER BY j.lease_until",
               "    WHERE j.status = 'running'\n    ORDER BY j.lease_until"),
              ("sql/queue.sql", "    WHERE j.id = e.id\n      AND j.status = 'running'\n      AND j.lease_until < now()\n",
               "    WHERE j.id = e.id\n      AND j.status = 'running'\n"))),
    Mutation("reap-no-backoff", "rescued jobs are due at once (no backoff)",
             f"{REAPER}::test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed",
             (("sql/queue.sql", "THEN now() + make_interval(secs => least(%(backoff_cap)s,",
               "THEN now() + 0 * make_interval(secs => least(%(backoff_cap)s,"),)),
    Mutation("reap-no-jitter", "rescue backoff without jitter",
             f"{REAPER}::test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed",
             (("sql/queue.sql", "* (0.5 + random() / 2))", "* 0.75)"),)),
    Mutation("reap-exponent", "rescue backoff one doubling short",
             f"{REAPER}::test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed",
             (("sql/queue.sql", "power(2, greatest(j.attempts - 1, 0))", "power(2, greatest(j.attempts - 2, 0))"),)),
    Mutation("reap-exhausted-pending", "an exhausted rescued job goes back to pending",
             f"{REAPER}::test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed",
             (("sql/queue.sql", "SET status = CASE WHEN j.attempts < j.max_attempts THEN",
               "SET status = CASE WHEN j.attempts <= j.max_attempts THEN"),)),
    Mutation("reap-gives-attempt-back", "a lost lease gives the attempt back",
             f"{REAPER}::test_rescued_jobs_get_backoff_keep_the_attempt_and_exhausted_ones_go_to_failed",
             (("sql/queue.sql", "        lease_until = NULL\n    FROM expired AS e",
               "        lease_until = NULL,\n        attempts = greatest(j.attempts - 1, 0)\n    FROM expired AS e"),)),
    # --- promises that rest on a lock (issue 27): each test pauses one caller inside its
    # transaction and checks that a second one waits; run with --repeat 5 ------------------------
    Mutation("limit-queue-no-lock", "a limited queue's claim takes no lock (concurrency)",
             f"{LOCKS}::test_a_limited_queue_claim_waits_for_the_claim_in_progress_and_the_concurrency_holds",
             (("sql/limits.sql", QUEUE_LOCK, QUEUE_NO_LOCK),)),
    Mutation("limit-rate-no-lock", "a limited queue's claim takes no lock (rate)",
             f"{LOCKS}::test_a_rate_limited_queue_claim_waits_and_spends_each_token_once",
             (("sql/limits.sql", QUEUE_LOCK, QUEUE_NO_LOCK),)),
    Mutation("limit-kind-no-lock", "a limited kind's claim takes no lock",
             f"{LOCKS}::test_a_limited_kind_claim_waits_for_the_claim_in_progress_and_the_concurrency_holds",
             (("sql/limits.sql", "SELECT pg_advisory_xact_lock(hashtext('skiplock.kind:' || %(kind)s));",
               "SELECT hashtext('skiplock.kind:' || %(kind)s);"),)),
    Mutation("limit-kind-skips-queue-lock", "a limited kind claims from a limited queue without that queue's lock",
             f"{LOCKS}::test_a_limited_kinds_jobs_in_a_limited_queue_wait_for_that_queues_lock_too",
             (("console/queue/limits.py", '            cur.execute(query("limits", "lock_queue"), {"queue": queue_name})\n'
               '            claimed += _jobs(', "            claimed += _jobs("),)),
    Mutation("unique-no-window-lock", "a window row per enqueue: the window's key no longer conflicts",
             f"{LOCKS}::test_a_second_enqueue_of_a_key_waits_for_the_first_and_returns_its_job",
             UNIQUE_NO_LOCK),
    Mutation("unique-takeover-no-window-lock", "as unique-no-window-lock, over an expired window",
             f"{LOCKS}::test_two_enqueues_taking_over_an_expired_window_make_one_job_and_one_window",
             UNIQUE_NO_LOCK),
    Mutation("periodic-no-row-lock", "enqueue_due reads the schedule without locking its row",
             f"{LOCKS}::test_a_second_scheduler_waits_on_the_schedule_and_neither_enqueues_nor_misses_a_slot_twice",
             (("sql/periodic.sql", "  AND p.retired_at IS NULL\nFOR UPDATE;", "  AND p.retired_at IS NULL;"),)),
    Mutation("bulk-no-runner-lock", "a second runner works an operation another runner holds",
             f"{LOCKS}::test_a_bulk_operation_held_by_a_runner_is_left_alone_by_a_second",
             (("console/maintenance/bulk.py",
               'if not conn.execute(query("deadletters", "op_try_lock"), _lock_params(op_id)).fetchone()[0]:',
               'if not (conn.execute(query("deadletters", "op_try_lock"), _lock_params(op_id)).fetchone()[0] or True):'),)),
    Mutation("leader-no-lock", "every scheduler wins the election",
             f"{LOCKS}::test_a_scheduler_does_not_lead_while_another_session_holds_the_election_lock",
             (("sql/scheduler.sql", "SELECT pg_try_advisory_lock(%(key)s);", "SELECT pg_try_advisory_lock(%(key)s) OR true;"),)),
    Mutation("leader-no-lock-pair", "every scheduler wins the election (two schedulers)",
             "tests/test_scheduler.py::test_only_one_of_two_schedulers_leads_and_only_the_leader_runs_jobs",
             (("sql/scheduler.sql", "SELECT pg_try_advisory_lock(%(key)s);", "SELECT pg_try_advisory_lock(%(key)s) OR true;"),)),
    Mutation("maintenance-run-now-no-lock", "run now ignores the task's lock (a second run starts)",
             "tests/test_web_maintenance.py::test_run_now_refuses_a_second_run_while_one_holds_the_task_lock",
             (("console/web/maintenance.py", "if not runs.try_lock(conn, task):",
               "if not (runs.try_lock(conn, task) or True):"),)),
    # --- time windows at their edges (issue 27): one boundary moved by an instant each --------------
    Mutation("unique-window-end-exclusive", "a window is still held at its end instant",
             f"{EDGES}::test_a_window_ends_at_its_end_instant_and_not_a_microsecond_before",
             (("sql/queue.sql", "    WHERE u.expires_at <= now()\n", "    WHERE u.expires_at < now()\n"),)),
    Mutation("unique-window-ends-early", "a window ends a second before its end",
             f"{EDGES}::test_with_half_a_second_left_a_duplicate_returns_the_first_and_leaves_the_window_as_it_was",
             (("sql/queue.sql", "    WHERE u.expires_at <= now()\n", "    WHERE u.expires_at <= now() + interval '1 second'\n"),)),
    Mutation("unique-window-ends-early-archived", "as unique-window-ends-early, for an archived job",
             f"{EDGES}::test_across_the_archive_the_window_holds_to_its_last_moment",
             (("sql/queue.sql", "    WHERE u.expires_at <= now()\n", "    WHERE u.expires_at <= now() + interval '1 second'\n"),)),
    Mutation("unique-duplicate-restarts-window", "a duplicate enqueue restarts the window",
             f"{EDGES}::test_with_half_a_second_left_a_duplicate_returns_the_first_and_leaves_the_window_as_it_was",
             (("sql/queue.sql", "    WHERE u.expires_at <= now()\n    RETURNING u.job_id", "    RETURNING u.job_id"),)),
    Mutation("unique-replayed-restarts-window", "a duplicate enqueue restarts the window (a replayed job)",
             f"{EDGES}::test_across_a_replay_the_window_keeps_pointing_at_the_replayed_job",
             (("sql/queue.sql", "    WHERE u.expires_at <= now()\n    RETURNING u.job_id", "    RETURNING u.job_id"),)),
    Mutation("reap-at-expiry-instant", "a lease is reaped at its expiry instant",
             f"{EDGES}::test_a_lease_is_reaped_a_microsecond_after_its_expiry_and_not_at_it",
             (("sql/queue.sql", "    WHERE j.status = 'running'\n      AND j.lease_until < now()\n    ORDER BY j.lease_until",
               "    WHERE j.status = 'running'\n      AND j.lease_until <= now()\n    ORDER BY j.lease_until"),
              ("sql/queue.sql", "    WHERE j.id = e.id\n      AND j.status = 'running'\n      AND j.lease_until < now()\n",
               "    WHERE j.id = e.id\n      AND j.status = 'running'\n      AND j.lease_until <= now()\n"))),
    Mutation("periodic-every-slot-late", "an `every` slot is due a second after its instant",
             f"{EDGES}::test_a_slot_is_due_at_its_instant_and_not_a_microsecond_before[every]",
             (("console/queue/periodic.py", "            last = int(until.timestamp()) // self.every",
               "            last = (int(until.timestamp()) - 1) // self.every"),)),
    Mutation("periodic-cron-slot-late", "a cron slot is due only after its instant",
             f"{EDGES}::test_a_slot_is_due_at_its_instant_and_not_a_microsecond_before[cron]",
             (("console/queue/periodic.py", "        while slot <= until:", "        while slot < until:"),)),
    Mutation("periodic-cron-slot-late-downtime", "as periodic-cron-slot-late, back from downtime on a slot",
             f"{EDGES}::test_a_scheduler_down_across_four_slots_and_back_on_the_fourth",
             (("console/queue/periodic.py", "        while slot <= until:", "        while slot < until:"),)),
    Mutation("periodic-dst-runs-missing-hour", "a cron slot in the spring-forward gap is run",
             f"{EDGES}::test_spring_forward_a_daily_slot_in_the_missing_hour_is_skipped_not_enqueued",
             (("console/queue/periodic.py", "                continue  # the wall time does not exist",
               "                pass  # the wall time does not exist"),)),
    Mutation("periodic-dst-second-occurrence", "a repeated wall time runs at its second occurrence",
             f"{EDGES}::test_fall_back_an_hourly_cron_runs_the_repeated_hour_once_at_its_first_occurrence",
             (("console/queue/periodic.py", "            instant = naive.replace(tzinfo=tz)  # fold=0",
               "            instant = naive.replace(tzinfo=tz, fold=1)  # fold=0"),)),
    Mutation("retention-raw-cutoff-inclusive", "retention deletes a raw sample at the cutoff",
             f"{EDGES}::test_retention_keeps_a_sample_at_the_cutoff_and_deletes_one_a_microsecond_older",
             (("sql/collectors_retention.sql", "    WHERE o.collected_at < %(cutoff)s", "    WHERE o.collected_at <= %(cutoff)s"),)),
    Mutation("retention-rollup-cutoff-inclusive", "retention deletes a rollup at the cutoff",
             f"{EDGES}::test_retention_keeps_a_sample_at_the_cutoff_and_deletes_one_a_microsecond_older",
             (("sql/collectors_retention.sql", "      AND o.bucket < %(cutoff)s", "      AND o.bucket <= %(cutoff)s"),)),
    Mutation("silence-end-inclusive", "a silence still holds at its end instant",
             f"{EDGES}::test_a_silence_holds_from_its_start_instant_to_just_before_its_end",
             (("sql/alerts.sql", "WHERE s.ends_at > %(now)s", "WHERE s.ends_at >= %(now)s"),)),
    Mutation("silence-start-exclusive", "a silence starts an instant after its start",
             f"{EDGES}::test_a_silence_holds_from_its_start_instant_to_just_before_its_end",
             (("sql/alerts.sql", "  AND s.starts_at <= %(now)s", "  AND s.starts_at < %(now)s"),)),
    # --- every watched system's states (issue 27): one predicate wrong at a time ---------------------
    Mutation("ext-pgqueuer-due-at-instant", "PGQueuer: a job at its execute_after instant counts as due",
             f"{STATES}::test_pgqueuer_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgqueuer.py", 'due=sql.SQL("j.execute_after < now()")', 'due=sql.SQL("j.execute_after <= now()")'),)),
    Mutation("ext-pgqueuer-stale-not-stuck", "PGQueuer: a picked job's stale heartbeat is not stuck",
             f"{STATES}::test_pgqueuer_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgqueuer.py", 'stuck=sql.SQL("j.heartbeat < now() - %(stuck_after)s::interval")',
               'stuck=sql.SQL("j.heartbeat < now() - %(stuck_after)s::interval - interval \'1 day\'")'),)),
    Mutation("ext-pgqueuer-cancel-completed", "PGQueuer: a cancelled job counts as completed",
             f"{STATES}::test_pgqueuer_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgqueuer.py", "(\"completed\", sql.SQL(\"e.status = 'successful'\"))",
               "(\"completed\", sql.SQL(\"e.status IN ('successful', 'canceled')\"))"),)),
    Mutation("ext-procrastinate-stuck-needs-no-worker", "Procrastinate: a doing job is stuck only once its worker row is gone",
             f"{STATES}::test_procrastinate_every_state_counts_as_exactly_one_of_ours",
             (("console/external/procrastinate.py", 'stuck=sql.SQL("j.worker_id IS NULL OR NOT EXISTS',
               'stuck=sql.SQL("j.worker_id IS NULL AND NOT EXISTS'),)),
    Mutation("ext-procrastinate-retried-manual", "Procrastinate: retries counted from manual 'retried' events",
             f"{STATES}::test_procrastinate_every_state_counts_as_exactly_one_of_ours",
             (("console/external/procrastinate.py", "sql.SQL(\"e.type = 'deferred_for_retry'\")", "sql.SQL(\"e.type = 'retried'\")"),)),
    Mutation("ext-graphile-last-attempt-failed", "graphile-worker: a job running its last attempt counts as failed",
             f"{STATES}::test_graphile_worker_every_state_counts_as_exactly_one_of_ours",
             (("console/external/graphile_worker.py", 'failed=sql.SQL("j.locked_at IS NULL AND j.attempts >= j.max_attempts")',
               'failed=sql.SQL("j.attempts >= j.max_attempts")'),)),
    Mutation("ext-graphile-exhausted-pending", "graphile-worker: a job out of attempts counts as pending",
             f"{STATES}::test_graphile_worker_every_state_counts_as_exactly_one_of_ours",
             (("console/external/graphile_worker.py", 'pending=sql.SQL("j.locked_at IS NULL AND j.attempts < j.max_attempts")',
               'pending=sql.SQL("j.locked_at IS NULL")'),)),
    Mutation("ext-pgboss-due-at-instant", "pg-boss: a job at its start_after instant counts as due",
             f"{STATES}::test_pgboss_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgboss.py", 'due=sql.SQL("j.start_after < now()")', 'due=sql.SQL("j.start_after <= now()")'),)),
    Mutation("ext-pgboss-retry-not-pending", "pg-boss: a job in retry is not pending",
             f"{STATES}::test_pgboss_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgboss.py", "pending=sql.SQL(\"j.state IN ('created', 'retry')\")",
               "pending=sql.SQL(\"j.state = 'created'\")"),)),
    Mutation("ext-pgboss-cancelled-failed", "pg-boss: a cancelled job counts as a dead letter",
             f"{STATES}::test_pgboss_every_state_counts_as_exactly_one_of_ours",
             (("console/external/pgboss.py", "failed=sql.SQL(\"j.state = 'failed'\")",
               "failed=sql.SQL(\"j.state IN ('failed', 'cancelled')\")"),)),
    Mutation("ext-table-stuck-at-instant", "a declared table's lease is lapsed at its instant",
             f"{STATES}::test_a_declared_table_counts_each_of_its_states_by_the_operators_predicates",
             (("console/external/table.py", 'sql.SQL(" < now()")', 'sql.SQL(" <= now()")'),)),
    # --- webhook signatures ------------------------------------------------------------------
    Mutation("sign-no-dot", "the signature is computed over t+body without the dot",
             f"{SIGNATURE}::test_a_real_delivery_verifies_with_an_hmac_written_from_the_docs",
             (("console/alerts/transports.py", 'f"{timestamp}.".encode() + body', 'f"{timestamp}".encode() + body'),)),
    Mutation("verify-no-window", "verify drops the replay window",
             f"{SIGNATURE}::test_verify_refuses_stale_and_future_timestamps",
             (("console/alerts/transports.py", "    if abs((now or time.time()) - timestamp) > tolerance:\n        return False\n", ""),)),
    Mutation("verify-past-only", "verify refuses stale but not future timestamps",
             f"{SIGNATURE}::test_verify_refuses_stale_and_future_timestamps",
             (("console/alerts/transports.py", "if abs((now or time.time()) - timestamp) > tolerance:",
               "if (now or time.time()) - timestamp > tolerance:"),)),
    # --- archive round trip ------------------------------------------------------------------
    Mutation("archive-drops-fingerprint", "the archiver does not copy error_fingerprint",
             f"{ARCHIVE}::test_completed_jobs_arrive_in_the_archive_column_for_column",
             (("sql/maintenance.sql", "m.error_fingerprint, m.created_at", "NULL, m.created_at"),)),
    Mutation("archive-wrong-lease", "the archiver copies locked_at into lease_until",
             f"{ARCHIVE}::test_completed_jobs_arrive_in_the_archive_column_for_column",
             (("sql/maintenance.sql", "m.locked_at, m.lease_until, m.last_error", "m.locked_at, m.locked_at, m.last_error"),)),
    Mutation("purge-drops-key", "a purge to the archive does not copy idempotency_key",
             f"{ARCHIVE}::test_dead_letters_purged_to_the_archive_arrive_column_for_column",
             (("sql/deadletters.sql", "r.idempotency_key, r.locked_by, r.locked_at", "NULL, r.locked_by, r.locked_at"),)),
    # --- the doorbell ------------------------------------------------------------------------
    Mutation("enqueue-no-notify", "enqueue does not NOTIFY",
             f"{DOORBELL}::test_an_enqueue_rings_the_doorbell_and_the_idle_worker_picks_it_up_at_once",
             (("sql/queue.sql", "pg_notify('skiplock_jobs', inserted.queue) AS notified", "NULL AS notified"),)),
    Mutation("worker-no-listen", "the worker does not LISTEN for jobs",
             f"{DOORBELL}::test_an_enqueue_rings_the_doorbell_and_the_idle_worker_picks_it_up_at_once",
             (("console/queue/worker.py", 'conn.execute("LISTEN skiplock_jobs")', 'conn.execute("SELECT 1")'),)),
    Mutation("worker-fast-poll", "the worker polls every 0.2 s whatever poll_interval says (hides a broken doorbell)",
             f"{DOORBELL}::test_an_enqueue_rings_the_doorbell_and_the_idle_worker_picks_it_up_at_once",
             (("console/queue/worker.py", "            timeout = self.poll_interval\n", "            timeout = min(self.poll_interval, 0.2)\n"),)),
    Mutation("worker-idle-no-flush", "an idle worker writes its registry row only when it polls",
             f"{DOORBELL}::test_an_idle_worker_with_a_long_poll_still_reports_every_flush_interval",
             (("console/queue/worker.py", "if self._wake.wait(max(0.0, min(poll_at, flush_at) - now)) or flush_at >= poll_at:",
               "if self._wake.wait(max(0.0, poll_at - now)) or True:"),)),
    Mutation("matrix-bulk-api-to-viewers", "the bulk dead-letter API is opened to viewers",
             "tests/test_security_matrix.py",
             (("console/web/deadletters.py", '@bp.post("/api/v1/deadletters/operations")\n@requires("operator")',
               '@bp.post("/api/v1/deadletters/operations")\n@requires("viewer")'),)),
    Mutation("matrix-sso-without-csrf", "users signed in by the SSO header skip the CSRF check",
             "tests/test_security_matrix.py",
             (("console/web/auth.py", 'if user and user.via == "token":\n            if user.read_only:',
               'if user and user.via in ("token", "header"):\n            if user.via == "token" and user.read_only:'),)),
    Mutation("matrix-readonly-token-writes", "a read-only API token may change state",
             "tests/test_security_matrix.py",
             (("console/web/auth.py", "            if user.read_only:\n", "            if False:\n"),)),
    # --- signals (issue 25): each breaks one definition; a named scenario goes red ----------------
    Mutation("signal-dead-letter-one-interval", "dead letters per hour from two samples one interval apart (as before)",
             "tests/test_scenarios_failures.py::test_a_dead_letter_stream",
             (("console/collectors/queue.py",
               '            Sample("dead_letter_growth", q, per_hour.get(name, 0.0)),\n',
               '            Sample("dead_letter_growth", q, (dead - ctx.previous.get("dead_letters", {}).get(name, 0.0))'
               ' * 3600.0 / ctx.interval if ctx.interval else None),\n'),
              ("console/collectors/queue.py",
               '    out.append(Sample("completed_rows_estimate", {}, estimates.get("completed", 0.0)))\n',
               '    out.append(Sample("completed_rows_estimate", {}, estimates.get("completed", 0.0)))\n'
               '    ctx.remember({"dead_letters": {s.labels["queue"]: s.value for s in out if s.metric == "dead_letters"}})\n'),)),
    Mutation("signal-holder-own-threshold", "the Database page judges horizon holders by a threshold of its own",
             "tests/test_scenarios_database.py::test_an_xmin_holder",
             (("console/web/health.py", "    threshold = signals.horizon_threshold(judge.rules if judge else None)\n",
               "    threshold = 300.0\n"),)),
    Mutation("signal-idle-by-depth", "idle means nothing waiting or running in the newest sample",
             "tests/test_scenarios_queue.py::test_healthy_busy_traffic_fires_nothing",
             (("console/signals.py", "    if last_busy is not None and now - last_busy < window:\n        return False, None\n",
               ""),)),
    Mutation("signal-retry-rate-one-interval", "the retry rate over the last interval only",
             "tests/test_scenarios_failures.py::test_a_retry_storm",
             (("console/collectors/workers.py", '    out.append(Sample("retry_rate", {}, retry_rate(recent)))\n',
               '    out.append(Sample("retry_rate", {}, retry_rate(recent[-1:]) if int(ctx.now.timestamp()) % 2 else 0.0))\n'),)),
    Mutation("signal-reaper-charges-nobody", "the reaper does not charge the worker whose job it rescued",
             "tests/test_scenarios_queue.py::test_stuck_leases_after_a_kill_9",
             (("sql/queue.sql", "    SET reaped = w.reaped + c.jobs\n", "    SET reaped = w.reaped\n"),)),
    Mutation("signal-guard-no-series-holds", "a guard with no series holds the alert (workers_zero never resolves)",
             "tests/test_scenarios_queue.py::test_the_worker_fleet_gone",
             (("console/alerts/evaluate.py", "    if not rows:\n        return False\n", "    if not rows:\n        return None\n"),)),
    Mutation("signal-verdict-repeats-alerts", "the verdict lists a firing alert's summary beside the finding it is about",
             "tests/test_scenarios_queue.py::test_a_stalled_queue",
             (("console/web/overview.py", "            if a[\"id\"] in said:\n                continue\n", ""),)),
    Mutation("signal-lag-own-threshold", "the Database page judges standby lag by a threshold of its own",
             "tests/test_scenarios_replica.py::test_replica_lag",
             (("console/web/health.py", '        judged = judge.level("replica_lag_seconds", lag, {"standby": s["name"] or ""}) if judge else "neutral"\n',
               '        judged = "neutral"\n'),)),
    Mutation("advisor-empty-baseline", "claim-buffers counts measurements of an empty queue's claims in its baseline",
             f"{CAUSES}::test_a_baseline_taken_while_the_queue_was_empty_does_not_count",
             (("console/advisor/claim_path.py", "BASELINE_ROWS_PER_CALL = 0.1\n", "BASELINE_ROWS_PER_CALL = 0.0\n"),)),
    Mutation("advisor-one-measurement-fails", "claim-buffers fails against a baseline of one measurement",
             f"{CAUSES}::test_a_baseline_of_too_few_measurements_cannot_fail",
             (("console/advisor/claim_path.py", "    enough = len(counted) >= needed\n", "    enough = True\n"),)),
    Mutation("advisor-claims-ignore-holder", "claim-buffers fails beside the horizon holder xmin-horizon names",
             f"{CAUSES}::test_claims_climbing_behind_an_idle_holder_name_it_in_every_check_that_sees_it",
             (("console/advisor/claim_path.py", "    if holder is not None:\n        cause = holder_cause(holder)\n        return cause,",
               "    if False:\n        cause = holder_cause(holder)\n        return cause,"),)),
    Mutation("advisor-horizon-own-words", "xmin-horizon names its holder in words of its own",
             f"{CAUSES}::test_claims_climbing_behind_an_idle_holder_name_it_in_every_check_that_sees_it",
             (("console/advisor/hygiene.py", 'return Outcome(status, cause.sentence("vacuum can then remove the dead rows"),',
               'return Outcome(status, f"the xmin horizon has been held for {seconds(oldest)}",'),)),
    Mutation("advisor-claims-ignore-pause", "claim-buffers fails beside a paused queue's backlog it walks past",
             f"{CAUSES}::test_claims_walking_past_a_paused_queues_backlog_name_the_pause",
             (("console/advisor/claim_path.py", "    if held:\n        return held[0],", "    if False:\n        return held[0],"),)),
    Mutation("advisor-claims-ignore-change", "claim-buffers fails right after an operator's bulk replay",
             f"{CAUSES}::test_an_operators_change_shortly_before_is_named",
             (("console/advisor/claim_path.py", "    if changes:\n        cause = change_cause(changes[0])",
               "    if False:\n        cause = change_cause(changes[0])"),)),
    Mutation("verdict-short-history", "a signal says outgrowing after minutes of history",
             f"{VERDICT}::test_eight_minutes_of_history_say_not_enough_history_and_call_nothing_outgrowing",
             (("console/advisor/verdict.py", "    short = sig.history_seconds < OUTGROWING_HISTORY.total_seconds() or sig.instants < OUTGROWING_POINTS\n",
               "    short = False\n"),)),
    Mutation("verdict-ignore-holder", "the verdict calls an idle-in-transaction session's damage outgrowing",
             f"{VERDICT}::test_claims_climbing_behind_an_idle_holder_name_it_and_its_fix_not_outgrowing",
             (("console/advisor/verdict.py", 'HOLDER_SIGNALS = ("claim-latency", "autovacuum", "competition")',
               "HOLDER_SIGNALS = ()"),)),
    Mutation("verdict-ignore-pause", "the verdict calls a paused queue's backlog outgrowing",
             f"{VERDICT}::test_a_paused_queue_whose_backlog_grows_names_the_pause",
             (("console/advisor/verdict.py", 'HELD_BACK_SIGNALS = ("claim-latency", "competition")', "HELD_BACK_SIGNALS = ()"),)),
    Mutation("verdict-ignore-change", "the verdict calls the aftermath of an operator's replay outgrowing",
             f"{VERDICT}::test_an_operators_change_shortly_before_the_rise_is_named",
             (("console/advisor/verdict.py", "    return causes.change_cause(rows[0], onset) if rows else None\n",
               "    return None\n"),)),
    Mutation("verdict-any-overlap-explains", "a holder in a fifth of the samples explains a signal away",
             f"{VERDICT}::test_a_capacity_signal_with_no_known_cause_is_still_outgrowing",
             (("console/advisor/verdict.py", "EXPLAINS = 0.5 ", "EXPLAINS = 0.1 "),)),
    Mutation("verdict-small-backlog-explains", "a paused queue of 50 jobs explains a signal away",
             f"{VERDICT}::test_a_capacity_signal_with_no_known_cause_is_still_outgrowing",
             (("console/advisor/causes.py", "BACKLOG_MIN = 100 ", "BACKLOG_MIN = 10 "),)),
    Mutation("verdict-old-change-explains", "a replay three hours before the rise explains it away",
             f"{VERDICT}::test_a_capacity_signal_with_no_known_cause_is_still_outgrowing",
             (("console/advisor/causes.py", "CHANGES_BEFORE = timedelta(minutes=30)", "CHANGES_BEFORE = timedelta(hours=4)"),)),
    Mutation("verdict-login-explains", "a sign-in just before the rise explains it away",
             f"{VERDICT}::test_a_capacity_signal_with_no_known_cause_is_still_outgrowing",
             (("console/advisor/causes.py", 'LOAD_CHANGES = ("pause",', 'LOAD_CHANGES = ("login", "pause",'),)),
)


def copy_tree(dest: Path) -> None:
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".skiplock-demo",
        "test-results", "node_modules", "build", "dist", "*.egg-info"))


def run_pytest(tree: Path, tests: list[str]) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout', seconds, last lines of output)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    try:
        proc = subprocess.run([str(PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started, ""
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return ("passed" if proc.returncode == 0 else "failed"), time.monotonic() - started, tail


def check_imports_copy(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([str(PYTHON), "-c", "import console, console.sqlfiles as s; print(console.__file__)"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"the copy is not what gets imported ({out}); refusing to report meaningless results")


def apply(tree: Path, mutation: Mutation) -> dict[Path, str]:
    originals: dict[Path, str] = {}
    for rel, old, new in mutation.edits:
        path = tree / rel
        text = path.read_text()
        originals.setdefault(path, text)
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"{mutation.id}: the text to replace occurs {count} times in {rel} (expected once): "
                             "the code moved on; update the mutation")
        path.write_text(text.replace(old, new))
    return originals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="ID", help="run only this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--baseline", action="store_true", help="first run the named tests on the unmutated copy")
    parser.add_argument("--tests", nargs="+", metavar="TEST", help="run these tests against each mutation instead")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each mutation's test N times; it is killed only if every run failed")
    args = parser.parse_args(argv)

    chosen = [m for m in MUTATIONS if not args.only or m.id in args.only]
    unknown = set(args.only or ()) - {m.id for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.id:28} {m.breaks}\n{'':28} -> {m.test}")
        return 0
    if not PYTHON.exists():
        parser.error(f"{PYTHON} is missing: run scripts/bootstrap.sh --test first")

    with tempfile.TemporaryDirectory(prefix="skiplock-mutations-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        check_imports_copy(tree)
        if args.baseline:
            tests = args.tests or sorted({m.test for m in chosen})
            outcome, seconds, tail = run_pytest(tree, tests)
            print(f"baseline (unmutated): {outcome} in {seconds:.0f}s")
            if outcome != "passed":
                print(tail)
                return 1
        survived = 0
        for m in chosen:
            originals = apply(tree, m)
            runs: list[tuple[str, float, str]] = []
            try:
                for _ in range(max(1, args.repeat)):
                    runs.append(run_pytest(tree, args.tests or [m.test]))
            finally:
                for path, text in originals.items():
                    path.write_text(text)
            passed = [r for r in runs if r[0] == "passed"]
            # A race's test that fails on some runs only is a survivor: it proves nothing by construction.
            outcome, seconds, tail = passed[0] if passed else runs[-1]
            seconds = sum(r[1] for r in runs)
            verdict = {"failed": "KILLED", "timeout": "KILLED (timeout)", "passed": "SURVIVED"}[outcome]
            if len(runs) > 1:
                verdict = f"{verdict} {len(runs) - len(passed)}/{len(runs)}"
            survived += outcome == "passed"
            print(f"{verdict:16} {m.id:28} {seconds:5.0f}s  {m.breaks}", flush=True)
            failed = [line for line in tail.splitlines() if line.startswith(("FAILED", "ERROR"))]
            if outcome == "passed" or failed:
                print(f"{'':16} {failed[0] if failed else tail}"[:300])
    print(f"{len(chosen) - survived} killed, {survived} survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
