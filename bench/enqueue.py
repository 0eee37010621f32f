#!/usr/bin/env python
"""enqueue_many rate: the multi-row INSERT path against the COPY path, side by side in one run.

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster, relaxed durability), then
for each round enqueues `--jobs` no-op jobs (no idempotency keys) in one transaction with
each implementation (`_enqueue_insert`: INSERT ... SELECT FROM unnest; `enqueue_many`: COPY
for a key-less batch of COPY_THRESHOLD or more), commits, and prints jobs/s. The table is
truncated between rounds, so every round starts from the same state.

    .venv/bin/python bench/enqueue.py                       # 100,000 jobs, 3 rounds
    .venv/bin/python bench/enqueue.py --jobs 20000 --rounds 1
    .venv/bin/python bench/enqueue.py --dsn postgresql://... # an existing database (TRUNCATEs its jobs!)

Target (issue 13): enqueue_many of 100 k jobs at 50 k jobs/s or more. The machine may be
shared: the load average is printed beside the figures; say so next to them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.queue import handles, producer  # noqa: E402


def one(dsn: str, fn, n: int) -> float:
    jobs = [q.NewJob("noop", {"i": i}, queue=("default", "mail", "billing")[i % 3]) for i in range(n)]
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs")
        conn.execute("CHECKPOINT")
    with connect(dsn, autocommit=False) as conn:
        t0 = time.perf_counter()
        ids = fn(conn, jobs)
        conn.commit()
        elapsed = time.perf_counter() - t0
    assert len(ids) == n
    return n / elapsed


def run(dsn: str, n: int, rounds: int) -> None:
    with connect(dsn) as conn:
        migrate(conn)
        print(f"PostgreSQL {conn.info.server_version}; {os.cpu_count()} CPUs; load average {os.getloadavg()}", flush=True)
    paths = [("INSERT ... unnest (keyed/small path)", lambda c, j: handles.run(handles.sync_adapter(c), producer._insert_steps(list(j)))),
             ("COPY (enqueue_many, key-less)", q.enqueue_many)]
    rates: dict[str, list[float]] = {name: [] for name, _ in paths}
    for r in range(rounds):
        for name, fn in paths:  # interleaved, so load changes hit both alike
            rate = one(dsn, fn, n)
            rates[name].append(rate)
            print(f"round {r + 1}: {name:38} {rate:10,.0f} jobs/s", flush=True)
    print()
    for name, got in rates.items():
        print(f"{name:38} median {statistics.median(got):10,.0f} jobs/s over {rounds} round(s)")
    print(f"load average after: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="an existing database (its skiplock.jobs is TRUNCATEd); default: a private cluster")
    args = parser.parse_args()
    print("command: bench/enqueue.py " + " ".join(sys.argv[1:]), flush=True)
    if args.dsn:
        run(args.dsn, args.jobs, args.rounds)
        return
    with PrivateCluster(settings=RELAXED_DURABILITY) as cluster:
        with connect(cluster.dsn) as conn:
            conn.execute("CREATE DATABASE bench")
        run(cluster.dsn_for("bench"), args.jobs, args.rounds)


if __name__ == "__main__":
    main()
