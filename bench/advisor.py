#!/usr/bin/env python
"""What the advisor costs: every check's time on a jobs table of a given size.

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster), fills skiplock.jobs with
`--rows` jobs (by default 60% completed, 35% pending, 5% failed, some running with expired
leases), runs ANALYZE, then runs all checks `--runs` times and prints each check's median and
worst time side by side with the table's size. The claim is that no check scans the jobs table,
so times should stay flat as --rows grows; compare two sizes in one run with --rows 100000,1000000.

    .venv/bin/python bench/advisor.py                        # 100k and 1M rows, 5 runs each
    .venv/bin/python bench/advisor.py --rows 50000 --runs 3  # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.advisor import run_checks  # noqa: E402
from console.config import load_config  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402

FILL = """
INSERT INTO skiplock.jobs (queue, kind, status, priority, run_at, attempts, max_attempts,
                           locked_by, locked_at, lease_until, finished_at, created_at)
SELECT
    'q' || (g %% 4),
    'kind' || (g %% 7),
    s.status,
    (g %% 3)::smallint,
    now() - make_interval(secs => g %% 3600),
    CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
    5,
    CASE WHEN s.status = 'running' THEN 'bench-worker' END,
    CASE WHEN s.status = 'running' THEN now() - interval '10 minutes' END,
    CASE WHEN s.status = 'running' THEN now() - interval '5 minutes' END,
    CASE WHEN s.status IN ('completed', 'failed') THEN now() - make_interval(secs => g %% 172800) END,
    now() - make_interval(secs => g %% 172800)
FROM generate_series(1, %(rows)s) AS g
CROSS JOIN LATERAL (SELECT CASE
    WHEN g %% 100 < 60 THEN 'completed'
    WHEN g %% 100 < 95 THEN 'pending'
    WHEN g %% 1000 = 999 THEN 'running'
    ELSE 'failed' END AS status) AS s
"""


def measure(dsn: str, rows: int, runs: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs")
        conn.execute(FILL, {"rows": rows})
        conn.execute("VACUUM ANALYZE skiplock.jobs")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('skiplock.jobs'))").fetchone()[0]
        print(f"  {rows:,} rows, skiplock.jobs with indexes: {size}", flush=True)
        config = load_config(env={}, overrides={"database.statement_timeout_ms": 10_000})
        times: dict[str, list[float]] = {}
        for _ in range(runs):
            started = time.perf_counter()
            report = run_checks(conn, config)
            times.setdefault("(all checks)", []).append((time.perf_counter() - started) * 1000)
            for r in report.results:
                times.setdefault(r.id, []).append(r.elapsed_ms)
        statuses = {r.id: r.status for r in report.results}
    return times, statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated table sizes (default 100000,1000000)")
    parser.add_argument("--runs", type=int, default=5, help="runs of all checks per size (default 5)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.rows.split(",") if x.strip()]
    cluster = PrivateCluster(settings={**RELAXED_DURABILITY, "shared_buffers": "256MB", "autovacuum": "off"})
    cluster.start()
    results = {}
    try:
        with connect(cluster.dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            migrate(conn)
        for rows in sizes:
            results[rows] = measure(cluster.dsn, rows, args.runs)
    finally:
        cluster.stop()
    ids = list(next(iter(results.values()))[0])
    header = f"{'check':22}" + "".join(f"  {f'{n:,} rows: median / max ms':>30}" for n in sizes)
    print()
    print(header)
    for check_id in ids:
        cells = "".join(
            f"  {statistics.median(results[n][0][check_id]):>20.1f} / {max(results[n][0][check_id]):>7.1f}" for n in sizes
        )
        print(f"{check_id:22}{cells}")
    print()
    print("statuses at the largest size:", ", ".join(f"{k}={v}" for k, v in results[sizes[-1]][1].items() if v != "ok") or "all ok")
    print("command: .venv/bin/python bench/advisor.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
