"""A test that runs past its timeout leaves its stacks where the run's log shows them.

pytest-timeout's "thread" method (pyproject.toml: it also ends tests blocked in C) dumps every
thread's stack to the terminal and ends the process with `os._exit(1)`. Under xdist that
terminal is the worker's, which the controller never prints: the log says only
`[gw1] node down: Not properly terminated`, and which test, how long and where it hung are lost.
This hook writes the same dump to a file first (`.pytest-timeouts/` under the run's root
directory, one file per worker process), and the controller prints those files at the end of
the run.

`make test` also passes `--max-worker-restart 0`: after a worker is lost, xdist 3.8's `loadfile`
scheduler can requeue the dead worker's finished files as empty units and wait for them forever
(two suites side by side on two cores hung at 99 % this way). A lost worker now ends the run
with the test it was running named, instead of stalling CI.
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from pathlib import Path

import pytest


def _dumps(config) -> Path:
    return Path(config.rootpath) / ".pytest-timeouts"


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_sessionstart(session):
    """The controller (or a run without xdist) starts with no dumps of an earlier run."""
    if not hasattr(session.config, "workerinput"):
        for old in _dumps(session.config).glob("*.txt"):
            old.unlink(missing_ok=True)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Arm pytest-timeout's own thread timer, with a dump to a file ahead of its `os._exit`."""
    if settings.method != "thread" or not settings.timeout or settings.timeout <= 0:
        return None  # pytest-timeout's own implementation handles it
    import pytest_timeout

    started = time.monotonic()
    dumps = _dumps(item.config)

    def expire() -> None:
        try:
            dumps.mkdir(exist_ok=True)
            with open(dumps / f"{_worker()}-{os.getpid()}.txt", "w") as out:
                load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                out.write(f"{item.nodeid} ran past its {settings.timeout:.0f} s timeout "
                          f"({time.monotonic() - started:.0f} s, load average {load}) on {_worker()}\n\n")
                out.flush()
                faulthandler.dump_traceback(out, all_threads=True)
        except OSError:
            pass  # the dump is a help; the timeout must still end the test
        pytest_timeout.timeout_timer(item, settings)  # its terminal dump, then os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # pytest-timeout's pytest_timeout_cancel_timer calls it
    timer.start()
    return True


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    dumps = sorted(_dumps(config).glob("*.txt"))
    if not dumps:
        return
    terminalreporter.section("tests past their timeout (stacks of every thread)", sep="+")
    for dump in dumps:
        terminalreporter.write_line(f"--- {dump.name}")
        terminalreporter.write_line(dump.read_text(errors="replace"))
