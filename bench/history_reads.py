#!/usr/bin/env python
"""What the pages' reads of the samples' history cost at width, before and after, side by side.

Issue 31, item 1: with thousands of queues the pages must not read the samples' history per
request. Two reads did:
- "every queue seen in 24 h and since when it is idle" (samples.queue_activity: the overview,
  the Queues page, search) scanned a day of queue_depth and queue_throughput samples; since
  migration 029 it reads samples_latest (one row per series, with its busy_at);
- an overview chart split by queue fetched every queue's series over the window, then threw
  them away past six lines and read the total again; it now counts the lines in samples_latest
  first, and (migration 032) reads the total from skiplock.samples_totals, one row a cycle,
  where summing the samples read every queue's.

Starts a throwaway PostgreSQL, stores `--cycles` collection cycles of `--queues` queues (five
series each: four queue_depth states and queue_throughput, as the collectors write them, one
statement a cycle so the triggers run as in production, samples_totals' included), then times
each read `--repeat` times: the earlier statements (kept here as baselines) and today's, in the
same run.

    .venv/bin/python bench/history_reads.py                       # 5,000 queues, 240 cycles (1 h at 15 s)
    .venv/bin/python bench/history_reads.py --queues 1000 --cycles 60

Timings on a shared machine say little: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402

# sql/samples.sql's queue_activity before migration 029: a scan of the window's samples.
ACTIVITY_BEFORE = """
SELECT s.labels ->> 'queue' AS queue, max(s.collected_at) AS last_seen,
       max(s.collected_at) FILTER (WHERE s.value > 0 AND (s.metric = 'queue_throughput'
           OR s.labels ->> 'state' IN ('eligible', 'scheduled', 'running'))) AS last_busy
FROM skiplock.samples AS s
WHERE s.metric IN ('queue_depth', 'queue_throughput')
  AND s.collected_at >= now() - make_interval(secs => %(within)s)
  AND s.labels ? 'queue' AND NOT s.labels ? 'external'
GROUP BY s.labels ->> 'queue' ORDER BY queue LIMIT %(cap)s"""

# One collection cycle of the fleet: every queue busy now and then (a third of them have work).
CYCLE = """
INSERT INTO skiplock.samples (collected_at, metric, labels, value)
SELECT now() - make_interval(secs => %(ago)s), m.metric,
       CASE WHEN m.state IS NULL THEN jsonb_build_object('queue', 'fleet-' || lpad(q::text, 5, '0'))
            ELSE jsonb_build_object('queue', 'fleet-' || lpad(q::text, 5, '0'), 'state', m.state) END,
       CASE WHEN (q + %(cycle)s) %% 3 = 0 THEN (q %% 17)::float8 ELSE 0 END
FROM generate_series(1, %(queues)s) AS q
CROSS JOIN (VALUES ('queue_depth', 'eligible'), ('queue_depth', 'scheduled'), ('queue_depth', 'running'),
                   ('queue_depth', 'failed'), ('queue_throughput', NULL)) AS m(metric, state)"""


def timed(repeat: int, call) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times), result


def run(dsn: str, queues: int, cycles: int, interval: float, repeat: int) -> None:
    from console import samples
    from console.web import overview

    with connect(dsn) as conn:
        migrate(conn)
        t0 = time.perf_counter()
        for cycle in range(cycles):
            conn.execute(CYCLE, {"ago": (cycles - cycle) * interval, "cycle": cycle, "queues": queues})
        rows = conn.execute("SELECT count(*) FROM skiplock.samples").fetchone()[0]
        conn.execute("VACUUM ANALYZE skiplock.samples")
        conn.execute("VACUUM ANALYZE skiplock.samples_latest")
        conn.execute("VACUUM ANALYZE skiplock.samples_totals")
        print(f"stored {cycles} cycles of {queues:,} queues: {rows:,} samples in {time.perf_counter() - t0:.1f} s "
              f"({(time.perf_counter() - t0) / cycles * 1000:.0f} ms a cycle, triggers included)", flush=True)
        window = timedelta(hours=24).total_seconds()
        depth = next(f for f in overview.FIGURES if f.key == "depth")
        hour = timedelta(hours=1)

        def chart_before():
            lines = overview.chart_lines(conn, depth.metric, hour, where=dict(depth.where), split_by="queue")
            return overview._sample_lines(conn, depth.metric, hour, where=dict(depth.where)) if len(lines) > 6 else lines

        def chart_summed():  # before 032: count the lines, then sum every queue's samples
            where = dict(depth.where)
            overview.split_keys(conn, depth.metric, hour, "queue", where=where)
            return overview._sample_lines(conn, depth.metric, hour, where=where)

        totals = conn.execute("SELECT count(*) FROM skiplock.samples_totals").fetchone()[0]
        # The values only: each read starts its window (the buckets' origin) at its own "now".
        same = [v for ln in chart_summed() for _, v in ln.points] == \
               [v for ln in overview._series(conn, depth, hour) for _, v in ln.points]
        print(f"samples_totals: {totals:,} rows; the chart from the totals draws the same values as the sum: {same}",
              flush=True)
        reads = [
            ("queue activity, 24 h (before 029)", lambda: conn.execute(ACTIVITY_BEFORE, {"within": window, "cap": 1000}).fetchall()),
            ("queue activity, 24 h (samples_latest)", lambda: samples.queue_activity(conn)),
            ("depth chart, 1 h (split, then total)", chart_before),
            ("depth chart, 1 h (count, then sum samples)", chart_summed),
            ("depth chart, 1 h (count, then totals: 032)", lambda: overview._series(conn, depth, hour)),
        ]
        print(f"\n{'read':44} {'median':>10} {'max':>10}  result")
        for name, call in reads:
            median, worst, result = timed(repeat, call)
            print(f"{name:44} {median:8.1f} ms {worst:8.1f} ms  {len(result)} rows/lines", flush=True)
    print(f"\ncommand: bench/history_reads.py {' '.join(sys.argv[1:])}; load average "
          f"{tuple(round(x, 2) for x in os.getloadavg())}; {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=5000)
    parser.add_argument("--cycles", type=int, default=240)
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between the stored cycles")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with PrivateCluster(settings={**RELAXED_DURABILITY}) as cluster:
        with connect(cluster.dsn) as conn:
            conn.execute("CREATE DATABASE bench")
        run(cluster.dsn_for("bench"), args.queues, args.cycles, args.interval, args.repeat)


if __name__ == "__main__":
    main()
