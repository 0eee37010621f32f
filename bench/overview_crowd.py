#!/usr/bin/env python
"""Sixty on-call people watch the overview of a wide fleet during an incident (issue 31, item 2).

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster), seeds `--queues` queues,
`--kinds` kinds and `--groups` error groups (tests/fleet_data.py, as bench/size_attack.py), and
runs collection cycles with the alert evaluation after each one every `--interval` seconds in
a process of its own (what the scheduler's leader does), and, while a checkout with
console/web/cycle_store.py is served, the overview's stored model after each (as its leader
does). Then, for each checkout named (default: this one), serves the console with gunicorn as the Procfile does (2 workers x 4 threads) and has
`--users` people sign in (spread over 10 s) and poll the overview's three fragments every
`--poll` seconds for `--seconds`, as static/skiplock.js does: with the ETag of the last answer
in If-None-Match (a checkout before console/web/cycle.py answers 200 every time). Prints, per
checkout, each fragment's p50/p95/max answer time and its answers by status, and the load
average; the checkouts run one after the other on the same database and the same collector.

    .venv/bin/python bench/overview_crowd.py                          # this checkout
    .venv/bin/python bench/overview_crowd.py --checkout /tmp/before --checkout .   # side by side

A checkout of another commit: `git worktree add /tmp/before <commit>`; it runs with this
checkout's virtualenv. Timings on a shared machine say little: the load average is printed
beside them, and a figure taken while other work ran is labelled LOADED in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import multiprocessing
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
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.db import connect, migrate  # noqa: E402
from console.pgcluster import PrivateCluster, free_port  # noqa: E402
from console.sqlfiles import query  # noqa: E402
from console.users import hash_password  # noqa: E402

PASSWORD = "on-call-" + secrets.token_hex(8)
FRAGMENTS = ("/overview/_verdict", "/overview/_figures", "/overview/_queues")
TIMEOUT_S = 120.0  # no single request may take longer (the run fails instead of hanging)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Collector:
    """A collection cycle and the alert evaluation every `interval` seconds, as the leader runs
    them, and (`store` set) the overview's stored model after each: in a process of its own, as
    the scheduler is, so that its Python does not hold up the crowd's threads here (in this
    process, the model's build showed as seconds of every poll's answer time)."""

    def __init__(self, dsn: str, interval: float):
        ctx = multiprocessing.get_context("spawn")
        self.stop, self._store, self.first = ctx.Event(), ctx.Event(), ctx.Event()
        self._store.set()
        self._times = ctx.Queue()
        self._process = ctx.Process(target=_collect, args=(dsn, interval, self.stop, self._store, self.first,
                                                           self._times), daemon=True, name="collector")
        self.cycles: list[float] = []
        self.builds: list[float] = []  # the stored model's build, when the checkout served reads it

    @property
    def store(self) -> bool:
        return self._store.is_set()

    @store.setter
    def store(self, on: bool) -> None:
        (self._store.set if on else self._store.clear)()

    def start(self) -> None:
        self._process.start()

    def drain(self) -> None:
        while not self._times.empty():
            kind, took = self._times.get()
            (self.cycles if kind == "cycle" else self.builds).append(took)

    def join(self, timeout: float) -> None:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
        self.drain()


def _collect(dsn: str, interval: float, stop, store, first, times) -> None:
    sys.path.insert(0, str(ROOT))
    from console.alerts import evaluate, rules
    from console.collectors import collect_once
    from console.config import load_config

    config = load_config(env={})
    while not stop.is_set():
        started = time.perf_counter()
        collect_once(dsn)
        with connect(dsn) as conn:
            evaluate.evaluate(conn, rules.load(conn, config), evaluate.AlertSettings.from_config(config))
            times.put(("cycle", time.perf_counter() - started))
            if store.is_set():  # the leader's last step since 036: the overview's model, stored
                from console.web import cycle_store, overview

                for took in cycle_store.refresh(conn, config, "default", overview.STORED).values():
                    times.put(("build", took))
        first.set()
        stop.wait(max(0.0, interval - (time.perf_counter() - started)))


def sign_in(base: str, name: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base}/login", timeout=TIMEOUT_S).read().decode()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode({"name": name, "password": PASSWORD, "csrf_token": csrf}).encode()
    opener.open(f"{base}/login", data=body, timeout=TIMEOUT_S).read()
    return opener


def watch(base: str, name: str, seconds: float, poll: float, delay: float,
          out: dict[str, list[tuple[int, float, float]]], lock: threading.Lock, signed_in: list[float]) -> None:
    time.sleep(delay)
    t0 = time.perf_counter()
    opener = sign_in(base, name)
    with lock:
        signed_in.append(time.perf_counter() - t0)
        out["signed in at"].append((0, 0.0, time.monotonic()))
    tags: dict[str, str] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        for path in FRAGMENTS:
            request = urllib.request.Request(f"{base}{path}", headers={"HX-Request": "true", "X-Skiplock-Poll": "1"})
            if path in tags:
                request.add_header("If-None-Match", tags[path])
            at, t0 = time.monotonic(), time.perf_counter()
            try:
                with opener.open(request, timeout=TIMEOUT_S) as resp:
                    resp.read()
                    status, tag = resp.status, resp.headers.get("ETag")
            except urllib.error.HTTPError as exc:
                status, tag = exc.code, exc.headers.get("ETag")
            took = time.perf_counter() - t0
            if status == 200 and tag:
                tags[path] = tag
            with lock:
                out[path].append((status, took, at))
        time.sleep(max(0.0, poll - (time.monotonic() - started)))


def serve(checkout: Path, dsn: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env.update(DATABASE_URL=dsn, SKIPLOCK_WEB_SECRET_KEY=secrets.token_hex(32), SKIPLOCK_WEB_PRODUCTION="false",
               SKIPLOCK_WEB_LOGIN_MAX_PER_IP="10000",  # the crowd shares 127.0.0.1 (a checkout before issue 31)
               PYTHONPATH=str(checkout), PYTHONUNBUFFERED="1")
    port = free_port()
    gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or "gunicorn"
    log = open(workdir / f"web-{port}.log", "w")  # noqa: SIM115 - closed with the process
    web = subprocess.Popen([gunicorn, "--config", str(checkout / "gunicorn.conf.py"), "--no-control-socket",
                            "-b", f"127.0.0.1:{port}", "--timeout", "120", "console.web:create_app()"],
                           env=env, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200:
                return web, base
        except OSError:
            pass
        if time.monotonic() > deadline or web.poll() is not None:
            raise SystemExit(f"gunicorn did not come up; see {workdir}")
        time.sleep(0.2)


def run_crowd(checkout: Path, dsn: str, names: list[str], args, workdir: Path, collector: Collector) -> None:
    # A checkout before console/web/cycle_store.py has no leader that builds the model: the
    # collector stores none while it is served (its web processes build their own).
    collector.store = (checkout / "console" / "web" / "cycle_store.py").exists()
    web, base = serve(checkout, dsn, workdir)
    try:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
        out: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
        signed_in: list[float] = []
        lock = threading.Lock()
        load_before = os.getloadavg()
        threads = [threading.Thread(target=watch, args=(base, name, args.seconds, args.poll,
                                                        10.0 * i / len(names), out, lock, signed_in), daemon=True)
                   for i, name in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=args.seconds + 10 + 3 * TIMEOUT_S)
            if t.is_alive():
                raise SystemExit("a watcher did not finish in time")
        load_after = os.getloadavg()
        print(f"\n{checkout} ({commit}): {len(names)} users polling every {args.poll:g} s for {args.seconds:g} s")
        for path in FRAGMENTS:
            times = [took * 1000 for _, took, _ in out[path]]
            codes = Counter(status for status, _, _ in out[path])
            print(f"  {path:22} p50 {statistics.median(times):8.1f} ms  p95 {pct(times, 95):8.1f} ms  "
                  f"max {max(times):8.1f} ms  answers {dict(sorted(codes.items()))}")
        every = [took * 1000 for path in FRAGMENTS for _, took, _ in out[path]]
        print(f"  all polls              p50 {statistics.median(every):8.1f} ms  p95 {pct(every, 95):8.1f} ms  "
              f"({len(every)} requests)")
        # Where the tail is: the answers with a body against the 304s, and the polls once every
        # user has signed in (the sign-ins' password hashing shares the web processes' cores).
        last_sign_in = max(at for _, _, at in out["signed in at"])
        for label, keep in (("200s", lambda st, at: st == 200), ("304s", lambda st, at: st == 304),
                            ("after the sign-ins", lambda st, at: at > last_sign_in)):
            part = [took * 1000 for path in FRAGMENTS for st, took, at in out[path] if keep(st, at)]
            if part:
                print(f"  {label:22} p50 {statistics.median(part):8.1f} ms  p95 {pct(part, 95):8.1f} ms  "
                      f"({len(part)} requests)")
        print(f"  sign-in                p50 {statistics.median(signed_in) * 1000:8.1f} ms  "
              f"p95 {pct(signed_in, 95) * 1000:8.1f} ms  ({len(signed_in)} people over 10 s)")
        print("  load average before " + " ".join(f"{x:.2f}" for x in load_before)
              + ", after " + " ".join(f"{x:.2f}" for x in load_after) + f" ({os.cpu_count()} cores)")
    finally:
        web.terminate()
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--queues", type=int, default=5000)
    parser.add_argument("--kinds", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between a user's polls (web.poll_fast)")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between collection cycles")
    parser.add_argument("--checkout", action="append", type=Path, help="a checkout to serve (repeatable)")
    args = parser.parse_args()
    print("$ " + shlex.join([Path(sys.executable).name, *sys.argv]), flush=True)
    checkouts = [c.resolve() for c in (args.checkout or [ROOT])]

    from tests.fleet_data import seed_fleet

    workdir = Path(tempfile.mkdtemp(prefix="skiplock-crowd-"))
    cluster = PrivateCluster(settings={"fsync": "off", "full_page_writes": "off", "max_connections": "200"})
    cluster.start()
    collector = None
    try:
        with connect(cluster.dsn) as conn:
            migrate(conn)
            print(f"seeded {seed_fleet(conn, queues=args.queues, kinds=args.kinds, groups=args.groups)}", flush=True)
            stored = hash_password(PASSWORD)
            names = [f"oncall{i:02d}" for i in range(args.users)]
            for name in names:
                conn.execute(query("users", "upsert_user"), {"name": name, "role": "viewer", "password_hash": stored})
        collector = Collector(cluster.dsn, args.interval)
        collector.start()
        collector.first.wait(timeout=600)
        for checkout in checkouts:
            run_crowd(checkout, cluster.dsn, names, args, workdir, collector)
        collector.stop.set()
        collector.join(timeout=60)
        print(f"\ncollection cycles (with evaluation): median {statistics.median(collector.cycles):.2f} s over "
              f"{len(collector.cycles)}")
        if collector.builds:
            print(f"stored overview model (built by the collector after each cycle): median "
                  f"{statistics.median(collector.builds):.2f} s over {len(collector.builds)}")
        return 0
    finally:
        if collector is not None:
            collector.stop.set()
            collector.join(timeout=60)
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
