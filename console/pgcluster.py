"""A private, throwaway PostgreSQL cluster for the demo, the tests and the benchmarks.

It runs Debian's (or any local) PostgreSQL server binaries in a data directory of its own, on
a free loopback port, with `pg_stat_statements` preloaded. `initdb`, `pg_ctl` and `postgres`
refuse to run as root, so as root they run as the `postgres` user, and the directory lives
under /tmp (never under /root or a pytest tmp_path, which that user cannot reach).

It will not touch the system's own cluster and never installs anything: when no server
binaries are found it raises `PostgresNotFound` naming the package to install.

Other majors than the system's (the test suite's PostgreSQL matrix, `pytest --postgresql 17`):
`scripts/bootstrap.sh --test` unpacks the server binaries of PostgreSQL 16, 17 and 18 into
`BUNDLED_DIR/<major>` (bin/, lib/ with their own shared libraries, share/), and
`find_bindir(major)` finds them there, or in Debian's /usr/lib/postgresql/<major>/bin. Binaries
that bring their own libraries (a `lib/` beside `bin/` holding `lib*.so*`) run with
LD_LIBRARY_PATH set to it.

With `exit_guard=True` (the test suite) the cluster is stopped however the process ends: by
`stop()`, at interpreter exit (atexit), on SIGTERM, SIGINT or SIGHUP (handlers that stop it,
then hand the signal to whatever handled it before), and when the process dies without running
any Python at all (SIGKILL, pytest-timeout's `os._exit`): a small watchdog process started with
the cluster waits for its parent to go and then runs `pg_ctl stop -m immediate`. The demo does
not use it: a killed demo leaves its cluster for the next start to find and stop.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

INSTALL_HINT = (
    "No PostgreSQL server binaries (initdb, pg_ctl) were found. Install them, for example "
    "`apt-get install postgresql-15` on Debian/Ubuntu or `brew install postgresql@15` on macOS, "
    "or set PG_BIN to the folder that holds them."
)

DEFAULT_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "listen_addresses": "127.0.0.1",
    "track_io_timing": "on",
    "max_connections": "200",
}

# Durability off: for tests and benchmarks that say so. Never for data anyone keeps.
RELAXED_DURABILITY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class PostgresNotFound(RuntimeError):
    pass


class ClusterError(RuntimeError):
    pass


# Where scripts/bootstrap.sh --test unpacks the other majors' server binaries, one folder per
# major (bin/, lib/, share/). Outside the checkout and outside /root: the binaries run as the
# postgres user when the tests run as root, and it must reach them; several checkouts (and CI's
# fresh clone on the same machine) share one copy.
BUNDLED_DIR = Path("/var/tmp/skiplock-postgresql")


def find_bindir(major: int | None = None) -> Path:
    """The folder holding initdb and pg_ctl: $PG_BIN, `pg_config --bindir`, then Debian's layout.

    With `major`, the binaries of that major version only: the bundled ones (BUNDLED_DIR) or
    Debian's; PostgresNotFound says how to get them."""
    if major is not None:
        for folder in (BUNDLED_DIR / str(major) / "bin", Path(f"/usr/lib/postgresql/{major}/bin")):
            if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
                return folder
        raise PostgresNotFound(
            f"No PostgreSQL {major} server binaries in {BUNDLED_DIR / str(major)} or "
            f"/usr/lib/postgresql/{major}: `scripts/bootstrap.sh --test` fetches 16, 17 and 18."
        )
    candidates: list[str] = []
    if os.environ.get("PG_BIN"):
        candidates.append(os.environ["PG_BIN"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(out.stdout.strip())
        except (OSError, subprocess.CalledProcessError):
            pass

    def version_key(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version_key, reverse=True)
    candidates += ["/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/bin", "/usr/bin"]
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    raise PostgresNotFound(INSTALL_HINT)


def server_env(bindir: Path) -> dict[str, str] | None:
    """The environment to run the binaries of `bindir` in: None (this process's) for binaries
    linked against the system's libraries, LD_LIBRARY_PATH naming the bundled `lib/` beside
    `bin/` for those that bring their own (libicu, libssl, libxml2 of their build)."""
    lib = bindir.parent / "lib"
    if not lib.is_dir() or not any(lib.glob("lib*.so*")):
        return None
    previous = os.environ.get("LD_LIBRARY_PATH")
    return {**os.environ, "LD_LIBRARY_PATH": f"{lib}{os.pathsep}{previous}" if previous else str(lib)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The watchdog (run with `python -c`, so it needs nothing importable): it blocks reading its
# stdin, a pipe whose only writer is the process that started the cluster. `stop()` writes
# "done"; any other end of the writer (a crash, SIGKILL, os._exit) is an EOF, and then it stops
# the cluster at once and removes its folder. Its own session keeps Ctrl-C and the terminal's
# SIGHUP, which are meant for the test run, away from it.
_GUARD = r"""
import json, os, shutil, signal, subprocess, sys, time
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
spec = json.loads(sys.argv[1])
if sys.stdin.read() != "done":
    try:
        subprocess.run(spec["stop"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
    except Exception:
        pass
    try:
        with open(spec["pidfile"]) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)
        time.sleep(0.2)
    except Exception:
        pass
    if not spec["keep"]:
        shutil.rmtree(spec["base"], ignore_errors=True)
"""

_GUARDED: list[PrivateCluster] = []  # started clusters with exit_guard=True, stopped at exit
_PREVIOUS_HANDLERS: dict[int, object] = {}
_installed = False
_GUARD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stop_guarded() -> None:
    for cluster in list(_GUARDED):
        try:
            cluster.stop(mode="immediate")
        except Exception:  # at exit, stop what can be stopped
            pass


def _on_signal(signum: int, frame: object) -> None:
    """Stop every guarded cluster, then do what the signal would have done without us."""
    _stop_guarded()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)  # e.g. Python's SIGINT handler: KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_guards() -> None:
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread, and once is enough
    for sig in _GUARD_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # ignored on purpose (nohup): it must not stop the cluster either
        _PREVIOUS_HANDLERS[sig] = signal.signal(sig, _on_signal)
    _installed = True


atexit.register(_stop_guarded)


class PrivateCluster:
    """Start with `start()` (or `with PrivateCluster() as cluster:`), read `dsn`, `stop()`.

    `base_dir` is created when not given and removed on stop unless `keep=True`. An existing
    data directory in `base_dir` is reused (the demo restarts on the same data). `exit_guard`:
    stop it however this process ends (see the module docstring).
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        keep: bool = False,
        exit_guard: bool = False,
        bindir: str | os.PathLike[str] | None = None,
    ):
        self.bindir = Path(bindir) if bindir else find_bindir()
        self.env = server_env(self.bindir)
        self._made_base = base_dir is None
        self.base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="skiplock-pg-", dir="/tmp"))
        self.port = port or free_port()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.keep = keep
        self.exit_guard = exit_guard
        self.running = False
        self._watchdog: subprocess.Popen | None = None

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def log_file(self) -> Path:
        return self.base / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return args

    def _run(self, args: list[str], what: str) -> None:
        result = subprocess.run(self._as_owner(args), capture_output=True, text=True, env=self.env)
        if result.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise ClusterError(f"{what} failed: {result.stderr.strip() or result.stdout.strip()}\n{log}")

    def start(self) -> str:
        self.base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                 "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                "initdb",
            )
        options = [f"-p {self.port}", f"-k {self.base}"] + [f"-c {k}={v}" for k, v in self.settings.items()]
        self._run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
             "-w", "-t", "60", "-o", " ".join(options), "start"],
            "pg_ctl start",
        )
        self.running = True
        if self.exit_guard:
            self._guard()
        return self.dsn

    def _guard(self) -> None:
        if self not in _GUARDED:
            _GUARDED.append(self)
        _install_guards()
        if self._watchdog is None or self._watchdog.poll() is not None:
            spec = {
                "stop": self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"]),
                "pidfile": str(self.data_dir / "postmaster.pid"),
                "base": str(self.base),
                "keep": self.keep,
            }
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _GUARD, json.dumps(spec)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, env=self.env,
            )

    def _dismiss_guard(self) -> None:
        if self in _GUARDED:
            _GUARDED.remove(self)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.poll() is None:
            try:
                watchdog.communicate(b"done", timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                watchdog.kill()

    def restart(self, mode: str = "fast") -> None:
        """Stop and start on the same port and data (fault tests restart PostgreSQL under load)."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"], "pg_ctl stop")
        self.running = False
        self.start()

    def halt(self, mode: str = "immediate") -> None:
        """Stop PostgreSQL and keep the data and port: `start()` brings the same cluster back
        (tests of a database that goes down while the console watches it)."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"], "pg_ctl stop")
        self.running = False

    def promote(self) -> None:
        """Promote this standby to a primary (`pg_ctl promote -w`: returns once it accepts
        writes); failover tests stop the primary first."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", "promote"], "pg_ctl promote")

    def start_standby(
        self,
        application_name: str,
        *,
        slot: str | None = None,
        settings: dict[str, str] | None = None,
    ) -> PrivateCluster:
        """A streaming standby of this (running) cluster: `pg_basebackup -R` into a new data
        directory, started on its own port. Stop it yourself (`stop()`), before or after this one.

        It inherits this cluster's settings (a hot standby needs max_connections,
        max_prepared_transactions and friends at least as high as its primary's), then
        `settings`. `application_name` names it in the primary's pg_stat_replication; `slot`
        creates a physical replication slot of that name on the primary and streams through it.
        The primary needs wal_level=replica (the default), max_wal_senders > 0 (default 10) and a
        replication line in pg_hba.conf (initdb -A trust writes one for 127.0.0.1).
        """
        if not self.running:
            raise ClusterError("start the primary before its standby")
        standby = PrivateCluster(settings={**self.settings, **(settings or {})}, bindir=self.bindir)
        try:
            standby.base.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(standby.base, "postgres", "postgres")
            conninfo = f"host=127.0.0.1 port={self.port} user=postgres application_name={application_name}"
            args = [str(self.bindir / "pg_basebackup"), "-D", str(standby.data_dir), "-R", "-X", "stream",
                    "-c", "fast", "--no-sync", "-d", conninfo]
            if slot:
                args += ["-S", slot, "-C"]
            self._run(args, "pg_basebackup")
            standby.start()
        except BaseException:
            standby.stop()
            raise
        return standby

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, mode: str = "fast") -> None:
        """Stop PostgreSQL and remove the directory (unless `keep`). `mode="immediate"` skips the
        shutdown checkpoint: for data thrown away right after, where writing out every dirty
        buffer (seconds on a busy machine) buys nothing."""
        if self.running or (self.data_dir / "postmaster.pid").exists():
            try:
                self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"], "pg_ctl stop")
            except ClusterError:
                pid = self.postmaster_pid()
                if pid:
                    try:
                        os.kill(pid, 9)
                        time.sleep(0.2)
                    except ProcessLookupError:
                        pass
            self.running = False
        if not self.keep:
            shutil.rmtree(self.base, ignore_errors=True)
        self._dismiss_guard()

    def __enter__(self) -> PrivateCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
