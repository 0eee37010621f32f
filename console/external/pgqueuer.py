"""PGQueuer (system = "pgqueuer"): the `pgqueuer` table its `pgq install` creates.

Schema read: PGQueuer 1.x as installed by 1.6.0 (table pgqueuer with entrypoint, priority,
status, execute_after, heartbeat, created; enum pgqueuer_status with queued, picked,
successful, exception, canceled, deleted, failed). PGQueuer has no queue names: a queue here is
an entrypoint. Finished jobs leave the table (their history is pgqueuer_log); a job that fails
with on_failure="hold" stays with status 'failed', which is what dead letters counts. A picked
job whose heartbeat is older than `stuck_after` (default 5m) counts as stuck.

Throughput comes from pgqueuer_log (a row per status change, `successful` = completed,
`exception`/`failed` = failed), read after the previous cycle's id.

An older schema without the 'failed' status or without the heartbeat column is refused: the
figures would not mean what they say.

Actions (with `actions = true`; sql/external_actions.sql `pgqueuer_*`), PGQueuer's own
transitions as 1.6.0 makes them (pgqueuer/core/insights.py QueueManagementService, `pgq
requeue` / `pgq failed`; adapters/persistence/qb.py):
- replay: a held failed job back to queued, due now, attempts 0, logged `queued` (its requeue);
- purge: a held failed job deleted and logged `deleted` (how its clear_queue removes jobs);
- cancel: a queued job deleted and logged `canceled`, with the cancellation NOTIFY (its
  mark_job_as_cancelled).
PGQueuer has no queue pause.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import Adapter, Completions, Shape, SourceError
from console.sqlfiles import query

REQUIRED_COLUMNS = ["id", "priority", "created", "updated", "heartbeat", "execute_after", "status", "entrypoint"]
REQUIRED_STATUSES = {"queued", "picked", "failed"}


class PgQueuerAdapter(Adapter):
    system = "pgqueuer"
    default_table = "pgqueuer"
    schema_version = "PGQueuer 1.x (read from 1.6.0)"
    statement_prefix = "pgqueuer"
    offered = {
        "replay": "back to queued, due now, attempts 0, logged 'queued' (PGQueuer's requeue of held jobs, `pgq requeue`)",
        "purge": "deleted from the queue table and logged 'deleted' (as PGQueuer's clear_queue removes jobs)",
        "cancel": "a queued job deleted and logged 'canceled', with PGQueuer's cancellation NOTIFY (mark_job_as_cancelled)",
    }
    withheld = {"pause": "PGQueuer has no queue pause", "resume": "PGQueuer has no queue pause"}

    def statement_identifiers(self) -> dict[str, sql.Composable]:
        schema, table = self.queue_table
        return {**super().statement_identifiers(), "log": sql.Identifier(schema, f"{table}_log"),
                "channel": sql.Literal(f"ch_{table}")}

    @property
    def claim_pattern(self) -> str | None:
        _, table = self.queue_table
        return self.entry.claim_query_like or f"%{table}%FOR UPDATE%SKIP LOCKED%"

    completed_note = "PGQueuer deletes a job's row when it finishes (its history is the pgqueuer_log table)."

    def completions(self) -> Completions:
        # Every status change is a row of pgqueuer_log (kept after aggregation into
        # pgqueuer_statistics: it is only flagged `aggregated`).
        _, table = self.queue_table
        return Completions(f"{table}_log", sql.SQL("e.entrypoint"), (
            ("completed", sql.SQL("e.status = 'successful'")),
            ("failed", sql.SQL("e.status IN ('exception', 'failed')")),
        ))

    def shape(self) -> Shape:
        return Shape(
            queue=sql.SQL("j.entrypoint"),
            pending=sql.SQL("j.status = 'queued'"),
            # Its dequeue takes `execute_after < NOW()`: a job at the instant is not yet due.
            due=sql.SQL("j.execute_after < now()"),
            since=sql.SQL("j.execute_after"),
            running=sql.SQL("j.status = 'picked'"),
            stuck=sql.SQL("j.heartbeat < now() - %(stuck_after)s::interval"),
            stuck_since=sql.SQL("j.heartbeat + %(stuck_after)s::interval"),
            failed=sql.SQL("j.status = 'failed'"),
            failed_at=sql.SQL("j.updated"),  # its log_jobs sets `updated` when it holds a failed job
            attempts=sql.SQL("j.attempts"),
        )

    def check_schema(self, cur: psycopg.Cursor) -> None:
        self._require_columns(cur, REQUIRED_COLUMNS)
        schema, table = self.queue_table
        labels = set(cur.execute(query("external", "enum_labels"), {"schema": schema, "type": f"{table}_status"}).fetchone()["labels"])
        if not labels:
            raise SourceError(f"no enum {schema}.{table}_status: not a PGQueuer schema Skiplock knows "
                              f"(it reads {self.schema_version}; run `pgq upgrade`)")
        missing = REQUIRED_STATUSES - labels
        if missing:
            raise SourceError(f"unknown PGQueuer schema version: status {', '.join(sorted(missing))} missing from "
                              f"{schema}.{table}_status (Skiplock reads {self.schema_version}; run `pgq upgrade`)")
        self._require_columns(cur, ["attempts"])  # its retries count here (1.x); the dead-letter list shows it
