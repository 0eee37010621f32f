#!/usr/bin/env python
"""What one argon2id password check costs on this machine, and sixty of them on two cores.

The sign-in's hashing cost is a measured choice (docs/security.md, "Password hashing cost"):
this prints, for the parameters given (default: the product's, console.users.HASH_*), the median
and minimum of 20 verifications one after another, how much they raised the process's peak RSS,
and the wall time of 60 verifications on `--threads` threads (argon2-cffi releases the GIL: 2 threads use 2 cores).

    .venv/bin/python bench/argon2_cost.py                 # the product's parameters
    .venv/bin/python bench/argon2_cost.py 65536 3 4       # argon2-cffi's defaults (RFC 9106, 2nd option)

Run each set in its own process (peak RSS is per process). Prints the load average beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argon2 import PasswordHasher  # noqa: E402

from console import users  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("memory_kib", type=int, nargs="?", default=users.HASH_MEMORY_KIB)
    parser.add_argument("time_cost", type=int, nargs="?", default=users.HASH_TIME_COST)
    parser.add_argument("parallelism", type=int, nargs="?", default=users.HASH_PARALLELISM)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--crowd", type=int, default=60)
    args = parser.parse_args()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    hasher = PasswordHasher(time_cost=args.time_cost, memory_cost=args.memory_kib, parallelism=args.parallelism)
    password = "correct horse battery staple"
    stored = hasher.hash(password)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        hasher.verify(stored, password)
        times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lambda _: hasher.verify(stored, password), range(args.crowd)))
    wall = time.perf_counter() - started
    print(f"m={args.memory_kib},t={args.time_cost},p={args.parallelism}: verification median "
          f"{statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f} ms); peak RSS +{peak - before:.0f} MiB; "
          f"{args.crowd} verifications on {args.threads} threads {wall:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
