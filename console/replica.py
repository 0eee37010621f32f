"""How far a database's streaming replica is behind, asked on the replica itself.

`status(conn, lsn)` answers, in one cheap statement under a short time limit, whether the
server behind `replica_dsn` is a standby at all, its replay lag in seconds, and whether it has
replayed the primary's WAL position `lsn` (what a session wrote last: its next page waits for
that before reading the replica). `primary_position(conn)` is that position, asked on the
primary. Which requests read a replica is the web console's choice (console/web/database.py);
this module only measures.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from console.db import time_limited
from console.sqlfiles import query

STATUS_TIMEOUT_MS = 500  # a replica too busy to answer this is too busy to serve pages


@dataclass(frozen=True)
class ReplicaStatus:
    in_recovery: bool
    lag_seconds: float | None  # None: not a standby, or nothing replayed since it started
    replayed: bool             # it has replayed the asked position (True when none was asked)


def status(conn: psycopg.Connection, lsn: str | None = None) -> ReplicaStatus:
    with time_limited(conn, STATUS_TIMEOUT_MS) as cur:
        cur.execute(query("replica", "status"), {"lsn": lsn})
        row = cur.fetchone()
    return ReplicaStatus(bool(row["in_recovery"]), row["lag_seconds"], bool(row["replayed"]))


def primary_position(conn: psycopg.Connection) -> str:
    with time_limited(conn, STATUS_TIMEOUT_MS) as cur:
        cur.execute(query("replica", "primary_position"))
        return cur.fetchone()["lsn"]
