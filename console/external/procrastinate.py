"""Procrastinate (system = "procrastinate"): the tables `procrastinate schema --apply` creates.

Schema read: Procrastinate 3.x as applied by 3.10.0 (procrastinate_jobs with queue_name,
status, scheduled_at, worker_id, abort_requested; procrastinate_workers with last_heartbeat;
procrastinate_events). Depth and dead letters are Procrastinate's own statuses per queue_name
(todo, doing, failed: what `JobManager.list_queues` counts). A todo job is due when its
scheduled_at is empty or past; its age runs from scheduled_at, else from its 'deferred' event.
A doing job is stuck when its worker is gone or has not sent a heartbeat for `stuck_after`
(Procrastinate's own stalled-worker rule; its default timeout is 30 s, Skiplock's 5m).

Throughput comes from procrastinate_events (`succeeded` = completed, `failed` = failed,
`deferred_for_retry` = retried), read after the previous cycle's id.

A 2.x schema (no procrastinate_workers, no worker_id) is refused with a message.

Actions (with `actions = true`; sql/external_actions.sql `procrastinate_*`), through
Procrastinate's own SQL functions of 3.10 (procrastinate/sql/schema.sql) as its JobManager and
`procrastinate shell` call them:
- replay: procrastinate_retry_job_v2(id, now(), ...) on a failed job (the shell's `retry`,
  JobManager.retry_job_by_id): back to todo, event `retried`;
- purge: the failed job deleted with its events (what JobManager.delete_old_jobs /
  the builtin remove_old_jobs delete, chosen by id instead of by age);
- cancel: procrastinate_cancel_job_v1(id, abort => false, delete_job => false) on a todo job
  (JobManager.cancel_job_by_id): status cancelled.
Procrastinate 3 has no queue pause.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import Adapter, Completions, Shape, SourceError

REQUIRED_COLUMNS = ["id", "queue_name", "task_name", "status", "scheduled_at", "attempts", "worker_id", "abort_requested"]


class ProcrastinateAdapter(Adapter):
    system = "procrastinate"
    default_table = "procrastinate_jobs"
    schema_version = "Procrastinate 3.x (read from 3.10.0)"
    statement_prefix = "procrastinate"
    needs_search_path = True  # its functions name procrastinate_jobs without a schema

    @property
    def claim_function(self) -> tuple[str, str]:
        schema, _ = self.queue_table
        return schema, "procrastinate_fetch_job%"
    offered = {
        "replay": "procrastinate_retry_job_v2(id, now()): failed back to todo, event 'retried' (its shell's `retry`)",
        "purge": "the failed job deleted with its events (what its remove_old_jobs deletes, chosen by id)",
        "cancel": "procrastinate_cancel_job_v1(id, abort false): a todo job becomes cancelled (JobManager.cancel_job_by_id)",
    }
    withheld = {"pause": "Procrastinate has no queue pause", "resume": "Procrastinate has no queue pause"}

    @property
    def claim_pattern(self) -> str | None:
        return self.entry.claim_query_like or "%procrastinate_fetch_job%"

    def tables(self) -> list[tuple[str, str]]:
        schema, _ = self.queue_table
        return [*super().tables(), (f"{self.name}:{schema}.procrastinate_events", f"{schema}.procrastinate_events")]

    completed_note = ("Procrastinate keeps finished jobs in procrastinate_jobs unless the worker deletes them "
                      "(`procrastinate worker --delete-jobs=successful`, or App(worker_defaults={'delete_jobs': "
                      "'successful'})) or the builtin task procrastinate.builtin_tasks.remove_old_jobs runs periodically.")

    @property
    def completed(self) -> sql.Composable:
        return sql.SQL("j.status IN ('succeeded', 'cancelled', 'aborted')")

    def completions(self) -> Completions:
        schema, table = self.queue_table
        jobs = sql.Identifier(schema, table)
        return Completions("procrastinate_events",
                           sql.SQL("(SELECT j.queue_name FROM {jobs} AS j WHERE j.id = e.job_id)").format(jobs=jobs), (
            ("completed", sql.SQL("e.type = 'succeeded'")),
            ("failed", sql.SQL("e.type = 'failed'")),
            ("retried", sql.SQL("e.type = 'deferred_for_retry'")),
        ))

    def shape(self) -> Shape:
        schema, _ = self.queue_table
        events = sql.Identifier(schema, "procrastinate_events")
        workers = sql.Identifier(schema, "procrastinate_workers")
        return Shape(
            queue=sql.SQL("j.queue_name"),
            pending=sql.SQL("j.status = 'todo'"),
            due=sql.SQL("j.scheduled_at IS NULL OR j.scheduled_at <= now()"),
            since=sql.SQL("coalesce(j.scheduled_at, (SELECT min(e.at) FROM {events} AS e "
                          "WHERE e.job_id = j.id AND e.type = 'deferred'))").format(events=events),
            running=sql.SQL("j.status = 'doing'"),
            stuck=sql.SQL("j.worker_id IS NULL OR NOT EXISTS (SELECT 1 FROM {workers} AS w WHERE w.id = j.worker_id "
                          "AND w.last_heartbeat >= now() - %(stuck_after)s::interval)").format(workers=workers),
            failed=sql.SQL("j.status = 'failed'"),
            # its trigger writes a 'failed' event when a job fails (procrastinate_events_job_id index)
            failed_at=sql.SQL("(SELECT max(e.at) FROM {events} AS e WHERE e.job_id = j.id AND e.type = 'failed')").format(
                events=events),
            attempts=sql.SQL("j.attempts"),
        )

    def check_schema(self, cur: psycopg.Cursor) -> None:
        try:
            self._require_columns(cur, REQUIRED_COLUMNS)
            self._require_columns(cur, ["id", "last_heartbeat"], "procrastinate_workers")
            self._require_columns(cur, ["job_id", "type", "at"], "procrastinate_events")
        except SourceError as exc:
            raise SourceError(f"unknown Procrastinate schema version ({exc}); Skiplock reads {self.schema_version}: "
                              "run `procrastinate schema --apply` or its migrations") from None
