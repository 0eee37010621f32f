"""pgmq (system = "pgmq"): one pgmq queue, its table pgmq.q_<queue>, as the pgmq SQL creates it.

pgmq keeps each queue in a table of its own (pgmq.q_<queue>, and pgmq.a_<queue> for archived
messages), made by `pgmq.create(queue)` at run time, so an entry watches one pgmq queue
(`queue = "orders"`): declare one entry per queue. Its SQL installs without the extension from
the PyPI package `pgmq` (1.1.4 ships pgmq.sql of PGMQ 1.13.0; `pgmq.install`), which is what
this adapter is read from: columns msg_id, read_ct, enqueued_at, vt, message.

pgmq is a message queue with a visibility timeout, not a job queue with states: `pgmq.read`
takes messages whose `vt` has passed (FOR UPDATE SKIP LOCKED inside the function), counts the
read in `read_ct` and hides them until `vt`; the consumer deletes or archives a message when it
is done, and one it does not comes back when `vt` passes. So: eligible = `vt` past (also a
message read before whose consumer did not finish: read_ct > 0); scheduled = never read, `vt`
later (sent with a delay); running = read and still hidden (read_ct > 0, `vt` later); age from
`vt` (when it became readable); stuck = none (pgmq has no heartbeat: a lapsed read is simply
readable again); dead letters = none (pgmq has no failed state: a dead-letter queue is the
application's own convention, often another pgmq queue, which can be watched as an entry of its
own).

Action (with `actions = true`; sql/external_actions.sql `pgmq_cancel`): cancel a waiting
message = `pgmq.archive(queue, msg_ids)`, its own function: the message leaves the queue for its
archive table (kept, not deleted). No replay or purge (no dead letters), no pause (pgmq has
none).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from console.external import Adapter, Shape, SourceError

REQUIRED_COLUMNS = ["msg_id", "read_ct", "enqueued_at", "vt", "message"]


class PgmqAdapter(Adapter):
    system = "pgmq"
    default_table = ""
    schema_version = "pgmq queue tables (read from pgmq.sql 1.13.0, PyPI pgmq 1.1.4)"
    statement_prefix = "pgmq"
    offered = {
        "cancel": "pgmq.archive(queue, msg_ids): a message no consumer holds leaves the queue for its archive table",
    }
    withheld = {
        "replay": "pgmq has no failed state: a message a consumer does not delete or archive is readable again once its "
                  "visibility timeout passes",
        "purge": "pgmq has no dead letters to purge (a dead-letter queue is the application's own convention)",
        "pause": "pgmq has no queue pause", "resume": "pgmq has no queue pause",
    }
    no_completions = ("pgmq deletes or archives a message when its consumer is done; the archive keeps the message's "
                      "own msg_id, which is no order of completion, so no bounded read finds the newest completions")
    completed_note = "pgmq removes a message from its queue table when its consumer deletes or archives it."

    @property
    def queue_table(self) -> tuple[str, str]:
        return "pgmq", f"q_{self.entry.queue.lower()}"  # its format_table_name: lower('q_' || queue)

    @property
    def claim_pattern(self) -> str | None:
        # Its claim runs inside pgmq.read(...); pg_stat_statements sees the call.
        return self.entry.claim_query_like or "%pgmq.read%"

    claim_function = ("pgmq", "read%")  # the advisor reads the claim in the function's body

    def statement_identifiers(self) -> dict[str, sql.Composable]:
        return {**super().statement_identifiers(), "qname": sql.Literal(self.entry.queue)}

    def shape(self) -> Shape:
        return Shape(
            queue=sql.Literal(self.entry.queue),
            pending=sql.SQL("j.vt <= now() OR j.read_ct = 0"),
            # Its read takes `vt <= clock_timestamp()`: a message at the instant is readable.
            due=sql.SQL("j.vt <= now()"),
            since=sql.SQL("j.vt"),
            running=sql.SQL("j.read_ct > 0 AND j.vt > now()"),
            failed=sql.SQL("false"),
            attempts=sql.SQL("j.read_ct"),
            key=sql.SQL("j.msg_id::text"),
            key_match=sql.SQL("j.msg_id = ANY(%(keys)s::text[]::bigint[])"),
        )

    def check_schema(self, cur: psycopg.Cursor) -> None:
        try:
            self._require_columns(cur, REQUIRED_COLUMNS)
            self._require_columns(cur, ["queue_name"], "meta")
        except SourceError as exc:
            raise SourceError(f"not a pgmq queue Skiplock knows ({exc}); it reads {self.schema_version}: "
                              f"`SELECT pgmq.create('{self.entry.queue}')` creates the queue") from None
