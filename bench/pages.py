#!/usr/bin/env python
"""Server time per console page on a large jobs table with live workers running.

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster, relaxed durability), fills
skiplock.jobs with `--rows` jobs (default 10,000,000: 94 % completed, 5 % pending, 0.8 % failed
in a few error groups, some running and scheduled), runs two collection cycles plus an hour of
stored history so the charts have series, starts `--workers` real `skiplock worker` processes
working a live queue that an enqueuer keeps fed, then requests every page `--requests` times
(default 50) through the WSGI app in this process, signed in as an operator, and prints the
median and p95 server time of each (the time to build the response: queries + rendering).
Every response's status is recorded: any that is not 200 is flagged in its row, and the run
exits 1 naming the page, URL and status (a fast error page is not a fast page).

    .venv/bin/python bench/pages.py                      # 10 M rows (several minutes to load)
    .venv/bin/python bench/pages.py --rows 1000000 --requests 20
    .venv/bin/python bench/pages.py --dsn postgresql://... # an existing migrated database

Targets (issue 5): every page under 150 ms p95, the jobs browser's first page under 100 ms
whatever the filter. The machine may be shared: say so next to the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402

FILL_SQL = """
INSERT INTO skiplock.jobs (queue, kind, payload, status, priority, run_at, attempts, max_attempts,
                           last_error, error_fingerprint, created_at, finished_at, locked_by, locked_at, lease_until)
SELECT
    (ARRAY['default', 'mail', 'billing', 'reports', 'webhooks'])[1 + g %% 5],
    (ARRAY['send_mail', 'charge_card', 'render_report', 'deliver_webhook', 'resize_image'])[1 + (g / 5) %% 5],
    jsonb_build_object('customer', g %% 100000, 'n', g),
    s.status,
    0,
    CASE WHEN s.status = 'pending' AND g %% 10 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END,
    CASE WHEN s.status IN ('completed', 'pending') THEN 1 ELSE 5 END,
    5,
    CASE WHEN s.status = 'failed' THEN (ARRAY['TimeoutError: SMTP server timed out',
                                              'ValueError: card declined',
                                              'KeyError: template'])[1 + g %% 3] END,
    CASE WHEN s.status = 'failed' THEN (ARRAY['TimeoutError: SMTP server timed out',
                                              'ValueError: card declined',
                                              'KeyError: template'])[1 + g %% 3] END,
    now() - make_interval(secs => (%(rows)s - g) * 0.05),
    CASE WHEN s.status IN ('completed', 'failed') THEN now() - make_interval(secs => (%(rows)s - g) * 0.05) END,
    CASE WHEN s.status = 'running' THEN 'bench-worker' END,
    CASE WHEN s.status = 'running' THEN now() END,
    CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END
FROM generate_series(%(start)s, %(stop)s) AS g
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN g %% 1000 < 940 THEN 'completed'
        WHEN g %% 1000 < 990 THEN 'pending'
        WHEN g %% 1000 < 998 THEN 'failed'
        ELSE 'running'
    END AS status
) AS s
"""


def fill(dsn: str, rows: int, chunk: int = 1_000_000) -> None:
    with connect(dsn) as conn:
        have = conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0]
        if have >= rows:
            print(f"jobs table already has {have:,} rows", flush=True)
            return
        t0 = time.perf_counter()
        for start in range(have + 1, rows + 1, chunk):
            stop = min(start + chunk - 1, rows)
            conn.execute(FILL_SQL, {"start": start, "stop": stop, "rows": rows})
            print(f"  {stop:,} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
        conn.execute("VACUUM (ANALYZE) skiplock.jobs")
        print(f"filled and vacuumed in {time.perf_counter() - t0:.0f} s", flush=True)


def start_workers(dsn: str, n: int) -> list[subprocess.Popen]:
    env = dict(os.environ)
    env.update({"DATABASE_URL": dsn, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")]),
                "SKIPLOCK_WORKER_FLUSH_INTERVAL": "1"})
    cmd = [sys.executable, "-m", "console", "worker", "--tasks", "noop_tasks", "--queues", "live", "--concurrency", "4"]
    return [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def enqueuer(dsn: str, stop: threading.Event, per_second: int) -> None:
    with connect(dsn) as conn:
        while not stop.is_set():
            q.enqueue_many(conn, [{"kind": "noop", "payload": {"i": i}, "queue": "live"} for i in range(max(1, per_second // 10))])
            stop.wait(0.1)


def prepare_samples(dsn: str) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.oncall_data import store_history

    with connect(dsn) as conn:
        store_history(conn, failing="billing", minutes=60, step_s=15)
    try:
        from console.collectors import collect_once

        for _ in range(2):
            collect_once(dsn)
            time.sleep(1)
    except ImportError:
        pass


def pages(dsn: str) -> list[tuple[str, str]]:
    with connect(dsn) as conn:
        job = conn.execute("SELECT max(id) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0]
    return [
        ("overview", "/overview"),
        ("overview 7d", "/overview?window=7d"),
        ("overview figures (poll)", "/overview/_figures"),
        ("overview API", "/api/v1/overview"),
        ("queues", "/queues"),
        ("queue", "/queues/billing"),
        ("queue charts", "/overview/queue/billing/_charts"),
        ("jobs (first page)", "/jobs"),
        ("jobs failed", "/jobs?state=failed"),
        ("jobs pending in a queue", "/jobs?state=pending&queue=mail"),
        ("jobs by kind", "/jobs?kind=render_report"),
        ("jobs payload filter", '/jobs?payload={"customer": 4242}'),
        ("job detail", f"/jobs/{job}"),
        ("dead letters", "/deadletters"),
        ("dead letters group", "/deadletters/jobs?fingerprint=ValueError: card declined"),
        ("workers", "/workers"),
        ("database health", "/health"),
        ("maintenance", "/maintenance"),
        ("audit", "/audit"),
        ("advisor", "/advisor"),
        ("advisor checks (poll)", "/advisor/_checks"),
    ]


def measure(dsn: str, requests: int) -> tuple[list[tuple[str, float, float, int]], list[str]]:
    """(name, median ms, p95 ms, last status) per page, and every non-200 response as
    "page URL: HTTP status (n of m)" (the run fails on any)."""
    from console.users import _hasher, start_session
    from console.web import create_app

    with connect(dsn) as conn:
        conn.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES ('bench', %s, 'operator') "
                     "ON CONFLICT (name) DO NOTHING", (_hasher.hash("bench-password"),))
        token = start_session(conn, "bench", "127.0.0.1", "bench/pages.py")
    # Production mode is the default; the test client speaks plain HTTP, so the Secure session
    # cookie would never come back. Sessions are server-side rows (as the login form makes).
    app = create_app({"database.dsn": dsn, "web.secret_key": "bench", "web.production": False})
    client = app.test_client()
    with client.session_transaction() as session:
        session["sid"] = token
        session["csrf"] = "bench"
    out = []
    bad: list[str] = []
    for name, url in pages(dsn):
        times = []
        statuses: list[int] = []
        for _ in range(requests + 2):
            t0 = time.perf_counter()
            resp = client.get(url)
            resp.get_data()
            times.append((time.perf_counter() - t0) * 1000)
            statuses.append(resp.status_code)
        times = times[2:]  # the first two warm caches and prepared statements
        p95 = statistics.quantiles(times, n=20)[18] if len(times) >= 20 else max(times)
        out.append((name, statistics.median(times), p95, statuses[-1]))
        for status in sorted(set(statuses) - {200}):
            bad.append(f"{name} ({url}): HTTP {status} ({statuses.count(status)} of {len(statuses)})")
        flag = "" if set(statuses) == {200} else "   NOT ALL 200: " + ", ".join(map(str, sorted(set(statuses))))
        print(f"{name:28} {statistics.median(times):8.1f} ms {p95:8.1f} ms   HTTP {statuses[-1]}{flag}", flush=True)
    app.extensions["skiplock"].close()
    return out, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--enqueue-rate", type=int, default=200, help="live jobs per second fed to the workers")
    parser.add_argument("--dsn", help="an existing database (migrated here); default: a private cluster")
    args = parser.parse_args()
    command = "bench/pages.py " + " ".join(sys.argv[1:])
    failed: list[str] = []  # every non-200 response; the run exits 1 naming them

    def run(dsn: str) -> None:
        with connect(dsn) as conn:
            migrate(conn)
            print(f"PostgreSQL {conn.info.server_version}; {os.cpu_count()} CPUs", flush=True)
        fill(dsn, args.rows)
        prepare_samples(dsn)
        workers = start_workers(dsn, args.workers)
        stop = threading.Event()
        feeder = threading.Thread(target=enqueuer, args=(dsn, stop, args.enqueue_rate), daemon=True)
        feeder.start()
        time.sleep(3)
        try:
            print(f"\n{'page':28} {'median':>11} {'p95':>11}   ({args.requests} requests each, "
                  f"{args.workers} live workers, {args.rows:,} rows)", flush=True)
            results, bad = measure(dsn, args.requests)
        finally:
            stop.set()
            for w in workers:
                w.terminate()
            for w in workers:
                try:
                    w.wait(15)
                except subprocess.TimeoutExpired:
                    w.kill()
        worst = max(results, key=lambda r: r[2])
        print(f"\nslowest p95: {worst[0]} {worst[2]:.1f} ms; command: {command}; load average {os.getloadavg()}")
        if bad:
            failed.extend(bad)

    if args.dsn:
        run(args.dsn)
    else:
        with PrivateCluster(settings={**RELAXED_DURABILITY, "shared_buffers": "1GB", "max_wal_size": "4GB"}) as cluster:
            with connect(cluster.dsn) as conn:
                conn.execute("CREATE DATABASE bench")
            run(cluster.dsn_for("bench"))
    if failed:
        print("\nFAILED: pages that did not answer 200 (their timings mean nothing):", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
