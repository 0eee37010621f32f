#!/usr/bin/env python
"""The broker backend beside PostgreSQL's, in one run (issue 32): what the outbox relay adds.

Starts a throwaway PostgreSQL (console.pgcluster.PrivateCluster, relaxed durability) and a
private `nats-server -js` (Debian's), then measures, for one queue on each backend:

1. **Enqueue.** `enqueue_many` of `--jobs` jobs in one transaction: into skiplock.jobs (a
   PostgreSQL queue) and into skiplock.outbox (a NATS queue); rounds interleaved.
2. **Relay throughput.** The relay (console.queue.broker.relay.Relay, in this process) publishes
   the outbox's `--jobs` rows to JetStream: from its start until every row is marked sent, at
   batch sizes 100 (the default) and 500. Beside it, the PostgreSQL side of the same step does not
   exist (the job is claimable once committed), so the figure is what a queue moved to NATS pays
   before its first worker can fetch.
3. **Drain.** Taking the `--jobs` jobs and acknowledging them in batches of 100: `claim` +
   `complete_many` on the PostgreSQL queue; a pull consumer's `fetch` + `ack` on the stream.
4. **Added latency.** `--latency-jobs` jobs, one a transaction, about 20 a second: from the
   producer's commit to the job reaching a consumer. PostgreSQL: a consumer that LISTENs on the
   workers' doorbell and claims. NATS: the relay (woken by the same doorbell) publishes and a
   core subscription on the queue's subject receives. p50, p95 and max in milliseconds.

    .venv/bin/python bench/relay.py                       # 20,000 jobs, 200 for latency
    .venv/bin/python bench/relay.py --jobs 5000 --latency-jobs 50

The machine may be shared: the load average is printed beside the figures; say so next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from console import queue as q  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.pgcluster import RELAXED_DURABILITY, PrivateCluster  # noqa: E402
from console.queue import broker  # noqa: E402

PG_QUEUE, NATS_QUEUE = "kept", "moved"
COMMAND = " ".join(["python", *sys.argv])


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_nats(folder: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not Path(binary).exists():
        sys.exit("nats-server is not installed (scripts/bootstrap.sh --test installs Debian's)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(folder / "nats-server.log", "w")  # noqa: SIM115 - the server's for its life
    proc = subprocess.Popen([binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(folder / "js")],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                sys.exit("nats-server did not start: " + (folder / "nats-server.log").read_text()[-2000:])
            time.sleep(0.05)


class Background:
    """An asyncio loop in a thread of its own, for the relay and the NATS consumers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def unsent(dsn: str) -> int:
    with connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM skiplock.outbox WHERE sent_at IS NULL").fetchone()[0]


def reset(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE skiplock.jobs, skiplock.outbox")
        conn.execute("CHECKPOINT")


def jobs_for(queue: str, n: int) -> list[q.NewJob]:
    return [q.NewJob("noop", {"i": i}, queue=queue) for i in range(n)]


def enqueue_rate(dsn: str, queue: str, n: int) -> float:
    reset(dsn)
    with connect(dsn, autocommit=False) as conn:
        t0 = time.perf_counter()
        q.enqueue_many(conn, jobs_for(queue, n))
        conn.commit()
        return n / (time.perf_counter() - t0)


async def purge_stream(nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for name in (broker.stream(NATS_QUEUE), broker.dead_stream(NATS_QUEUE)):
            try:
                await js.purge_stream(name)
            except Exception:  # noqa: BLE001 - not made yet: the relay makes it
                pass
    finally:
        await nc.close()


def relay_rate(bg: Background, dsn: str, nats_url: str, n: int, batch: int) -> float:
    from console.queue.broker.relay import Relay, RelaySettings

    bg.run(purge_stream(nats_url))
    with connect(dsn, autocommit=False) as conn:
        q.enqueue_many(conn, jobs_for(NATS_QUEUE, n))
        conn.commit()
    relay = Relay(dsn, RelaySettings(nats_url=nats_url, batch_size=batch, poll_interval=0.2))
    t0 = time.perf_counter()
    running = bg.start(relay.run())
    deadline = time.monotonic() + 600
    while unsent(dsn):
        if running.done() or time.monotonic() > deadline:
            raise SystemExit(f"the relay stopped or stalled: {running.result() if running.done() else 'timeout'}")
        time.sleep(0.02)
    elapsed = time.perf_counter() - t0
    bg.loop.call_soon_threadsafe(relay.stop)
    running.result(30)
    return n / elapsed


def pg_drain_rate(dsn: str, n: int) -> float:
    reset(dsn)
    with connect(dsn, autocommit=False) as conn:
        q.enqueue_many(conn, jobs_for(PG_QUEUE, n))
        conn.commit()
    with connect(dsn) as conn:
        done = 0
        t0 = time.perf_counter()
        while done < n:
            jobs = q.claim(conn, "bench", queues=[PG_QUEUE], limit=100)
            assert jobs, f"claimed nothing after {done} of {n}"
            q.complete_many(conn, jobs)
            done += len(jobs)
        return n / (time.perf_counter() - t0)


async def nats_drain(nats_url: str, n: int) -> float:
    import nats
    from nats.js import api

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        name = f"bench{time.monotonic_ns()}"
        await js.add_consumer(broker.stream(NATS_QUEUE), api.ConsumerConfig(
            durable_name=name, ack_policy=api.AckPolicy.EXPLICIT, filter_subject=broker.subject(NATS_QUEUE)))
        sub = await js.pull_subscribe_bind(durable=name, stream=broker.stream(NATS_QUEUE))
        done = 0
        t0 = time.perf_counter()
        while done < n:
            msgs = await sub.fetch(100, timeout=10)
            await asyncio.gather(*(m.ack_sync() for m in msgs))
            done += len(msgs)
        elapsed = time.perf_counter() - t0
        await js.delete_consumer(broker.stream(NATS_QUEUE), name)
        return n / elapsed
    finally:
        await nc.close()


def percentiles(ms: list[float]) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"p50 {statistics.median(ms):6.1f} ms  p95 {p95:6.1f} ms  max {ms[-1]:6.1f} ms  (n={len(ms)})"


def produce(dsn: str, queue: str, n: int, committed: dict[int, float]) -> None:
    with connect(dsn, autocommit=False) as conn:
        for _ in range(n):
            job_id = q.enqueue(conn, "noop", {"t": 0}, queue=queue)
            conn.commit()
            committed[job_id] = time.perf_counter()
            time.sleep(0.05)


def pg_latency(dsn: str, n: int) -> list[float]:
    reset(dsn)
    committed: dict[int, float] = {}
    arrived: dict[int, float] = {}
    stop = threading.Event()

    def consume() -> None:
        with psycopg.connect(dsn, autocommit=True) as listener, connect(dsn) as conn:
            listener.execute(f"LISTEN {q.NOTIFY_CHANNEL}")
            while not stop.is_set():
                for job in q.claim(conn, "bench", queues=[PG_QUEUE], limit=100):
                    arrived[job.id] = time.perf_counter()
                    q.complete(conn, job)
                for _ in listener.notifies(timeout=0.2, stop_after=1):
                    pass

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(0.5)
    produce(dsn, PG_QUEUE, n, committed)
    deadline = time.monotonic() + 30
    while len(arrived) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    consumer.join(10)
    return [1000 * (arrived[i] - committed[i]) for i in committed if i in arrived]


def nats_latency(bg: Background, dsn: str, nats_url: str, n: int) -> list[float]:
    import json

    import nats

    from console.queue.broker.relay import Relay, RelaySettings

    reset(dsn)
    committed: dict[int, float] = {}
    arrived: dict[int, float] = {}

    async def subscribe():
        nc = await nats.connect(nats_url)

        async def got(msg) -> None:
            arrived[json.loads(msg.data)["id"]] = time.perf_counter()

        await nc.subscribe(broker.subject(NATS_QUEUE), cb=got)
        return nc

    nc = bg.run(subscribe())
    relay = Relay(dsn, RelaySettings(nats_url=nats_url))
    running = bg.start(relay.run())
    time.sleep(1.0)  # leading, listening, streams made
    produce(dsn, NATS_QUEUE, n, committed)
    deadline = time.monotonic() + 30
    while len(arrived) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    bg.loop.call_soon_threadsafe(relay.stop)
    running.result(30)
    bg.run(nc.close())
    return [1000 * (arrived[i] - committed[i]) for i in committed if i in arrived]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="skiplock-bench-relay-"))
    cluster = PrivateCluster(settings=dict(RELAXED_DURABILITY))
    nats_proc = None
    bg = Background()
    try:
        cluster.start()
        nats_proc, nats_url = start_nats(folder)
        dsn = cluster.dsn
        with connect(dsn) as conn:
            migrate(conn)
            broker.set_backend(conn, NATS_QUEUE, "nats", actor="bench", reason="bench/relay.py")
            version = conn.info.server_version
        nats_version = subprocess.run([shutil.which("nats-server") or "/usr/sbin/nats-server", "--version"],
                                      capture_output=True, text=True).stdout.strip()
        print(f"$ {COMMAND}")
        print(f"PostgreSQL {version}; {nats_version}; {os.cpu_count()} CPUs; {load()}", flush=True)
        rates: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved, so load changes hit both sides alike
            rates.setdefault("enqueue_many, PostgreSQL queue (skiplock.jobs)", []).append(enqueue_rate(dsn, PG_QUEUE, args.jobs))
            rates.setdefault("enqueue_many, NATS queue (skiplock.outbox)", []).append(enqueue_rate(dsn, NATS_QUEUE, args.jobs))
            for batch in (100, 500):
                reset(dsn)
                rates.setdefault(f"relay to JetStream, batch {batch}", []).append(relay_rate(bg, dsn, nats_url, args.jobs, batch))
            rates.setdefault("drain, PostgreSQL: claim 100 + complete_many", []).append(pg_drain_rate(dsn, args.jobs))
            rates.setdefault("drain, JetStream: fetch 100 + ack each", []).append(bg.run(nats_drain(nats_url, args.jobs)))
            print(f"  round done, {load()}", flush=True)
        print(f"\n{args.jobs:,} jobs a run, {args.rounds} runs, median (min-max) jobs/s:")
        for name, values in rates.items():
            print(f"  {name:<48} {statistics.median(values):>9,.0f}  ({min(values):,.0f}-{max(values):,.0f})")
        print(f"\ncommit -> a consumer has the job, {args.latency_jobs} jobs one a transaction at ~20/s:")
        print(f"  {'PostgreSQL (LISTEN doorbell, claim)':<48} {percentiles(pg_latency(dsn, args.latency_jobs))}")
        print(f"  {'NATS (relay on the doorbell, publish, deliver)':<48} {percentiles(nats_latency(bg, dsn, nats_url, args.latency_jobs))}")
        print(f"{load()}")
    finally:
        bg.close()
        if nats_proc is not None:
            nats_proc.kill()
            nats_proc.wait(10)
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
