#!/usr/bin/env python
"""Sixty on-call people sign in at once, from one address (issue 31, item 2).

An incident: everyone opens the console within the same minute, from one office NAT or VPN
address. Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster), creates `--users`
users (one argon2id hash with the product's parameters, console.users.hash_password, stored
for all of them: the server verifies each one in full, which is what is measured), serves the
console with gunicorn as the Procfile does (2 workers x 4 threads unless told otherwise), and
has one thread per user fetch the sign-in form, wait for the others, then post the form at the
same moment (or spread over `--spread` seconds). Prints the sign-in time (the POST only)
p50/p95/max, the answers by status (429 is what issue 31 found), the argon2 parameters the
stored hashes carry, and the load average before and after.

    .venv/bin/python bench/signin_crowd.py                # 60 at once, 2 workers x 4 threads
    .venv/bin/python bench/signin_crowd.py --spread 60    # 60 arrivals spread over a minute

Timings on a shared machine say little: the load average is printed beside them, and a figure
taken while other work ran is labelled LOADED in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import os
import re
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import PrivateCluster, free_port  # noqa: E402
from console.sqlfiles import query  # noqa: E402
from console.users import hash_password  # noqa: E402

PASSWORD = "on-call-" + secrets.token_hex(8)
DEADLINE_S = 300.0  # no single sign-in may take longer than this (the run fails instead of hanging)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def crowd(base: str, names: list[str], spread: float) -> list[tuple[str, int | str, float]]:
    """(name, status or error, seconds of the POST) per user; every wait has a deadline."""
    barrier = threading.Barrier(len(names) + 1, timeout=120)
    results: list[tuple[str, int | str, float]] = []
    lock = threading.Lock()

    def run(i: int, name: str) -> None:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
                                             _NoRedirect)
        form = opener.open(f"{base}/login", timeout=120).read().decode()
        token = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
        body = urllib.parse.urlencode({"name": name, "password": PASSWORD, "csrf_token": token}).encode()
        barrier.wait()
        if spread:
            time.sleep(spread * i / len(names))
        started = time.perf_counter()
        try:
            status: int | str = opener.open(f"{base}/login", data=body, timeout=DEADLINE_S).status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError as exc:
            status = exc.__class__.__name__
        with lock:
            results.append((name, status, time.perf_counter() - started))

    threads = [threading.Thread(target=run, args=(i, name), daemon=True) for i, name in enumerate(names)]
    for thread in threads:
        thread.start()
    barrier.wait()  # every form fetched: go
    for thread in threads:
        thread.join(timeout=DEADLINE_S + spread + 30)
    if any(thread.is_alive() for thread in threads):
        raise SystemExit("some sign-ins did not finish within the deadline")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=None, help="database.pool_size per worker (default: the product's)")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds over which the posts arrive (0: at once)")
    args = parser.parse_args()
    print("$ " + shlex.join([Path(sys.executable).name, *sys.argv]), flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="skiplock-signin-"))
    cluster = PrivateCluster(settings={"fsync": "off", "full_page_writes": "off", "max_connections": "100"})
    cluster.start()
    web: subprocess.Popen | None = None
    try:
        with connect(cluster.dsn) as conn:
            migrate(conn)
            stored = hash_password(PASSWORD)
            names = [f"oncall{i:02d}" for i in range(args.users)]
            for name in names:
                conn.execute(query("users", "upsert_user"), {"name": name, "role": "viewer", "password_hash": stored})
        params = re.match(r"\$argon2id\$v=\d+\$([^$]+)\$", stored).group(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
        env.update(DATABASE_URL=cluster.dsn, SKIPLOCK_WEB_SECRET_KEY=secrets.token_hex(32),
                   SKIPLOCK_WEB_PRODUCTION="false",  # plain HTTP on loopback: no Secure cookies
                   PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        if args.pool_size:
            env["SKIPLOCK_DATABASE_POOL_SIZE"] = str(args.pool_size)
        port = free_port()
        gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or "gunicorn"
        log = open(workdir / "web.log", "w")  # noqa: SIM115 - closed with the process below
        web = subprocess.Popen([gunicorn, "--config", str(ROOT / "gunicorn.conf.py"), "--no-control-socket",
                                "-w", str(args.workers), "--threads", str(args.threads), "-b", f"127.0.0.1:{port}",
                                "--timeout", "120", "--keep-alive", "75", "console.web:create_app()"],
                               env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or web.poll() is not None:
                raise SystemExit(f"gunicorn did not come up; see {workdir / 'web.log'}")
            time.sleep(0.2)
        load_before = os.getloadavg()
        started = time.perf_counter()
        results = crowd(base, names, args.spread)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
        times = [seconds for _name, _status, seconds in results]
        codes = Counter(str(status) for _name, status, _seconds in results)
        print(f"argon2id parameters of the stored hashes: {params}")
        print(f"gunicorn: {args.workers} workers x {args.threads} threads, database.pool_size "
              f"{args.pool_size or 'default'}; {args.users} users from 127.0.0.1, "
              f"posts {'at once' if not args.spread else f'spread over {args.spread:g} s'}")
        print(f"sign-in (POST /login) p50 {statistics.median(times):.2f} s, p95 {_pct(times, 95):.2f} s, "
              f"max {max(times):.2f} s; all {args.users} answered within {wall:.1f} s")
        print(f"answers: {dict(sorted(codes.items()))}  (302 = signed in; 429 = refused by the throttle)")
        print(f"429 answers: {codes.get('429', 0)}")
        before, after = (" ".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
        print(f"load average before {before}, after {after} ({os.cpu_count()} cores)")
        return 0 if codes.get("302", 0) == args.users else 1
    finally:
        if web is not None:
            web.terminate()
            try:
                web.wait(timeout=30)
            except subprocess.TimeoutExpired:
                web.kill()
                web.wait(timeout=30)
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
