#!/usr/bin/env python
"""What one collection cycle costs at width, and where it goes (issue 31, target 1: "one
collection cycle < 1 s" at 5,000 queues).

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster), seeds bench/size_attack.py's
fleet with SQL (tests/fleet_data.py: 5,000 queues, 2,000 kinds, 1,001 error groups), then runs
`--cycles` cycles of `collect_once` as the scheduler does and prints each cycle's time: the
collectors' part (what `collection_duration_seconds` records), the store (the samples, the
triggers keeping samples_latest and samples_totals, the collectors' state and the run's row)
and the slowest collectors. Then it stores one cycle's samples again (`samples.store`, rolled
back) with each of the samples' insert triggers switched off in turn, so the triggers' share
of the store is measured, not guessed. `--profile` adds a cProfile of one more cycle (top
functions by their own time and by cumulative time).

    .venv/bin/python bench/collection_cycle.py                  # 5,000 queues, 5 cycles
    .venv/bin/python bench/collection_cycle.py --profile        # and where one cycle's time goes
    .venv/bin/python bench/collection_cycle.py --queues 1000

Timings on a shared machine say little: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the backend `pid` has used: /proc, so the server must run on
    this machine (the private cluster does). Unlike the wall time, it hardly moves with the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def store_parts(dsn: str, repeat: int = 3) -> None:
    """One cycle's samples stored again (rolled back), with the samples' insert triggers on,
    then each off in turn, then all off: the median of `repeat` of each."""
    from psycopg import sql

    from console import samples
    from console.collectors import collect, collector_connection

    with collector_connection(dsn) as conn:
        report = collect(conn, store=False)
        conn.execute("SET statement_timeout = 0")
        triggers = [r[0] for r in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'skiplock.samples'::regclass "
            "AND NOT tgisinternal AND (tgtype & 4) <> 0 ORDER BY tgname")]  # the INSERT triggers
        print(f"\nstoring one cycle again ({len(report.samples):,} samples, rolled back), median of {repeat}:")
        pid = conn.info.backend_pid
        for off in [[], *[[t] for t in triggers], triggers]:
            times, cpu = [], []
            for _ in range(repeat):
                with conn.transaction(force_rollback=True):
                    for name in off:
                        conn.execute(sql.SQL("ALTER TABLE skiplock.samples DISABLE TRIGGER {}").format(sql.Identifier(name)))
                    t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu(pid)
                    samples.store(conn, report.samples, at=report.started_at)
                    times.append(time.perf_counter() - t0)
                    cpu.append((time.process_time() - c0, server_cpu(pid) - s0))
            label = "every trigger on" if not off else ("every trigger off" if off == triggers and len(off) > 1
                                                       else f"without {off[0]}")
            client = statistics.median(c for c, _ in cpu) * 1000
            server = statistics.median(s for _, s in cpu) * 1000
            print(f"  {label:36} {statistics.median(times) * 1000:7.0f} ms  CPU client {client:5.0f} ms, "
                  f"server {server:5.0f} ms  load {load()}", flush=True)


def run(dsn: str, queues: int, kinds: int, groups: int, cycles: int, profile: bool) -> None:
    from console.collectors import collect, collect_once, collector_connection
    from tests.fleet_data import seed_fleet

    with connect(dsn) as conn:
        migrate(conn)
        t0 = time.perf_counter()
        counts = seed_fleet(conn, queues=queues, kinds=kinds, groups=groups)
        print(f"seeded {counts} in {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\n{'cycle':>5} {'samples':>8} {'total':>8} {'collect':>8} {'store':>8} {'CPU client':>10} {'server':>7}"
          "  slowest collectors (ms)  load 1/5/15 min")
    totals, cpus = [], []
    with collector_connection(dsn) as conn:  # one connection, as the scheduler's leader keeps
        pid = conn.info.backend_pid
        for n in range(1, cycles + 1):
            t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu(pid)
            report = collect(conn)
            total, client, server = time.perf_counter() - t0, time.process_time() - c0, server_cpu(pid) - s0
            totals.append(total)
            cpus.append(client + server)
            slowest = sorted(report.collectors.items(), key=lambda kv: -kv[1]["ms"])[:3]
            print(f"{n:>5} {len(report.samples):>8,} {total:>7.3f}s {report.duration_s:>7.3f}s "
                  f"{total - report.duration_s:>7.3f}s {client:>9.2f}s {server:>6.2f}s  "
                  + ", ".join(f"{name} {c['ms']:.0f}" for name, c in slowest) + f"  {load()}", flush=True)
    later, later_cpu = (totals[1:] or totals), (cpus[1:] or cpus)
    print(f"\nmedian cycle {statistics.median(later):.3f} s (min {min(later):.3f}, max {max(later):.3f}); "
          f"CPU client + server median {statistics.median(later_cpu):.3f} s (min {min(later_cpu):.3f})"
          + (" of cycles 2+ (the first has no previous cycle to compare with)" if len(totals) > 1 else ""))
    store_parts(dsn)
    if profile:
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        collect_once(dsn)
        profiler.disable()
        print(f"\nprofiled cycle: {time.perf_counter() - t0:.3f} s (under cProfile)")
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(25)
            print(f"\n--- by {key} ---\n" + "\n".join(out.getvalue().splitlines()[6:]))
    print(f"\ncommand: bench/collection_cycle.py {' '.join(sys.argv[1:])}; load average {load()}; {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=5000)
    parser.add_argument("--kinds", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="and a cProfile of one more cycle")
    parser.add_argument("--dsn", help="an existing empty database (migrated and seeded here); default: a private cluster")
    args = parser.parse_args()
    if args.dsn:
        run(args.dsn, args.queues, args.kinds, args.groups, args.cycles, args.profile)
        return
    with PrivateCluster(settings={**RELAXED_DURABILITY}) as cluster:
        with connect(cluster.dsn) as conn:
            conn.execute("CREATE DATABASE bench")
        run(cluster.dsn_for("bench"), args.queues, args.kinds, args.groups, args.cycles, args.profile)


if __name__ == "__main__":
    main()
