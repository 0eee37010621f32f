import psycopg
import pytest

from console import audit


def test_record_and_search_newest_first(conn):
    first = audit.record(conn, actor="alice", action="replay", selection={"queue": "mail"}, reason="bug fixed", rows=12)
    second = audit.record(conn, actor="bob", action="purge", target="job:7", rows=1)
    assert [r["id"] for r in audit.search(conn)] == [second, first]
    (row,) = audit.search(conn, actor="alice")
    assert row["selection"] == {"queue": "mail"} and row["reason"] == "bug fixed" and row["rows"] == 12
    assert [r["id"] for r in audit.search(conn, before_id=second)] == [first]


def test_audit_log_is_append_only(conn):
    audit.record(conn, actor="alice", action="pause", target="queue:mail")
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        conn.execute("UPDATE skiplock.audit_log SET actor = 'mallory'")
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        conn.execute("DELETE FROM skiplock.audit_log")


def test_bad_audit_rows_are_refused(conn):
    with pytest.raises(ValueError):
        audit.record(conn, actor="", action="replay")
    with pytest.raises(ValueError):
        audit.record(conn, actor="a", action="replay", outcome="maybe")
