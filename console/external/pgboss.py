"""pg-boss (system = "pg-boss"): the `pgboss` schema pg-boss creates when it starts.

Schema read: version 24, as pg-boss 10.4.2 creates it (pgboss.job, partitioned by queue name,
with name, state, start_after, started_on, expire_in, created_on; enum pgboss.job_state with
created, retry, active, completed, cancelled, failed; pgboss.version). Any other version is
refused: pg-boss migrates its own schema and its tables changed shape between majors.

A queue is a job `name` (a pg-boss queue). Eligible = created or retry with start_after past;
scheduled = the same later (a retry waiting out its delay is one); running = active; stuck =
active past its own `expire_in` (pg-boss's expiration rule, applied by its supervisor: stuck
means no supervisor has expired it yet); age from start_after; dead letters = failed.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import Adapter, Shape, SourceError

KNOWN_VERSIONS = {24: "pg-boss 10.4.2"}
REQUIRED_COLUMNS = ["id", "name", "state", "start_after", "started_on", "expire_in", "created_on"]


class PgBossAdapter(Adapter):
    system = "pg-boss"
    default_table = "job"
    schema_version = "pg-boss schema version 24 (read from 10.4.2)"

    @property
    def queue_table(self) -> tuple[str, str]:
        if "." in self.entry.table:
            return self.entry.qualified(self.default_table)
        return self.entry.schema or "pgboss", self.entry.table or self.default_table

    no_completions = ("pg-boss keeps completed jobs in its job table (state completed, completed_on), but no index "
                      "serves completed_on, so counting recent completions would scan the table every cycle")

    completed_note = ("pg-boss moves completed jobs to pgboss.archive after archiveCompletedAfterSeconds (12 h by "
                      "default) and deletes them after deleteAfterDays; only a running supervisor does this "
                      "(new PgBoss({supervise: true}), the default).")

    @property
    def completed(self) -> sql.Composable:
        return sql.SQL("j.state IN ('completed', 'cancelled')")

    @property
    def claim_pattern(self) -> str | None:
        # pg-boss 10's fetch (src/plans.js): "... FROM <schema>.job ... FOR UPDATE SKIP LOCKED";
        # naming the table keeps another queue's SKIP LOCKED claim in the same database out.
        schema, table = self.queue_table
        return self.entry.claim_query_like or f"%FROM {schema}.{table}%FOR UPDATE SKIP LOCKED%"

    def shape(self) -> Shape:
        return Shape(
            queue=sql.SQL("j.name"),
            pending=sql.SQL("j.state IN ('created', 'retry')"),
            # Its fetch takes `start_after < now()`: a job at the instant is not yet due.
            due=sql.SQL("j.start_after < now()"),
            since=sql.SQL("j.start_after"),
            running=sql.SQL("j.state = 'active'"),
            stuck=sql.SQL("j.started_on + j.expire_in < now()"),
            stuck_since=sql.SQL("j.started_on + j.expire_in"),
            failed=sql.SQL("j.state = 'failed'"),
        )

    def check_schema(self, cur: psycopg.Cursor) -> None:
        schema, _ = self.queue_table
        try:
            self._require_columns(cur, REQUIRED_COLUMNS)
            self._require_columns(cur, ["version"], "version")
        except SourceError as exc:
            raise SourceError(f"unknown pg-boss schema ({exc}); Skiplock reads {self.schema_version}") from None
        version = cur.execute(sql.SQL("SELECT max(v.version) AS version FROM {} AS v").format(
            sql.Identifier(schema, "version"))).fetchone()["version"]
        if version not in KNOWN_VERSIONS:
            raise SourceError(f"unknown pg-boss schema version {version} in {schema}.version "
                              f"(Skiplock reads {self.schema_version})")
