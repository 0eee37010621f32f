"""The Django example (examples/django_shop) passes its own tests under Django's test runner,
on a database of the suite's PostgreSQL: enqueue inside `atomic()` commits and rolls back with
the order, the schema comes with the shop's migrations, and a real worker runs the ORM handlers
(shop/tests.py has the cases)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.workers import ROOT

pytestmark = pytest.mark.slow
SHOP = ROOT / "examples" / "django_shop"


def test_the_django_example_passes_its_tests_under_manage_py_test(dsn):
    env = {**os.environ, "DATABASE_URL": dsn,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run([sys.executable, "manage.py", "test", "shop", "--noinput", "-v", "2"],
                            cwd=SHOP, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "Ran 3 tests" in result.stderr and "\nOK\n" in result.stderr, result.stderr[-3000:]
