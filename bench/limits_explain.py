#!/usr/bin/env python
"""Buffers read by one try of the limited path, from EXPLAIN (ANALYZE, BUFFERS) (issue 14).

A throwaway PostgreSQL (console.pgcluster.PrivateCluster, relaxed durability) gets a backlog of
`--backlog` eligible jobs of an unlimited kind in an unlimited queue ('default', 'noop'), a
limited queue ('limited': concurrency 2, rate 50/s) and a limited kind ('scarce': concurrency 1).
Then, with 0, 10 and `--many` jobs of the limited kind (in 'default') and of the limited queue
(kind 'noop'), each enqueued after the backlog (so they come last in the claim order), it runs
once each, inside a transaction it rolls back:

- claim_kind  (sql/limits.sql, kind 'scarce', limit 1): one try of the limited kind;
- claim_queue (sql/limits.sql, queue 'limited', kind NULL): one try of the limited queue;
- claim       (sql/queue.sql, limit 10): the unlimited fast claim, to show it is unchanged
  (also with --queues default, a worker serving named queues);

and prints the buffers each touched (shared hit + read), its time and the index it used.
The limited path's indexes (`console.queue.limits.keep_claim_indexes`, which the scheduler runs while
something is limited) are built after the limits are set; `--without-indexes` leaves them out:
the path as it was before them, and as it is until the scheduler has built them.

    .venv/bin/python bench/limits_explain.py                     # with the limited path's indexes
    .venv/bin/python bench/limits_explain.py --without-indexes   # without them
    .venv/bin/python bench/limits_explain.py --prepared auto # as a worker's connection runs them
    .venv/bin/python bench/limits_explain.py --enqueue 100000  # what the indexes cost enqueue_many

`--enqueue N` instead times enqueue_many of N jobs (one COPY batch, then batches of 10, the
INSERT path) with and without the limited path's indexes, alternating, 3 rounds, with the WAL written per
job: the indexes' cost is paid per enqueue. Times depend on the machine's load (the load
average is printed); WAL bytes do not.

Buffer counts depend on the data, not on the machine's load; the times do.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psycopg import sql  # noqa: E402

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.queue import limits  # noqa: E402
from console.sqlfiles import query  # noqa: E402

INDEXES = tuple(limits.CLAIM_INDEXES)

STATEMENTS = {
    "claim_kind": (query("limits", "claim_kind"),
                   {"kind": "scarce", "limit": 1, "queues": None, "worker": "explain", "lease": 30.0}),
    "claim_queue": (query("limits", "claim_queue"),
                    {"queue": "limited", "kind": None, "limit": 2, "worker": "explain", "lease": 30.0}),
    "claim": (query("queue", "claim"),
              {"queues": None, "limit": 10, "worker": "explain", "lease": 30.0}),
    "claim --queues": (query("queue", "claim"),
                       {"queues": ["default"], "limit": 10, "worker": "explain", "lease": 30.0}),
}


def prepared(conn, name: str, sql_text: str, params: dict) -> tuple[str, None]:
    """PREPARE the statement with $n parameters, as psycopg does after its prepare threshold,
    and return the EXECUTE to explain: after five runs PostgreSQL may switch it to a generic
    plan (plan_cache_mode=auto), the plan a long-lived worker connection then keeps."""
    order: list[str] = []

    def number(match):
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, sql_text)
    statement = "p_" + re.sub(r"\W", "_", name)
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE {statement} AS {text}")
    values = ", ".join(sql.Literal(params[k]).as_string(conn) for k in order)
    return f"EXECUTE {statement}({values})", None


def explain(conn, sql_text: str, params) -> tuple[int, float, str, int]:
    """(shared buffers hit + read, execution ms, indexes used, rows claimed) of one run, rolled back."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql_text, params).fetchone()[0][0]
    top = plan["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    indexes: list[str] = []

    def walk(node):
        if "Index Name" in node and node["Index Name"] not in indexes:
            indexes.append(node["Index Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(top)
    return buffers, plan["Execution Time"], ",".join(indexes) or "-", top.get("Actual Rows", 0)


def add(conn, n: int, queue: str, kind: str) -> None:
    # Enqueued after the backlog: last in the claim order (same priority, later run_at).
    conn.execute("INSERT INTO skiplock.jobs (queue, kind, run_at) "
                 "SELECT %s, %s, now() - interval '1 hour' + g * interval '1 microsecond' "
                 "FROM generate_series(1, %s) AS g", (queue, kind, n))


def enqueue_cost(conn, n: int) -> None:
    """jobs/s of enqueue_many with and without the limited path's indexes, alternating."""
    print(f"enqueue_many of {n:,} jobs: one batch (COPY), then batches of 10 (INSERT); jobs/s; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    for round_ in (1, 2, 3):
        for with_indexes in (False, True):
            conn.execute("TRUNCATE skiplock.jobs")
            for name in INDEXES:
                conn.execute(f"DROP INDEX IF EXISTS skiplock.{name}")
            if with_indexes:
                for _unit, create in limits.CLAIM_INDEXES.values():
                    conn.execute(query("limits", create))
            rates, wal = [], []
            for batch in (n, 10):
                jobs = n if batch == n else n // 10
                lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
                started = time.perf_counter()
                for _ in range(0, jobs, batch):
                    with conn.transaction():
                        q.enqueue_many(conn, [q.NewJob("noop", {"i": i}) for i in range(batch)])
                rates.append(jobs / (time.perf_counter() - started))
                wal.append(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                                        (lsn,)).fetchone()[0] / jobs)
            print(f"  round {round_} {'with' if with_indexes else 'without'} indexes: "
                  f"COPY {rates[0]:>9,.0f} ({wal[0]:,.0f} B WAL/job)   "
                  f"INSERT x10 {rates[1]:>7,.0f} ({wal[1]:,.0f} B WAL/job)   load {os.getloadavg()[0]:.1f}")
    sizes = conn.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                         "WHERE indrelid = 'skiplock.jobs'::regclass ORDER BY 1").fetchall()
    print("  index sizes after the last round: " + ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=500_000)
    parser.add_argument("--many", type=int, default=100_000)
    parser.add_argument("--prepared", choices=("auto", "generic"),
                        help="explain prepared statements after 6 runs (auto: the plan PostgreSQL settles on, "
                             "as for a worker's connection past psycopg's prepare threshold; generic: forced)")
    parser.add_argument("--enqueue", type=int, metavar="N", help="time enqueue_many with and without the limited path's indexes instead")
    parser.add_argument("--without-indexes", action="store_true", help="leave out the limited path's indexes")
    args = parser.parse_args()

    with PrivateCluster(settings={**RELAXED_DURABILITY, "shared_buffers": "512MB"}, exit_guard=True) as cluster:
        with connect(cluster.dsn) as conn:
            migrate(conn)
            if args.enqueue:
                enqueue_cost(conn, args.enqueue)
                return 0
            if args.prepared == "generic":
                conn.execute("SET plan_cache_mode = force_generic_plan")
            limits.set_limits(conn, "limited", concurrency=2, rate="50/s", actor="explain")
            limits.declare_kinds(conn, {"scarce": 1}, worker="explain")
            if not args.without_indexes:
                limits.keep_claim_indexes(conn)  # as the scheduler does while something is limited
            conn.execute("INSERT INTO skiplock.jobs (kind, run_at) "
                         "SELECT 'noop', now() - interval '2 hours' + g * interval '1 microsecond' "
                         "FROM generate_series(1, %s) AS g", (args.backlog,))
            have = 0
            print(f"backlog: {args.backlog:,} eligible 'noop' jobs in 'default'; "
                  f"limited path's indexes: {'left out' if args.without_indexes else 'built'}; "
                  f"{args.prepared or 'unprepared'} plans")
            print(f"{'limited jobs':>12}  {'statement':<12} {'buffers':>9} {'ms':>9} {'rows':>4}  index")
            for want in (0, 10, args.many):
                add(conn, want - have, "default", "scarce")
                add(conn, want - have, "limited", "noop")
                have = want
                conn.execute("VACUUM (ANALYZE) skiplock.jobs")
                for name, (sql_text, params) in STATEMENTS.items():
                    if args.prepared:
                        sql_text, params = prepared(conn, name, sql_text, params)
                    for _ in range(6 if args.prepared else 1):  # warm the cache (and the plan cache's choice)
                        explain(conn, sql_text, params)
                    buffers, ms, index, rows = explain(conn, sql_text, params)
                    print(f"{want:>12,}  {name:<12} {buffers:>9,} {ms:>9.2f} {rows:>4}  {index}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
