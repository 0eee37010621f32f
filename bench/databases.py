#!/usr/bin/env python
"""What one console can watch: a collection cycle over N databases.

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster), makes N migrated databases
in it (each with a few queued jobs), and measures, for each N given:
- `serial`: one collection cycle per database in turn, as `skiplock collect --once` does;
- `fleet`: one cycle of every database at once, as `skiplock scheduler` runs them (each
  database's collect job in its own thread of the Fleet's APScheduler pool), best of --runs;
- `fleet_api`: one `/api/v1/databases` answer over the N databases (read in parallel), not
  cached (`web.fleet_seconds = 0`): what one read of the fleet costs, best of --runs;
- `fleet_page_p95`: the p95 of `/databases` (the page) under a crowd: --crowd threads (20), each
  signed in, polling --polls times (10: 200 requests) --gap seconds apart (1 s, so the crowd
  spans a bucket change or two), through the WSGI app with `web.fleet_seconds` = --fleet-seconds
  (10, the default). One poll before the crowd, as a console that has been running has its
  previous read; `reads` is how many times the crowd read the fleet (one per bucket expected).
Many databases in one cluster share its CPU; separate servers would only do better.

    .venv/bin/python bench/databases.py                 # 10 and 50 databases
    .venv/bin/python bench/databases.py --sizes 10 --runs 3
    .venv/bin/python bench/databases.py --sizes 50 --runs 3 --crowd 20 --polls 10 --gap 1
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console import queue as q  # noqa: E402
from console.collectors import Options, collect, collector_connection  # noqa: E402
from console.config import load_config  # noqa: E402
from console.databases import load_databases  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.scheduler import Fleet  # noqa: E402


def client_of(app, token: str):
    """A test client of `app` signed in with session `token`."""
    client = app.test_client()
    with client.session_transaction() as session:
        session["sid"] = token
    return client


def crowd_polls(app, token: str, crowd: int, polls: int, gap: float) -> list[float]:
    """`crowd` threads, each polling /databases `polls` times `gap` seconds apart: the seconds
    each answer took, sorted."""
    latencies: list[float] = []
    lock = threading.Lock()

    def poll(_: int) -> None:
        client = client_of(app, token)
        time.sleep(random.uniform(0, gap))  # the crowd does not arrive in step
        for _ in range(polls):
            t0 = time.perf_counter()
            page = client.get("/databases")
            took = time.perf_counter() - t0
            assert page.status_code == 200, page.status_code
            with lock:
                latencies.append(took)
            time.sleep(max(0.0, gap - took))

    with ThreadPoolExecutor(max_workers=crowd) as threads:
        list(threads.map(poll, range(crowd)))
    return sorted(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,50", help="numbers of databases, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--crowd", type=int, default=20, help="threads polling the fleet page at once")
    parser.add_argument("--polls", type=int, default=10, help="requests per thread")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between one thread's polls")
    parser.add_argument("--fleet-seconds", type=float, default=10.0, help="web.fleet_seconds of the crowd's app")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    os.environ.pop("DATABASE_URL", None)
    cluster = PrivateCluster(settings={**RELAXED_DURABILITY, "max_connections": str(20 + 8 * max(sizes))})
    cluster.start()
    try:
        with connect(cluster.dsn) as conn:
            conn.execute("CREATE DATABASE bench_template")
        with connect(cluster.dsn_for("bench_template")) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(conn)
        made = 0
        print(f"{'databases':>9}  {'serial s':>9}  {'fleet s':>8}  {'fleet_api s':>11}  {'per db ms (serial)':>18}  "
              f"{'fleet_page_p95 ms':>17}  {'max ms':>7}  {'requests':>8}  {'reads':>5}")
        for n in sizes:
            with connect(cluster.dsn) as conn:
                for i in range(made, n):
                    conn.execute(f'CREATE DATABASE "db{i:03d}" TEMPLATE bench_template')
            for i in range(made, n):
                with connect(cluster.dsn_for(f"db{i:03d}"), autocommit=False) as c:
                    for j in range(20):
                        q.enqueue(c, "noop", queue=f"q{j % 3}")
                    c.commit()
            made = n
            config_path = Path(tempfile.mkdtemp(prefix="skiplock-bench-")) / "skiplock.toml"
            config_path.write_text(
                '[web]\nsecret_key = "k"\nproduction = false\n\n'
                + "".join(f'[[databases]]\nname = "db{i:03d}"\ndsn = "{cluster.dsn_for(f"db{i:03d}")}"\n\n'
                          for i in range(n)), encoding="utf-8")
            config = load_config(config_path, env={})
            databases = load_databases(config, env={})
            options = Options.from_config(config)
            serial, fleet_times, api_times = [], [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                for d in databases:
                    with collector_connection(d.dsn, options) as c:
                        collect(c, options, leader="bench")
                serial.append(time.perf_counter() - t0)
            fleet = Fleet(databases, config)
            try:
                fleet.elect()
                workers = ThreadPoolExecutor(max_workers=len(databases))
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    list(workers.map(lambda m: m.run_job("collect"), fleet.members.values()))
                    fleet_times.append(time.perf_counter() - t0)
                workers.shutdown()
            finally:
                fleet.close()
            from console.users import _hasher, start_session
            from console.web import create_app
            from console.web import fleet as web_fleet

            with connect(databases[0].dsn) as c:
                c.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES ('b', %s, 'viewer') "
                          "ON CONFLICT DO NOTHING", (_hasher.hash("x"),))
                token = start_session(c, "b", "127.0.0.1", "bench")

            # Not cached: every answer reads every database (what a cache miss costs).
            app = create_app(load_config(config_path, env={"SKIPLOCK_WEB_FLEET_SECONDS": "0"}))
            try:
                client = client_of(app, token)
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    rows = client.get("/api/v1/databases").get_json()["databases"]
                    api_times.append(time.perf_counter() - t0)
                    assert len(rows) == n and all(r["reachable"] for r in rows), rows[:1]
            finally:
                app.extensions["skiplock"].close()
            # The crowd, against the cached fleet page.
            app = create_app(load_config(config_path, env={"SKIPLOCK_WEB_FLEET_SECONDS": str(args.fleet_seconds)}))
            try:
                assert client_of(app, token).get("/databases").status_code == 200  # the previous read
                reads_before = web_fleet.reads
                latencies = crowd_polls(app, token, args.crowd, args.polls, args.gap)
                reads = web_fleet.reads - reads_before
            finally:
                app.extensions["skiplock"].close()
            p95 = latencies[max(0, int(len(latencies) * 0.95) - 1)]
            print(f"{n:>9}  {min(serial):>9.2f}  {min(fleet_times):>8.2f}  {min(api_times):>11.2f}  "
                  f"{statistics.median(serial) / n * 1000:>18.0f}  {p95 * 1000:>17.0f}  {latencies[-1] * 1000:>7.0f}  "
                  f"{len(latencies):>8}  {reads:>5}")
    finally:
        cluster.stop(mode="immediate")


if __name__ == "__main__":
    main()
