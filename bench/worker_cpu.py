#!/usr/bin/env python
"""CPU per no-op job of each thread of one in-process Skiplock worker (main loop, handlers, ...).

A private PostgreSQL (relaxed durability), `--jobs` no-op jobs, one Worker (concurrency 10,
batch 10) run in this process until they are done; prints each thread's CPU time
(time.thread_time) divided by the jobs. `--tree` runs the worker of another checkout (e.g. the
commit before a change) for a before/after on the same machine.

    .venv/bin/python bench/worker_cpu.py --jobs 30000 [--tree PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--tree", type=Path, default=BENCH.parent, help="the Skiplock checkout whose worker runs")
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree), str(BENCH)]

    # console first, from --tree: bench/throughput.py puts this checkout first on the path
    from console.queue.worker import Worker  # noqa: I001
    from console.db import connect
    from console.pgcluster import PrivateCluster
    import noop_tasks  # noqa: F401  (registers the no-op handler)
    import throughput as tp

    spent: dict[str, float] = {}
    run = threading.Thread.run

    def timed_run(self):
        try:
            run(self)
        finally:
            spent[self.name] = spent.get(self.name, 0.0) + time.thread_time()

    threading.Thread.run = timed_run
    print(f"worker from {Path(sys.modules[Worker.__module__].__file__).parent.parent}; load average {os.getloadavg()}")
    with PrivateCluster(settings={**tp.COMMON_SETTINGS, **tp.RELAXED_DURABILITY}) as cluster:
        dsn = tp.prepare_database(cluster, pgqueuer=False)
        tp.reset_skiplock(dsn, args.jobs)
        worker = Worker(dsn, concurrency=args.concurrency, batch_size=args.batch, poll_interval=0.2, flush_interval=1)

        def stop_when_drained() -> None:
            with connect(dsn) as conn:
                while tp.completed_skiplock(conn) < args.jobs:
                    time.sleep(0.1)
            worker.stop(immediately=True)

        threading.Thread(target=stop_when_drained, name="bench-stopper").start()
        started, cpu = time.time(), time.thread_time()
        worker.run()
        spent["main loop"] = time.thread_time() - cpu
        wall = time.time() - started
        time.sleep(1.5)  # the other threads end and record their time
    print(f"{args.jobs:,} jobs in {wall:.1f} s ({args.jobs / wall:,.0f} jobs/s); load average {os.getloadavg()}")
    handlers = sum(v for k, v in spent.items() if k.startswith("handler-"))
    rows = {"main loop": spent.get("main loop", 0.0), "handler threads (all)": handlers}
    rows.update({k: v for k, v in spent.items() if not k.startswith("handler-") and k not in ("main loop", "bench-stopper")})
    for name, seconds in rows.items():
        print(f"  {name:24s} {seconds * 1e6 / args.jobs:7.1f} us/job")
    print(f"  {'worker total':24s} {sum(rows.values()) * 1e6 / args.jobs:7.1f} us/job")


if __name__ == "__main__":
    main()
