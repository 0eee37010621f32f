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


def test_the_bare_actor_name_finds_its_cli_and_token_rows_but_not_a_longer_name(conn):
    """`--actor deploy-bot` is stored as 'deploy-bot (cli:root@host)' and a token as
    'owner (label)': filtering by the bare name finds both forms, not 'deploy-bot2'."""
    plain = audit.record(conn, actor="deploy-bot", action="pause", target="queue:mail")
    via_cli = audit.record(conn, actor="deploy-bot (cli:root@ci-7)", action="resume", target="queue:mail")
    audit.record(conn, actor="deploy-bot2 (cli:root@ci-7)", action="pause", target="queue:mail")
    audit.record(conn, actor="x deploy-bot (cli:root@ci-7)", action="pause", target="queue:mail")
    assert [r["id"] for r in audit.search(conn, actor="deploy-bot")] == [via_cli, plain]
    assert [r["id"] for r in audit.search(conn, actor="deploy-bot (cli:root@ci-7)")] == [via_cli]
