"""`skiplock migrate`: applies each file once, is idempotent, and is safe when two processes race."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from console import db
from console.cli.core import UPGRADE_NOTE
from console.db import (
    KNOWN_GAPS,
    MigrationChanged,
    MigrationError,
    check_numbering,
    connect,
    migrate,
    migration_checksum,
    migration_files,
    require_schema,
)
from console.web import create_app
from tests.workers import ROOT, cli


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
    # A new schema is no upgrade: nothing about the previous release's processes is said.
    assert not any(UPGRADE_NOTE in err for _, err in outputs)
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


# --- an applied migration never changes; numbering has no unexplained holes -------------------


def _tamper_recorded_checksum(dsn, version: int) -> str:
    """Make the database remember a different file than the one shipped (as if the shipped file
    had been edited after this database applied it); returns the shipped file's name."""
    with connect(dsn) as conn:
        conn.execute("UPDATE skiplock.schema_migrations SET checksum = 'deadbeef' WHERE version = %s", (version,))
    [path] = [p for v, _, p in migration_files() if v == version]
    return path.name


def test_migrate_refuses_an_applied_migration_whose_file_changed(make_database, monkeypatch, tmp_path):
    dsn = make_database(template=None)
    with connect(dsn) as conn:
        migrate(conn)
    # A real edit of a shipped file, in a copy of the folder.
    folder = tmp_path / "migrations"
    folder.mkdir()
    for _, _, path in migration_files():
        shutil.copy(path, folder / path.name)
    edited = folder / "003_samples.sql"
    before = migration_checksum(edited)
    edited.write_text(edited.read_text() + "\n-- a harmless-looking edit\n")
    following = max(version for version, _, _ in migration_files()) + 1
    extra = folder / f"{following:03d}_next.sql"
    extra.write_text("CREATE TABLE skiplock.next_one (id int);\n")
    shipped = db.migration_files
    monkeypatch.setattr("console.db.migration_files", lambda: shipped(folder))
    with connect(dsn) as conn:
        with pytest.raises(MigrationChanged) as info:
            migrate(conn)
        message = str(info.value)
        assert "003_samples.sql" in message and before in message and migration_checksum(edited) in message
        # nothing was applied: not even the new, innocent one
        assert conn.execute("SELECT to_regclass('skiplock.next_one')").fetchone()[0] is None
        with pytest.raises(MigrationChanged, match="003_samples.sql"):
            require_schema(conn)


def test_every_process_refuses_to_start_on_a_changed_migration(make_database, subprocess_env):
    dsn = make_database()
    name = _tamper_recorded_checksum(dsn, 3)
    env = {**subprocess_env, "DATABASE_URL": dsn}
    for args in (["migrate"], ["worker", "--tasks", "tests.sample_tasks"], ["scheduler"], ["enqueue", "x"]):
        result = cli(env, *args, timeout=30)  # a refused start takes a second or two
        assert result.returncode != 0, (args, result.stdout, result.stderr)
        assert name in result.stderr and "deadbeef" in result.stderr, (args, result.stderr)
    with pytest.raises(MigrationChanged, match=name):
        create_app({"database.dsn": dsn, "web.secret_key": "k", "TESTING": True})


def test_a_number_applied_under_another_name_is_named_as_such(make_database):
    """A build of main that no release shipped applied 017_limited_claim_indexes for 43 minutes
    on 2026-12-01; 0.2.0's 017 is another migration. Said plainly, not as an edit of 017."""
    dsn = make_database()
    with connect(dsn) as conn:
        conn.execute("UPDATE skiplock.schema_migrations SET name = 'limited_claim_indexes' WHERE version = 17")
        with pytest.raises(MigrationChanged) as info:
            require_schema(conn)
    message = str(info.value)
    assert "applied migration 017 is 'limited_claim_indexes', which this release does not have" in message
    assert "017_worker_signals.sql" in message and "CHANGELOG.md" in message
    assert "has changed since it was applied" not in message


def test_a_database_missing_this_releases_migrations_is_refused_with_what_to_run(make_database):
    """An earlier release migrated it: every process of this one says which migrations are
    missing and to run `skiplock migrate` (tests/test_upgrade.py runs the real previous release)."""
    dsn = make_database()
    with connect(dsn) as conn:
        conn.execute("ALTER TABLE skiplock.scheduler_jobs DROP COLUMN last_failure, DROP COLUMN last_failure_at")
        conn.execute("ALTER TABLE skiplock.alerts DROP COLUMN last_over_value")
        conn.execute("DELETE FROM skiplock.schema_migrations WHERE version = 18")
        with pytest.raises(db.MigrationsPending, match=r"lacks 1 migration\(s\) of this release \(skiplock \S+\): "
                                                        r"018_kept_values_and_errors; run `skiplock migrate` first"):
            require_schema(conn)
        assert migrate(conn) == ["018_kept_values_and_errors"]
        require_schema(conn)


def test_a_database_with_newer_migrations_is_accepted_and_said_once(make_database, caplog):
    """A later release migrated it (a rolling upgrade, or a rollback): this release runs on it."""
    dsn = make_database()
    with connect(dsn) as conn:
        conn.execute("INSERT INTO skiplock.schema_migrations (version, name, checksum) VALUES (999, 'from_the_future', 'x')")
        with caplog.at_level("INFO", logger="skiplock.db"):
            require_schema(conn)
            require_schema(conn)
    said = [r.getMessage() for r in caplog.records if "newer than this release" in r.getMessage()]
    assert len(said) == 1 and "999_from_the_future" in said[0]


def test_the_web_console_still_starts_when_the_database_is_down_or_unmigrated(make_database):
    for dsn in (make_database(template=None), "postgresql://nobody@127.0.0.1:1/none"):
        app = create_app({"database.dsn": dsn, "web.secret_key": "k", "web.db_wait": 1.0, "TESTING": True})
        app.extensions["skiplock"].close()


def test_the_shipped_migrations_have_only_explained_gaps():
    versions = [v for v, _, _ in migration_files()]
    missing = set(range(1, max(versions) + 1)) - set(versions)
    assert missing == set(KNOWN_GAPS) == {7}
    assert all(len(reason) > 40 for reason in KNOWN_GAPS.values())


@pytest.mark.parametrize(("versions", "message"), [
    ([1, 2, 3, 5], "migration 004 is missing"),
    ([1, 2, 3, 4, 5, 6, 7, 8], "migration 007 is a known gap"),
    ([1, 2, 2, 3], "share version 002"),
    ([2, 3], "migration 001 is missing"),
])
def test_numbering_refuses_unexplained_holes_reused_gaps_and_duplicates(versions, message):
    with pytest.raises(MigrationError, match=message):
        check_numbering(versions)


def test_a_lost_migration_file_is_refused_before_anything_is_applied(tmp_path):
    for _, _, path in migration_files():
        if not path.name.startswith("005"):
            shutil.copy(path, tmp_path / path.name)
    with pytest.raises(MigrationError, match="migration 005 is missing .*KNOWN_GAPS"):
        db.migration_files(tmp_path)
    check_numbering([1, 2, 3, 4, 5, 6, 8, 9, 10])  # the real gap is fine, and so is a new 010
