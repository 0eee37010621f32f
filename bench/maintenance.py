"""Maintenance under a live workload: archival of completed jobs and replay of dead letters.

    .venv/bin/python bench/maintenance.py                       # full size: 1,000,000 / 100,000
    .venv/bin/python bench/maintenance.py --completed 200000 --dead 20000 --phase-seconds 8

Parts (`--parts archive,replay,index`, all by default):

archive  Loads N completed jobs finished two hours ago, starts W worker processes draining a
         steady stream (a producer process enqueues --stream-rate jobs/s of a no-op kind),
         measures the workers' claim latency for --phase-seconds without maintenance, then
         archives everything older than 30 minutes with `archive_completed()` (the scheduler's
         function, default batch size and pause) while the workers keep going. Prints archived
         rows/s, p50/p99/max batch transaction time, WAL bytes per archived row (the
         pg_current_wal_insert_lsn() delta over the run, minus what the workload alone wrote at its
         baseline rate over the same time), and the claim-latency p99 with and without the
         archiver, as a ratio.
replay   The same with D dead letters replayed by `bulk.start()` + `bulk.run()` (the replayed
         jobs become pending and the same workers run them).
index    The price of `jobs_completed_idx` on the claim path: W workers drain --drain-jobs
         pending jobs with `complete_and_claim`, once on a database with the index and once
         without it (alternating, --rounds times); jobs/s and claim p50/p99 side by side.

It starts its own PostgreSQL (fsync and synchronous_commit off, full_page_writes on, so WAL
volume is realistic) unless --dsn names a server, and prints the command line with the results.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.maintenance import archive_completed, bulk  # noqa: E402
from console.pgcluster import PrivateCluster  # noqa: E402

BENCH_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "shared_buffers": "512MB",
    "max_wal_size": "4GB",
    "autovacuum_naptime": "5s",
}


# --- workload processes ------------------------------------------------------------------


def worker_proc(dsn: str, name: str, stop, out, batch: int) -> None:
    """Complete what was claimed and claim more, in one statement, as the real worker does;
    record (wall time, latency ms, jobs claimed) of every call."""
    samples: list[tuple[float, float, int]] = []
    with connect(dsn, application_name=f"bench-{name}") as conn:
        held: list[q.Job] = []
        while not stop.is_set():
            t0 = time.perf_counter()
            _, claimed = q.complete_and_claim(conn, name, held, limit=batch, lease=300)
            samples.append((time.time(), (time.perf_counter() - t0) * 1000.0, len(claimed)))
            held = claimed
            if not claimed:
                time.sleep(0.005)
        if held:
            q.complete_many(conn, held)
    out.put((name, samples))


def producer_proc(dsn: str, rate: float, stop) -> None:
    """Enqueue `rate` no-op jobs per second in chunks of 20."""
    with connect(dsn, application_name="bench-producer") as conn:
        chunk = 20
        interval = chunk / rate
        next_at = time.perf_counter()
        while not stop.is_set():
            q.enqueue_many(conn, [q.NewJob("noop", {}) for _ in range(chunk)])
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)


class Workload:
    """W worker processes and (optionally) a producer; collects their claim samples."""

    def __init__(self, dsn: str, workers: int, stream_rate: float, batch: int):
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.out = ctx.Queue()
        self.procs = [ctx.Process(target=worker_proc, args=(dsn, f"w{i}", self.stop, self.out, batch)) for i in range(workers)]
        if stream_rate > 0:
            self.procs.append(ctx.Process(target=producer_proc, args=(dsn, stream_rate, self.stop)))
        self.workers = workers

    def __enter__(self) -> Workload:
        for p in self.procs:
            p.start()
        return self

    def finish(self) -> list[tuple[float, float, int]]:
        self.stop.set()
        samples: list[tuple[float, float, int]] = []
        for _ in range(self.workers):
            _, got = self.out.get(timeout=120)
            samples += got
        for p in self.procs:
            p.join(30)
        return samples

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()


# --- figures ---------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def window(samples, start: float, end: float) -> list[float]:
    return [ms for at, ms, _ in samples if start <= at < end]


def wal_lsn(conn) -> int:
    return conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()[0]


def load_completed(conn, n: int) -> None:
    step = 100_000
    for lo in range(0, n, step):
        conn.execute(
            """
            INSERT INTO skiplock.jobs (queue, kind, payload, status, attempts, created_at, run_at, finished_at)
            SELECT 'default', 'noop', jsonb_build_object('n', g), 'completed', 1,
                   now() - interval '2 hours 1 minute', now() - interval '2 hours 1 minute',
                   now() - interval '2 hours' + g * interval '1 millisecond'
            FROM generate_series(%s::integer, %s::integer) AS g
            """,
            (lo + 1, min(lo + step, n)),
        )
    conn.execute("VACUUM ANALYZE skiplock.jobs")


def load_dead(conn, n: int) -> None:
    step = 50_000
    for lo in range(0, n, step):
        conn.execute(
            """
            INSERT INTO skiplock.jobs (queue, kind, payload, status, attempts, max_attempts, last_error,
                                       error_fingerprint, errors, finished_at)
            SELECT 'default', 'noop', jsonb_build_object('order', g), 'failed', 5, 5,
                   'RuntimeError: boom ' || g, 'RuntimeError: boom <n>',
                   jsonb_build_array(jsonb_build_object('attempt', 5, 'error_class', 'RuntimeError',
                                                        'message', 'boom ' || g)),
                   now() - interval '1 hour' + g * interval '1 millisecond'
            FROM generate_series(%s::integer, %s::integer) AS g
            """,
            (lo + 1, min(lo + step, n)),
        )
    conn.execute("VACUUM ANALYZE skiplock.jobs")


def fresh_database(admin_dsn: str, name: str, *, drop_completed_index: bool = False) -> str:
    with connect(admin_dsn) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    with connect(dsn) as conn:
        migrate(conn)
        if drop_completed_index:
            conn.execute("DROP INDEX skiplock.jobs_completed_idx")
    return dsn


def maintenance_under_load(args, admin_dsn: str, what: str) -> dict:
    dsn = fresh_database(admin_dsn, f"bench_maint_{what}")
    with connect(dsn) as conn:
        t0 = time.perf_counter()
        if what == "archive":
            load_completed(conn, args.completed)
            size = args.completed
        else:
            load_dead(conn, args.dead)
            size = args.dead
        print(f"[{what}] loaded {size:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)

        with Workload(dsn, args.workers, args.stream_rate, args.claim_batch) as load:
            time.sleep(2)  # warm-up
            base_start, base_wal = time.time(), wal_lsn(conn)
            time.sleep(args.phase_seconds)
            base_end, base_wal_end = time.time(), wal_lsn(conn)
            batch_ms: list[float] = []
            run_start, run_wal = time.time(), wal_lsn(conn)
            t0 = time.perf_counter()
            if what == "archive":
                result = archive_completed(conn, older_than=timedelta(minutes=30), batch_size=args.batch_size,
                                           pause_ms=args.pause_ms, rate=None)
                rows, batch_ms = result.rows, result.batch_ms
            else:
                op_id = bulk.start(conn, "replay", {"all": True}, actor="bench", batch_size=args.batch_size,
                                   rate=args.replay_rate or None)
                final = bulk.run(dsn, op_id, on_batch=lambda n, ms: batch_ms.append(ms))
                rows = final["done"]
            seconds = time.perf_counter() - t0
            run_end, run_wal_end = time.time(), wal_lsn(conn)
            samples = load.finish()

    base_wal_rate = (base_wal_end - base_wal) / (base_end - base_start)
    wal_total = run_wal_end - run_wal
    wal_net = wal_total - base_wal_rate * (run_end - run_start)
    before = window(samples, base_start, base_end)
    during = window(samples, run_start, run_end)
    return {
        "what": what, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds if seconds else 0.0,
        "batches": len(batch_ms), "batch_p50": pct(batch_ms, 50), "batch_p99": pct(batch_ms, 99),
        "batch_max": max(batch_ms) if batch_ms else float("nan"),
        "wal_per_row": wal_net / rows if rows else float("nan"), "wal_per_row_raw": wal_total / rows if rows else float("nan"),
        "claims_before": len(before), "claims_during": len(during),
        "claim_p50_before": pct(before, 50), "claim_p99_before": pct(before, 99),
        "claim_p50_during": pct(during, 50), "claim_p99_during": pct(during, 99),
        "claimed_during": sum(n for at, _, n in samples if run_start <= at < run_end),
    }


def drain(dsn: str, jobs: int, workers: int, batch: int) -> tuple[float, list[float]]:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs")
        q.enqueue_many(conn, [q.NewJob("noop", {}) for _ in range(jobs)])
        conn.execute("VACUUM ANALYZE skiplock.jobs")
        with Workload(dsn, workers, 0, batch) as load:
            t0 = time.perf_counter()
            while conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status <> 'completed'").fetchone()[0]:
                time.sleep(0.2)
            seconds = time.perf_counter() - t0
            samples = load.finish()
    return jobs / seconds, [ms for _, ms, n in samples if n]


def index_cost(args, admin_dsn: str) -> list[dict]:
    dbs = {
        "with jobs_completed_idx": fresh_database(admin_dsn, "bench_maint_idx_with"),
        "without it": fresh_database(admin_dsn, "bench_maint_idx_without", drop_completed_index=True),
    }
    results: dict[str, list] = {k: [] for k in dbs}
    for r in range(args.rounds):
        for label, dsn in dbs.items():
            rate, lat = drain(dsn, args.drain_jobs, args.workers, args.claim_batch)
            results[label].append((rate, lat))
            print(f"[index] round {r + 1} {label}: {rate:,.0f} jobs/s", flush=True)
    out = []
    for label, runs in results.items():
        lat = [x for _, ls in runs for x in ls]
        out.append({"label": label, "jobs_per_s": statistics.median(r for r, _ in runs),
                    "claim_p50": pct(lat, 50), "claim_p99": pct(lat, 99)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="an existing server (admin DSN: databases bench_maint_* are created)")
    parser.add_argument("--parts", default="archive,replay,index")
    parser.add_argument("--completed", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--stream-rate", type=float, default=500.0, help="jobs/s the producer enqueues")
    parser.add_argument("--claim-batch", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--pause-ms", type=float, default=10.0)
    parser.add_argument("--replay-rate", type=float, default=0.0, help="throttle of the replay in rows/s (0: none)")
    parser.add_argument("--phase-seconds", type=float, default=15.0, help="baseline measurement without maintenance")
    parser.add_argument("--drain-jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    cluster = None
    admin = args.dsn
    if not admin:
        cluster = PrivateCluster(settings=BENCH_SETTINGS)
        cluster.start()
        admin = cluster.dsn
    try:
        results = [maintenance_under_load(args, admin, what) for what in ("archive", "replay") if what in parts]
        index = index_cost(args, admin) if "index" in parts else []
    finally:
        if cluster is not None:
            cluster.stop()

    print()
    print("command: " + " ".join(["python", "bench/maintenance.py", *sys.argv[1:]]))
    print(f"machine: {os.cpu_count()} cores (shared with other work); {args.workers} workers, "
          f"stream {args.stream_rate:g} jobs/s, maintenance batch {args.batch_size}, pause {args.pause_ms:g} ms, "
          f"replay rate {args.replay_rate or 'unthrottled'}")
    if results:
        print()
        print("| task | rows | rows/s | batch p50 / p99 / max (ms) | WAL bytes/row (net; raw) | claim p99 without → with (ms) | ratio |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            ratio = r["claim_p99_during"] / r["claim_p99_before"] if r["claim_p99_before"] else float("nan")
            print(f"| {r['what']} | {r['rows']:,} | {r['rows_per_s']:,.0f} | {r['batch_p50']:.1f} / {r['batch_p99']:.1f} / "
                  f"{r['batch_max']:.1f} | {r['wal_per_row']:,.0f}; {r['wal_per_row_raw']:,.0f} | "
                  f"{r['claim_p99_before']:.2f} → {r['claim_p99_during']:.2f} | {ratio:.2f} |")
        for r in results:
            print(f"  {r['what']}: {r['batches']} batches in {r['seconds']:.1f} s; claims measured {r['claims_before']:,} "
                  f"before / {r['claims_during']:,} during (p50 {r['claim_p50_before']:.2f} → {r['claim_p50_during']:.2f} ms); "
                  f"jobs claimed during: {r['claimed_during']:,}")
    if index:
        print()
        print("| claim path | jobs/s (median of rounds) | claim p50 (ms) | claim p99 (ms) |")
        print("|---|---|---|---|")
        for r in index:
            print(f"| {r['label']} | {r['jobs_per_s']:,.0f} | {r['claim_p50']:.2f} | {r['claim_p99']:.2f} |")


if __name__ == "__main__":
    main()
