"""graphile-worker (system = "graphile-worker"): the `graphile_worker` schema its CLI installs.

Schema read: migration 20, as `graphile-worker --schema-only` of 0.18.0 leaves it (the table
graphile_worker._private_jobs with task_id, run_at, attempts, max_attempts, locked_at,
is_available; _private_tasks with identifier; graphile_worker.migrations). Any other latest
migration is refused: the private tables are graphile-worker's own and change between versions.

A queue here is a task identifier (graphile-worker's named job queues only serialise jobs).
Eligible = available (not locked, attempts left) with run_at past; scheduled = available later
(a retry waiting out its backoff is one); running = locked; stuck = locked longer than
`stuck_after` (graphile-worker itself lets a lock expire after 4 hours: set stuck_after = "4h"
to match it); dead letters = attempts used up (graphile-worker keeps such jobs in the table).

Actions (with `actions = true`; sql/external_actions.sql `graphile_*`) go through the
administrative functions graphile-worker documents for admin UIs (website/docs/admin-functions.md;
they skip a locked job themselves, and its docs warn against UPDATE or DELETE on a locked one):
replay = reschedule_jobs(ids, run_at => now(), attempts => 0), purge = complete_jobs(ids),
cancel = permanently_fail_jobs(ids, reason). graphile-worker has no queue pause.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import Adapter, Shape, SourceError

KNOWN_MIGRATIONS = {20: "graphile-worker 0.18.0"}
REQUIRED_COLUMNS = ["id", "task_id", "run_at", "attempts", "max_attempts", "locked_at", "created_at", "updated_at",
                    "last_error"]


class GraphileWorkerAdapter(Adapter):
    statement_prefix = "graphile"
    offered = {
        "replay": "graphile_worker.reschedule_jobs(ids, run_at => now(), attempts => 0): runs again now with its "
                  "whole attempt budget (its documented way to retry a permanently failed job)",
        "purge": "graphile_worker.complete_jobs(ids): deleted, as its docs say completing a job does",
        "cancel": "graphile_worker.permanently_fail_jobs(ids, reason): a waiting job becomes a dead letter, kept "
                  "with the reason as its last error",
    }
    withheld = {"pause": "graphile-worker has no queue pause", "resume": "graphile-worker has no queue pause"}

    system = "graphile-worker"
    default_table = "_private_jobs"
    schema_version = "graphile-worker schema migration 20 (read from 0.18.0)"

    @property
    def queue_table(self) -> tuple[str, str]:
        if "." in self.entry.table:
            return self.entry.qualified(self.default_table)
        return self.entry.schema or "graphile_worker", self.entry.table or self.default_table

    completed_note = ("graphile-worker deletes a job's row when it succeeds; jobs whose attempts are used up stay "
                      "(those are the dead letters).")
    no_completions = "graphile-worker deletes a job's row when it succeeds and keeps no log of finished jobs"

    @property
    def claim_pattern(self) -> str | None:
        return self.entry.claim_query_like or "%get_job%"

    def shape(self) -> Shape:
        schema, _ = self.queue_table
        tasks = sql.Identifier(schema, "_private_tasks")
        return Shape(
            queue=sql.SQL("(SELECT t.identifier FROM {tasks} AS t WHERE t.id = j.task_id)").format(tasks=tasks),
            pending=sql.SQL("j.locked_at IS NULL AND j.attempts < j.max_attempts"),
            due=sql.SQL("j.run_at <= now()"),
            since=sql.SQL("j.run_at"),
            running=sql.SQL("j.locked_at IS NOT NULL"),
            stuck=sql.SQL("j.locked_at < now() - %(stuck_after)s::interval"),
            stuck_since=sql.SQL("j.locked_at + %(stuck_after)s::interval"),
            failed=sql.SQL("j.locked_at IS NULL AND j.attempts >= j.max_attempts"),
            failed_at=sql.SQL("j.updated_at"),  # its fail_jobs and permanently_fail_jobs set it
            error=sql.SQL("j.last_error"),
            attempts=sql.SQL("j.attempts"),
        )

    def check_schema(self, cur: psycopg.Cursor) -> None:
        schema, _ = self.queue_table
        try:
            self._require_columns(cur, REQUIRED_COLUMNS)
            self._require_columns(cur, ["id", "identifier"], "_private_tasks")
            self._require_columns(cur, ["id"], "migrations")
        except SourceError as exc:
            raise SourceError(f"unknown graphile-worker schema ({exc}); Skiplock reads {self.schema_version}") from None
        latest = cur.execute(sql.SQL("SELECT max(m.id) AS id FROM {} AS m").format(sql.Identifier(schema, "migrations"))).fetchone()["id"]
        if latest not in KNOWN_MIGRATIONS:
            raise SourceError(f"unknown graphile-worker schema version: migration {latest} in {schema}.migrations "
                              f"(Skiplock reads {self.schema_version})")
