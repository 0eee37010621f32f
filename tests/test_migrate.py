"""`skiplock migrate`: applies each file once, is idempotent, and is safe when two processes race."""

from __future__ import annotations

import subprocess
import sys

from console.db import connect, migrate, migration_files
from tests.workers import ROOT


def applied_versions(dsn):
    with connect(dsn) as conn:
        return conn.execute("SELECT version FROM skiplock.schema_migrations ORDER BY version").fetchall()


def test_migrate_applies_every_file_once_and_is_idempotent(make_database):
    dsn = make_database(template=None)
    expected = [f"{v:03d}_{name}" for v, name, _ in migration_files()]
    with connect(dsn) as conn:
        assert migrate(conn) == expected
        assert migrate(conn) == []
        assert conn.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL").fetchone()[0]
    assert [v for (v,) in applied_versions(dsn)] == [v for v, _, _ in migration_files()]


def test_two_processes_migrating_at_once_apply_each_file_once(make_database, subprocess_env):
    dsn = make_database(template=None)
    env = {**subprocess_env, "DATABASE_URL": dsn}
    procs = [
        subprocess.Popen([sys.executable, "-m", "console", "migrate"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    stdouts = [out for out, _ in outputs]
    # exactly one process applied the files; the others waited on the lock and found nothing to do
    appliers = [out for out in stdouts if out.startswith("applied ")]
    assert len(appliers) == 1 and appliers[0].count("applied ") == len(migration_files())
    assert sorted(stdouts).count("schema is up to date\n") == 2
    versions = applied_versions(dsn)
    assert len(versions) == len(set(versions)) == len(migration_files())


def test_a_failing_migration_leaves_the_database_untouched(make_database, monkeypatch, tmp_path):
    dsn = make_database(template=None)
    files = migration_files()
    broken = tmp_path / "999_broken.sql"
    broken.write_text("CREATE TABLE skiplock.half_done (id int);\nSELECT no_such_function();\n")
    monkeypatch.setattr("console.db.migration_files", lambda: [*files, (999, "broken", broken)])
    with connect(dsn) as conn:
        try:
            migrate(conn)
        except Exception as exc:  # psycopg's UndefinedFunction
            assert "no_such_function" in str(exc)
        else:  # pragma: no cover
            raise AssertionError("the broken migration was applied")
        assert conn.execute("SELECT to_regnamespace('skiplock')").fetchone()[0] is None
