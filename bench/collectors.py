"""What one collection cycle costs on a big jobs table, against the naive way, in one run.

Builds skiplock.jobs with --rows rows (default 10,000,000: 95 % completed, 4 % pending of which
a tenth is scheduled for later, 1 % failed, plus a few running jobs with expired leases) in one
INSERT ... SELECT generate_series on a throwaway cluster with durability off, then VACUUM
ANALYZE. Then it times --cycles full collection cycles (every collector, and the store of the
samples, state and run row) and the same number of "naive" cycles: the queries a typical queue
dashboard runs (count(*) GROUP BY queue, status; the oldest pending job per queue; stuck leases;
dead letters per queue). It prints the medians, per collector too, the ratio, the server's own
execution time per cycle for both (pg_stat_statements, which a busy machine's scheduling delays
do not inflate), the load average, and the plans of the collector queries that touch the jobs
table (and fails if any is a sequential scan of it).

    .venv/bin/python bench/collectors.py                       # 10 M rows, 20 cycles
    .venv/bin/python bench/collectors.py --rows 1000000 --cycles 10
    .venv/bin/python bench/collectors.py --dsn postgresql://...  # an existing, empty database
    .venv/bin/python bench/collectors.py --data-dir /tmp/skiplock-bench-collectors  # build once, rerun

The machine's cores may be shared with other work: say so next to any figure you record.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.collectors import Options, collect, collector_connection  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.sqlfiles import query  # noqa: E402

QUEUES = 5

BUILD = """
INSERT INTO skiplock.jobs (queue, kind, payload, status, priority, run_at, attempts, finished_at, last_error, error_fingerprint)
SELECT
    'queue-' || (i %% %(queues)s),
    'bench',
    '{}'::jsonb,
    CASE WHEN i <= %(completed)s THEN 'completed'
         WHEN i <= %(completed)s + %(pending)s THEN 'pending'
         ELSE 'failed' END,
    0,
    CASE WHEN i > %(completed)s AND i <= %(completed)s + %(pending)s AND i %% 10 = 0
         THEN now() + interval '1 hour'
         ELSE now() - make_interval(secs => (%(total)s - i) / 100.0) END,
    1,
    CASE WHEN i <= %(completed)s OR i > %(completed)s + %(pending)s
         THEN now() - make_interval(secs => (%(total)s - i) / 100.0) END,
    CASE WHEN i > %(completed)s + %(pending)s THEN 'RuntimeError: bench' END,
    CASE WHEN i > %(completed)s + %(pending)s THEN 'RuntimeError: bench' END
FROM generate_series(1, %(total)s) AS i
"""

# What a typical dashboard runs instead: exact counts over the whole table.
NAIVE = {
    "depth_by_status": "SELECT queue, status, count(*) FROM skiplock.jobs GROUP BY queue, status",
    "oldest_pending": "SELECT queue, min(run_at) FROM skiplock.jobs WHERE status = 'pending' AND run_at <= now() GROUP BY queue",
    "stuck_leases": "SELECT queue, count(*) FROM skiplock.jobs WHERE status = 'running' AND lease_until < now() GROUP BY queue",
    "dead_letters": "SELECT queue, count(*) FROM skiplock.jobs WHERE status = 'failed' GROUP BY queue",
}

PLANNED = [
    ("collectors_queue", "queue_snapshot", {"cap": Options().depth_exact_limit, "failed_total_cap": Options().failed_total_limit,
                                            "failed_queue_cap": Options().failed_queue_limit}),
    ("collectors_statements", "probe_queues", {"limit": 3}),
    ("queue", "claim", {"worker": "probe", "queues": None, "limit": 1, "lease": 1.0}),
]


def build(dsn: str, rows: int) -> None:
    completed = int(rows * 0.95)
    pending = int(rows * 0.04)
    with connect(dsn) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        migrate(conn)
        conn.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false)")
        t0 = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(BUILD, {"total": rows, "completed": completed, "pending": pending, "queues": QUEUES})
        # A few running jobs whose lease expired (the stuck-lease collector has something to see).
        conn.execute("""UPDATE skiplock.jobs SET status = 'running', locked_by = 'gone', locked_at = now(),
                        lease_until = now() - interval '1 minute'
                        WHERE id IN (SELECT id FROM skiplock.jobs WHERE status = 'pending' ORDER BY id LIMIT 50)""")
        built = time.perf_counter() - t0
        conn.execute("VACUUM ANALYZE skiplock.jobs")
        conn.execute("ALTER TABLE skiplock.jobs RESET (autovacuum_enabled)")
        counts = dict(conn.execute("SELECT status, count(*) FROM skiplock.jobs GROUP BY status").fetchall())
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('skiplock.jobs'))").fetchone()[0]
    print(f"built {rows:,} rows in {built:.1f} s (+ VACUUM ANALYZE); by status: "
          + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) + f"; jobs table with indexes: {size}")


def already_built(dsn: str, rows: int) -> bool:
    with connect(dsn) as conn:
        if not conn.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL").fetchone()[0]:
            return False
        return conn.execute("SELECT max(id) FROM skiplock.jobs").fetchone()[0] == rows


def plans(dsn: str) -> bool:
    ok = True
    with collector_connection(dsn) as conn:  # the collectors' own session settings
        for concern, name, params in PLANNED:
            with conn.transaction(force_rollback=True):
                if concern == "queue":  # the probe plans the claim with the server's defaults
                    conn.execute(query("collectors_statements", "probe_planner_defaults"), {})
                text = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query(concern, name), params))
            seq = "Seq Scan on jobs" in text
            ok &= not seq
            print(f"\n-- plan of {concern}.{name}{'   <-- SEQUENTIAL SCAN OF jobs' if seq else ''}\n{text}")
    return ok


SERVER_TIME = """
SELECT coalesce(sum(s.total_exec_time), 0)::float8
FROM pg_stat_statements AS s
WHERE s.dbid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
"""


def server_ms(dsn: str) -> float:
    """Execution time PostgreSQL spent on this database's statements so far (pg_stat_statements):
    what a phase cost the database itself, whatever the client's scheduling delays."""
    with connect(dsn, application_name="bench-meter") as conn:
        return conn.execute(SERVER_TIME).fetchone()[0]


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in skiplock.jobs (default 10,000,000)")
    parser.add_argument("--cycles", type=int, default=20, help="collection cycles timed (and naive cycles); default 20")
    parser.add_argument("--naive-cycles", type=int, default=None, help="naive cycles (default: --cycles)")
    parser.add_argument("--dsn", help="an existing empty database instead of a private cluster")
    parser.add_argument("--data-dir", help="private cluster directory to keep and reuse (the table is built once per --rows)")
    args = parser.parse_args()
    if args.rows < 1000 or args.cycles < 1:
        parser.error("--rows must be at least 1000 and --cycles at least 1")

    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = PrivateCluster(args.data_dir, settings={**RELAXED_DURABILITY, "shared_buffers": "1GB", "max_wal_size": "8GB",
                                                          "checkpoint_timeout": "30min", "autovacuum": "off"},
                                 keep=bool(args.data_dir))
        cluster.start()
        dsn = cluster.dsn_for("postgres")
    try:
        print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        if not already_built(dsn, args.rows):
            build(dsn, args.rows)
        else:
            print(f"reusing the {args.rows:,}-row table in {args.data_dir}")
        plans_ok = plans(dsn)

        options = Options()
        load_before = os.getloadavg()[0]
        with collector_connection(dsn, options) as conn:
            collect(conn, options)  # warm-up; also the baseline for the rate collectors
            server_before = server_ms(dsn)
            cycles = []
            per: dict[str, list[float]] = {}
            for _ in range(args.cycles):
                t0 = time.perf_counter()
                report = collect(conn, options)
                cycles.append(time.perf_counter() - t0)
                for name, info in report.collectors.items():
                    per.setdefault(name, []).append(info["ms"] / 1000.0)
                    if info["error"]:
                        print(f"collector {name} failed: {info['error']}")
            collector_server = (server_ms(dsn) - server_before) / args.cycles
            exact_options = Options(depth_exact_limit=args.rows)
            exact = []
            for _ in range(max(3, args.cycles // 4)):
                t0 = time.perf_counter()
                collect(conn, exact_options, store=False, only=("queue",))
                exact.append(time.perf_counter() - t0)

        naive_cycles = []
        naive_per: dict[str, list[float]] = {}
        server_before = server_ms(dsn)
        with connect(dsn, application_name="bench-naive") as conn:
            for _ in range(args.naive_cycles or args.cycles):
                started = time.perf_counter()
                for name, text in NAIVE.items():
                    t0 = time.perf_counter()
                    conn.execute(text).fetchall()
                    naive_per.setdefault(name, []).append(time.perf_counter() - t0)
                naive_cycles.append(time.perf_counter() - started)

        naive_server = (server_ms(dsn) - server_before) / len(naive_cycles)
        load_after = os.getloadavg()[0]

        print(f"\nload average (1 min) before/after the timed phases: {load_before:.1f} / {load_after:.1f} on {os.cpu_count()} cores")
        print(f"full collection cycle (all collectors + storing), median of {len(cycles)}: {ms(cycles)}")
        for name, values in per.items():
            print(f"  {name:<12} {ms(values)}")
        print(f"queue collector with exact counts (cap = {args.rows:,}), median of {len(exact)}: {ms(exact)}")
        print(f"naive cycle (whole-table counts), median of {len(naive_cycles)}: {ms(naive_cycles)}")
        for name, values in naive_per.items():
            print(f"  {name:<16} {ms(values)}")
        ratio = statistics.median(naive_cycles) / statistics.median(cycles)
        queue_ratio = statistics.median(naive_cycles) / statistics.median(per["queue"])
        print(f"naive / full cycle: {ratio:.1f}x   naive / queue collector alone: {queue_ratio:.1f}x")
        print(f"server execution time per cycle (pg_stat_statements): collectors {collector_server:.1f} ms, "
              f"naive {naive_server:.1f} ms, ratio {naive_server / collector_server:.1f}x")
        print(f"no sequential scan of skiplock.jobs in the collector plans: {'yes' if plans_ok else 'NO'}")
        return 0 if plans_ok else 1
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
