"""Start and stop everything `skiplock demo` runs, and nothing else.

In order: a private PostgreSQL cluster in a data directory of the demo's own (reused across
runs; `--reset` starts over), a `skiplock_demo` database with pg_stat_statements, the
migrations, a config file with short intervals, then child processes: the scheduler, the web
console, a few workers and the traffic generator. It prints the URL, the login and the
database address, kills one worker now and then (so stuck leases appear and the reaper rescues
them), and runs until Ctrl-C, SIGTERM or `--duration`.

Every child runs in a process group of its own (so a terminal's Ctrl-C reaches only this
process, which then stops them in order) and is asked to die with this process (Linux
`PR_SET_PDEATHSIG`). Shutdown sends SIGTERM to each group, waits, sends SIGKILL to what is
left, then stops PostgreSQL. A cluster left running by a demo that was itself killed is stopped
at the next start.

A component whose command is not part of this installation is reported as "not running" and
never imitated: the demo shows what Skiplock really does.

What the demo writes into its config is `console.demo.democonfig`; how a child process is
started and stopped is `console.demo.processes`.

Why one module of about 510 lines: it is the demo's lifecycle in order (prepare, start,
watch, chaos, stop), each step short; the pieces with a life of their own already moved out.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from console.config import SETTINGS
from console.db import DatabaseError, connect, migrate, time_limited
from console.demo.democonfig import (
    CLUSTER_SETTINGS,
    demo_alerts,
    demo_periodic,
    demo_settings,
    has_setting,
    toml_value,
    traffic_args,
)
from console.demo.processes import Child, pid_alive, reachable_by_postgres
from console.pgcluster import ClusterError, PostgresNotFound, PrivateCluster, free_port
from console.sqlfiles import query

log = logging.getLogger("skiplock.demo")

SIGNALS = {s.value for s in signal.Signals}
DEMO_DATABASE = "skiplock_demo"
DEMO_USER = "demo"


class DemoError(RuntimeError):
    """The demo cannot start; the message says why and what to do."""


@dataclass
class DemoOptions:
    data_dir: Path | None = None
    port: int = 8000
    host: str = "127.0.0.1"
    rate: float = 5.0
    duration: float | None = None
    seed_history: bool = False
    seed_hours: float = 3.0
    workers: int = 2
    kill_every: float = 180.0  # seconds between SIGKILLs of the victim worker; 0 disables
    first_kill_after: float = 60.0
    reset: bool = False
    status_every: float = 60.0
    traffic_args: list[str] = field(default_factory=list)
    # Every interval of the demo (its config, its traffic's schedule, the kills) divided by
    # this: --pace 6 plays the same half hour in five minutes.
    pace: float = 1.0

    def __post_init__(self) -> None:
        if not 0.1 <= self.pace <= 60:
            raise ValueError("--pace must be between 0.1 and 60")
        if self.rate <= 0:
            raise ValueError("--rate must be greater than 0 jobs per second")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("--duration must be greater than 0")
        if not 1 <= self.port <= 65535:
            raise ValueError("--port must be between 1 and 65535")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")


def default_data_dir() -> Path:
    return Path.cwd() / ".skiplock-demo"


# The `skiplock` commands the demo starts as child processes, and the module each one needs.
DEMO_RELEASE = "shop 2026.12.3"
COMPONENTS = {"scheduler": "console.scheduler", "serve": "console.web", "worker": "console.queue.worker",
              "users": "console.users"}


def available_commands() -> set[str]:
    """The components of this installation the demo can run, found without importing them: the
    CLI starts the demo, so the demo must not import the CLI (or a face) back."""
    return {command for command, module in COMPONENTS.items() if importlib.util.find_spec(module) is not None}


class Demo:
    def __init__(self, options: DemoOptions, out: Callable[[str], None] = print):
        self.options = options
        self.out = out
        self.base = Path(options.data_dir) if options.data_dir else default_data_dir()
        self.cluster: PrivateCluster | None = None
        self.children: dict[str, Child] = {}
        self.not_running: dict[str, str] = {}
        self.dsn = ""
        self.url = ""
        self.receiver_port = 0
        self.login: tuple[str, str] | None = None
        self._stop_requested = 0
        self._commands: set[str] = set()
        self._next_kill = 0.0
        self._next_look = 0.0
        self._victim_down_since: float | None = None

    # --- paths ---------------------------------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def config_path(self) -> Path:
        return self.base / "skiplock.toml"

    @property
    def state_path(self) -> Path:
        return self.base / "state.json"

    # --- signals -------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_requested += 1
        if self._stop_requested == 1:
            self.out(f"\n{signal.Signals(signum).name} received: stopping everything the demo started ...")
        else:
            self.out("second signal: killing at once")

    def install_signal_handlers(self) -> dict[int, Any]:
        """Catch Ctrl-C, SIGTERM and SIGHUP; return the previous handlers for `run` to restore."""
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    @property
    def stopping(self) -> bool:
        return self._stop_requested > 0

    # --- the whole run -------------------------------------------------------------------

    def run(self) -> int:
        previous = self.install_signal_handlers()
        try:
            self.prepare()
            if self.stopping:
                return 0
            self.start_children()
            self.announce()
            return self.watch()
        finally:
            self.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # --- preparing -----------------------------------------------------------------------

    def _check_not_running_already(self) -> None:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return
        pid = state.get("pid")
        if pid and pid != os.getpid() and pid_alive(pid) and state.get("running"):
            raise DemoError(f"a demo is already running from {self.base} (pid {pid}); stop it first or pass --data-dir")

    def prepare(self) -> None:
        opts = self.options
        self._commands = available_commands()
        self.base.mkdir(parents=True, exist_ok=True)
        if not reachable_by_postgres(self.base):
            digest = hashlib.sha1(str(self.base.resolve()).encode()).hexdigest()[:8]
            fallback = Path("/tmp") / f"skiplock-demo-{digest}"
            self.out(f"note: the postgres user cannot enter {self.base} (running as root); using {fallback} instead")
            self.base = fallback
            self.base.mkdir(parents=True, exist_ok=True)
        self._check_not_running_already()
        if "serve" in self._commands:
            _check_port_free(opts.host, opts.port)
            self.url = f"http://{opts.host}:{opts.port}/"
        self.receiver_port = free_port()

        try:
            cluster = PrivateCluster(self.base, settings=CLUSTER_SETTINGS, keep=True)
        except PostgresNotFound as exc:
            raise DemoError(str(exc)) from None
        if (cluster.data_dir / "postmaster.pid").exists():
            self.out("stopping a PostgreSQL left running by an earlier demo ...")
            cluster.stop()
        if opts.reset:
            self.out(f"--reset: removing {self.base}")
            for child in self.base.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        fresh = not (cluster.data_dir / "PG_VERSION").exists()
        self.out(("creating" if fresh else "starting") + f" a private PostgreSQL in {cluster.data_dir} ...")
        self.cluster = cluster
        try:
            cluster.start()
        except ClusterError as exc:
            raise DemoError(f"PostgreSQL did not start: {exc}\n(log: {cluster.log_file}; `--reset` starts over)") from None
        self._write_state(running=True)

        with connect(cluster.dsn, application_name="skiplock-demo") as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DATABASE,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
        self.dsn = cluster.dsn_for(DEMO_DATABASE)
        with connect(self.dsn, application_name="skiplock-demo") as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            applied = migrate(conn)
        self.out(f"migrated: {', '.join(applied)}" if applied else "schema is up to date")
        self._write_config()
        self._write_state(running=True)
        if opts.seed_history:
            from console.demo.seed import seed_history

            with connect(self.dsn, application_name="skiplock-demo-seed") as conn:
                stored = seed_history(conn, hours=opts.seed_hours, rate=opts.rate)
            self.out(f"--seed-history: stored {stored} samples covering the last {opts.seed_hours:g} h")

    @property
    def alerts_installed(self) -> bool:
        return has_setting("alerts.evaluate")

    def _write_config(self) -> None:
        known = {s.dotted: s for s in SETTINGS}
        wanted = demo_settings(self.options.pace)
        if self.url:
            wanted["alerts.console_url"] = self.url.rstrip("/")
        applied = {k: v for k, v in wanted.items() if k in known}
        sections: dict[str, list[str]] = {}
        for dotted, value in applied.items():
            section, key = dotted.split(".", 1)
            sections.setdefault(section, []).append(f"{key} = {toml_value(value)}")
        lines = ["# Written by `skiplock demo` at each start: short intervals so a few minutes show everything.", ""]
        for section, entries in sections.items():
            lines += [f"[{section}]", *entries, ""]
        skipped = [f"#   {k} = {toml_value(v)}" for k, v in wanted.items() if k not in known]
        if skipped:
            lines += ["# Demo settings this installation does not have yet (its component is not installed):", *skipped, ""]
        lines += [demo_periodic(self.options.pace)]
        if self.alerts_installed:
            lines += [demo_alerts(port=self.receiver_port, secret=self._secrets()["webhook_secret"], pace=self.options.pace)]
        self.config_path.write_text("\n".join(lines), encoding="utf-8")
        self.config_path.chmod(0o600)  # it holds the demo receiver's signing secret

    def _secrets(self) -> dict[str, str]:
        """The demo login's password and the web console's secret key, kept across runs."""
        path = self.base / "secrets.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data.setdefault("password", secrets.token_urlsafe(9))
        data.setdefault("secret_key", secrets.token_hex(32))
        data.setdefault("webhook_secret", secrets.token_hex(16))
        path.write_text(json.dumps(data))
        path.chmod(0o600)
        return data

    def child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
        env.update(DATABASE_URL=self.dsn, SKIPLOCK_CONFIG=str(self.config_path), PYTHONUNBUFFERED="1")
        # The release a deploy would set ([worker] release): the Workers page and the timeline show it.
        env["SKIPLOCK_WORKER_RELEASE"] = DEMO_RELEASE
        # The checkout on the path, so an uninstalled run (`python -m console demo`) works too.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        return env

    # --- children ------------------------------------------------------------------------

    def _skiplock(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", *args]

    def _add(self, name: str, argv: list[str], *, restart: bool = True, env: dict[str, str] | None = None) -> Child:
        child = Child(name, argv, {**self.child_env(), **(env or {})}, self.logs / f"{name}.log", restart=restart)
        self.children[name] = child
        child.start()
        return child

    def start_children(self) -> None:
        opts = self.options
        cmds = self._commands
        if self.alerts_installed and "scheduler" in cmds:
            self._add("webhooks", [sys.executable, "-m", "console.demo.receiver", "--port", str(self.receiver_port)],
                      env={"DEMO_WEBHOOK_SECRET": self._secrets()["webhook_secret"]})
        if "scheduler" in cmds:
            # A crash prints every thread's stack to its log (docs/alerts.md#scheduler_restarts).
            self._add("scheduler", self._skiplock("scheduler"), env={"PYTHONFAULTHANDLER": "1"})
        else:
            self.not_running["scheduler"] = (
                "`skiplock scheduler` is not in this installation yet: no collectors (charts stay empty "
                "unless --seed-history), no reaper (stuck leases stay stuck), no archiver")
        if "serve" in cmds:
            # A secret key kept across runs, so a restart of the web console keeps the sign-in.
            key = {"SKIPLOCK_WEB_SECRET_KEY": self._secrets()["secret_key"]} if has_setting("web.secret_key") else {}
            self._add("web", self._skiplock("serve", "--host", opts.host, "--port", str(opts.port)), env=key)
        else:
            self.not_running["web"] = "`skiplock serve` is not in this installation yet: no web console to open"
        self._create_login()
        queues = "billing,mail,webhooks,default"
        for i in range(1, opts.workers + 1):
            self._add(f"worker-{i}", self._skiplock("worker", "--tasks", "console.demo.tasks", "--queues", queues))
        self._add("worker-reports", self._skiplock("worker", "--tasks", "console.demo.tasks", "--queues", "reports,search",
                                                   "--concurrency", "2"))
        self._next_kill = time.monotonic() + opts.first_kill_after
        traffic = [sys.executable, "-m", "console.demo.traffic", "--dsn", self.dsn, "--rate", str(opts.rate),
                   *traffic_args(opts.pace)]
        self._add("traffic", traffic + list(opts.traffic_args))
        self._write_state(running=True)

    def _create_login(self) -> None:
        """The demo login, created through `console.users` directly (what `skiplock users add`
        calls), audited like the command does."""
        if "users" not in self._commands:
            self.not_running["login"] = "`skiplock users` is not in this installation yet: no demo login"
            return
        from console import audit, users
        from console.actions import cli_actor

        password = self._secrets()["password"]
        try:
            with connect(self.dsn, application_name="skiplock-demo") as conn, conn.transaction():
                created = users.add_user(conn, DEMO_USER, "operator", password)
                audit.record(conn, actor=cli_actor("skiplock-demo"), action="user_add" if created else "user_update",
                             target=f"user:{DEMO_USER}", selection={"user": DEMO_USER}, rows=1,
                             reason="demo setup: the operator login printed by `skiplock demo`",
                             detail={"role": "operator"})
        except (psycopg.Error, DatabaseError, ValueError) as exc:
            self.not_running["login"] = f"creating the demo login failed: {str(exc).strip()[-300:]}"
            return
        self.login = (DEMO_USER, password)

    def _wait_for_web(self, timeout: float = 30.0) -> bool:
        if "web" not in self.children:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping:
            if not self.children["web"].alive():
                return False
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        return False

    def announce(self) -> None:
        opts = self.options
        web_ok = self._wait_for_web()
        lines = ["", "Skiplock demo is running."]
        if web_ok:
            lines.append(f"  Console    {self.url}")
            if self.login:
                lines.append(f"  Login      {self.login[0]} / {self.login[1]}   (an operator: may replay, purge, pause)")
        elif "web" in self.children:
            lines.append(f"  Console    {self.url} did not answer yet; see {self.children['web'].log_path}")
        lines += [
            f"  Database   {self.dsn}   (psql \"{self.dsn}\")",
            *self.cli_lines(),
            f"  Traffic    about {opts.rate:g} jobs/s on queues billing, mail, webhooks, default, reports, search;",
            f"             retries, dead letters in three error groups, a burst every {_human(240 / opts.pace)}, a session idle in",
            f"             transaction for {_human(360 / opts.pace)} every {_human(1200 / opts.pace)}"
            + (", worker-reports killed every " + _human(opts.kill_every) if opts.kill_every else "")
            + (f" (--pace {opts.pace:g})" if opts.pace != 1 else ""),
        ]
        paced = demo_settings(opts.pace)
        if "scheduler" in self.children:
            lines.append(f"  Scheduler  collectors every {_human(paced['scheduler.collect_interval'])}, reaper every "
                         f"{_human(paced['scheduler.reap_interval'])}, archiver every {_human(paced['scheduler.archive_interval'])}")
        if "webhooks" in self.children:
            lines.append(f"  Alerts     demo thresholds (queue age > {_human(30 / opts.pace)}, stuck leases, xmin horizon > "
                         f"{_human(30 / opts.pace)}; docs/operators-guide.md says when each fires) delivered to a local"
                         f" receiver: {self.children['webhooks'].log_path}")
        lines += [
            f"  Processes  {', '.join(f'{name} (pid {c.pid})' for name, c in self.children.items())}",
            f"  Logs       {self.logs}/",
        ]
        for name, why in self.not_running.items():
            lines.append(f"  Not running: {name}: {why}")
        if opts.duration:
            lines.append(f"Stopping by itself after {opts.duration:g} s.")
        lines += ["Press Ctrl-C to stop everything (PostgreSQL included; the data stays for next time).", ""]
        self.out("\n".join(lines))

    def cli_lines(self) -> list[str]:
        """The banner's lines for a shell beside the demo: `skiplock ...` run there must read the
        demo's database and settings (its lease, intervals and alert rules), not the defaults."""
        return [f"  CLI        export DATABASE_URL='{self.dsn}' SKIPLOCK_CONFIG='{self.config_path}'",
                "             (then `skiplock queues list`, `skiplock why JOB_ID`, ... use the demo's settings)"]

    # --- running -------------------------------------------------------------------------

    def watch(self) -> int:
        opts = self.options
        started = time.monotonic()
        next_status = started + opts.status_every
        while not self.stopping:
            now = time.monotonic()
            if opts.duration and now - started >= opts.duration:
                self.out(f"--duration {opts.duration:g}s reached: stopping.")
                break
            self._chaos(now)
            self._supervise(now)
            if opts.status_every and now >= next_status:
                self.out(self.status_line())
                next_status = now + opts.status_every
            time.sleep(0.2)
        return 0

    def _chaos(self, now: float) -> None:
        """SIGKILL the reports worker now and then; its jobs keep their leases until the reaper.

        The kill waits until the worker holds a job (a worker killed idle loses nothing, and
        there would be nothing to see) and comes just after a reaper run: its jobs' leases then
        expire and stay expired until the next run, long enough for the stuck_leases alert.
        Killed at a random moment, the reaper often came first and the promised alert never
        fired (docs/operators-guide.md, "The demo")."""
        victim = self.children.get("worker-reports")
        if not self.options.kill_every or victim is None:
            return
        if self._victim_down_since is None and now >= self._next_kill and victim.alive() and now >= self._next_look:
            self._next_look = now + 0.5  # a look at the database at most twice a second while a kill is due
            if not self._ripe(victim):
                return
            victim.signal_group(signal.SIGKILL)
            victim.popen.wait()
            self._victim_down_since = now
            self.out(f"chaos: killed worker-reports (pid {victim.pid}) with SIGKILL while it held a job; its jobs keep "
                     "their leases until they expire and the reaper rescues them")
        elif self._victim_down_since is not None and now - self._victim_down_since >= 5.0 / self.options.pace:
            victim.start()
            self._victim_down_since = None
            self._next_kill = now + self.options.kill_every
            self._write_state(running=True)

    def _ripe(self, victim: Child) -> bool:
        """The victim holds a running job and the reaper ran less than a sixth of its interval ago
        (or the scheduler is not running: then nothing rescues the jobs anyway)."""
        try:
            with connect(self.dsn, application_name="skiplock-demo", connect_timeout=2) as conn, \
                    time_limited(conn, 1000) as cur:
                row = cur.execute(query("demo", "kill_moment"), {
                    "worker": f"%:{victim.pid}:%", "fresh": demo_settings(self.options.pace)["scheduler.reap_interval"] / 6,
                }).fetchone()
        except (psycopg.Error, DatabaseError):
            return False
        return bool(row["holds"]) and (row["reaped_recently"] or not row["reaper_seen"] or "scheduler" not in self.children)

    def _supervise(self, now: float) -> None:
        """Restart a child that exited on its own (not the victim while it is meant to be down)."""
        for name, child in self.children.items():
            if child.alive() or not child.restart:
                continue
            if name == "worker-reports" and self._victim_down_since is not None:
                continue
            code = child.popen.returncode if child.popen else None
            if now - child.started_at < 10 and child.starts >= 3:
                child.restart = False
                self.out(f"{name} keeps exiting (code {code}); not restarting it. See {child.log_path}")
                continue
            how = f"code {code}" + (f", {signal.Signals(-code).name}" if code is not None and -code in SIGNALS else "")
            # The demo keeps the console running, but a restart is not hidden: a scheduler that
            # died without stopping counts in scheduler_restarts (Maintenance page, alert).
            counted = "; it counts as a scheduler restart (Maintenance page, alert scheduler_restarts)" \
                if name == "scheduler" else ""
            self.out(f"{name} exited ({how}); restarting it{counted}. See {child.log_path}")
            child.start()
            self._write_state(running=True)

    def status_line(self) -> str:
        try:
            with connect(self.dsn, application_name="skiplock-demo") as conn, time_limited(conn, 2000) as cur:
                row = cur.execute(query("demo", "status")).fetchone()
        except (psycopg.Error, DatabaseError) as exc:
            return f"status: not available ({type(exc).__name__})"
        return ("status: {completed} completed, {retried} retried, {pending} pending, {running} running, "
                "{stuck_leases} stuck leases, {dead_letters} dead letters").format(**row)

    # --- stopping ------------------------------------------------------------------------

    def shutdown(self, grace: float = 10.0) -> None:
        """SIGTERM every child's group, wait up to `grace` seconds, SIGKILL the rest, stop PostgreSQL."""
        alive = [c for c in self.children.values() if c.alive()]
        for child in alive:
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.alive() for c in alive) and time.monotonic() < deadline and self._stop_requested < 2:
            time.sleep(0.1)
        for child in self.children.values():
            child.signal_group(signal.SIGKILL)  # also reaches grandchildren left in the group
            if child.popen is not None:
                try:
                    child.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if self.cluster is not None and self.cluster.running:
            self.cluster.stop()
            self.out("stopped: PostgreSQL and " + (f"{len(self.children)} processes" if self.children else "nothing else"))
        self._write_state(running=False)

    def _write_state(self, *, running: bool) -> None:
        """state.json: what runs now, for `--reset`, a second demo, and the tests' process checks."""
        if not self.base.exists():
            return
        state = {
            "pid": os.getpid(),
            "running": running,
            "dsn": self.dsn,
            "url": self.url,
            "postmaster_pid": self.cluster.postmaster_pid() if self.cluster and running else None,
            "children": {name: c.pid for name, c in self.children.items()} if running else {},
            "config": str(self.config_path),
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_path)


def _human(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:.3g} s"


def _check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise DemoError(f"port {port} on {host} is in use; pass --port with a free one (e.g. --port {free_port()})") from None
