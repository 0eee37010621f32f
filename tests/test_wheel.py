"""The built wheel works outside the checkout: sql/ (and templates/, static/) travel inside it.

Builds the wheel with `python -m build`, installs it with its dependencies into a fresh virtual
environment under /tmp, and runs `skiplock migrate` from a directory that is not the checkout,
with no PYTHONPATH: only the installed copy can answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from console.db import connect, migration_files

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed_venv():
    base = Path(tempfile.mkdtemp(prefix="skiplock-wheel-", dir="/tmp"))
    try:
        dist = base / "dist"
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                       check=True, capture_output=True, text=True, timeout=300)
        (wheel,) = dist.glob("skiplock-*.whl")
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                       check=True, capture_output=True, text=True, timeout=600)
        yield venv, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL", "SKIPLOCK_CONFIG"}}
    return {**env, **extra}


def test_the_installed_wheel_carries_its_sql_templates_static_files_and_docs(installed_venv):
    venv, base = installed_venv
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import console, console.resources as r; print(console.__file__); "
         "print(*(r.resource_dir(n) for n in ('sql', 'templates', 'static', 'docs')), sep='\\n')"],
        cwd=base, env=clean_env(), check=True, capture_output=True, text=True,
    ).stdout.split()
    assert all(line.startswith(str(venv)) for line in out), out  # not the checkout's copy
    assert out[1].endswith("console/_data/sql") and out[4].endswith("console/_data/docs")


def test_the_installed_wheel_carries_the_skiplock_import_name_typed(installed_venv):
    """`import skiplock` is the documented name (README, "Installing and importing"): the wheel
    ships it beside the `console` implementation, both marked typed (py.typed), and its names
    are the engine's own objects."""
    venv, base = installed_venv
    script = ("import importlib.resources as r, skiplock, console, console.queue as q; print(skiplock.__file__); "
              "print(r.files('skiplock').joinpath('py.typed').is_file(), r.files('console').joinpath('py.typed').is_file()); "
              "print(skiplock.enqueue is q.enqueue is console.enqueue, skiplock.Job is q.Job, sorted(skiplock.__all__))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=base, env=clean_env(), check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[0].startswith(str(venv)) and out[0].endswith("skiplock/__init__.py")
    assert out[1] == "True True"
    assert out[2] == ("True True ['BatchFailure', 'Cancelled', 'DoNotRetry', 'InvalidJob', 'Job', 'JobTimeout', 'NewJob', 'enqueue', "
                      "'enqueue_async', 'enqueue_many', 'enqueue_many_async', 'migrate', 'schedule', 'task']")


def test_the_installed_console_renders_the_runbooks(installed_venv):
    """An installed console serves the docs its alerts link to (/docs/alerts.md#<rule>): the pages
    and the Markdown renderer (a dependency of the wheel) come with it."""
    venv, base = installed_venv
    script = ("from console.alerts.defaults import DEFAULT_RULES; from console.resources import resource_dir; "
              "from console.web import docpages; page = docpages.render(resource_dir('docs'), 'alerts.md'); "
              "print(page.title); print(sorted(r.name for r in DEFAULT_RULES if r.name not in page.anchors))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=base, env=clean_env(), check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out == ["Alerts and webhooks", "[]"]


def test_skiplock_migrate_runs_from_the_installed_wheel(installed_venv, make_database):
    venv, base = installed_venv
    dsn = make_database(template=None)
    result = subprocess.run([str(venv / "bin" / "skiplock"), "migrate", "--dsn", dsn],
                            cwd=base, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("applied ") == len(migration_files())
    with connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM skiplock.schema_migrations").fetchone()[0] == len(migration_files())
    again = subprocess.run([str(venv / "bin" / "skiplock"), "migrate", "--dsn", dsn],
                           cwd=base, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stdout) == (0, "schema is up to date\n")
