"""The SQLAlchemy recipe (examples/sqlalchemy_recipe.py) runs as the docs say, and each of its
transactions leaves exactly what it should: the committed invoices' jobs, nothing of the
refused one, nothing of the rolled-back savepoint."""

from __future__ import annotations

import subprocess
import sys

from tests.workers import ROOT


def test_the_recipe_runs_and_each_job_follows_its_transaction(dsn, subprocess_env):
    result = subprocess.run([sys.executable, "examples/sqlalchemy_recipe.py"], cwd=ROOT, env=subprocess_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # invoice ids: 1 (committed), 2 (rolled back), 3 (committed), 4 (savepoint rolled back), 5 (async)
    assert result.stdout.splitlines() == [
        "invoices (totals): [10, 20, 30]",
        "jobs (keys):       ['invoice-1', 'invoice-3', 'invoice-5']",
    ]
