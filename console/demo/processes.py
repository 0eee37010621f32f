"""The demo's child processes: each in a process group of its own, asked to die with the demo
(Linux `PR_SET_PDEATHSIG`), its output in a log file. `console.demo.orchestrator` decides what
runs; this module only starts, signals and checks processes (bench/soak.py uses `Child` too).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: ask Linux to SIGTERM the child when this process dies (even by SIGKILL)."""

    def setup() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return  # not Linux: shutdown still stops children; only a SIGKILLed demo leaks them
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


@dataclass
class Child:
    """One child process, in its own process group, with its output in a log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    restart: bool = True
    popen: subprocess.Popen | None = None
    starts: int = 0
    started_at: float = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent(os.getpid()),
            )
        self.starts += 1
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reachable_by_postgres(path: Path) -> bool:
    """As root the cluster runs as `postgres`, who must be able to enter every parent folder."""
    if os.geteuid() != 0:
        return True
    result = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(path)], capture_output=True)
    return result.returncode == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
