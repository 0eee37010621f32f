"""The public API is typed, and a type checker agrees (issue 29 item 5).

`mypy --strict` over the public surface (the `skiplock` package and the engine's modules behind
its names) and over tests/typing_usage.py, application code that uses every public name and
misuses a few on purpose (an ignore that is not needed fails --strict, so an API that turned
Any would fail here too). The settings are in pyproject.toml ([tool.mypy]).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import skiplock

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_SURFACE = ["skiplock", "console/queue/producer.py", "console/queue/handles.py", "console/queue/protocol.py",
                  "console/queue/tasks.py", "console/queue/periodic.py"]

pytestmark = pytest.mark.slow


def test_mypy_strict_passes_on_the_public_surface_and_on_typed_application_code(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
                          *PUBLIC_SURFACE, "tests/typing_usage.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_packages_say_they_are_typed():
    assert (ROOT / "skiplock" / "py.typed").is_file() and (ROOT / "console" / "py.typed").is_file()


def test_the_surface_checked_is_where_the_public_names_are_defined():
    defined = {Path(sys.modules[getattr(skiplock, name).__module__].__file__).relative_to(ROOT).as_posix()
               for name in skiplock.__all__}
    assert defined <= set(PUBLIC_SURFACE), defined - set(PUBLIC_SURFACE)
