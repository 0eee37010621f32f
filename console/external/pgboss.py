"""pg-boss (system = "pg-boss"): the `pgboss` schema pg-boss creates when it starts.

Schema read: version 24, as pg-boss 10.4.2 creates it (pgboss.job, partitioned by queue name,
with name, state, start_after, started_on, expire_in, created_on; enum pgboss.job_state with
created, retry, active, completed, cancelled, failed; pgboss.version). Any other version is
refused: pg-boss migrates its own schema and its tables changed shape between majors.

A queue is a job `name` (a pg-boss queue). Eligible = created or retry with start_after past;
scheduled = the same later (a retry waiting out its delay is one); running = active; stuck =
active past its own `expire_in` (pg-boss's expiration rule, applied by its supervisor: stuck
means no supervisor has expired it yet); age from start_after; dead letters = failed.

Actions (with `actions = true`; sql/external_actions.sql `pgboss_*`) make the transitions of
pg-boss 10.4's own manager methods (src/manager.js over src/plans.js): replay = retry (failed ->
retry with one more retry allowed: its redrive of a dead letter), purge = deleteJob (restricted
to failed jobs), cancel = cancel (restricted to waiting jobs: created or retry). pg-boss 10 has
no queue pause.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from console.external import Adapter, Shape, SourceError

KNOWN_VERSIONS = {24: "pg-boss 10.4.2"}
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
REQUIRED_COLUMNS = ["id", "name", "state", "start_after", "started_on", "expire_in", "created_on", "completed_on",
                    "retry_count", "retry_limit", "output"]


class PgBossAdapter(Adapter):
    system = "pg-boss"
    default_table = "job"
    schema_version = "pg-boss schema version 24 (read from 10.4.2)"
    statement_prefix = "pgboss"
    offered = {
        "replay": "failed -> retry with retry_limit + 1, as pg-boss's retry(name, id) redrives a dead letter",
        "purge": "deleted, as pg-boss's deleteJob(name, id) does (only failed jobs)",
        "cancel": "a created or retry job becomes cancelled, as pg-boss's cancel(name, id) does",
    }
    withheld = {"pause": "pg-boss 10 has no queue pause", "resume": "pg-boss 10 has no queue pause"}

    key_example = "name:id (a pg-boss queue name and job UUID)"

    def check_key(self, key: str) -> str:
        name, _, job_id = key.rpartition(":")
        if not name or len(name) > 500 or "\x00" in name or not _UUID.fullmatch(job_id):
            raise ValueError(f"{key[:80]!r} is not a pg-boss job key: {self.key_example}")
        return f"{name}:{job_id.lower()}"

    def key_params(self, keys: list[str]) -> dict:
        # The job table's primary key is (name, id) over partitions by name: find rows by both.
        pairs = [k.rpartition(":") for k in keys]
        return {"key_names": [p[0] for p in pairs], "key_ids": [p[2] for p in pairs]}

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
            failed_at=sql.SQL("j.completed_on"),  # its failJobs sets completed_on when retries run out
            error=sql.SQL("coalesce(j.output ->> 'message', j.output -> 'value' ->> 'message', j.output::text)"),
            attempts=sql.SQL("j.retry_count"),
            key=sql.SQL("(j.name || ':' || j.id::text)"),
            key_match=sql.SQL("(j.name, j.id) IN (SELECT k.n, k.i FROM unnest(%(key_names)s::text[], "
                              "%(key_ids)s::text[]::uuid[]) AS k(n, i))"),
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
