"""Soak: Skiplock's processes under steady traffic and scheduled faults; nothing may be lost.

    python bench/soak.py                       # 10 minutes, 300 jobs/s, 50 on-call users
    python bench/soak.py --minutes 2 --rate 50 --users 5 --faults worker,postgres

It starts a private PostgreSQL (durable commits: a crash must not be allowed to hide a lost
job), two schedulers (leader and standby), the web console under gunicorn (two workers), two
`skiplock worker`s running `bench.soak_tasks`, a webhook receiver whose behaviour the soak
switches (200, 500, 410, hanging, down), a producer enqueueing at `--rate` jobs per second in
short transactions, and Locust playing `--users` on-call engineers polling the pages and the
API (loopback only, bounded by the run time). While they run it injects the faults below on a
schedule spread over the run, and afterwards drains the queue and checks conservation:

- every enqueued job (the producer records each job id in `soak.enqueued` in the same
  transaction as the enqueue, so a transaction lost to a crash loses both) is exactly once in
  the hot table or the archive, completed or dead-lettered: none lost, none duplicated, none
  left pending or running;
- no job completed without its handler's side effect (`soak.effects`, written by the handler);
  side effects that ran to the end twice (at-least-once after a SIGKILL or a crash) are counted;
- every alert notification in the outbox was delivered or is accounted for (failed for good
  after a 410, or still retrying), and the receiver saw no delivery id more often than the
  outbox retried it;
- no 5xx outside a fault's window; each fault's recovery time (the console answers and a job
  completes again after the fault ends).

It prints a table per fault (recovery time, jobs lost, duplicate side effects, 5xx) and the
conservation figures, writes them as JSON (`--json`), and exits 1 when a job was lost or
duplicated in the tables, a job completed without its side effect, or a 5xx came outside a
fault window. See docs/reliability.md.

Faults (`--faults`, comma-separated; default all): worker (SIGKILL a worker, restart it),
postgres (`pg_ctl stop -m immediate`, start again), scheduler (SIGKILL the leader), web (SIGKILL
the gunicorn group, restart), webhook-500, webhook-410, webhook-hang, webhook-down, idle (a
session idle in transaction holding the xmin horizon).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console import queue as q  # noqa: E402
from console.config import SETTINGS  # noqa: E402
from console.db import connect, migrate  # noqa: E402
from console.demo.orchestrator import Child  # noqa: E402
from console.pgcluster import PrivateCluster, free_port  # noqa: E402
from console.users import add_user, create_token  # noqa: E402

log = logging.getLogger("soak")

ALL_FAULTS = ("worker", "postgres", "scheduler", "web", "webhook-500", "webhook-hang", "idle",
              "webhook-410", "webhook-down")
KNOWN_SETTINGS = {s.dotted for s in SETTINGS}

SOAK_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS soak;
CREATE TABLE IF NOT EXISTS soak.enqueued (job_id bigint PRIMARY KEY, kind text NOT NULL,
                                          at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS soak.effects (job_id bigint NOT NULL, attempt int NOT NULL, ok boolean NOT NULL,
                                         at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS effects_job_idx ON soak.effects (job_id);
"""

SETTINGS_WANTED = {
    "worker.concurrency": 4,
    "worker.lease": 10.0,
    "worker.poll_interval": 1.0,
    "worker.shutdown_grace": 3.0,
    "queue.backoff_base": 1.0,
    "queue.backoff_cap": 5.0,
    "scheduler.collect_interval": 5.0,
    "scheduler.reap_interval": 5.0,
    "scheduler.archive_interval": 15.0,
    "scheduler.election_interval": 2.0,
    "maintenance.archive_after": "20s",
    "alerts.allow_private_destinations": True,  # the receiver is on loopback
    "web.metrics_public": True,
    # The soak talks plain HTTP on loopback: production mode's Secure cookies would never come
    # back, and every page would be a redirect to the login form.
    "web.production": False,
    # Every simulated user signs in from 127.0.0.1. Until issue 31 the per-address ceiling
    # counted right passwords too and turned most of them away; it now counts failures only, and
    # the raised ceiling stays so a soak's restarts (re-sign-ins mid-fault) are never refused.
    "web.login_max_per_ip": 10000,
}

ALERT_RULES = """
[[webhooks]]
name = "soak-receiver"
kind = "json"
url = "http://127.0.0.1:{port}/hook"
secret = "{secret}"

[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
op = ">"
threshold = 5
clear = 2
for = "5s"
severity = "critical"
summary = "Oldest eligible job in queue {{queue}} has waited {{value}}s"
runbook = "/docs/alerts#queue_age"

[[alerts.rules]]
name = "idle_session"
metric = "idle_in_transaction_sessions"
op = ">"
threshold = 0
for = "5s"
severity = "warning"
summary = "{{value}} session(s) idle in transaction"
runbook = "/docs/alerts#idle"

[[alerts.rules]]
name = "stuck_leases"
metric = "stuck_leases"
op = ">"
threshold = 0
for = "5s"
severity = "warning"
summary = "{{value}} job(s) in queue {{queue}} hold an expired lease"
runbook = "/docs/alerts#stuck_leases"
"""


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


# --- the webhook receiver ----------------------------------------------------------------------

class Receiver:
    """A local webhook endpoint whose answer the soak switches: ok, 500, 410, hang, down."""

    def __init__(self) -> None:
        self.port = free_port()
        self.mode = "ok"
        self.seen: dict[str, int] = {}  # delivery id -> times received
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.release = threading.Event()

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(length, 1_000_000))  # drain the request
                mode = receiver.mode
                if mode == "hang":
                    receiver.release.wait(30)
                    return
                status = {"ok": 200, "500": 500, "410": 410}.get(mode, 200)
                if status == 200:
                    key = self.headers.get("Idempotency-Key") or "none"
                    with receiver.lock:
                        receiver.seen[key] = receiver.seen.get(key, 0) + 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="receiver").start()

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def set_mode(self, mode: str) -> None:
        if mode == "down":
            self.stop()
        elif self.server is None:
            self.release.clear()
            self.start()
        if mode != "hang":
            self.release.set()
        else:
            self.release.clear()
        self.mode = mode


# --- the producer ----------------------------------------------------------------------------

class Neighbour:
    """A bad neighbour that keeps alerts flowing: every `every` seconds it leaves a session idle
    in transaction for `hold` seconds, so the idle-session rule fires and resolves all run long
    and notifications are in flight whenever a webhook fault begins."""

    def __init__(self, dsn: str, every: float = 30.0, hold: float = 12.0):
        self.dsn, self.every, self.hold = dsn, every, hold
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="neighbour")

    def run(self) -> None:
        while not self.stop.wait(self.every - self.hold):
            try:
                with psycopg.connect(self.dsn, autocommit=False, connect_timeout=3,
                                     application_name="soak: idle neighbour") as conn:
                    conn.execute("SELECT txid_current()")
                    self.stop.wait(self.hold)
                    conn.rollback()
            except psycopg.Error:
                continue


class Producer:
    """Enqueues at a steady rate, ten jobs per transaction, each recorded in soak.enqueued."""

    MIX = (("soak.ok", 90), ("soak.flaky", 7), ("soak.dead", 3))

    def __init__(self, dsn: str, rate: float):
        self.dsn = dsn
        self.rate = rate
        self.stop = threading.Event()
        self.committed = 0
        self.failed_transactions = 0
        self.thread = threading.Thread(target=self.run, daemon=True, name="producer")
        self._n = 0

    def _kind(self) -> str:
        self._n += 1
        slot = self._n % 100
        for kind, share in self.MIX:
            if slot < share:
                return kind
            slot -= share
        return "soak.ok"

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        started = time.monotonic()
        sent = 0
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            if sent >= due:
                self.stop.wait(0.01)
                continue
            jobs = [q.NewJob(kind=self._kind(), queue="soak", payload={"ms": 5}) for _ in range(10)]
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = connect(self.dsn, application_name="soak-producer", autocommit=False)
                with conn.transaction():
                    ids = q.enqueue_many(conn, jobs)
                    with conn.cursor() as cur:
                        cur.executemany("INSERT INTO soak.enqueued (job_id, kind) VALUES (%s, %s)",
                                        [(i, j.kind) for i, j in zip(ids, jobs, strict=True)])
                self.committed += len(jobs)
            except (psycopg.Error, OSError, Exception) as exc:  # an outage: the truth is in the database
                self.failed_transactions += 1
                log.debug("producer: %s", exc)
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.5)
                started = time.monotonic() - sent / self.rate  # do not flood after the outage
                continue
            sent += len(jobs)
        if conn is not None:
            conn.close()


# --- the run ---------------------------------------------------------------------------------

@dataclass
class Fault:
    name: str
    at: float            # seconds after the start
    lasts: float         # how long the fault condition is held
    started: float = 0.0   # unix times
    ended: float = 0.0
    recovered: float | None = None
    note: str = ""
    failures_5xx: int = 0
    duplicates: int = 0

    @property
    def window(self) -> tuple[float, float]:
        end = self.recovered if self.recovered is not None else self.ended + 60
        return self.started - 1.0, end + 5.0


@dataclass
class Soak:
    minutes: float
    rate: float
    users: int
    faults: list[str]
    workdir: Path
    cluster: PrivateCluster | None = None
    dsn: str = ""
    web_port: int = 0
    children: dict[str, Child] = field(default_factory=dict)
    receiver: Receiver = field(default_factory=Receiver)
    producer: Producer | None = None
    timeline: list[Fault] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    token: str = ""
    neighbour: Neighbour | None = None

    # --- set-up ----------------------------------------------------------------------------

    def prepare(self) -> None:
        self.cluster = PrivateCluster(settings={"fsync": "off", "full_page_writes": "off",
                                                "synchronous_commit": "on", "max_connections": "200",
                                                "autovacuum_naptime": "5s"})
        self.cluster.start()
        with connect(self.cluster.dsn) as admin:
            admin.execute("CREATE DATABASE soak")
        self.dsn = self.cluster.dsn_for("soak")
        with connect(self.dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            migrate(conn)
            conn.execute(SOAK_SCHEMA)
            add_user(conn, "soak", "operator", self.password)
            self.token = create_token(conn, "soak", "soak load generator")
        self.receiver.start()
        config = self.workdir / "skiplock.toml"
        sections: dict[str, list[str]] = {}
        for dotted, value in SETTINGS_WANTED.items():
            if dotted in KNOWN_SETTINGS:
                section, key = dotted.split(".", 1)
                sections.setdefault(section, []).append(f"{key} = {_toml(value)}")
        lines = []
        for section, entries in sections.items():
            lines += [f"[{section}]", *entries, ""]
        lines.append(ALERT_RULES.format(port=self.receiver.port, secret=secrets.token_hex(16)))
        config.write_text("\n".join(lines), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
        env.update(DATABASE_URL=self.dsn, SKIPLOCK_CONFIG=str(config), PYTHONUNBUFFERED="1",
                   SKIPLOCK_WEB_SECRET_KEY=secrets.token_hex(32),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        self.env = env
        self.web_port = free_port()

    def _child(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.env, self.workdir / "logs" / f"{name}.log")
        child.start()
        self.children[name] = child
        return child

    def _skiplock(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", *args]

    def _start_web(self) -> Child:
        gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or "gunicorn"
        return self._child("web", [gunicorn, "--config", str(ROOT / "gunicorn.conf.py"), "--no-control-socket",
                                   "-w", "2", "--threads", "4",
                                   "-b", f"127.0.0.1:{self.web_port}", "--timeout", "30",
                                   # longer than any client's idle gap: a keep-alive connection closed by
                                   # the server just as a client reuses it is a reset, not an answer
                                   "--keep-alive", "75",
                                   "console.web:create_app()"])

    def start_processes(self) -> None:
        self._child("scheduler-1", self._skiplock("scheduler"))
        self._child("scheduler-2", self._skiplock("scheduler"))
        self._start_web()
        for i in (1, 2):
            self._child(f"worker-{i}", self._skiplock("worker", "--tasks", "bench.soak_tasks", "--queues", "soak"))
        if not self._wait(lambda: self._healthz() == 200, 60):
            raise RuntimeError(f"the web console did not come up; see {self.workdir / 'logs' / 'web.log'}")
        self.producer = Producer(self.dsn, self.rate)
        self.producer.thread.start()
        self.neighbour = Neighbour(self.dsn)
        self.neighbour.thread.start()

    def _start_locust(self, seconds: int) -> subprocess.Popen | None:
        if self.users <= 0:
            return None
        locust = shutil.which("locust", path=str(Path(sys.executable).parent)) or shutil.which("locust")
        if not locust:
            raise RuntimeError("Locust is not installed: pip install -e '.[bench]' (or --users 0)")
        env = {**self.env, "SOAK_USER": "soak", "SOAK_PASSWORD": self.password, "SOAK_TOKEN": self.token,
               "SOAK_FAILURES": str(self.workdir / "failures.jsonl"), "SOAK_PAGES_OK": str(self.workdir / "pages_ok.txt")}
        out = open(self.workdir / "logs" / "locust.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [locust, "-f", str(ROOT / "bench" / "soak_locustfile.py"), "--headless", "-u", str(self.users),
             "-r", str(max(1, self.users // 5)), "--run-time", f"{seconds}s", "--stop-timeout", "5",
             "--host", f"http://127.0.0.1:{self.web_port}", "--only-summary",
             "--csv", str(self.workdir / "locust")],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )

    # --- probes ----------------------------------------------------------------------------

    def _healthz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=2) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, urllib.error.URLError):
            return 0

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
            return conn.execute(sql, params).fetchall()

    def _completed_since(self, since: float) -> bool:
        try:
            rows = self._query("SELECT 1 FROM soak.effects WHERE ok AND at > to_timestamp(%s) LIMIT 1", (since,))
        except psycopg.Error:
            return False
        return bool(rows)

    @staticmethod
    def _wait(predicate, timeout: float, step: float = 0.25) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(step)
        return False

    # --- faults ----------------------------------------------------------------------------

    def schedule(self, seconds: float) -> None:
        """Spread the chosen faults over the middle of the run, leaving time to recover."""
        chosen = [f for f in ALL_FAULTS if f in self.faults]
        span = seconds * 0.8
        gap = span / max(1, len(chosen))
        for i, name in enumerate(chosen):
            lasts = min(30.0, gap * 0.5) if name.startswith("webhook") or name == "idle" else 3.0
            self.timeline.append(Fault(name, at=seconds * 0.1 + i * gap, lasts=lasts))

    def _leader_pid(self) -> int | None:
        try:
            rows = self._query("SELECT pid FROM skiplock.scheduler_nodes WHERE is_leader AND stopped_at IS NULL "
                               "ORDER BY last_seen DESC LIMIT 1")
        except psycopg.Error:
            return None
        return rows[0][0] if rows else None

    def inject(self, fault: Fault) -> None:
        fault.started = time.time()
        name = fault.name
        if name == "worker":
            victim = self.children["worker-1"]
            victim.signal_group(signal.SIGKILL)
            time.sleep(fault.lasts)
            victim.start()
        elif name == "postgres":
            assert self.cluster is not None
            self.cluster._run([str(self.cluster.bindir / "pg_ctl"), "-D", str(self.cluster.data_dir),
                               "-m", "immediate", "-w", "stop"], "pg_ctl stop -m immediate")
            time.sleep(fault.lasts)
            self.cluster.start()
        elif name == "scheduler":
            pid = self._leader_pid()
            victim = next((c for c in self.children.values() if c.pid == pid), None)
            if victim is None:
                fault.note = "no leader found"
            else:
                fault.note = f"killed {victim.name}"
                victim.signal_group(signal.SIGKILL)
                time.sleep(fault.lasts)
                victim.start()
        elif name == "web":
            self.children["web"].signal_group(signal.SIGKILL)
            time.sleep(fault.lasts)
            self._start_web()
        elif name.startswith("webhook-"):
            self.receiver.set_mode(name.split("-", 1)[1])
            time.sleep(fault.lasts)
            self.receiver.set_mode("ok")
        elif name == "idle":
            conn = psycopg.connect(self.dsn, autocommit=False, application_name="soak: idle in transaction")
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.execute("SELECT txid_current(), count(*) FROM skiplock.queues")
            time.sleep(fault.lasts)
            conn.rollback()
            conn.close()
        fault.ended = time.time()
        ok = self._wait(lambda: self._healthz() == 200 and self._completed_since(fault.ended), 120)
        fault.recovered = time.time() if ok else None

    # --- the end ---------------------------------------------------------------------------

    def drain(self, timeout: float = 180) -> bool:
        def empty() -> bool:
            try:
                rows = self._query("SELECT count(*) FROM skiplock.jobs WHERE status IN ('pending', 'running')")
            except psycopg.Error:
                return False
            return rows[0][0] == 0
        return self._wait(empty, timeout, step=1.0)

    def conservation(self) -> dict[str, Any]:
        rows = self._query(
            """
            WITH everywhere AS (
                SELECT id, status FROM skiplock.jobs
                UNION ALL
                SELECT id, status FROM skiplock.jobs_archive
            ), per_job AS (
                SELECT e.job_id, e.kind, count(w.id) AS copies, min(w.status) AS status
                FROM soak.enqueued AS e
                LEFT JOIN everywhere AS w ON w.id = e.job_id
                GROUP BY e.job_id, e.kind
            ), effects AS (
                SELECT job_id, count(*) FILTER (WHERE ok) AS ok_runs
                FROM soak.effects
                GROUP BY job_id
            )
            SELECT count(*)                                                        AS enqueued,
                   count(*) FILTER (WHERE copies = 0)                              AS lost,
                   count(*) FILTER (WHERE copies > 1)                              AS duplicated_rows,
                   count(*) FILTER (WHERE status = 'completed')                    AS completed,
                   count(*) FILTER (WHERE status = 'failed')                       AS dead_lettered,
                   count(*) FILTER (WHERE status IN ('pending', 'running'))        AS unfinished,
                   count(*) FILTER (WHERE status = 'completed' AND coalesce(f.ok_runs, 0) = 0)
                                                                                   AS completed_without_effect,
                   count(*) FILTER (WHERE coalesce(f.ok_runs, 0) > 1)              AS ran_twice,
                   count(*) FILTER (WHERE p.kind = 'soak.dead' AND status <> 'failed') AS dead_not_failed,
                   count(*) FILTER (WHERE p.kind <> 'soak.dead' AND status = 'failed') AS live_failed
            FROM per_job AS p
            LEFT JOIN effects AS f USING (job_id)
            """
        )
        names = ("enqueued", "lost", "duplicated_rows", "completed", "dead_lettered", "unfinished",
                 "completed_without_effect", "ran_twice", "dead_not_failed", "live_failed")
        figures = dict(zip(names, rows[0], strict=True))
        twice_at = self._query(
            "SELECT extract(epoch FROM max(at)) FROM soak.effects WHERE ok GROUP BY job_id HAVING count(*) > 1")
        for fault in self.timeline:
            low, high = fault.window
            fault.duplicates = sum(1 for (at,) in twice_at if at is not None and low <= float(at) <= high + 30)
        figures["ran_twice_outside_faults"] = figures["ran_twice"] - sum(f.duplicates for f in self.timeline)
        figures["purged_in_audit"] = self._query("SELECT count(*) FROM skiplock.audit_log WHERE action LIKE '%%purge%%'")[0][0]
        return figures

    def deliveries(self) -> dict[str, Any]:
        """The outbox by status, and whether every row marked delivered really reached the
        receiver (a delivered row the receiver never saw is a lost notification)."""
        try:
            outbox = dict(self._query("SELECT status, count(*) FROM skiplock.alert_outbox GROUP BY status"))
            delivered = {key for (key,) in self._query(
                "SELECT idempotency_key FROM skiplock.alert_outbox WHERE status = 'delivered'")}
            retries = dict(self._query("SELECT idempotency_key, attempts FROM skiplock.alert_outbox"))
        except psycopg.Error as exc:
            return {"error": str(exc)}
        with self.receiver.lock:
            seen = dict(self.receiver.seen)
        return {"outbox": outbox, "received_distinct": len(seen),
                "received_more_than_once": sum(1 for n in seen.values() if n > 1),
                "delivered_but_not_received": len(delivered - set(seen)),
                "received_more_often_than_sent": sum(1 for k, n in seen.items() if n > retries.get(k, 0))}

    def failures(self) -> tuple[int, int, dict[str, int]]:
        """5xx and refused connections, inside and outside the faults' windows, and by status."""
        path = self.workdir / "failures.jsonl"
        inside = outside = 0
        by_status: dict[str, int] = {}
        if not path.exists():
            return 0, 0, by_status
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            key = str(entry["status"] or entry["error"])
            by_status[key] = by_status.get(key, 0) + 1
            owner = next((f for f in self.timeline if f.window[0] <= entry["at"] <= f.window[1]), None)
            if owner is None:
                outside += 1
            else:
                owner.failures_5xx += 1
                inside += 1
        return inside, outside, by_status

    def stop_all(self) -> None:
        for thread_owner in (self.producer, self.neighbour):
            if thread_owner is not None:
                thread_owner.stop.set()
                thread_owner.thread.join(timeout=10)
        for child in self.children.values():
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in self.children.values():
            while child.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            child.signal_group(signal.SIGKILL)
        self.receiver.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def pages_served(self) -> int:
        """Pages the load generator got with a 200 while signed in (a run whose users never
        got past the login form exercised nothing)."""
        path = self.workdir / "pages_ok.txt"
        return path.stat().st_size if path.exists() else 0

    def requests_made(self) -> int:
        stats = self.workdir / "locust_stats.csv"
        if not stats.exists():
            return 0
        for line in stats.read_text().splitlines():
            if ",Aggregated," in line:
                return int(line.split(",")[2])
        return 0

    def run(self) -> dict[str, Any]:
        seconds = self.minutes * 60
        self.schedule(seconds)
        self.prepare()
        load_before = os.getloadavg()
        self.start_processes()
        locust = self._start_locust(int(seconds))
        started = time.monotonic()
        try:
            for fault in self.timeline:
                wait = started + fault.at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                log.info("fault: %s", fault.name)
                self.inject(fault)
                log.info("  recovered in %s s", f"{fault.recovered - fault.ended:.1f}" if fault.recovered else "—")
            remaining = started + seconds - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
            load_during = os.getloadavg()
            self.producer.stop.set()
            self.producer.thread.join(timeout=30)
            self.neighbour.stop.set()
            if locust is not None:
                try:
                    locust.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(locust.pid, signal.SIGKILL)
            drained = self.drain()
            self._wait(lambda: not self.deliveries().get("outbox", {}).get("pending"), 60, step=1.0)
            pages_ok = self.pages_served()
            figures = self.conservation()
            deliveries = self.deliveries()
            inside, outside, by_status = self.failures()
        finally:
            self.stop_all()
        return {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "minutes": self.minutes, "rate": self.rate, "users": self.users,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_during": [round(x, 2) for x in load_during],
            "producer_committed": self.producer.committed,
            "producer_failed_transactions": self.producer.failed_transactions,
            "drained": drained,
            "jobs": figures,
            "deliveries": deliveries,
            "http_requests": self.requests_made(),
            "http_pages_served_signed_in": pages_ok,
            "http_5xx_inside_fault_windows": inside,
            "http_5xx_outside_fault_windows": outside,
            "http_failures_by_status": by_status,
            "faults": [
                {"fault": f.name, "note": f.note, "held_s": round(f.ended - f.started, 1),
                 "recovery_s": round(f.recovered - f.ended, 1) if f.recovered else None,
                 "duplicate_side_effects": f.duplicates, "http_5xx": f.failures_5xx}
                for f in self.timeline
            ],
        }


def verdict(result: dict[str, Any]) -> list[str]:
    """What makes the soak fail; empty when it ran clean."""
    jobs = result["jobs"]
    problems = []
    for key in ("lost", "duplicated_rows", "unfinished", "completed_without_effect", "dead_not_failed", "live_failed"):
        if jobs[key]:
            problems.append(f"{jobs[key]} job(s) {key.replace('_', ' ')}")
    for key in ("delivered_but_not_received", "received_more_often_than_sent"):
        if result["deliveries"].get(key):
            problems.append(f"{result['deliveries'][key]} alert notification(s) {key.replace('_', ' ')}")
    if result["users"] and not result["http_pages_served_signed_in"]:
        problems.append("the on-call users never got a page while signed in")
    if not result["drained"]:
        problems.append("the queue did not drain within 180 s after the run")
    if result["http_5xx_outside_fault_windows"]:
        problems.append(f"{result['http_5xx_outside_fault_windows']} 5xx answer(s) outside any fault window")
    for fault in result["faults"]:
        if fault["recovery_s"] is None:
            problems.append(f"no recovery within 120 s after fault {fault['fault']}")
    return problems


def report(result: dict[str, Any]) -> str:
    jobs = result["jobs"]
    lines = [
        f"$ {result['command']}",
        f"load average before {result['load_average_before']}, at the end {result['load_average_during']}",
        "",
        "| fault | held (s) | recovery (s) | jobs lost | duplicate side effects | 5xx |",
        "|---|---|---|---|---|---|",
    ]
    for f in result["faults"]:
        rec = "—" if f["recovery_s"] is None else f"{f['recovery_s']:.1f}"
        note = f" ({f['note']})" if f["note"] else ""
        lines.append(f"| {f['fault']}{note} | {f['held_s']:.1f} | {rec} | {jobs['lost']} (run total) | "
                     f"{f['duplicate_side_effects']} | {f['http_5xx']} |")
    lines += [
        "",
        f"jobs: {jobs['enqueued']} enqueued, {jobs['completed']} completed, {jobs['dead_lettered']} dead-lettered, "
        f"{jobs['lost']} lost, {jobs['duplicated_rows']} in two places, {jobs['unfinished']} unfinished, "
        f"{jobs['completed_without_effect']} completed without their side effect, {jobs['ran_twice']} ran to the end "
        f"twice ({jobs['ran_twice_outside_faults']} outside a fault window)",
        f"producer: {result['producer_committed']} jobs committed, {result['producer_failed_transactions']} "
        f"transactions failed during outages (their jobs were never enqueued)",
        f"alerts: outbox {result['deliveries'].get('outbox')}, receiver saw {result['deliveries'].get('received_distinct')} "
        f"distinct deliveries ({result['deliveries'].get('received_more_than_once')} more than once: at-least-once), "
        f"{result['deliveries'].get('delivered_but_not_received')} marked delivered but never received",
        f"http: {result['http_requests']} requests by {result['users']} users ({result['http_pages_served_signed_in']} pages "
        f"served signed in); 5xx inside fault windows "
        f"{result['http_5xx_inside_fault_windows']}, outside {result['http_5xx_outside_fault_windows']} "
        f"(by status or error: {result['http_failures_by_status']}; 503 is the console saying the database is unreachable, "
        f"0 a refused connection while the web process restarts)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=300.0, help="jobs per second")
    parser.add_argument("--users", type=int, default=50, help="Locust users (0: no load generator)")
    parser.add_argument("--faults", default=",".join(ALL_FAULTS), help=f"comma-separated, from: {', '.join(ALL_FAULTS)}")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    args = parser.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(ALL_FAULTS))
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(unknown)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    workdir = Path(tempfile.mkdtemp(prefix="skiplock-soak-", dir="/tmp"))
    (workdir / "logs").mkdir()
    soak = Soak(args.minutes, args.rate, args.users, faults, workdir)
    try:
        result = soak.run()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}")
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    problems = verdict(result)
    for problem in problems:
        print(f"FAIL: {problem}")
    print("soak: clean" if not problems else "soak: FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
