#!/usr/bin/env python
"""What an xmin-horizon holder costs a queue (issue 28 target 3), Skiplock and PGQueuer side by side.

A sustained run per contender on one throwaway PostgreSQL (bench/throughput.py's cluster, relaxed
durability, PostgreSQL's default autovacuum): a backlog kept full (topped up after every interval,
as throughput.py's sustained test does), `--workers` worker processes, and a `REPEATABLE READ`
session that takes its snapshot at `--holder-at` seconds and holds it for `--holder-for` seconds.
While it holds, vacuum can remove no row that died after its snapshot: every claimed and
completed job leaves dead versions in the table and dead entries at the head of the claim index,
which every later claim walks past.

Printed per interval: jobs/s and the queue table's dead tuples (pg_stat_user_tables) of each
contender; per phase (before, while held, after): the mean jobs/s, and for Skiplock the claim
p50/p99 from its workers' registry histograms (the console's own buckets). PGQueuer's dequeue
latency is not split by phase (its worker reports one histogram at its end).

    .venv/bin/python bench/xmin_holder.py                       # 5 min each: holder at 60 s for 180 s
    .venv/bin/python bench/xmin_holder.py --duration 60 --holder-at 15 --holder-for 30   # a quick look
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import throughput as tp  # noqa: E402

from console.db import connect  # noqa: E402
from console.histogram import delta, quantile  # noqa: E402
from console.pgcluster import PrivateCluster  # noqa: E402

# skiplock-head: the same worker with worker.claim_resume_ms = 0 (every claim from the head of
# the claim index, as before console/queue/resume_point.py)
TABLE = {"skiplock": "jobs", "skiplock-head": "jobs", "pgqueuer": "pgqueuer", "pgqueuer-asyncpg": "pgqueuer"}


def dead_tuples(conn, table: str) -> int:
    row = conn.execute("SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()
    return int(row[0]) if row else 0


class Holder:
    """A REPEATABLE READ transaction whose snapshot holds the database's xmin horizon."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = None

    def open(self) -> None:
        self.conn = connect(self.dsn, application_name="bench-xmin-holder", autocommit=False)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.conn.execute("SELECT count(*) FROM pg_class")  # the snapshot is taken here

    def close(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


def phase_of(t: float, args) -> str:
    if t <= args.holder_at:
        return "before"
    return "held" if t <= args.holder_at + args.holder_for else "after"


def run(contender: str, dsn: str, args) -> dict:
    (tp.reset_pgqueuer if contender.startswith("pgqueuer") else tp.reset_skiplock)(dsn, args.backlog)
    holder = Holder(dsn)
    rows: list[dict] = []
    hists: dict[str, list[int]] = {}
    with connect(dsn) as conn:
        if contender.startswith("skiplock"):
            env = {"SKIPLOCK_WORKER_CLAIM_RESUME_MS": "0"} if contender == "skiplock-head" else {}
            procs = tp.start_skiplock_workers(dsn, args.workers, args, env)
            tp.wait_ready(lambda: conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0], args.workers,
                          lambda: all(p.poll() is None for p in procs), contender)

            def done() -> int:
                return conn.execute("SELECT coalesce(sum(completed), 0)::bigint FROM skiplock.workers").fetchone()[0]
        else:
            ctx = mp.get_context("fork")
            out = ctx.Queue()
            counters = [ctx.Value("q", 0, lock=False) for _ in range(args.workers)]
            clock = tp.Clock(ctx)
            procs = [ctx.Process(target=tp.pgqueuer_worker,
                                 args=(dsn, args.batch, contender == "pgqueuer-asyncpg", clock, counters[i], out))
                     for i in range(args.workers)]
            for p in procs:
                p.start()
            tp.wait_ready(clock.count_ready, args.workers, lambda: all(p.is_alive() for p in procs), contender)

            def done() -> int:
                return sum(c.value for c in counters)
        try:
            start = time.time()
            if not contender.startswith("skiplock"):
                clock.open_window(start, start + args.duration)
            last_t, last_c, topped = start, done(), 0
            phase_hist_start = tp.registry_histogram(conn)[0] if contender.startswith("skiplock") else None
            current_phase = "before"
            while time.time() < start + args.duration - 0.1:
                time.sleep(args.interval)
                now, count = time.time(), done()
                t = now - start
                if holder.conn is None and args.holder_at < t <= args.holder_at + args.holder_for:
                    holder.open()
                elif holder.conn is not None and t > args.holder_at + args.holder_for:
                    holder.close()
                rate = (count - last_c) / (now - last_t)
                prev_phase = phase_of(t - args.interval / 2, args)
                rows.append({"t": t, "rate": rate, "dead": dead_tuples(conn, TABLE[contender]), "phase": prev_phase})
                if contender.startswith("skiplock"):
                    phase = phase_of(t + 0.01, args)
                    if phase != current_phase:
                        hist_now = tp.registry_histogram(conn)[0]
                        hists[current_phase] = delta(hist_now, phase_hist_start)
                        phase_hist_start, current_phase = hist_now, phase
                last_t, last_c = now, count
                if args.refill:
                    (tp.top_up_pgqueuer if contender.startswith("pgqueuer") else tp.top_up_skiplock)(conn, count - topped)
                    topped = count
                print(f"    {contender} t={t:5.0f}s {rate:8.0f} jobs/s  dead tuples {rows[-1]['dead']:>10,}"
                      f"{'  (held)' if holder.conn is not None else ''}", flush=True)
            if contender.startswith("skiplock"):
                time.sleep(1.1)  # one more counter flush
                hists[current_phase] = delta(tp.registry_histogram(conn)[0], phase_hist_start)
        finally:
            holder.close()
            if contender.startswith("skiplock"):
                tp.stop_skiplock_workers(procs)
            else:
                clock.stop()
                for _ in procs:
                    out.get(timeout=120)
                for p in procs:
                    p.join(timeout=30)
    return {"rows": rows, "hists": hists}


def summarize(name: str, result: dict) -> dict:
    by_phase: dict[str, list[dict]] = {}
    for row in result["rows"]:
        by_phase.setdefault(row["phase"], []).append(row)
    summary = {}
    for phase in ("before", "held", "after"):
        rows = by_phase.get(phase, [])
        if not rows:
            continue
        hist = result["hists"].get(phase)
        summary[phase] = {
            "rate": sum(r["rate"] for r in rows) / len(rows),
            "dead_max": max(r["dead"] for r in rows),
            "p50": quantile(hist, 0.5) if hist else None,
            "p99": quantile(hist, 0.99) if hist else None,
        }
    return summary


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contenders", default="skiplock,skiplock-head,pgqueuer-asyncpg")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per contender")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--holder-at", type=float, default=60.0)
    parser.add_argument("--holder-for", type=float, default=180.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--refill", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(contenders) - set(TABLE)
    if unknown:
        parser.error(f"unknown contender(s): {sorted(unknown)}; known: {sorted(TABLE)}")
    if not 0 < args.holder_at < args.holder_at + args.holder_for < args.duration:
        parser.error("need 0 < --holder-at < --holder-at + --holder-for < --duration")
    print(f"# bench/xmin_holder.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")
    results = {}
    with PrivateCluster(settings={**tp.COMMON_SETTINGS, **tp.MODES["relaxed"]}) as cluster:
        dsn = tp.prepare_database(cluster, pgqueuer=any(c.startswith("pgqueuer") for c in contenders))
        with connect(dsn) as conn:
            print(f"PostgreSQL {conn.info.server_version}, relaxed durability, {args.workers} workers each, "
                  f"{args.backlog:,} backlog kept full, holder from {args.holder_at:g} s for {args.holder_for:g} s", flush=True)
        for contender in contenders:
            results[contender] = summarize(contender, run(contender, dsn, args))
    print("\n| contender | phase | jobs/s (mean) | of before | dead tuples (max) | claim p50 ms | claim p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, summary in results.items():
        before = summary.get("before", {}).get("rate") or 0.0
        for phase, s in summary.items():
            share = f"{s['rate'] / before:.0%}" if before else "-"
            print(f"| {name} | {phase} | {s['rate']:,.0f} | {share} | {s['dead_max']:,} | {ms(s['p50'])} | {ms(s['p99'])} |")
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {tp.loadavg()}")
    print(f"command: .venv/bin/python bench/xmin_holder.py {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
