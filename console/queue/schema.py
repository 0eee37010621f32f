"""Skiplock's schema from application code: `skiplock.migrate(conn)`, what `skiplock migrate`
does, for frameworks that run their migrations themselves (a Django migration, an Alembic
revision, a test fixture). The migrations and their checks are console.db's, shared with the
command; this module only gives them a public, typed name."""

from __future__ import annotations

from typing import Any

import psycopg

from console import db


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Create or update Skiplock's schema (`skiplock`) on this psycopg connection, as the
    `skiplock migrate` command does; returns the names of the migrations applied (empty when
    current). For frameworks that run migrations themselves: a Django migration (on
    `connection.connection`, with `atomic = False`), an Alembic revision, a test fixture.

    The whole run is one transaction under an advisory lock, so processes that migrate at once
    apply each file once; it refuses a database whose applied files changed (`MigrationChanged`).
    """
    return db.migrate(conn)
