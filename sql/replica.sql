-- Run on a database's replica (replica_dsn) before a page reads it: console/replica.py.

-- name: status
-- Is it a standby, how far behind is its replay, and has it replayed %(lsn)s (the primary's
-- WAL position after this session's last change; NULL: no change to wait for)? Lag is 0 when
-- everything received is replayed (an idle primary sends nothing to replay), else the age of
-- the last replayed commit: an upper bound while the primary writes.
SELECT
    pg_is_in_recovery() AS in_recovery,
    CASE
        WHEN NOT pg_is_in_recovery() THEN NULL
        WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
        ELSE greatest(0.0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))
    END::float8 AS lag_seconds,
    coalesce(%(lsn)s::pg_lsn IS NULL OR pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn, false) AS replayed;

-- name: primary_position
-- Run on the primary after a change: the position a replica must replay before this session
-- reads it again. The insert position: with synchronous_commit off the change's commit record
-- may not be written yet, and pg_current_wal_lsn() (the write position) would be before it.
SELECT pg_current_wal_insert_lsn()::text AS lsn;
