#!/usr/bin/env python
"""Queue throughput: Skiplock's worker against a naive FOR UPDATE claim, PGQueuer and a bare loop.

Everything runs on one throwaway PostgreSQL (console.pgcluster.PrivateCluster) started by this
script, once per durability mode:

- durable: PostgreSQL's defaults (fsync, synchronous_commit and full_page_writes on);
- relaxed: fsync=off, synchronous_commit=off, full_page_writes=off (RELAXED_DURABILITY).

Both modes use shared_buffers=1GB (the 2M-row sustained backlog and its indexes fit) and
PostgreSQL's default autovacuum_naptime (60 s): the queue has to hold up under the settings an
operator actually has.

The grid drains no-op jobs from a pre-filled table at each worker count; a "worker" is one OS
process for every contender:

- skiplock: real `skiplock worker --tasks noop_tasks` processes;
- naive:    a bare psycopg loop running Skiplock's complete-and-claim statement with
            `FOR UPDATE` instead of `FOR UPDATE SKIP LOCKED` (the convoy);
- pgqueuer: PGQueuer's QueueManager on its psycopg driver, batch 10, same database;
- pgqueuer-asyncpg: the same on its asyncpg driver (PGQueuer's other driver);
- bare:     a bare psycopg loop running exactly Skiplock's complete-and-claim SQL (the ceiling
            for Python on this database);
- bare-100: the same loop claiming 100 jobs per statement (whatever --batch says): the ceiling
            at the size the worker's adaptive claims reach (worker.claim_max, 100) on a deep
            backlog of fast jobs, where `bare` stays at --batch.
- bare-100-apart: the same loop at 100 a claim, completing each batch in a statement of its own
            (complete_many) just before the next claim, as the worker does.
- bare-prelimits: the same loop running the statement as it was before queue limits (without
            the two look-ups that leave limited queues and kinds to console.queue.limits): what the
            limits cost a queue that has none.
- bare-archive: a design probe (issue 28 target 1), not a product: the same loop, but the
            completion DELETEs the finished rows from the hot table and INSERTs them into
            skiplock.jobs_archive in the same statement (completed jobs leave the hot table as
            they complete). Its rate counts rows in the archive.
- bare-delete: a design probe, the lower bound of that idea: the completion only DELETEs (no
            history kept at all, which the console needs; PGQueuer's shape without its log).

`--with-limits` gives another queue a concurrency and a rate and another kind a concurrency
before the grid, so the benchmarked (unlimited) queue shares the database and the workers with
limited ones: the workers then also run their limited path (console.queue.limits), with the indexes
the scheduler keeps while something is limited (so enqueues in that run pay for them too).

jobs/s is the rise in completed rows (counted in the database) over a fixed window after a
warm-up; claim latency is the round trip of the claim statement (for Skiplock and the loops
the complete-and-claim statement, for PGQueuer its dequeue query), p50/p99 interpolated in the
fixed buckets of console.histogram (the same ones the console uses).

Looking inside a cell: `--statements N` prints its N costliest statements over the window
(pg_stat_statements: calls, execution time, rows and buffers per job completed), `--waits`
what its backends waited on (pg_stat_activity, sampled every 20 ms). Two environment knobs
change the loops for an experiment: BARE_BURN_US=N spins N microseconds per claimed job after
each claim (a handler's client CPU), BARE_HOLD_MS=N sleeps N ms before the next statement
completes the batch.

The sustained test works a large backlog (default 2,000,000 jobs, 5 minutes) with Skiplock and
then with PGQueuer and prints both throughputs every 5 s side by side. A producer in the bench
process enqueues, after every interval, as many jobs as were completed in it (one INSERT ...
SELECT at the backlog's tail), so the backlog stays at its size for the whole run however fast
the workers drain it (`--no-refill`: a fixed backlog, which two workers empty in under 3
minutes on a quiet machine). Each contender first runs `--sustained-warmup` seconds (10) the
same way, topped up after every interval, before its first interval counts: the first
interval is then not the only one without a top-up beside it.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/throughput.py --quick                 # a few minutes
    .venv/bin/python bench/throughput.py                          # full grid + sustained
    .venv/bin/python bench/throughput.py --no-grid --backlog 500000 --duration 120
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from console.db import connect, migrate  # noqa: E402
from console.histogram import Histogram, delta, quantile  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.sqlfiles import query  # noqa: E402

MODES = {
    "durable": {},
    "relaxed": dict(RELAXED_DURABILITY),
}
COMMON_SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "4GB"}
CONTENDERS = ("skiplock", "naive", "pgqueuer", "pgqueuer-asyncpg", "bare", "bare-100", "bare-100-apart", "bare-prelimits",
              "bare-archive", "bare-delete",
              "skiplock-before", "skiplock-inline")

CLAIM_SQL = query("queue", "complete_and_claim")
NAIVE_SQL = CLAIM_SQL.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")
assert NAIVE_SQL != CLAIM_SQL
# Before limits (and fair queues, migration 025, which joined the same look-up) the queue
# look-up left only paused queues alone.
PRELIMITS_SQL = "\n".join(line for line in CLAIM_SQL.replace(" OR q.limited OR q.fair)", ")").splitlines()
                          if "skiplock.kind_limits" not in line)
assert PRELIMITS_SQL.count("NOT IN") == 1 and "limited" not in PRELIMITS_SQL and "q.fair" not in PRELIMITS_SQL

# The design probes: the finished CTE of complete_and_claim, as the product has it (an UPDATE to
# 'completed'), replaced by a DELETE that moves the rows into the archive, or by a bare DELETE.
_FINISHED = CLAIM_SQL[CLAIM_SQL.index("WITH finished AS ("):CLAIM_SQL.index("candidates AS (")]
ARCHIVE_FINISHED = """WITH moved AS (
    DELETE FROM skiplock.jobs AS j
    USING_THE_FENCE
    RETURNING j.*
),
finished AS (
    INSERT INTO skiplock.jobs_archive (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
                                       idempotency_key, locked_by, locked_at, last_error, errors,
                                       error_fingerprint, created_at, finished_at)
    SELECT id, queue, kind, payload, 'completed', priority, run_at, attempts, max_attempts,
           idempotency_key, locked_by, locked_at, last_error, errors, error_fingerprint, created_at, now()
    FROM moved
    RETURNING id
),
"""
DELETE_FINISHED = """WITH finished AS (
    DELETE FROM skiplock.jobs AS j
    USING_THE_FENCE
    RETURNING j.id
),
"""
# The fence, as the product's finished CTE has it, with USING for FROM (a DELETE's join).
_USING = _FINISHED[_FINISHED.index("FROM (SELECT u.id"):_FINISHED.index("    RETURNING j.id")].rstrip().replace("FROM", "USING", 1)
ARCHIVE_SQL = CLAIM_SQL.replace(_FINISHED, ARCHIVE_FINISHED.replace("USING_THE_FENCE", _USING))
DELETE_SQL = CLAIM_SQL.replace(_FINISHED, DELETE_FINISHED.replace("USING_THE_FENCE", _USING))
# bare-100's claim: the size the worker's adaptive claims reach on a deep backlog of fast jobs
# (worker.claim_max's default).
BARE_100 = 100
HOLD_S = float(os.environ.get("BARE_HOLD_MS", "0")) / 1000  # experiment: the loops wait this long before completing
BURN_S = float(os.environ.get("BARE_BURN_US", "0")) / 1e6  # experiment: ... or spin this long per job
# bare-100-apart: the worker's shape since it completes apart (console/queue/worker.py): the
# finished batch completed by complete_many, then the claim with nothing to complete.
COMPLETE_SQL = query("queue", "complete_many")
LOOP_SQL = {"naive": NAIVE_SQL, "bare-prelimits": PRELIMITS_SQL, "bare-archive": ARCHIVE_SQL, "bare-delete": DELETE_SQL}


# --- filling -----------------------------------------------------------------------------------

def settle(dsn: str, timeout: float = 15.0) -> None:
    """Before every cell: empty both systems' tables, so no autovacuum of the last contender's
    garbage runs inside this one's window, and wait (at most `timeout`) for any autovacuum
    worker already running to finish. Without it a cell could share the two cores with the
    vacuum of the previous contender's tables. It removes that interference only: the spread at
    4 processes between runs stayed (docs/benchmarks.md, 2026-12-02)."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs, skiplock.workers, skiplock.jobs_archive")
        if conn.execute("SELECT to_regclass('pgqueuer') IS NOT NULL").fetchone()[0]:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        deadline = time.time() + timeout
        while time.time() < deadline and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").fetchone()[0]:
            time.sleep(0.2)


def reset_skiplock(dsn: str, jobs: int) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs, skiplock.workers, skiplock.jobs_archive")
        fill_skiplock(conn, jobs)
        conn.execute("VACUUM (ANALYZE) skiplock.jobs")
        conn.execute("CHECKPOINT")


def fill_skiplock(conn: psycopg.Connection, jobs: int) -> None:
    step = 500_000
    for start in range(0, jobs, step):
        conn.execute(
            "INSERT INTO skiplock.jobs (kind, payload) SELECT 'noop', jsonb_build_object('i', g) "
            "FROM generate_series(%s::bigint, %s::bigint) AS g",
            (start + 1, min(start + step, jobs)),
        )


def top_up_skiplock(conn: psycopg.Connection, jobs: int) -> None:
    """The sustained test's producer: `jobs` more at the backlog's tail, one statement."""
    conn.execute("INSERT INTO skiplock.jobs (kind, payload) SELECT 'noop', jsonb_build_object('i', g) "
                 "FROM generate_series(1, %s::bigint) AS g", (jobs,))


def top_up_pgqueuer(conn: psycopg.Connection, jobs: int) -> None:
    conn.execute("INSERT INTO pgqueuer (priority, entrypoint, status, payload) "
                 "SELECT 0, 'noop', 'queued', NULL FROM generate_series(1, %s::bigint)", (jobs,))


def reset_pgqueuer(dsn: str, jobs: int) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        step = 500_000
        for start in range(0, jobs, step):
            conn.execute(
                "INSERT INTO pgqueuer (priority, entrypoint, status, payload) "
                "SELECT 0, 'noop', 'queued', NULL FROM generate_series(%s::bigint, %s::bigint)",
                (start + 1, min(start + step, jobs)),
            )
        conn.execute("VACUUM (ANALYZE) pgqueuer")
        conn.execute("CHECKPOINT")


def completed_skiplock(conn) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'completed'").fetchone()[0]


def done_by(contender: str, conn, jobs: int) -> int:
    """Jobs a loop or PGQueuer contender has finished so far in a cell of `jobs`."""
    if contender.startswith("pgqueuer"):
        return jobs - remaining_pgqueuer(conn)
    if contender == "bare-archive":
        return conn.execute("SELECT count(*) FROM skiplock.jobs_archive").fetchone()[0]
    if contender == "bare-delete":
        return jobs - conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0]
    return completed_skiplock(conn)


def remaining_pgqueuer(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]


def add_limits(dsn: str) -> None:
    """Limits on a queue and a kind the benchmark's jobs do not use ('default' queue, 'noop'),
    and the limited path's indexes, as the scheduler's leader builds them within 30 s."""
    from console.queue import limits

    with connect(dsn) as conn:
        limits.set_limits(conn, "limited", concurrency=2, rate="50/s", actor="bench", reason="bench/throughput.py --with-limits")
        limits.declare_kinds(conn, {"scarce": 1}, worker="bench")
        limits.keep_claim_indexes(conn)


# --- the contenders' worker processes ------------------------------------------------------------

def loop_params(worker: str, batch: int) -> dict:
    """The complete-and-claim statement's parameters for a loop that claims every kind of every
    queue (tests/test_bench_throughput.py runs each loop's statement with them)."""
    return {"worker": worker, "ids": [], "attempts": [], "queues": None, "kinds": None, "skip_kinds": None,
            "limit": batch, "lease": 300.0}


def loop_worker(dsn: str, sql_text: str, batch: int, clock, counts, out, apart: bool = False) -> None:
    """Complete the previous batch and claim the next in one statement, nothing else (`apart`:
    complete it in a statement of its own first, then claim).

    `clock` is the cell's shared state (see Clock): the process reports ready once connected,
    observes latencies only inside the window the parent opens, and stops when told."""
    worker = f"loop-{os.getpid()}"
    hist = Histogram()
    params = loop_params(worker, batch)
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        id_at = attempts_at = None
        deadlocks = 0
        clock.ready()
        while not clock.stopped():
            started = time.perf_counter()
            if apart and params["ids"]:
                cur.execute(COMPLETE_SQL, {"worker": worker, "ids": params["ids"], "attempts": params["attempts"]}, prepare=True)
                params["ids"], params["attempts"] = [], []
            try:
                cur.execute(sql_text, params, prepare=True)
            except psycopg.errors.DeadlockDetected:
                # the naive claim's lock convoy also deadlocks now and then (two statements
                # waiting on each other's head rows); the finished batch is completed next round
                deadlocks += 1
                continue
            rows = cur.fetchall()
            elapsed = time.perf_counter() - started
            if HOLD_S:
                time.sleep(HOLD_S)
            if BURN_S:  # experiment: the client's CPU per job, as a handler would spend it
                spin_until = time.perf_counter() + BURN_S * len(rows)
                while time.perf_counter() < spin_until:
                    pass
            if id_at is None:
                names = [c.name for c in cur.description]
                id_at, attempts_at = names.index("id"), names.index("attempts")
            if clock.in_window():
                hist.observe(elapsed)
            claimed = [r for r in rows if r[id_at] is not None]
            params["ids"] = [r[id_at] for r in claimed]
            params["attempts"] = [r[attempts_at] for r in claimed]
            if counts is not None:
                with counts.get_lock():
                    counts.value += len(claimed)
            if not claimed:
                time.sleep(0.01)
        if params["ids"]:
            cur.execute(sql_text, {**params, "limit": 0})
    if deadlocks:
        print(f"  ({worker}: {deadlocks} deadlocks)", flush=True)
    out.put(hist.counts)


def pgqueuer_worker(dsn: str, batch: int, asyncpg_driver: bool, clock, counts, out) -> None:
    asyncio.run(_pgqueuer_worker(dsn, batch, asyncpg_driver, clock, counts, out))


async def _pgqueuer_worker(dsn, batch, asyncpg_driver, clock, counts, out) -> None:
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    hist = Histogram()
    if asyncpg_driver:
        import asyncpg
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

        parts = psycopg.conninfo.conninfo_to_dict(dsn)  # asyncpg takes no libpq key=value string
        conn = await asyncpg.connect(host=parts.get("host"), port=int(parts.get("port", 5432)), user=parts.get("user"),
                                     database=parts.get("dbname"), password=parts.get("password"))
        queries = Queries(AsyncpgDriver(conn))
    else:
        from pgqueuer.adapters.drivers.psycopg import PsycopgDriver

        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        queries = Queries(PsycopgDriver(conn))
    manager = QueueManager(queries)
    dequeue = queries.dequeue

    async def timed_dequeue(*args, **kwargs):
        started = time.perf_counter()
        jobs = await dequeue(*args, **kwargs)
        if clock.in_window():
            hist.observe(time.perf_counter() - started)
        return jobs

    queries.dequeue = timed_dequeue

    # The grid counts completed rows in the database (counts is None): the handler does
    # nothing, and takes no cross-process lock. The sustained test's counter is per process.
    @manager.entrypoint("noop")
    async def noop(job) -> None:
        if counts is not None:
            counts.value += 1  # this process's own slot: no lock shared with the others

    async def stop_when_told() -> None:
        while not clock.stopped():
            await asyncio.sleep(0.05)
        manager.shutdown.set()

    stopper = asyncio.create_task(stop_when_told())
    clock.ready()
    await manager.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))
    await stopper
    await conn.close()
    out.put(hist.counts)


class Clock:
    """A cell's shared state between the parent and its forked contender processes: how many
    processes are ready, the measurement window (opened by the parent after all are ready and
    the warm-up has passed) and the stop flag."""

    def __init__(self, ctx) -> None:
        self._ready = ctx.Value("i", 0)
        self._window = ctx.Array("d", [float("inf"), float("inf")], lock=False)
        self._stop = ctx.Value("b", 0, lock=False)

    def ready(self) -> None:
        with self._ready.get_lock():
            self._ready.value += 1

    def count_ready(self) -> int:
        return self._ready.value

    def open_window(self, t0: float, t1: float) -> None:
        self._window[0], self._window[1] = t0, t1

    def in_window(self) -> bool:
        return self._window[0] <= time.time() <= self._window[1]

    def stop(self) -> None:
        self._stop.value = 1

    def stopped(self) -> bool:
        return bool(self._stop.value)


def cpu_seconds(pids) -> dict[int, float]:
    """user+system CPU seconds of each live process (all its threads), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def server_pids(data_dir: Path) -> list[int]:
    """The postmaster and its children (backends, autovacuum, checkpointer...)."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return [postmaster, *children]


class CpuMeter:
    """CPU the contender's processes and the server spent in the window. On a saturated machine
    throughput follows CPU per job, and CPU per job does not depend on the neighbours' load the
    way jobs/s does (it still rises somewhat with cache and scheduler pressure)."""

    def __init__(self, client_pids, data_dir: Path | None) -> None:
        self.client_pids, self.data_dir = list(client_pids), data_dir

    def start(self) -> None:
        self._c0 = cpu_seconds(self.client_pids)
        self._s0 = cpu_seconds(server_pids(self.data_dir)) if self.data_dir else {}

    def stop(self) -> tuple[float, float]:
        c1 = cpu_seconds(self.client_pids)
        s1 = cpu_seconds(server_pids(self.data_dir)) if self.data_dir else {}
        client = sum(v - self._c0[pid] for pid, v in c1.items() if pid in self._c0)
        server = sum(v - self._s0.get(pid, 0.0) for pid, v in s1.items())
        return client, server


def wait_ready(count, n: int, procs_alive, what: str, timeout: float = 120.0) -> None:
    """Wait until all `n` processes of a contender report ready (symmetric warm-up)."""
    deadline = time.time() + timeout
    while count() < n:
        if time.time() > deadline or not procs_alive():
            raise RuntimeError(f"{what}: {count()} of {n} processes ready")
        time.sleep(0.02)


def start_skiplock_workers(dsn: str, n: int, args, extra_env: dict[str, str] | None = None,
                           tree: Path = ROOT, tasks: str = "noop_tasks") -> list[subprocess.Popen]:
    """`n` real `skiplock worker` processes, run from `tree` (this checkout, or --before-tree)."""
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": dsn,
        "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT / "bench")]),
        "SKIPLOCK_WORKER_FLUSH_INTERVAL": "1",
        "SKIPLOCK_WORKER_POLL_INTERVAL": "0.2",
        **(extra_env or {}),
    })
    cmd = [sys.executable, "-m", "console", "worker", "--tasks", tasks,
           "--concurrency", str(args.concurrency), "--batch-size", str(args.batch)]
    return [subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(n)]


def stop_skiplock_workers(procs: list[subprocess.Popen]) -> list[str]:
    """SIGTERM, then wait (60 s each, then SIGKILL). Returns (and prints to stderr) a line per
    process that did not exit 0, with the last line it wrote to stderr."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    exits: list[str] = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            exits.append(f"worker {proc.pid} killed after 60 s")
            continue
        if proc.returncode != 0:
            exits.append(f"worker {proc.pid} exited {proc.returncode}: {err.strip().splitlines()[-1:]}")
            print(f"  {exits[-1]}", file=sys.stderr)
    return exits


def registry_histogram(conn) -> tuple[list[int], int]:
    rows = conn.execute("SELECT claim_histogram, completed FROM skiplock.workers").fetchall()
    total = [0] * len(Histogram().counts)
    for counts, _ in rows:
        total = [a + b for a, b in zip(total, list(counts) + [0] * (len(total) - len(counts)), strict=True)]
    return total, sum(done for _, done in rows)


# --- one cell of the grid ----------------------------------------------------------------------

def reset_statements(conn) -> None:
    """Start pg_stat_statements' counts afresh (the cell's window, with --statements)."""
    conn.execute("SELECT pg_stat_statements_reset()")


def statement_costs(conn, jobs: int, top: int) -> list[str]:
    """The `top` statements by execution time since the reset, per job completed in the window:
    calls, execution microseconds (wall time in the executor, lock waits included; parse, bind,
    the protocol and the commit are not in it), rows and shared buffers touched, with the
    query's first words."""
    rows = conn.execute(
        "SELECT calls, total_exec_time, rows, shared_blks_hit + shared_blks_read, regexp_replace(query, '\\s+', ' ', 'g') "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "ORDER BY total_exec_time DESC LIMIT %s", (top,)).fetchall()
    return [f"    {calls / jobs:8.4f} calls/job {ms_total * 1000 / jobs:7.2f} us/job {rows_ / max(calls, 1):7.1f} rows/call "
            f"{blocks / jobs:6.1f} buffers/job  {text[:100]}"
            for calls, ms_total, rows_, blocks, text in rows]


class WaitSampler:
    """With --waits: what the cell's backends wait on during the window, sampled from
    pg_stat_activity every 20 ms on a connection of its own (the average number of this
    database's other backends in each state and wait event)."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.counts, self.samples = dsn, {}, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        with connect(self.dsn) as conn:
            while not self.done.is_set():
                for key, n in conn.execute(
                        "SELECT state || coalesce(' ' || wait_event_type || ':' || wait_event, ''), count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                        "GROUP BY 1").fetchall():
                    self.counts[key] = self.counts.get(key, 0) + n
                self.samples += 1
                self.done.wait(0.02)

    def stop(self) -> list[str]:
        self.done.set()
        self.thread.join(10)
        top = sorted(self.counts.items(), key=lambda kv: -kv[1])[:6]
        return [f"    waits: {n / max(self.samples, 1):5.2f} backends {key}" for key, n in top]


class CellProbe:
    """What --statements and --waits print for a cell: started as its window opens, read as it
    closes (nothing at all without either option)."""

    def __init__(self, dsn: str, conn, args) -> None:
        self.conn, self.top = conn, args.statements
        if self.top:
            reset_statements(conn)
        self.sampler = WaitSampler(dsn) if args.waits else None
        if self.sampler:
            self.sampler.start()

    def stop(self, jobs: int) -> list[str]:
        lines = statement_costs(self.conn, jobs, self.top) if self.top else []
        return lines + (self.sampler.stop() if self.sampler else [])


def run_cell(contender: str, dsn: str, workers: int, args) -> dict:
    """One measurement: fill, start `workers` processes, wait until every one reports ready
    (Skiplock: its registry row; the loops and PGQueuer: connected and about to loop), let
    them run `warmup` seconds, then count completed rows over `window` seconds."""
    jobs = args.cell_jobs
    settle(dsn)
    if contender.startswith("pgqueuer"):
        reset_pgqueuer(dsn, jobs)
    else:
        reset_skiplock(dsn, jobs)
    warmup, window = args.warmup, args.window
    load_before = os.getloadavg()[0]
    with connect(dsn) as conn:
        if contender.startswith("skiplock"):
            tree = args.before_tree if contender == "skiplock-before" else ROOT
            tasks = "noop_inline_tasks" if contender == "skiplock-inline" else "noop_tasks"
            procs = start_skiplock_workers(dsn, workers, args, tree=tree, tasks=tasks)
            try:
                wait_ready(lambda: conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0], workers,
                           lambda: all(p.poll() is None for p in procs), contender)
                time.sleep(warmup)
                meter = CpuMeter([p.pid for p in procs], args.data_dir)
                before_hist, _ = registry_histogram(conn)
                meter.start()
                probe = CellProbe(dsn, conn, args)
                t0, c0 = time.time(), completed_skiplock(conn)
                time.sleep(window)
                t1, c1 = time.time(), completed_skiplock(conn)
                cpu = meter.stop()
                statements = probe.stop(max(c1 - c0, 1))
                time.sleep(1.1)  # one more counter flush covering the window's end
                after_hist, _ = registry_histogram(conn)
            finally:
                stop_skiplock_workers(procs)
            hist = delta(after_hist, before_hist)
        else:
            ctx = mp.get_context("fork")
            out = ctx.Queue()
            clock = Clock(ctx)
            if contender.startswith("pgqueuer"):
                target, extra = pgqueuer_worker, (args.batch, contender == "pgqueuer-asyncpg")
            else:
                sql_text = LOOP_SQL.get(contender, CLAIM_SQL)
                target, extra = loop_worker, (sql_text, BARE_100 if contender.startswith("bare-100") else args.batch)
            apart = {"apart": True} if contender == "bare-100-apart" else {}
            procs = [ctx.Process(target=target, args=(dsn, *extra, clock, None, out), kwargs=apart) for _ in range(workers)]
            for p in procs:
                p.start()
            try:
                wait_ready(clock.count_ready, workers, lambda: all(p.is_alive() for p in procs), contender)
                time.sleep(warmup)
                meter = CpuMeter([p.pid for p in procs], args.data_dir)
                clock.open_window(time.time(), time.time() + window)
                meter.start()
                probe = CellProbe(dsn, conn, args)
                t0 = time.time()
                c0 = done_by(contender, conn, jobs)
                time.sleep(window)
                t1 = time.time()
                c1 = done_by(contender, conn, jobs)
                cpu = meter.stop()
                statements = probe.stop(max(c1 - c0, 1))
            finally:
                clock.stop()
            hist = [0] * len(Histogram().counts)
            for _ in procs:
                counts = out.get(timeout=120)
                hist = [a + b for a, b in zip(hist, counts, strict=True)]
            for p in procs:
                p.join(timeout=30)
    rate = (c1 - c0) / (t1 - t0)
    p50, p99 = quantile(hist, 0.5), quantile(hist, 0.99)
    note = "ran dry" if c1 >= jobs - args.batch * workers else ""
    load = (load_before, os.getloadavg()[0])
    done = max(c1 - c0, 1)
    return {"rate": rate, "p50": p50, "p99": p99, "note": note, "load": load,
            "cpu_client": cpu[0] / done, "cpu_server": cpu[1] / done, "statements": statements}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def run_grid(mode: str, dsn: str, args) -> dict:
    """Every worker count, `runs` rounds; in each round every contender once, the order
    rotated from round to round so no contender always runs first (or last) on a machine
    whose load moves."""
    print(f"\n## grid, {mode} durability ({describe(mode)})", flush=True)
    results: dict[tuple[str, int], list[dict]] = {}
    for n in args.workers:
        for r in range(args.runs):
            shift = r % len(args.contenders)
            for contender in args.contenders[shift:] + args.contenders[:shift]:
                cell = run_cell(contender, dsn, n, args)
                cell["round"] = r
                results.setdefault((contender, n), []).append(cell)
                print(f"  round {r + 1} {contender:15s} workers={n:2d}  {cell['rate']:8.0f} jobs/s  claim p50 {ms(cell['p50'])} ms"
                      f"  p99 {ms(cell['p99'])} ms  cpu/job client {cell['cpu_client'] * 1e6:5.0f} us server {cell['cpu_server'] * 1e6:5.0f} us"
                      f"  load {cell['load'][0]:.1f}->{cell['load'][1]:.1f} {cell['note']}", flush=True)
                for line in cell["statements"]:
                    print(line, flush=True)
    print_table(mode, results, args)
    return results


def print_table(mode: str, results: dict, args) -> None:
    print(f"\n### {mode} durability: jobs/s, median (min-max) of {args.runs} run(s); claim p50 / p99 ms of the median run;"
          " 1-min load average during the cells\n")
    header = "| workers | " + " | ".join(args.contenders) + " | load avg |"
    print(header)
    print("|---:|" + "---:|" * len(args.contenders) + "---:|")
    med: dict[tuple[str, int], float] = {}
    for n in args.workers:
        cells, loads = [], []
        for contender in args.contenders:
            runs = results.get((contender, n)) or []
            if not runs:
                cells.append("-")
                continue
            rates = [c["rate"] for c in runs]
            med[(contender, n)] = m = median(rates)
            mid = min(runs, key=lambda c: abs(c["rate"] - m))
            loads += [x for c in runs for x in c["load"]]
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
            notes = " ran dry" if any(c["note"] for c in runs) else ""
            cells.append(f"{m:,.0f}{spread} ({ms(mid['p50'])} / {ms(mid['p99'])}){notes}")
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    print(f"\n### {mode} durability: CPU per job in microseconds, client + server = total, median of {args.runs} run(s)\n")
    print(header)
    print("|---:|" + "---:|" * len(args.contenders) + "---:|")
    for n in args.workers:
        cells, loads = [], []
        for contender in args.contenders:
            runs = results.get((contender, n)) or []
            if not runs:
                cells.append("-")
                continue
            loads += [x for c in runs for x in c["load"]]
            client = median([c["cpu_client"] for c in runs]) * 1e6
            server = median([c["cpu_server"] for c in runs]) * 1e6
            total = median([c["cpu_client"] + c["cpu_server"] for c in runs]) * 1e6
            cells.append(f"{client:,.0f} + {server:,.0f} = {total:,.0f}")
        print(f"| {n} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    lines = []
    for name in ("skiplock", "skiplock-before", "skiplock-inline"):
        if name not in args.contenders:
            continue
        sk = {n: med[(name, n)] for n in args.workers}
        peak = max(sk.values())
        lines.append(f"{name}: peak {peak:,.0f} jobs/s; at {max(args.workers)} workers {sk[max(args.workers)] / peak:.0%} of peak.")
        for bare in ("bare", "bare-100", "bare-100-apart"):
            if bare not in args.contenders:
                continue
            ratios = []
            for n in args.workers:
                # per round (the contenders of a round ran back to back), then the median
                paired = [a["rate"] / b["rate"] for a in results[(name, n)] for b in results[(bare, n)]
                          if a["round"] == b["round"] and b["rate"] > 0]
                ratios.append(f"{n}: {median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f})")
            lines.append(f"{name} / {bare} loop at the same process count, median (min-max) of the per-round ratios: "
                         + ", ".join(ratios) + ".")
            cpu = ", ".join(f"{n}: {median([c['cpu_client'] + c['cpu_server'] for c in results[(bare, n)]]) / median([c['cpu_client'] + c['cpu_server'] for c in results[(name, n)]]):.2f}"
                            for n in args.workers)
            lines.append(f"{name}: {bare} loop's CPU per job / {name}'s (the throughput ratio on a saturated machine): {cpu}.")
        drivers = [c for c in ("pgqueuer", "pgqueuer-asyncpg") if c in args.contenders]
        if drivers:  # against PGQueuer's faster driver at each count
            best = {n: max(med[(c, n)] for c in drivers) for n in args.workers}
            ratios = ", ".join(f"{n}: {sk[n] / best[n]:.1f}x" for n in args.workers if best[n] > 0)
            lines.append(f"{name} / PGQueuer ({' or '.join(drivers)}, the faster at each count; medians): {ratios}.")
    if lines:
        print("\n" + "\n".join(lines))


# --- the sustained test ------------------------------------------------------------------------

def hot_table_state(conn: psycopg.Connection, table: str) -> dict[str, float]:
    """What a sustained run's decay could come from, read between intervals: the hot table's heap
    and index sizes (every vacuum scans each index whole), its dead rows, and how many vacuums
    (the workers' and autovacuum's) have run on it."""
    row = conn.execute(
        "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), s.n_dead_tup, s.n_live_tup, "
        "s.vacuum_count + s.autovacuum_count FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "WHERE c.oid = %s::regclass", (table,)).fetchone()
    return {"heap_mb": row[0] / 2**20, "indexes_mb": row[1] / 2**20, "dead": row[2], "live": row[3], "vacuums": row[4]}


def interval_line(state: dict[str, float], server_cpu_s: float, jobs: int) -> str:
    per_job = f"{server_cpu_s / jobs * 1e6:4.0f} us" if jobs else "   - us"
    return (f"server {per_job}/job, heap {state['heap_mb']:5.0f} MB, indexes {state['indexes_mb']:5.0f} MB, "
            f"live {state['live'] / 1e6:4.1f} M, dead {state['dead'] / 1e3:5.0f} k, vacuums {state['vacuums']:3d}")


# Sustained contenders that are Skiplock's worker with a setting changed.
SUSTAINED_VARIANTS = {
    "skiplock-novacuum": {"SKIPLOCK_WORKER_VACUUM_INTERVAL": "0"},  # the worker's own VACUUM off
    "skiplock-archive": {"SKIPLOCK_WORKER_COMPLETE_INTO_ARCHIVE": "true"},  # completed jobs leave the hot table as they complete
}


def measure_intervals(conn: psycopg.Connection, args, contender: str, table: str,
                      completed: Callable[[], int], top_up: Callable[[int], None]) -> list[float]:
    """Jobs/s per interval for args.duration, after args.sustained_warmup seconds that run the
    same way but do not count. After every interval (warm-up ones too) the producer enqueues as
    many jobs as were completed since its last top-up. Every contender gets the same warm-up:
    without it the first interval was the only one with no top-up competing for the server
    (the refill runs between intervals) and ran up to half again as fast as any later one."""
    rates: list[float] = []
    last_t, last_c = time.time(), completed()
    topped_up = 0  # the jobs completed before the first reading came out of the backlog too
    measure_from = last_t + args.sustained_warmup
    end = measure_from + args.duration
    server = CpuMeter([], args.data_dir)  # the server's CPU per interval, the top-up's left out
    server.start()
    while time.time() < end - 0.1:
        time.sleep(args.interval)
        now, done = time.time(), completed()
        rate = (done - last_c) / (now - last_t)
        state = interval_line(hot_table_state(conn, table), server.stop()[1], done - last_c)
        warming = last_t < measure_from - 0.1  # the interval began inside the warm-up
        if not warming:
            rates.append(rate)
        last_t, last_c = now, done
        if args.refill:
            top_up(done - topped_up)
            topped_up = done
        server.start()
        label = "warm-up" if warming else f"t={now - measure_from:5.0f}s"
        print(f"    {contender} {label:>8} {rate:8.0f} jobs/s  {state}", flush=True)
    return rates


def sustained(dsn: str, args) -> None:
    n = args.sustained_workers
    print(f"\n## sustained: {args.backlog:,} job backlog, {args.duration:g} s after a {args.sustained_warmup:g} s warm-up, "
          f"{n} workers each, {args.sustained_mode} durability; jobs/s per {args.interval:g} s"
          + ("; topped up after every interval" if args.refill else "; not topped up"), flush=True)
    series: dict[str, list[float]] = {}
    for contender in args.sustained_contenders:
        started = time.time()
        (reset_pgqueuer if contender.startswith("pgqueuer") else reset_skiplock)(dsn, args.backlog)
        print(f"  {contender}: filled {args.backlog:,} jobs in {time.time() - started:.0f} s", flush=True)
        with connect(dsn) as conn:
            if contender.startswith("skiplock"):
                env = SUSTAINED_VARIANTS.get(contender, {})
                procs = start_skiplock_workers(dsn, n, args, env)
                try:
                    while conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0] < n:
                        time.sleep(0.05)
                    series[contender] = measure_intervals(
                        conn, args, contender, "skiplock.jobs",
                        lambda: conn.execute("SELECT coalesce(sum(completed), 0)::bigint FROM skiplock.workers").fetchone()[0],
                        lambda jobs: top_up_skiplock(conn, jobs))
                finally:
                    stop_skiplock_workers(procs)
            else:
                ctx = mp.get_context("fork")
                out = ctx.Queue()
                counters = [ctx.Value("q", 0, lock=False) for _ in range(n)]  # one per process, no shared lock
                clock = Clock(ctx)
                procs = [ctx.Process(target=pgqueuer_worker, args=(dsn, args.batch, contender == "pgqueuer-asyncpg", clock, counters[i], out))
                         for i in range(n)]
                for p in procs:
                    p.start()
                wait_ready(clock.count_ready, n, lambda procs=procs: all(p.is_alive() for p in procs), contender)
                clock.open_window(time.time(), float("inf"))
                series[contender] = measure_intervals(
                    conn, args, contender, "pgqueuer", lambda counters=counters: sum(c.value for c in counters),
                    lambda jobs: top_up_pgqueuer(conn, jobs))
                clock.stop()
                for _ in procs:
                    out.get(timeout=120)
                for p in procs:
                    p.join(timeout=30)
    print_sustained(series, args)


def trend(rates: list[float]) -> tuple[float, float]:
    """The least-squares line through a run's intervals: its value at the first interval and at
    the last. Over a five-minute run one odd interval moves it far less than it moves the ratio
    of two windows (a vacuum, a checkpoint, the workers' once-a-second counters landing in one
    interval or the next): a first interval at 1.4x the rest, 0.95 against the ratio's 0.82."""
    n = len(rates)
    if n < 2:
        return (rates[0], rates[0]) if rates else (0.0, 0.0)
    mean_x, mean_y = (n - 1) / 2, sum(rates) / n
    slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(rates)) / sum((i - mean_x) ** 2 for i in range(n))
    return mean_y - slope * mean_x, mean_y + slope * (n - 1 - mean_x)


def print_sustained(series: dict[str, list[float]], args) -> None:
    names = list(series)
    print(f"\n### sustained ({args.sustained_mode}): jobs/s per {args.interval:g} s\n")
    print("| t (s) | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for i in range(max(len(s) for s in series.values())):
        cells = [f"{series[name][i]:,.0f}" if i < len(series[name]) else "-" for name in names]
        print(f"| {(i + 1) * args.interval:g} | " + " | ".join(cells) + " |")
    first_n = max(1, round(10 / args.interval))
    minute_n = max(1, round(60 / args.interval))
    print()
    for name in names:
        s = series[name]
        first = sum(s[:first_n]) / len(s[:first_n])
        last = sum(s[-minute_n:]) / len(s[-minute_n:])
        mean = sum(s) / len(s)
        # The first 10 s are two intervals, and one interval swings by a third (a vacuum, a
        # checkpoint, the workers' once-a-second counters land in one or the next): the first
        # minute against the last is the steadier comparison, printed beside the issue's.
        first_minute = sum(s[:minute_n]) / len(s[:minute_n])
        start, end = trend(s)
        print(f"{name}: first 10 s {first:,.0f} jobs/s, last minute {last:,.0f} jobs/s ({last / first:.0%} of the start), "
              f"mean {mean:,.0f}; first minute {first_minute:,.0f} jobs/s, the last {last / first_minute:.0%} of it; "
              f"the fitted line {start:,.0f} -> {end:,.0f} jobs/s ({end / start:.0%})")


# --- main --------------------------------------------------------------------------------------

def describe(mode: str) -> str:
    settings = {**COMMON_SETTINGS, **MODES[mode]}
    return ", ".join(f"{k}={v}" for k, v in settings.items()) + ("" if MODES[mode] else ", fsync/synchronous_commit/full_page_writes on")


def prepare_database(cluster: PrivateCluster, *, pgqueuer: bool = True) -> str:
    with connect(cluster.dsn) as conn:
        conn.execute("CREATE DATABASE bench")
    dsn = cluster.dsn_for("bench")
    with connect(dsn) as conn:
        migrate(conn)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")  # --statements reads it

    async def install_pgqueuer() -> None:
        from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
        from pgqueuer.queries import Queries

        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        queries = Queries(PsycopgDriver(aconn))
        await queries.install()
        await queries.optimize_autovacuum()  # PGQueuer's recommended per-table settings (`pgq autovac`)
        await aconn.close()

    if pgqueuer:  # PGQueuer (the bench extra) is needed only when it is benchmarked
        asyncio.run(install_pgqueuer())
    return dsn


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="durable,relaxed", help="durable,relaxed")
    parser.add_argument("--workers", default="1,2,4,8,16", help="worker (process) counts")
    parser.add_argument("--contenders", default=None,
                        help=f"any of {','.join(CONTENDERS)} (skiplock-before needs --before-tree); "
                             "default skiplock,naive,pgqueuer,bare (--headline: skiplock,pgqueuer-asyncpg,bare-100,bare-100-apart)")
    parser.add_argument("--runs", type=int, default=3,
                        help="rounds per worker count; each round runs every contender once, in rotated order")
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="another checkout of Skiplock (e.g. main) whose worker runs as contender skiplock-before")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before the window opens")
    parser.add_argument("--cell-jobs", type=int, default=200_000, help="pre-filled jobs per cell")
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim (all contenders)")
    parser.add_argument("--concurrency", type=int, default=10, help="Skiplock handler threads per worker")
    parser.add_argument("--grid", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sustained", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sustained-mode", default="relaxed", choices=sorted(MODES))
    parser.add_argument("--sustained-contenders", default="skiplock,pgqueuer",
                        help="skiplock, pgqueuer, skiplock-novacuum (the worker's own VACUUM off) and skiplock-archive "
                             "(worker.complete_into_archive on)")
    parser.add_argument("--sustained-workers", type=int, default=4)
    parser.add_argument("--refill", action=argparse.BooleanOptionalAction, default=True,
                        help="sustained: after every interval a producer enqueues as many jobs as were completed, "
                             "so the backlog stays at --backlog minus one interval's work for the whole run")
    parser.add_argument("--backlog", type=int, default=2_000_000)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--sustained-warmup", type=float, default=10.0,
                        help="sustained: seconds each contender runs (and is topped up) before its first interval counts")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="print each cell's N costliest statements in its window (pg_stat_statements, reset as "
                             "the window opens): calls, execution time and rows per job completed")
    parser.add_argument("--waits", action="store_true",
                        help="print what each cell's backends waited on in its window (pg_stat_activity every 20 ms)")
    parser.add_argument("--with-limits", action="store_true",
                        help="give another queue and another kind limits first (the benchmarked queue has none)")
    parser.add_argument("--quick", action="store_true",
                        help="relaxed only, workers 1,2,4,16, 5 s windows, 200k backlog for 60 s")
    parser.add_argument("--headline", action="store_true",
                        help="the headline comparison `make bench` runs (about 8 minutes): relaxed only, "
                             "skiplock,pgqueuer-asyncpg,bare-100,bare-100-apart at 1,2,4,16 workers, 3 rounds, 1.5 s warm-up, 4 s windows, "
                             "400k jobs per cell (at 42 k jobs/s a 2-core machine ran 250k dry inside its 5.5 s), no sustained test; "
                             "PGQueuer's psycopg driver is left out: its asyncpg driver was the faster or tied at every count")
    args = parser.parse_args(argv)
    if args.headline:
        args.modes, args.workers, args.runs = "relaxed", "1,2,4,16", 3
        args.contenders = args.contenders or "skiplock,pgqueuer-asyncpg,bare-100,bare-100-apart"
        args.window, args.warmup, args.cell_jobs, args.sustained = 4.0, 1.5, 400_000, False
    if args.quick:
        args.modes, args.workers, args.window, args.warmup = "relaxed", "1,2,4,16", 5.0, 1.0
        args.cell_jobs, args.backlog, args.duration = 100_000, 200_000, 60.0
    args.contenders = args.contenders or "skiplock,naive,pgqueuer,bare"
    args.modes = [m for m in args.modes.split(",") if m]
    args.workers = [int(n) for n in args.workers.split(",")]
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.sustained_contenders = [c for c in args.sustained_contenders.split(",") if c]
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown or any(m not in MODES for m in args.modes):
        parser.error(f"unknown contender or mode: {sorted(unknown) or args.modes}")
    if "skiplock-before" in args.contenders and args.before_tree is None:
        parser.error("contender skiplock-before needs --before-tree PATH")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # SIGTERM (e.g. stopping a background run) unwinds like Ctrl-C: workers stop, cluster stops
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"# bench/throughput.py {' '.join(sys.argv[1:])}")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, psycopg {psycopg.__version__}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()}")
    try:
        from importlib.metadata import version
        print(f"pgqueuer {version('pgqueuer')}")
    except Exception:  # noqa: BLE001 - informational only
        pass
    modes = list(args.modes) if args.grid else []
    if args.sustained and args.sustained_mode not in modes:
        modes.append(args.sustained_mode)
    for mode in modes:
        with PrivateCluster(settings={**COMMON_SETTINGS, **MODES[mode]}) as cluster:
            args.data_dir = cluster.data_dir
            dsn = prepare_database(cluster, pgqueuer=any(c.startswith("pgqueuer") for c in args.contenders)
                                   or (args.sustained and any(c.startswith("pgqueuer") for c in args.sustained_contenders)))
            if args.with_limits:
                add_limits(dsn)
            with connect(dsn) as conn:
                print(f"\nPostgreSQL {conn.info.server_version}, {mode}: {describe(mode)}", flush=True)
            if args.grid and mode in args.modes:
                run_grid(mode, dsn, args)
            if args.sustained and mode == args.sustained_mode:
                sustained(dsn, args)
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()}")


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


if __name__ == "__main__":
    main()
