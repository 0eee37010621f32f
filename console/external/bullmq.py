"""BullMQ on PostgreSQL (system = "bullmq"): the schema BullMQ 6's PostgreSQL backend creates
with its own `runMigrations` (default schema `bullmq`).

BullMQ 6 (npm `bullmq`) runs its Queue, Worker and FlowProducer on PostgreSQL when given
`createPostgresBackend` (its guide docs/gitbook/guide/postgresql.md; `pg` is an optional peer
dependency). Schema read: ledger version 11 of `<schema>.migration`, as 6.7.0's migrations
leave it (table job keyed by (queue, id) with state, process_at_ms, added_at_ms,
locked_until_ms, finished_at_ms, attempts_made, failed_reason; per-queue flags in meta). Any
other version is refused: BullMQ's SQL is its own and its functions change between versions.

A queue is a BullMQ queue name. Times are epoch milliseconds. Eligible = waiting (prioritized
jobs are waiting jobs with a priority) and delayed jobs whose process_at_ms has passed (its
move_to_active promotes those first); scheduled = delayed later; running = active; stuck =
active with an expired lock (locked_until_ms past: its stalled-job checker has not moved it back
yet, so check that a worker runs); age from process_at_ms, else added_at_ms; dead letters =
failed. Parents waiting for their children (`waiting-children`) count as none of these. A
paused queue (meta field `paused`) keeps its waiting jobs eligible-looking: the panel says
it is paused.

Actions (with `actions = true`; sql/external_actions.sql `bullmq_*`) call BullMQ's own SQL
functions, the ones its PostgresQueueBackend calls (src/postgres/migrations/0002_functions.sql):
replay = reprocess_job(queue, id, 'failed', lifo false, reset attempts) as Job.retry('failed')
does; purge = remove(queue, id, false) as Job.remove() does (it refuses a locked job); cancel =
remove(queue, id, false) on a waiting or delayed job; pause / resume = pause(queue, true /
false) as Queue.pause() / Queue.resume() do.

Throughput: none (its event stream is keyed by (queue, id) and trimmed, so no index finds the
newest events of every queue within bounds).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

from console.external import Adapter, Shape, SourceError
from console.sqlfiles import query

KNOWN_VERSIONS = {11: "BullMQ 6.7.0"}
REQUIRED_COLUMNS = ["queue", "id", "name", "state", "priority", "added_at_ms", "process_at_ms", "finished_at_ms",
                    "locked_until_ms", "attempts_made", "failed_reason"]
NOW_MS = "(extract(epoch FROM now()) * 1000)"
_KEY = re.compile(r"^[^:\x00]{1,500}:[^:\x00]{1,500}$")


class BullMQAdapter(Adapter):
    system = "bullmq"
    default_table = "job"
    schema_version = "BullMQ PostgreSQL schema version 11 (read from 6.7.0)"
    statement_prefix = "bullmq"
    key_example = "queue:id (a BullMQ queue name and job id, which cannot contain ':')"
    offered = {
        "replay": "reprocess_job(queue, id, 'failed', ...): back to waiting with its attempts reset, as Job.retry('failed')",
        "purge": "remove(queue, id, false): deleted with its logs, as Job.remove() (a locked job is refused)",
        "cancel": "remove(queue, id, false) on a waiting or delayed job, as Job.remove()",
        "pause": "pause(queue, true): workers stop taking its jobs, as Queue.pause()",
        "resume": "pause(queue, false): workers take its jobs again, as Queue.resume()",
    }
    no_completions = ("BullMQ's event stream is keyed by (queue, id) and trimmed to a maximum length: no index "
                      "finds the newest events of every queue within bounds")
    completed_note = ("BullMQ keeps completed jobs in its job table unless they are added with removeOnComplete "
                      "(and failed ones unless removeOnFail); Queue.clean removes them by age.")

    @property
    def queue_table(self) -> tuple[str, str]:
        if "." in self.entry.table:
            return self.entry.qualified(self.default_table)
        return self.entry.schema or "bullmq", self.entry.table or self.default_table

    @property
    def completed(self) -> sql.Composable:
        return sql.SQL("j.state = 'completed'")

    @property
    def claim_pattern(self) -> str | None:
        # Its claim is the function move_to_active (SELECT * FROM move_to_active($1, ...)).
        return self.entry.claim_query_like or "%move_to_active%"

    def check_key(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ValueError(f"{key[:80]!r} is not a BullMQ job key: {self.key_example}")
        return key

    def key_params(self, keys: list[str]) -> dict[str, Any]:
        queues, ids = zip(*(k.split(":", 1) for k in keys), strict=True) if keys else ((), ())
        return {"key_queues": list(queues), "key_ids": list(ids)}

    def shape(self) -> Shape:
        now_ms = sql.SQL(NOW_MS)
        return Shape(
            queue=sql.SQL("j.queue"),
            pending=sql.SQL("j.state IN ('waiting', 'delayed')"),
            due=sql.SQL("j.state = 'waiting' OR j.process_at_ms <= {now}").format(now=now_ms),
            since=sql.SQL("to_timestamp(coalesce(j.process_at_ms, j.added_at_ms) / 1000.0)"),
            running=sql.SQL("j.state = 'active'"),
            stuck=sql.SQL("j.locked_until_ms < {now}").format(now=now_ms),
            stuck_since=sql.SQL("to_timestamp(j.locked_until_ms / 1000.0)"),
            failed=sql.SQL("j.state = 'failed'"),
            failed_at=sql.SQL("to_timestamp(j.finished_at_ms / 1000.0)"),
            error=sql.SQL("j.failed_reason"),
            attempts=sql.SQL("j.attempts_made"),
            key=sql.SQL("(j.queue || ':' || j.id)"),
            key_match=sql.SQL("(j.queue, j.id) IN (SELECT k.q, k.i FROM unnest(%(key_queues)s::text[], "
                              "%(key_ids)s::text[]) AS k(q, i))"),
        )

    def paused_queues(self, cur: psycopg.Cursor) -> set[str]:
        schema, _ = self.queue_table
        rows = cur.execute(sql.SQL(query("external_actions", "bullmq_paused")).format(
            meta=sql.Identifier(schema, "meta")), {}).fetchall()
        return {r["queue"] if isinstance(r, dict) else r[0] for r in rows}

    def check_schema(self, cur: psycopg.Cursor) -> None:
        schema, _ = self.queue_table
        try:
            self._require_columns(cur, REQUIRED_COLUMNS)
            self._require_columns(cur, ["queue", "field", "value"], "meta")
            self._require_columns(cur, ["version"], "migration")
        except SourceError as exc:
            raise SourceError(f"unknown BullMQ schema ({exc}); Skiplock reads {self.schema_version}") from None
        version = cur.execute(sql.SQL("SELECT max(m.version) AS version FROM {} AS m").format(
            sql.Identifier(schema, "migration"))).fetchone()["version"]
        if version not in KNOWN_VERSIONS:
            raise SourceError(f"unknown BullMQ schema version {version} in {schema}.migration "
                              f"(Skiplock reads {self.schema_version})")
