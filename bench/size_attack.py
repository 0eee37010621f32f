#!/usr/bin/env python
"""What a wide fleet costs each page: size (always) and server time (with --time) of the pages,
their polls, the JSON API and /metrics with 5,000 queues, 2,000 kinds and 1,001 error groups.

Issue 26, class 9 ("size as an attack"): whatever a producer can create in bulk must not make
a page or /metrics unbounded. Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster),
seeds the jobs with SQL (tests/fleet_data.py), runs two collection cycles so the samples are
what the collectors store, then requests every URL through the WSGI app in this process, signed
in as an operator, and prints each answer's bytes, rows shown and "N more" note, and with
`--time` the median and p95 server time over `--requests` requests.

    .venv/bin/python bench/size_attack.py                 # sizes only (any machine)
    .venv/bin/python bench/size_attack.py --time          # and times: on a quiet machine only
    .venv/bin/python bench/size_attack.py --queues 20000  # wider
    .venv/bin/python bench/size_attack.py --time --history 15  # with 15 minutes of samples

Two collection cycles leave two cycles of samples, where a fleet that has run a while has a
history: the Queues page's drain estimates read the last 15 minutes of each queue's backlog.
`--history M` stores M minutes of earlier cycles (copies of the newest cycle's samples, one
statement a cycle every 15 s so the triggers run as in production, each value moved a little).

Timings on a shared machine say nothing: the script prints the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402

URLS = [
    ("overview", "/overview"),
    ("overview verdict (poll)", "/overview/_verdict"),
    ("overview figures (poll)", "/overview/_figures"),
    ("overview queues (poll)", "/overview/_queues"),
    ("overview API", "/api/v1/overview"),
    ("queues", "/queues"),
    ("queues table (poll)", "/queues/_table"),
    ("queues API", "/api/v1/queues"),
    ("queues search", "/queues?q=fleet-049"),
    ("dead letters", "/deadletters"),
    ("dead letters API", "/api/v1/deadletters"),
    ("alerts", "/alerts"),
    ("alerts API", "/api/v1/alerts"),
    ("search", "/search?q=fleet"),
    ("metrics", "/metrics"),
]


# One earlier cycle: the newest cycle's samples %(ago)s seconds back, each value moved by up to 3
# (never below 0) so the backlog's trend is not flat.
EARLIER_CYCLE = """
INSERT INTO skiplock.samples (collected_at, metric, labels, value)
SELECT s.collected_at - make_interval(secs => %(ago)s), s.metric, s.labels,
       CASE WHEN s.value IS NULL THEN NULL ELSE greatest(s.value + (%(step)s %% 7) - 3, 0) END
FROM skiplock.samples AS s
WHERE s.collected_at = (SELECT max(c.started_at) FROM skiplock.collection_runs AS c)"""


def store_history(dsn: str, minutes: int, interval: float = 15.0) -> None:
    """`minutes` of earlier cycles before the newest (see the module's docstring)."""
    with connect(dsn) as conn:
        t0 = time.perf_counter()
        cycles = int(minutes * 60 / interval)
        for step in range(1, cycles + 1):
            with conn.transaction():
                conn.execute(EARLIER_CYCLE, {"ago": step * interval, "step": step})
        conn.execute("VACUUM ANALYZE skiplock.samples")
        print(f"history: {cycles} earlier cycles in {time.perf_counter() - t0:.1f} s", flush=True)


def seed(dsn: str, queues: int, kinds: int, groups: int, history: int = 0) -> None:
    from console.alerts import evaluate, rules
    from console.collectors import collect_once
    from console.config import load_config
    from tests.fleet_data import seed_fleet

    with connect(dsn) as conn:
        t0 = time.perf_counter()
        counts = seed_fleet(conn, queues=queues, kinds=kinds, groups=groups)
        print(f"seeded {counts} in {time.perf_counter() - t0:.1f} s", flush=True)
    for _ in range(2):
        t0 = time.perf_counter()
        report = collect_once(dsn)
        print(f"collection cycle: {len(report.samples):,} samples in {time.perf_counter() - t0:.1f} s", flush=True)
    if history:
        store_history(dsn, history)
    with connect(dsn) as conn:  # the alert rules judge those samples, as the scheduler does after a cycle
        config = load_config(env={})
        report = evaluate.evaluate(conn, rules.load(conn, config), evaluate.AlertSettings.from_config(config))
        active = conn.execute("SELECT count(*) FROM skiplock.alerts WHERE state IN ('pending', 'firing')").fetchone()[0]
        print(f"alert evaluation: {active:,} alerts pending or firing", flush=True)


def shown(body: str) -> tuple[int, str]:
    """(table rows in the answer, its "N more" note if any)."""
    rows = body.count("<tr") - body.count("<thead")
    note = re.search(r"([\d,]+ more [^<\"]{0,60})", body)
    return max(rows, 0), note.group(1) if note else ""


def measure(dsn: str, requests: int, timed: bool) -> list[tuple[str, int, int, str, float | None, float | None]]:
    from console.users import _hasher, start_session
    from console.web import create_app

    with connect(dsn) as conn:
        conn.execute("INSERT INTO skiplock.users (name, password_hash, role) VALUES ('bench', %s, 'operator') "
                     "ON CONFLICT (name) DO NOTHING", (_hasher.hash("bench-password"),))
        token = start_session(conn, "bench", "127.0.0.1", "bench/size_attack.py")
    app = create_app({"database.dsn": dsn, "web.secret_key": "bench", "web.production": False,
                      "web.metrics_public": True})
    client = app.test_client()
    with client.session_transaction() as session:
        session["sid"] = token
        session["csrf"] = "bench"
    out = []
    for name, url in URLS:
        times = []
        body = b""
        for _ in range((requests + 2) if timed else 1):
            t0 = time.perf_counter()
            resp = client.get(url)
            body = resp.get_data()
            times.append((time.perf_counter() - t0) * 1000)
            if resp.status_code != 200:
                raise SystemExit(f"{name} ({url}): HTTP {resp.status_code}")
        rows, note = shown(body.decode("utf-8", "replace"))
        median = p95 = None
        if timed:
            times = times[2:]
            median = statistics.median(times)
            p95 = statistics.quantiles(times, n=20)[18] if len(times) >= 20 else max(times)
        out.append((name, len(body), rows, note, median, p95))
        timing = f"{median:8.1f} ms {p95:8.1f} ms" if timed else ""
        print(f"{name:28} {len(body):>11,} B {rows:>6} rows  {note[:40]:40} {timing}", flush=True)
    app.extensions["skiplock"].close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=5000)
    parser.add_argument("--kinds", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--time", action="store_true", help="also time each URL (a quiet machine only)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--history", type=int, default=0, metavar="MINUTES",
                        help="also store this many minutes of earlier cycles (default 0: the two cycles only)")
    parser.add_argument("--dsn", help="an existing database (migrated and seeded here); default: a private cluster")
    args = parser.parse_args()

    def run(dsn: str) -> None:
        with connect(dsn) as conn:
            migrate(conn)
        seed(dsn, args.queues, args.kinds, args.groups, args.history)
        print(f"\n{'url':28} {'bytes':>13} {'shown':>11}  {'note':40}"
              + (f" {'median':>11} {'p95':>11}" if args.time else ""), flush=True)
        measure(dsn, args.requests, args.time)
        print(f"\ncommand: bench/size_attack.py {' '.join(sys.argv[1:])}; load average {os.getloadavg()}; "
              f"{os.cpu_count()} CPUs")

    if args.dsn:
        run(args.dsn)
    else:
        with PrivateCluster(settings={**RELAXED_DURABILITY}) as cluster:
            with connect(cluster.dsn) as conn:
                conn.execute("CREATE DATABASE bench")
            run(cluster.dsn_for("bench"))


if __name__ == "__main__":
    main()
