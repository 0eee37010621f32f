"""A hand-rolled table-as-queue, described by the operator's predicates (system = "table").

The predicates are SQL fragments from the config file (never from the web); the console wraps
each in parentheses inside its own statement and runs it READ ONLY under statement_timeout.
Without `queue_column` every row belongs to one queue named "default"; without `enqueued_at`
the queue's age is 0; without `lease_until` nothing counts as stuck; without `completed` the
advisor cannot tell whether finished rows leave the table; without `failed_at` there is no
dead-letter growth. A declared table offers no action: Skiplock does not know its state machine.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import NO_TIME, Adapter, Shape


def col(name: str) -> sql.Composable:
    return sql.SQL("j.") + sql.Identifier(name)


class TableAdapter(Adapter):
    system = "table"
    schema_version = "declared by the operator"
    no_completions = "a declared table has no log of finished jobs Skiplock can read within bounds"

    def shape(self) -> Shape:
        e = self.entry
        return Shape(
            queue=col(e.queue_column) if e.queue_column else sql.Literal("default"),
            pending=sql.SQL(e.pending),
            since=col(e.enqueued_at) if e.enqueued_at else sql.SQL("NULL"),
            running=sql.SQL(e.running) if e.running else sql.SQL("false"),
            stuck=(col(e.lease_until) + sql.SQL(" < now()")) if e.lease_until else sql.SQL("false"),
            stuck_since=col(e.lease_until) if e.lease_until else sql.SQL("NULL"),
            failed=sql.SQL(e.failed) if e.failed else sql.SQL("false"),
            failed_at=col(e.failed_at) if e.failed_at else NO_TIME,
        )

    @property
    def completed(self) -> sql.Composable | None:
        return sql.SQL(self.entry.completed) if self.entry.completed else None

    def check_schema(self, cur: psycopg.Cursor) -> None:
        e = self.entry
        self._require_columns(cur, [c for c in (e.queue_column, e.enqueued_at, e.lease_until, e.failed_at) if c])
