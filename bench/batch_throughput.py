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

A cell that fails (a worker process exits, the readiness wait times out) or completes nothing in
its window counts 0 jobs/s with the reason (the job states, the workers' last words), beside it
and in a list under the tables; the run goes on, and the tables, headed by the command line,
are printed even when it is cut short.

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


def failed_cell(reason: str, load: tuple[float, float]) -> dict:
    """A cell that measured nothing: 0 jobs/s, and why (printed beside it and under the tables)."""
    return {"rate": 0.0, "note": f"FAILED: {reason}", "load": load, "cpu_client": None, "cpu_server": None}


def run_cell(contender: str, dsn: str, workers: int, args) -> dict:
    """One cell, never raising (but for Ctrl-C): a cell that fails or completes nothing
    reports 0 jobs/s with the reason, and the grid goes on."""
    load_before = os.getloadavg()[0]
    try:
        return measure_cell(contender, dsn, workers, args)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - a cell's failure is a figure (0, with its reason), not the end of the run
        first = (str(exc).strip().splitlines() or [""])[0]
        return failed_cell(f"{type(exc).__name__}: {first}"[:300], (load_before, os.getloadavg()[0]))


def job_states(conn) -> str:
    rows = conn.execute("SELECT status, count(*) FROM skiplock.jobs GROUP BY status ORDER BY status").fetchall()
    return ", ".join(f"{status} {n:,}" for status, n in rows) or "no jobs"


def measure_cell(contender: str, dsn: str, workers: int, args) -> dict:
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
            states = job_states(conn)
        except Exception as exc:  # with why the worker processes exited, when they did
            exits = tp.stop_skiplock_workers(procs)
            procs = []
            raise RuntimeError("; ".join([str(exc).strip(), *exits])) from exc
        finally:
            exits = tp.stop_skiplock_workers(procs) if procs else []
    load = (load_before, os.getloadavg()[0])
    if c0 >= args.cell_jobs:  # nothing left to measure: no figure rather than a false one
        return {"rate": None, "note": "drained in the warm-up: raise --cell-jobs", "load": load,
                "cpu_client": None, "cpu_server": None}
    done = c1 - c0
    if done <= 0:
        return failed_cell(f"completed nothing in {t1 - t0:.1f} s ({states}"
                           + "".join(f"; {line}" for line in exits) + ")", load)
    return {"rate": done / max(t1 - t0, 1e-9), "note": "drained" if c1 >= args.cell_jobs else "", "load": load,
            "cpu_client": cpu[0] / done, "cpu_server": cpu[1] / done}


def us(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e6:,.1f}"


def measured(runs: list[dict], key: str) -> list[float]:
    return [c[key] for c in runs if c[key] is not None]


def run_grid(dsn: str, args, results: dict[tuple[str, int], list[dict]]) -> None:
    """Fill `results` cell by cell (the caller keeps what was measured if the run is cut short)."""
    names = contenders(args.batches)
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


def print_tables(results: dict[tuple[str, int], list[dict]], args) -> None:
    names = contenders(args.batches)
    header = "| workers | " + " | ".join(names) + " | load avg |"
    print(f"\ncommand: {args.command}")
    print(f"\n### no-op jobs/s, median (min-max) of {args.runs} run(s); in brackets, the median against single\n")
    print(header)
    print("|---:|" + "---:|" * len(names) + "---:|")
    for n in args.workers:
        if not any((name, n) in results for name in names):
            continue  # the run was cut short before this worker count
        singles = measured(results.get(("single", n), []), "rate")
        single = tp.median(singles) if singles else 0.0
        cells, loads = [], []
        for name in names:
            runs = results.get((name, n), [])
            loads += [x for c in runs for x in c["load"]]
            rates = measured(runs, "rate")
            if not rates:
                cells.append("- (drained in the warm-up)" if runs else "- (not run)")
                continue
            m = tp.median(rates)
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
            against = f" [{m / single:.1f}x]" if name != "single" and single > 0 else ""
            drained = " drained" if any(c["note"] == "drained" for c in runs) else ""
            failed = sum(c["note"].startswith("FAILED") for c in runs)
            cells.append(f"{m:,.0f}{spread}{against}{drained}" + (f" ({failed} failed)" if failed else ""))
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    print(f"\n### CPU per job in microseconds, worker processes + server = total, median of {args.runs} run(s)\n")
    print(header)
    print("|---:|" + "---:|" * len(names) + "---:|")
    for n in args.workers:
        if not any((name, n) in results for name in names):
            continue
        cells, loads = [], []
        for name in names:
            runs = results.get((name, n), [])
            loads += [x for c in runs for x in c["load"]]
            clients, servers = measured(runs, "cpu_client"), measured(runs, "cpu_server")
            if not clients:
                cells.append("-")
                continue
            client, server = tp.median(clients) * 1e6, tp.median(servers) * 1e6
            cells.append(f"{client:,.1f} + {server:,.1f} = {client + server:,.1f}")
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    failures = [(name, n, c["note"]) for (name, n), runs in results.items() for c in runs if c["note"].startswith("FAILED")]
    if failures:
        print("\n### cells that measured nothing (counted as 0 jobs/s above)\n")
        for name, n, note in failures:
            print(f"- {name}, workers={n}: {note}")


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
    args.command = "bench/batch_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"# {args.command}")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, psycopg {psycopg.__version__}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")
    print(f"workers: --concurrency {args.concurrency} --batch-size {args.batch}; {args.cell_jobs:,} jobs per cell, "
          f"{args.warmup:g} s warm-up, {args.window:g} s window at most")
    with PrivateCluster(settings={**tp.COMMON_SETTINGS, **tp.MODES[args.mode]}) as cluster:
        args.data_dir = cluster.data_dir
        dsn = tp.prepare_database(cluster, pgqueuer=False)
        with connect(dsn) as conn:
            print(f"\nPostgreSQL {conn.info.server_version}, {args.mode}: {tp.describe(args.mode)}", flush=True)
        results: dict[tuple[str, int], list[dict]] = {}
        try:
            run_grid(dsn, args, results)
        finally:  # cut short (Ctrl-C, SIGTERM, a fill that failed): still the tables of what was measured
            print_tables(results, args)
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")


if __name__ == "__main__":
    main()
