#!/usr/bin/env python
"""CPU per no-op job, A/B: the bare loop and in-process Workers of other checkouts, alternated.

One private PostgreSQL (relaxed durability, as bench/throughput.py); each round refills
`jobs` no-op jobs per contender, in an order rotated every round, and drains them in a fresh
child process: the bare loop (bench/throughput.py's, Skiplock's complete-and-claim statement,
batch 10, prepared) or a Worker (concurrency 10, batch 10) of the checkout named, stopped once
its own counter says every job completed (no polling query). Per contender and round it prints
the child's CPU (process time over the drain, user / system, context switches) and the
server's (the postmaster with its reaped children plus the live ones, so the drained
connection's backend counts after it exits), per job, with the claim statement's
pg_stat_statements mean. For decisions on a shared machine: pair the rounds, not the totals.

    .venv/bin/python bench/worker_ab.py 20000 4 bare=. before=PATH after=.
    .venv/bin/python bench/worker_ab.py 20000 3 after=. inline=.:inline   # noop_inline_tasks
    .venv/bin/python bench/worker_ab.py 20000 3 before=PATH after=. logs-before=PATH:logging logs-after=.:logging

A name starting with `bare` runs the bare loop (its tree is ignored); `:inline` after a tree
registers the no-op inline; `:logging` a no-op that logs one INFO record per job
(bench/noop_logging_tasks.py: the cost of per-attempt logs, docs/queue.md); `:batchN` the no-op
registered `batch=N` (bench/noop_batch_tasks.py). PROF=/tmp/p writes a cProfile (thread CPU time) of each Worker's
main thread to /tmp/p.<name>.<round>.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import throughput as tp  # noqa: E402

from console.db import connect  # noqa: E402
from console.pgcluster import PrivateCluster  # noqa: E402

CHILD = r'''
import json, os, resource, sys, threading, time
tree, bench, dsn, jobs, mode, prof = sys.argv[1:7]
jobs = int(jobs)
sys.path[:0] = [tree, bench]
import psycopg
r0 = resource.getrusage(resource.RUSAGE_SELF)
if mode == "bare":
    import throughput as tp
    params = {"worker": "loop", "ids": [], "attempts": [], "queues": None, "limit": 10, "lease": 300.0}
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        t0, c0, n, id_at = time.time(), time.process_time(), 0, None
        while n < jobs:  # as throughput.loop_worker, without its clock and histogram
            rows = cur.execute(tp.CLAIM_SQL, params, prepare=True).fetchall()
            if id_at is None:
                names = [c.name for c in cur.description]
                id_at, at = names.index("id"), names.index("attempts")
            claimed = [r for r in rows if r[id_at] is not None]
            params["ids"] = [r[id_at] for r in claimed]
            params["attempts"] = [r[at] for r in claimed]
            n += len(claimed)
        cur.execute(tp.CLAIM_SQL, {**params, "limit": 0})
        cpu, wall = time.process_time() - c0, time.time() - t0
else:
    from console.queue.worker import Worker
    if mode.startswith("batch"):  # `:batchN`: the no-op as a batch handler of N (bench/noop_batch_tasks.py)
        os.environ["SKIPLOCK_BENCH_BATCH"] = mode[len("batch"):]
    __import__({"inline": "noop_inline_tasks", "logging": "noop_logging_tasks"}.get(
        mode, "noop_batch_tasks" if mode.startswith("batch") else "noop_tasks"))
    worker = Worker(dsn, concurrency=10, batch_size=10, poll_interval=0.2, flush_interval=1)

    def stopper():
        while worker.counters.completed < jobs:
            time.sleep(0.05)
        worker.stop(immediately=True)

    threading.Thread(target=stopper, daemon=True).start()
    t0, c0 = time.time(), time.process_time()
    if prof:
        import cProfile
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
    worker.run()
    if prof:
        profile.disable()
        profile.dump_stats(prof)
    cpu, wall = time.process_time() - c0, time.time() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": cpu, "wall": wall, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
                  "vcs": r1.ru_nvcsw - r0.ru_nvcsw, "ivcs": r1.ru_nivcsw - r0.ru_nivcsw}))
'''


def server_total(data_dir: Path) -> float:
    """All server CPU so far: the postmaster with its reaped children (cutime/cstime) and the
    live children (a backend that exits mid-run lands in the postmaster's cutime)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for i, pid in enumerate(tp.server_pids(data_dir)):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if i == 0 else 0)
    return total / tick


def main() -> None:
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    jobs, rounds = int(sys.argv[1]), int(sys.argv[2])
    contenders = [arg.split("=", 1) for arg in sys.argv[3:]]
    prof = os.environ.get("PROF", "")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in contenders}
    print(f"load average {os.getloadavg()}")
    with PrivateCluster(settings={**tp.COMMON_SETTINGS, **tp.RELAXED_DURABILITY}) as cluster:
        dsn = tp.prepare_database(cluster, pgqueuer=False)
        with connect(dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for r in range(rounds):
            shift = r % len(contenders)
            for name, spec in contenders[shift:] + contenders[:shift]:
                tree, _, mode = spec.partition(":")
                mode = "bare" if name.startswith("bare") else (mode or "pool")
                tp.reset_skiplock(dsn, jobs)
                with connect(dsn) as conn:
                    conn.execute("SELECT pg_stat_statements_reset()")
                load = os.getloadavg()[0]
                s0 = server_total(cluster.data_dir)
                out = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()), str(BENCH), dsn, str(jobs), mode,
                                      f"{prof}.{name}.{r}" if prof and mode != "bare" else ""],
                                     capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
                if out.returncode:
                    raise SystemExit(f"{name}: {out.stderr}")
                d = json.loads(out.stdout.strip().splitlines()[-1])
                server = server_total(cluster.data_dir) - s0
                with connect(dsn) as conn:
                    calls, mean = conn.execute(
                        "SELECT calls, mean_exec_time FROM pg_stat_statements WHERE query LIKE '%%finished AS%%' "
                        "ORDER BY calls DESC LIMIT 1").fetchone() or (0, 0.0)
                client, server = d["cpu"] * 1e6 / jobs, server * 1e6 / jobs
                results[name].append((client, server))
                print(f"r{r} {name:10s} client {client:6.1f} (user {d['user'] * 1e6 / jobs:5.1f} sys {d['sys'] * 1e6 / jobs:4.1f}) "
                      f"server {server:6.1f} us/job; {jobs / d['wall']:6.0f} jobs/s; switches/job {d['vcs'] / jobs:.2f} "
                      f"voluntary {d['ivcs'] / jobs:.2f} forced; claim {calls} calls, mean {mean:.3f} ms; load {load:.1f}", flush=True)
    for name, runs in results.items():
        clients, servers = [c for c, _ in runs], [s for _, s in runs]
        print(f"{name:10s} median client {statistics.median(clients):6.1f} (min {min(clients):.1f} max {max(clients):.1f}), "
              f"server {statistics.median(servers):6.1f}, total {statistics.median([c + s for c, s in runs]):6.1f} us/job")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
