#!/usr/bin/env python
"""Batch handlers: no-op jobs/s against the batch size, beside the single-job handler, in one run.

One throwaway PostgreSQL (console.pgcluster.PrivateCluster, relaxed durability by default, the
settings of bench/throughput.py), one database. For each worker-process count (1 and 2 by
default) and each round, every contender drains pre-filled no-op jobs once, in an order rotated
from round to round (a machine whose load moves favours no contender):

- single:     `skiplock worker --tasks noop_tasks` (the plain `def noop(job)`);
- batch=N:    `skiplock worker --tasks noop_batch_tasks` with SKIPLOCK_BENCH_BATCH=N, the
              same no-op registered `@task("noop", batch=N)`: it gets lists of up to N jobs.

Every worker runs `--concurrency` handler threads and `--batch-size` (the worker's claim batch,
in slots: a handler batch takes one slot). jobs/s is the rise in completed rows (counted in the
database) from the end of the warm-up over `--window` seconds, or until the cell's jobs are all
done ("drained": then the rate covers the time it took, and a bigger --cell-jobs gives a
steadier figure); CPU per job is the worker processes' and the server's over the same span
(bench/throughput.py's CpuMeter).

The fill, the worker processes, the readiness wait and the CPU meter are bench/throughput.py's.

    .venv/bin/python bench/batch_throughput.py                   # workers 1,2; single + batch 1,10,100,1000; 3 rounds
    .venv/bin/python bench/batch_throughput.py --cell-jobs 2000 --runs 1 --warmup 0.2 --window 3   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import psycopg  # noqa: E402
import throughput as tp  # noqa: E402

from console.db import connect  # noqa: E402
from console.pgcluster import PrivateCluster  # noqa: E402


def contenders(batches: list[int]) -> list[str]:
    return ["single", *(f"batch={n}" for n in batches)]


def run_cell(contender: str, dsn: str, workers: int, args) -> dict:
    """Fill, start `workers` processes, wait until each has its registry row, let them run
    `warmup` seconds, then count completed rows until `window` seconds passed or all are done."""
    tp.settle(dsn)
    tp.reset_skiplock(dsn, args.cell_jobs)
    if contender == "single":
        tasks, env = "noop_tasks", {}
    else:
        tasks, env = "noop_batch_tasks", {"SKIPLOCK_BENCH_BATCH": contender.split("=", 1)[1]}
    load_before = os.getloadavg()[0]
    with connect(dsn) as conn:
        procs = tp.start_skiplock_workers(dsn, workers, args, env, tasks=tasks)
        try:
            tp.wait_ready(lambda: conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0], workers,
                          lambda: all(p.poll() is None for p in procs), contender)
            time.sleep(args.warmup)
            meter = tp.CpuMeter([p.pid for p in procs], args.data_dir)
            meter.start()
            t0, c0 = time.time(), tp.completed_skiplock(conn)
            t1, c1 = t0, c0
            while t1 - t0 < args.window and c1 < args.cell_jobs:
                time.sleep(0.05)
                t1, c1 = time.time(), tp.completed_skiplock(conn)
            cpu = meter.stop()
        finally:
            tp.stop_skiplock_workers(procs)
    load = (load_before, os.getloadavg()[0])
    if c0 >= args.cell_jobs:  # nothing left to measure: no figure rather than a false one
        return {"rate": None, "note": "drained in the warm-up: raise --cell-jobs", "load": load,
                "cpu_client": None, "cpu_server": None}
    done = c1 - c0
    return {"rate": done / max(t1 - t0, 1e-9), "note": "drained" if c1 >= args.cell_jobs else "", "load": load,
            "cpu_client": cpu[0] / done, "cpu_server": cpu[1] / done}


def us(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e6:,.1f}"


def measured(runs: list[dict], key: str) -> list[float]:
    return [c[key] for c in runs if c[key] is not None]


def run_grid(dsn: str, args) -> dict[tuple[str, int], list[dict]]:
    names = contenders(args.batches)
    results: dict[tuple[str, int], list[dict]] = {}
    for n in args.workers:
        for r in range(args.runs):
            shift = r % len(names)
            for contender in names[shift:] + names[:shift]:
                cell = run_cell(contender, dsn, n, args)
                results.setdefault((contender, n), []).append(cell)
                rate = "-" if cell["rate"] is None else f"{cell['rate']:,.0f}"
                print(f"  round {r + 1} {contender:12s} workers={n}  {rate:>9s} jobs/s"
                      f"  cpu/job client {us(cell['cpu_client'])} us server {us(cell['cpu_server'])} us"
                      f"  load {cell['load'][0]:.1f}->{cell['load'][1]:.1f} {cell['note']}", flush=True)
    return results


def print_tables(results: dict[tuple[str, int], list[dict]], args) -> None:
    names = contenders(args.batches)
    header = "| workers | " + " | ".join(names) + " | load avg |"
    print(f"\n### no-op jobs/s, median (min-max) of {args.runs} run(s); in brackets, the median against single\n")
    print(header)
    print("|---:|" + "---:|" * len(names) + "---:|")
    for n in args.workers:
        singles = measured(results[("single", n)], "rate")
        single = tp.median(singles) if singles else 0.0
        cells, loads = [], []
        for name in names:
            runs = results[(name, n)]
            loads += [x for c in runs for x in c["load"]]
            rates = measured(runs, "rate")
            if not rates:
                cells.append("- (drained in the warm-up)")
                continue
            m = tp.median(rates)
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
            against = f" [{m / single:.1f}x]" if name != "single" and single > 0 else ""
            drained = " drained" if any(c["note"] for c in runs) else ""
            cells.append(f"{m:,.0f}{spread}{against}{drained}")
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    print(f"\n### CPU per job in microseconds, worker processes + server = total, median of {args.runs} run(s)\n")
    print(header)
    print("|---:|" + "---:|" * len(names) + "---:|")
    for n in args.workers:
        cells, loads = [], []
        for name in names:
            runs = results[(name, n)]
            loads += [x for c in runs for x in c["load"]]
            clients, servers = measured(runs, "cpu_client"), measured(runs, "cpu_server")
            if not clients:
                cells.append("-")
                continue
            client, server = tp.median(clients) * 1e6, tp.median(servers) * 1e6
            cells.append(f"{client:,.1f} + {server:,.1f} = {client + server:,.1f}")
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker (process) counts")
    parser.add_argument("--batches", default="1,10,100,1000", help="the handler's batch sizes (beside the single-job handler)")
    parser.add_argument("--runs", type=int, default=3, help="rounds per worker count, each contender once per round, order rotated")
    parser.add_argument("--mode", default="relaxed", choices=sorted(tp.MODES), help="durability (bench/throughput.py)")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds per cell, at most")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before the count starts")
    parser.add_argument("--cell-jobs", type=int, default=500_000, help="pre-filled jobs per cell")
    parser.add_argument("--batch", type=int, default=10, help="the worker's --batch-size (claim batch, in slots)")
    parser.add_argument("--concurrency", type=int, default=10, help="handler threads per worker")
    args = parser.parse_args(argv)
    args.workers = [int(n) for n in args.workers.split(",") if n]
    args.batches = [int(n) for n in args.batches.split(",") if n]
    if args.runs < 1 or any(n < 1 for n in args.workers + args.batches):
        parser.error("--runs, --workers and --batches must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"# bench/batch_throughput.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, psycopg {psycopg.__version__}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")
    print(f"workers: --concurrency {args.concurrency} --batch-size {args.batch}; {args.cell_jobs:,} jobs per cell, "
          f"{args.warmup:g} s warm-up, {args.window:g} s window at most")
    with PrivateCluster(settings={**tp.COMMON_SETTINGS, **tp.MODES[args.mode]}) as cluster:
        args.data_dir = cluster.data_dir
        dsn = tp.prepare_database(cluster, pgqueuer=False)
        with connect(dsn) as conn:
            print(f"\nPostgreSQL {conn.info.server_version}, {args.mode}: {tp.describe(args.mode)}", flush=True)
        results = run_grid(dsn, args)
    print_tables(results, args)
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")


if __name__ == "__main__":
    main()
