#!/usr/bin/env python
"""Claim throughput of a fair queue beside the same queue unlimited and only concurrency-limited
(issue 31, "Fair queues"), on one throwaway PostgreSQL.

Each queue gets `--backlog` eligible jobs; the fair one spreads them over `--groups` groups
(group i gets a share that shrinks with i, so one group is big and most are small, plus 1% in
the NULL group). Then, for each mode in turn (alternating, `--rounds` rounds of `--seconds`),
one connection claims `--batch` jobs and completes them at once, in a loop, and the loop's
jobs/s and the claim statement's mean time are printed:

- unlimited       : sql/queue.sql `claim` with --queues (the workers' fast claim), as this
                    branch has it (`... OR q.fair` in the queues subplan);
- unlimited (old) : the same statement without `OR q.fair` (main's text), on the same queue
                    (alternating with the one above), to show the fast claim's cost is unchanged;
- concurrency     : the limited path (sql/limits.sql `claim_queue`) of a queue with
                    concurrency 1,000 (never reached: the cost of the path itself);
- fair            : the limited path of a queue with group_concurrency `--per-group`;
- fair (weighted) : with `--weighted N`, the same queue with its first N groups (tenant-0..)
                    of weight 3 (skiplock.group_weights, migration 028), alternating with
                    `fair` on the same jobs (the weights are inserted before, and deleted after,
                    each of its rounds); the fair queue then gets twice the backlog.

The limited path's indexes are built first (as the scheduler does while something is limited
or fair). Times depend on the machine's load: the load average is printed before and after.

    .venv/bin/python bench/fair_claim.py
    .venv/bin/python bench/fair_claim.py --groups 1000 --backlog 200000
    .venv/bin/python bench/fair_claim.py --weighted 10
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.queue import limits  # noqa: E402
from console.sqlfiles import query  # noqa: E402

CLAIM = query("queue", "claim")
OLD_CLAIM = CLAIM.replace("q.paused OR q.limited OR q.fair", "q.paused OR q.limited")
assert OLD_CLAIM != CLAIM


def fill(conn, queue: str, n: int, groups: int) -> None:
    if groups:
        # Group g (0-based) gets weight 1/(g+1): group 0 is the big tenant; 1% of jobs have no group.
        conn.execute("""
            INSERT INTO skiplock.jobs (queue, kind, group_key, run_at)
            SELECT %(queue)s, 'noop',
                   CASE WHEN g %% 100 = 0 THEN NULL
                        ELSE 'tenant-' || floor(%(groups)s * power(random(), 3))::int END,
                   now() - interval '2 hours' + g * interval '1 microsecond'
            FROM generate_series(1, %(n)s) AS g""", {"queue": queue, "n": n, "groups": groups})
    else:
        conn.execute("INSERT INTO skiplock.jobs (queue, kind, run_at) SELECT %s, 'noop', "
                     "now() - interval '2 hours' + g * interval '1 microsecond' FROM generate_series(1, %s) AS g",
                     (queue, n))


def run(conn, mode: str, seconds: float, batch: int) -> tuple[float, float, int]:
    """(jobs/s of claim+complete, mean claim ms, claims) over `seconds`."""
    done = claims = 0
    claim_time = 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        if mode.startswith("fair"):
            jobs = limits.claim_from_queue(conn, "fair", "bench", limit=batch)
        elif mode == "concurrency":
            jobs = limits.claim_from_queue(conn, "conc", "bench", limit=batch)
        else:
            text = CLAIM if mode == "unlimited" else OLD_CLAIM
            with conn.cursor() as cur:
                rows = cur.execute(text, {"queues": ["free"], "limit": batch, "worker": "bench", "lease": 60.0}).fetchall()
                names = [d.name for d in cur.description]
            jobs = [q.Job.from_row(dict(zip(names, r, strict=True))) for r in rows]
        claim_time += time.perf_counter() - t
        claims += 1
        if not jobs:
            break
        q.complete_many(conn, jobs)
        done += len(jobs)
    elapsed = time.perf_counter() - start
    return done / elapsed, claim_time / max(claims, 1) * 1000, claims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--per-group", type=int, default=2,
                        help="group_concurrency of the fair queue (the loop completes what it claims before "
                             "claiming again, so nothing runs between claims: the limit shapes the statement's "
                             "work, not the loop)")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--weighted", type=int, default=0, metavar="N",
                        help="also measure the fair queue with its first N groups of weight 3")
    args = parser.parse_args()
    print("$ " + " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/fair_claim.py", *sys.argv[1:]]))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cpus)")
    modes: tuple[str, ...] = ("unlimited", "unlimited (old)", "concurrency", "fair")
    if args.weighted:
        modes += ("fair (weighted)",)
    results: dict[str, list[tuple[float, float, int]]] = {m: [] for m in modes}
    with PrivateCluster(settings={**RELAXED_DURABILITY, "shared_buffers": "512MB"}, exit_guard=True) as cluster:
        with connect(cluster.dsn) as conn:
            migrate(conn)
            limits.set_limits(conn, "conc", concurrency=1_000_000, actor="bench")
            limits.set_limits(conn, "fair", group_concurrency=args.per_group, actor="bench")
            limits.keep_claim_indexes(conn)
            for name, groups in (("free", 0), ("conc", 0), ("fair", args.groups)):
                # free serves both unlimited modes: four times the backlog, so neither drains it.
                fill(conn, name, args.backlog * (4 if name == "free" else 2 if name == "fair" and args.weighted else 1),
                     groups)
            conn.execute("VACUUM (ANALYZE) skiplock.jobs")
            print(f"backlog: {args.backlog:,} eligible jobs in each of conc, fair{' (twice that)' if args.weighted else ''} "
                  f"and four times that in free (fair: {args.groups} groups "
                  f"+ the NULL group, group_concurrency {args.per_group:,}); claim {args.batch} + complete, "
                  f"{args.rounds} rounds x {args.seconds:g} s per mode, alternating")
            for _ in range(args.rounds):
                for mode in modes:
                    if mode == "fair (weighted)":
                        conn.execute("INSERT INTO skiplock.group_weights (queue, group_key, weight) "
                                     "SELECT 'fair', 'tenant-' || g, 3 FROM generate_series(0, %s - 1) AS g",
                                     (args.weighted,))
                    results[mode].append(run(conn, mode, args.seconds, args.batch))
                    conn.execute("DELETE FROM skiplock.group_weights")
    print(f"{'mode':<16} {'jobs/s (median)':>16} {'claim ms (median)':>18}  rounds (jobs/s)")
    for mode in modes:
        rates = sorted(r[0] for r in results[mode])
        ms = sorted(r[1] for r in results[mode])
        print(f"{mode:<16} {rates[len(rates) // 2]:>16,.0f} {ms[len(ms) // 2]:>18.2f}  "
              + ", ".join(f"{r[0]:,.0f}" for r in results[mode]))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
