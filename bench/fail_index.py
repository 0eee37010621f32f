#!/usr/bin/env python
"""What jobs_failed_groups_idx (migration 021) costs the fail path: permanent failures per second
with and without it, interleaved rounds on the same database.

    .venv/bin/python bench/fail_index.py [--jobs 4000] [--dsn postgresql://.../postgres]

Creates (and drops) a database `failbench` on the server; default: a private cluster. Each
round enqueues --jobs jobs with max_attempts=1, claims them all, then times one q.fail per job.
"""
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

INDEX = ("CREATE INDEX jobs_failed_groups_idx ON skiplock.jobs (error_fingerprint, finished_at) "
         "INCLUDE (queue, kind) WHERE status = 'failed'")


def round_(dsn: str, n: int, with_index: bool) -> float:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs")
        conn.execute("DROP INDEX IF EXISTS skiplock.jobs_failed_groups_idx")
        if with_index:
            conn.execute(INDEX)
        q.enqueue_many(conn, [q.NewJob("doomed", {"i": i}, max_attempts=1) for i in range(n)])
        jobs = []
        while len(jobs) < n:
            jobs += q.claim(conn, "w", limit=500, lease=600)
        t0 = time.perf_counter()
        for i, job in enumerate(jobs):
            q.fail(conn, job, RuntimeError(f"boom {i % 7}"))
        return n / (time.perf_counter() - t0)


def run(server_dsn: str, n: int, rounds: int) -> None:
    base = server_dsn.rsplit("/", 1)[0]
    with connect(server_dsn) as c:
        c.execute("DROP DATABASE IF EXISTS failbench")
        c.execute("CREATE DATABASE failbench")
    dsn = base + "/failbench"
    with connect(dsn) as conn:
        migrate(conn)
    print(f"load average before {os.getloadavg()}", flush=True)
    res: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for w in (False, True):
            rate = round_(dsn, n, w)
            res[w].append(rate)
            print(f"round {r + 1} {'with' if w else 'without'} jobs_failed_groups_idx: {rate:,.0f} permanent failures/s", flush=True)
    for w in (False, True):
        print(f"{'with' if w else 'without'}: median {statistics.median(res[w]):,.0f}/s")
    print(f"load average after {os.getloadavg()}")
    with connect(server_dsn) as c:
        c.execute("DROP DATABASE failbench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="a server's maintenance database (postgresql://.../postgres)")
    args = parser.parse_args()
    print("command: bench/fail_index.py " + " ".join(sys.argv[1:]), flush=True)
    if args.dsn:
        run(args.dsn, args.jobs, args.rounds)
        return
    with PrivateCluster(settings=RELAXED_DURABILITY) as cluster:
        run(cluster.dsn, args.jobs, args.rounds)


if __name__ == "__main__":
    main()
