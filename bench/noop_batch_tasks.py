"""The no-op as a batch handler for bench/batch_throughput.py: `@task("noop", batch=N)` with N from
SKIPLOCK_BENCH_BATCH (the bench sets it per cell; the single-job no-op is bench/noop_tasks.py)."""

import os

import console

SIZE = int(os.environ["SKIPLOCK_BENCH_BATCH"])


@console.task("noop", batch=SIZE)
def noop(jobs):
    return None
