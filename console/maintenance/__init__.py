"""Maintenance a table-as-queue needs: archival, retention, reaping, dead-letter groups, and
safe bulk replay and purge, all audited. The scheduler, the CLI and the web UI call these same
functions. Every function that changes rows does it in batches of at most `batch_size`, each
its own short transaction; connections passed in must be autocommit.

Archival and retention (scheduler: every few minutes / hourly; CLI: `skiplock archive`)
    archive_completed(conn, older_than=timedelta, mode="archive"|"delete", batch_size=1000,
                      rate=None, pause_ms=10, max_batches=None, actor="scheduler", reason=None,
                      stop=None) -> RunResult
    apply_retention(conn, retention=timedelta, batch_size=1000, ..., actor="scheduler") -> RunResult
    ensure_partitions(conn, first_day, last_day) -> [created partition names]
    archived_job(conn, job_id) -> dict | None;  archive_size(conn) -> {partitions, total_bytes, estimated_rows}
    RunResult: run_id, task, outcome (ok|error|cancelled), batches, rows, seconds,
               slowest_batch_ms, batch_ms, error, detail; .as_dict()

Reaper and queue actions (audited unless actor == "scheduler"; pause/resume always audited)
    reap(conn, actor="scheduler", reason=None, batch_size=1000) -> RunResult
    pause_queue(conn, queue, actor=, reason=None);  resume_queue(conn, queue, actor=, reason=None)

Maintenance-run rows (skiplock.maintenance_runs)
    runs.recent(conn, task=None, limit=50) -> [row];  runs.last_by_task(conn) -> {task: row}

Dead letters (reads only; jobs_failed_idx; under a statement timeout)
    Selection(ids=, queue=, kind=, fingerprint=, failed_since=, failed_before=, payload=, all=)
    Selection.from_dict({...}) (web/API input; unknown keys refused), .to_dict(), .describe()
    groups(conn, queue=None, kind=None, limit=50) -> [{fingerprint, count, first_seen, last_seen,
                                                       queues, kinds, example}]
    list_dead_letters(conn, selection=None, limit=50, before=(finished_at, id)) -> [row]
    preview(conn, selection, sample=10) -> Preview(total, sample, selection, description,
                                                   max_id, previewed_at, selection_hash)
    Preview.bound() -> Previewed(total, max_id, previewed_at, selection_hash): pass it to start();
    Previewed.from_fields(form) / .as_fields() carry it through a form or the API.

Bulk replay and purge (skiplock.bulk_operations; see bulk.py)
    start(conn, "replay"|"purge", selection, actor=, reason=None, rate=None, batch_size=1000,
          purge_mode="delete"|"archive", preview=None) -> op_id  # exact count fixed; audit 'started'
          # with preview=Previewed: bound to it (id <= max_id, failed by previewed_at), and
          # PreviewMismatch unless the selection still matches exactly the previewed count
    run(dsn, op_id, stop=None, history=20) -> progress  # blocking; run_in_thread(dsn, op_id)
    progress(conn, op_id) -> {id, action, state, total, done, percent, rows_per_s, eta_s,
                              selection, actor, reason, started_at, finished_at, error, ...}
    cancel(conn, op_id, actor=, reason=None) -> progress  # stops between batches
    resume(conn, op_id, actor=, reason=None) -> progress  # a cancelled/failed op back to queued; then run()
    resume_abandoned(dsn, min_age=30s) -> [op ids]      # the scheduler calls it
    recent_operations(conn, limit=20);  replay(dsn, selection, actor=, ...);  purge(dsn, ...)
    States: queued -> running -> done | cancelled | failed.

Fix and replay (one dead letter edited, then replayed; see edit_replay.py)
    edit_replay.parse_edit(fields, payload_is_text=False) -> Edit
    edit_replay.preview(conn, job_id, edit, keys=) -> Preview(version, changes)  # redacted diff
    edit_replay.apply(conn, job_id, edit, version=, actor=, reason=, keys=) -> {id, status, ...}
    # one transaction: row locked, state and version checked, one guarded UPDATE, audit row

Settings: MaintenanceSettings.from_config(config).archive_kwargs() / .retention_kwargs().

Errors (ValueError subclasses; nothing was changed when one is raised): MaintenanceError,
InvalidSelection (malformed filter, impossible date range), NothingMatches, InvalidSettings
(batch size 0, negative rate...), OperationState (unknown or already-ended operation: HTTP 409),
PreviewMismatch (the selection no longer matches what was previewed: HTTP 409).

This package does not schedule anything (the scheduler does), render anything, or ask for
confirmation: the faces show `preview()` before `start()`.
"""

from console.maintenance.actions import (
    check_known_queue,
    known_queues,
    pause_queue,
    reap,
    resume_queue,
)
from console.maintenance.archive import (
    RunResult,
    archive_completed,
    archive_size,
    archived_job,
    ensure_partitions,
)
from console.maintenance.bulk import (
    cancel,
    progress,
    purge,
    replay,
    resume,
    resume_abandoned,
    run,
    run_in_thread,
    start,
)
from console.maintenance.bulk import recent as recent_operations
from console.maintenance.deadletters import (
    Preview,
    Previewed,
    Selection,
    groups,
    last_attempt_logs,
    list_dead_letters,
    preview,
    selection_hash,
)
from console.maintenance.errors import (
    InvalidSelection,
    InvalidSettings,
    MaintenanceError,
    NothingMatches,
    OperationState,
    PreviewMismatch,
    UnknownQueue,
)
from console.maintenance.retention import apply_retention
from console.maintenance.settings import MaintenanceSettings

__all__ = [
    "InvalidSelection", "InvalidSettings", "MaintenanceError", "MaintenanceSettings", "NothingMatches",
    "OperationState", "Preview", "Previewed", "PreviewMismatch", "RunResult", "Selection", "apply_retention", "archive_completed",
    "archive_size", "archived_job", "cancel", "ensure_partitions", "groups", "last_attempt_logs", "list_dead_letters",
    "pause_queue", "preview", "progress", "purge", "reap", "recent_operations", "replay",
    "resume", "resume_abandoned", "resume_queue", "run", "run_in_thread", "selection_hash", "start",
    "UnknownQueue", "check_known_queue", "known_queues",
]
