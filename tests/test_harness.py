"""The harness itself: however a test run ends (a hang cut short by pytest-timeout, Ctrl-C,
SIGTERM, even SIGKILL), its private PostgreSQL does not outlive it.

Each case runs a real pytest in a child process on a tiny test file that starts the session's
cluster (the `pg_cluster` fixture of tests/conftest.py) and then hangs, ends it that way, and
looks in /proc for any process still running on that cluster's data directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

# The child runs need none of the installed plugins but pytest-timeout (named with -p where it is
# used). Autoloading them (schemathesis, hypothesis, locust, playwright) costs a child run about
# five seconds of CPU, several times what the child's own test costs.
NO_PLUGIN_AUTOLOAD = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

# The child stands for a run in a terminal, where Ctrl-C raises KeyboardInterrupt. A run started
# in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored,
# and Python then leaves it ignored: the child slept through its SIGINT, which is what the
# cluster's guard is meant to respect (pgcluster `_install_guards`), not what this case tests.
HANGING_CONFTEST = """
import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.conftest import *  # noqa: E402,F401,F403
"""

HANGING_TEST = """
import os
import time
from pathlib import Path


def test_hangs(pg_cluster):
    Path(os.environ["HARNESS_MARKER"]).write_text(str(pg_cluster.data_dir))
    time.sleep(600)
"""


def processes_on(data_dir: str) -> list[str]:
    """Command lines of live processes that mention `data_dir` (`postgres -D <data_dir> ...`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if data_dir in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.parametrize("ending", ["timeout", "SIGINT", "SIGTERM", "SIGKILL"])
def test_a_hung_or_killed_run_leaves_no_postgres_behind(tmp_path, ending):
    (tmp_path / "conftest.py").write_text(HANGING_CONFTEST)
    (tmp_path / "test_hang.py").write_text(HANGING_TEST)
    marker = tmp_path / "data_dir.txt"
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PYTEST_ADDOPTS"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["HARNESS_MARKER"] = str(marker)
    env.update(NO_PLUGIN_AUTOLOAD)
    # The suite's own method (pyproject.toml): "thread" ends the process with os._exit, so no
    # finally and no atexit runs; only the watchdog can stop the cluster.
    timeout = ["--timeout", "20", "-o", "timeout_method=thread"] if ending == "timeout" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_timeout", "-q", "-s", *timeout,
         str(tmp_path / "test_hang.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        data_dir = wait_for(lambda: marker.exists() and marker.read_text() or proc.poll() is not None and "exited",
                            timeout=120, what="the child run's cluster")
        assert data_dir != "exited", proc.communicate()[0]
        assert processes_on(data_dir), "the child's cluster should be running now"
        if ending != "timeout":
            time.sleep(0.5)  # into the hanging test's sleep
            proc.send_signal(getattr(signal, ending))
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            # Say what was still running in the child's session and what it had printed: this is
            # how a child asleep through an inherited, ignored SIGINT was found (HANGING_CONFTEST).
            tree = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "-s", str(proc.pid)],
                                  capture_output=True, text=True).stdout
            os.killpg(proc.pid, signal.SIGKILL)
            printed = proc.communicate()[0]
            pytest.fail(f"the child run did not end within 120 s of {ending}\nits session:\n{tree}\n"
                        f"it printed:\n{printed}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, output
    if ending == "timeout":
        assert "Timeout" in output and "test_hangs" in output, output  # a failure with a stack
    wait_for(lambda: not processes_on(data_dir), timeout=30, what=f"PostgreSQL on {data_dir} to stop after {ending}")
    wait_for(lambda: not Path(data_dir).parent.exists(), timeout=30, what=f"{Path(data_dir).parent} to be removed")


def _run_child_pytest(tmp_path, conftest: str, test_file: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_child.py").write_text(test_file)
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PYTEST_ADDOPTS", "CI"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--strict-markers",
         "-o", "markers=browser: drives Chromium", str(tmp_path / "test_child.py")],
        cwd=tmp_path, env={**env, **NO_PLUGIN_AUTOLOAD, **env_extra}, capture_output=True, text=True, timeout=120,
    )


SKIPPING_TEST = """
import pytest


def test_skips_for_a_reason_of_the_environment():
    pytest.skip("DATABASE_URL given")
"""


def test_under_ci_a_skip_is_a_failure(tmp_path):
    conftest = "from tests.conftest import pytest_runtest_makereport  # noqa: F401\n"
    outside = _run_child_pytest(tmp_path, conftest, SKIPPING_TEST, {})
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    in_ci = _run_child_pytest(tmp_path, conftest, SKIPPING_TEST, {"CI": "true"})
    assert in_ci.returncode == 1, in_ci.stdout
    assert "1 failed" in in_ci.stdout and "skipped under CI=true" in in_ci.stdout, in_ci.stdout


BROWSER_TEST = """
import pytest


@pytest.mark.browser
def test_drives_chromium():
    pass
"""


def test_under_ci_a_missing_chromium_stops_the_run_instead_of_skipping_browser_tests(tmp_path):
    conftest = ("from pathlib import Path\n\nimport tests.conftest\n"
                "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n\n"
                "tests.conftest.CHROMIUM = Path('/nonexistent/chromium')\n")
    in_ci = _run_child_pytest(tmp_path, conftest, BROWSER_TEST, {"CI": "true"})
    assert in_ci.returncode != 0 and "/nonexistent/chromium is missing" in in_ci.stdout + in_ci.stderr, in_ci
    outside = _run_child_pytest(tmp_path, conftest, BROWSER_TEST, {})
    assert outside.returncode == 0, outside.stdout


SLOW_TEST = """
import time


def test_outlives_its_timeout():
    time.sleep(60)


def test_quick():
    pass
"""


def test_a_test_past_its_timeout_under_xdist_is_named_with_its_stack_and_ends_the_run(tmp_path):
    """Under xdist the thread timeout's own dump is lost with the worker's terminal, and a lost
    worker could leave `loadfile` waiting forever (tests/timeouts.py). The run must end, name the
    test, and print where it was."""
    (tmp_path / "conftest.py").write_text(
        "from tests.timeouts import pytest_sessionstart, pytest_terminal_summary, pytest_timeout_set_timer  # noqa: F401\n")
    (tmp_path / "test_slow.py").write_text(SLOW_TEST)
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PYTEST_ADDOPTS", "CI"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_timeout", "-p", "xdist.plugin",
         "-n", "2", "--dist", "loadfile", "--max-worker-restart", "0", "--timeout", "3", "-o", "timeout_method=thread",
         str(tmp_path / "test_slow.py")],
        cwd=tmp_path, env={**env, **NO_PLUGIN_AUTOLOAD}, capture_output=True, text=True, timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert time.monotonic() - started < 60, "the run waited for the sleeping test instead of ending it"
    assert "crashed while running 'test_slow.py::test_outlives_its_timeout'" in output, output
    assert "tests past their timeout" in output and "ran past its 3 s timeout" in output, output
    assert 'test_slow.py", line 6 in test_outlives_its_timeout' in output, output  # the stack, where it slept
