#!/usr/bin/env python
"""I/O-bound jobs per worker process: Skiplock's asyncio runtime against its threaded worker,
PGQueuer and Procrastinate, side by side in one run on one PostgreSQL.

Every job waits 50 ms and does nothing else (an HTTP call's shape without the network): what
a worker process can keep in flight, and what claiming and finishing cost it, decide the rate,
not the handler's CPU. Each contender is one OS process with the same concurrency (jobs in
flight at once, `--concurrency`: 100 and then 500 by default) and works a pre-filled table of its own:

- skiplock-async:   `skiplock worker --tasks io_tasks --async-concurrency C` (bench/io_tasks.py:
                    `async def`, `await asyncio.sleep(0.05)`), batch `--batch`;
- skiplock-threads: `skiplock worker --tasks io_sync_tasks --concurrency C` (the same wait as
                    `time.sleep(0.05)` in C handler threads), batch `--batch`;
- pgqueuer:         PGQueuer's QueueManager on its asyncpg driver, `max_concurrent_tasks=C`,
                    batch `--batch`, an async entrypoint awaiting 0.05 s. (Its psycopg driver
                    shares one connection with its LISTEN loop: here every other dequeue waited
                    about 1 s for it, 20 jobs/s whatever the concurrency, so it is not the one
                    to compare);
- procrastinate:    Procrastinate's worker (`run_worker_async(concurrency=C)`, psycopg
                    connector), an async task awaiting 0.05 s.

The ceiling is C / 0.05 s (2,000 jobs/s at C = 100, 10,000 at C = 500). jobs/s is the rise in finished jobs,
counted in the database (Skiplock: completed rows; PGQueuer: rows gone from its queue table;
Procrastinate: succeeded rows), over a `--window` after a `--warmup`, per round; the table
gives the median of `--runs` rounds, which run the contenders in rotated order. CPU is the
worker process's user+system seconds per 1,000 jobs in the window (from /proc).

The script starts its own throwaway PostgreSQL (console.pgcluster.PrivateCluster, default
settings) and installs PGQueuer's and Procrastinate's schemas beside Skiplock's.

    .venv/bin/python bench/async_io.py                      # 3 rounds, 10 s windows, C = 100 and 500
    .venv/bin/python bench/async_io.py --runs 1 --window 4 --warmup 1 --jobs 30000   # a small proof it runs
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import PrivateCluster  # noqa: E402

CONTENDERS = ("skiplock-async", "skiplock-threads", "pgqueuer", "procrastinate")
WAIT = 0.05


# --- filling and counting, per contender --------------------------------------------------------

def fill(conn: psycopg.Connection, contender: str, jobs: int) -> None:
    if contender.startswith("skiplock"):
        conn.execute("TRUNCATE skiplock.jobs; TRUNCATE skiplock.workers")
        conn.execute("INSERT INTO skiplock.jobs (queue, kind) SELECT 'default', 'io' FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM (ANALYZE) skiplock.jobs")
    elif contender == "pgqueuer":
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        conn.execute("INSERT INTO pgqueuer (priority, entrypoint, status, payload) "
                     "SELECT 0, 'io', 'queued', NULL FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM (ANALYZE) pgqueuer")
    else:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args, status) "
                     "SELECT 'io', 'io', '{}', 'todo' FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM (ANALYZE) procrastinate_jobs")


def done(conn: psycopg.Connection, contender: str, jobs: int) -> int:
    if contender.startswith("skiplock"):
        return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0]
    if contender == "pgqueuer":
        return jobs - conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
    return conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()[0]


# --- the contenders' processes --------------------------------------------------------------------

def start_skiplock(dsn: str, contender: str, args) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": dsn,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")]),
           "SKIPLOCK_WORKER_POLL_INTERVAL": "0.2", "SKIPLOCK_WORKER_FLUSH_INTERVAL": "1"}
    if contender == "skiplock-async":
        slots = ["--tasks", "io_tasks", "--async-concurrency", str(args.concurrency)]
    else:
        slots = ["--tasks", "io_sync_tasks", "--concurrency", str(args.concurrency)]
    return subprocess.Popen([sys.executable, "-m", "console", "worker", *slots, "--batch-size", str(args.batch)],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def pgqueuer_main(dsn: str, concurrency: int, batch: int) -> None:
    async def run() -> None:
        import asyncpg
        from pgqueuer import QueueManager
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
        from pgqueuer.queries import Queries

        parts = psycopg.conninfo.conninfo_to_dict(dsn)  # asyncpg takes no libpq key=value string
        conn = await asyncpg.connect(host=parts.get("host"), port=int(parts.get("port", 5432)), user=parts.get("user"),
                                     database=parts.get("dbname"), password=parts.get("password"))
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint("io")
        async def io(job) -> None:
            await asyncio.sleep(WAIT)

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
        await manager.run(batch_size=batch, max_concurrent_tasks=concurrency, dequeue_timeout=timedelta(seconds=1))
        await conn.close()

    asyncio.run(run())


def procrastinate_main(dsn: str, concurrency: int) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="io", queue="io")
    async def io() -> None:
        await asyncio.sleep(WAIT)

    async def run() -> None:
        async with app.open_async():
            await app.run_worker_async(queues=["io"], concurrency=concurrency, wait=True,
                                       install_signal_handlers=True, shutdown_graceful_timeout=5)

    asyncio.run(run())


def start(dsn: str, contender: str, args):
    """The contender's worker process and its pid."""
    if contender.startswith("skiplock"):
        proc = start_skiplock(dsn, contender, args)
        return proc, proc.pid
    ctx = mp.get_context("spawn")
    if contender == "pgqueuer":
        proc = ctx.Process(target=pgqueuer_main, args=(dsn, args.concurrency, args.batch))
    else:
        proc = ctx.Process(target=procrastinate_main, args=(dsn, args.concurrency))
    proc.start()
    return proc, proc.pid


def stop(proc) -> None:
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGTERM)
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join()


def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- one measurement ------------------------------------------------------------------------------

def measure(dsn: str, contender: str, args) -> dict:
    with connect(dsn) as conn:
        fill(conn, contender, args.jobs)
        proc, pid = start(dsn, contender, args)
        try:
            deadline = time.monotonic() + 60
            while done(conn, contender, args.jobs) == 0:  # started and working
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{contender}: no job finished within 60 s")
                time.sleep(0.05)
            time.sleep(args.warmup)
            c0, cpu0, t0 = done(conn, contender, args.jobs), cpu_seconds(pid), time.monotonic()
            time.sleep(args.window)
            c1, cpu1, t1 = done(conn, contender, args.jobs), cpu_seconds(pid), time.monotonic()
        finally:
            stop(proc)
    if c1 >= args.jobs:
        print(f"  warning: {contender} ran out of jobs inside the window: raise --jobs", file=sys.stderr)
    finished = c1 - c0
    return {"rate": finished / (t1 - t0), "cpu_per_1000": 1000 * (cpu1 - cpu0) / finished if finished else float("nan")}


def prepare(cluster: PrivateCluster) -> str:
    with connect(cluster.dsn) as conn:
        conn.execute("CREATE DATABASE bench")
    dsn = cluster.dsn_for("bench")
    with connect(dsn) as conn:
        migrate(conn)

    async def install() -> None:
        import procrastinate
        from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
        from pgqueuer.queries import Queries

        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        await Queries(PsycopgDriver(aconn)).install()
        await aconn.close()
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())
    return dsn


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"any of {','.join(CONTENDERS)}")
    parser.add_argument("--concurrency", default="100,500",
                        help="jobs in flight at once per process (all contenders); several values: one table each")
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim (Skiplock, PGQueuer)")
    parser.add_argument("--runs", type=int, default=3, help="rounds; each runs every contender once, in rotated order")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds per contender and round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds after the first finished job before the window")
    parser.add_argument("--jobs", type=int, default=40_000, help="pre-filled jobs per measurement (more than a window drains)")
    args = parser.parse_args(argv)
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.concurrencies = [int(n) for n in args.concurrency.split(",") if n]
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contender(s): {sorted(unknown)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    from importlib.metadata import version

    print(f"# bench/async_io.py {' '.join(sys.argv[1:])}")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"psycopg {psycopg.__version__}, pgqueuer {version('pgqueuer')}, procrastinate {version('procrastinate')}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()}")
    print(f"each job awaits {WAIT * 1000:g} ms; one worker process per contender", flush=True)
    with PrivateCluster() as cluster:
        dsn = prepare(cluster)
        with connect(dsn) as conn:
            print(f"PostgreSQL {conn.info.server_version} (default settings)", flush=True)
        for concurrency in args.concurrencies:
            args.concurrency = concurrency
            print(f"\nconcurrency {concurrency} per process (ceiling {concurrency / WAIT:,.0f} jobs/s)", flush=True)
            results: dict[str, list[dict]] = {c: [] for c in args.contenders}
            for run in range(args.runs):
                order = args.contenders[run % len(args.contenders):] + args.contenders[:run % len(args.contenders)]
                for contender in order:
                    result = measure(dsn, contender, args)
                    results[contender].append(result)
                    print(f"  round {run + 1} {contender:<17} {result['rate']:8.0f} jobs/s  "
                          f"{result['cpu_per_1000']:6.2f} CPU s / 1000 jobs", flush=True)
            print(f"\n{'contender':<17} {'jobs/s (median)':>16} {'of ceiling':>11} {'CPU s / 1000 jobs':>18}")
            for contender, rounds in results.items():
                rate = statistics.median(r["rate"] for r in rounds)
                cpu = statistics.median(r["cpu_per_1000"] for r in rounds)
                print(f"{contender:<17} {rate:16.0f} {rate / (concurrency / WAIT):10.0%} {cpu:18.2f}", flush=True)
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()}")


if __name__ == "__main__":
    main()
