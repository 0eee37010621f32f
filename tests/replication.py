"""A primary with two hot standbys for the tests that need replication (tests/test_replica.py,
tests/test_scenarios_replica.py): made by console.pgcluster `start_standby`, both with
hot_standby_feedback on and a 1 s status interval.

- `replica-slot` streams through the physical slot SLOT, so its feedback becomes the slot's
  xmin (pg_stat_replication.backend_xmin stays empty for it);
- `replica-feedback` has no slot, so its feedback is the walsender's backend_xmin.

Each module starts its own (a standby would slow every other test) and stops it whatever its
tests do; `fresh_database` gives each test a migrated database of its own on the primary."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from console.db import connect, migrate
from console.pgcluster import PrivateCluster
from tests.collector_helpers import eventually

SLOT = "skiplock_test_slot"
FEEDBACK = {"hot_standby_feedback": "on", "wal_receiver_status_interval": "1s"}
_names = itertools.count()


@dataclass
class Replication:
    primary: PrivateCluster
    slot_standby: PrivateCluster      # application_name replica-slot, through SLOT
    feedback_standby: PrivateCluster  # application_name replica-feedback, no slot
    template: str


@contextmanager
def replicated(template: str) -> Iterator[Replication]:
    # wal_keep_size: replica-feedback has no slot, and a checkpoint (CREATE DATABASE makes one)
    # must not recycle the WAL it has yet to receive while its replay is paused
    primary = PrivateCluster(settings={"fsync": "off", "max_prepared_transactions": "5", "wal_keep_size": "256MB"})
    standbys: list[PrivateCluster] = []
    try:
        primary.start()
        with connect(primary.dsn) as admin:
            admin.execute(f'CREATE DATABASE "{template}"')
        with connect(primary.dsn_for(template)) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            migrate(conn)
        # One after the other: a second base backup's checkpoint may recycle WAL the first one
        # still streams.
        standbys.append(primary.start_standby("replica-slot", slot=SLOT, settings=FEEDBACK))
        standbys.append(primary.start_standby("replica-feedback", settings=FEEDBACK))
        with connect(primary.dsn) as admin:
            eventually(lambda: admin.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()[0] == 2, timeout=30)
        yield Replication(primary, *standbys, template=template)
    finally:
        for standby in standbys:  # thrown away: no shutdown checkpoint
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")


@contextmanager
def fresh_database(replication: Replication, prefix: str) -> Iterator[str]:
    """A migrated database of its own on the primary; its DSN."""
    name = f"{prefix}_{next(_names)}"
    with connect(replication.primary.dsn) as admin:
        # FILE_COPY: a checkpoint and a file copy, instead of the whole template through the WAL
        # (which both standbys would then replay)
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{replication.template}" STRATEGY FILE_COPY')
    try:
        yield replication.primary.dsn_for(name)
    finally:
        with connect(replication.primary.dsn) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
