"""What differs between the supported PostgreSQL majors (15, 16, 17, 18), checked on the server
of this session: `make test` runs this file with the other matrix files once per major
(`--postgresql 16`, ...; Makefile PG_MATRIX_QUEUE and PG_MATRIX_READS).

A view's column that a newer major dropped or renamed fails a query outright, and every named
query is planned here; a name that changed its spelling (pg_stat_slru's SLRUs and the SLRU wait
events were renamed in 17) fails nothing and quietly matches no row, so each place that looks
for one by name is checked against this server's own vocabulary.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql

from console.collectors.database import is_slru_wait, slru_name
from console.resources import resource_dir
from console.sqlfiles import queries
from console.web.health import SLRU_SHOWN, slru_panel
from console.web.overview import Latest

# Named queries that cannot be planned alone, and why. Queries with psycopg.sql placeholders
# ({name}) and utility statements (COPY, VACUUM, CREATE, DROP, EXPLAIN: no PREPARE) are left out
# by their text; these are the fragments that the code composes into a statement.
FRAGMENTS = {
    ("browse", "jobs_filters"): "the WHERE clause composed into the jobs page's queries",
    ("deadletters", "selection"): "the selection predicate composed into the bulk queries",
    ("deadletters", "count_matching"): "composed with the selection predicate",
    ("deadletters", "count_matching_at"): "composed with the selection predicate",
    ("deadletters", "preview_snapshot"): "composed with the selection predicate",
    ("deadletters", "list_matching"): "composed with the selection predicate",
    ("deadletters", "replay_batch"): "composed with the selection predicate",
    ("deadletters", "purge_batch"): "composed with the selection predicate",
}
UTILITY = re.compile(r"^(?:\s*--[^\n]*\n)*\s*(COPY|VACUUM|CREATE|DROP|EXPLAIN)\b", re.IGNORECASE)


def _server_major(conn) -> int:
    return conn.info.server_version // 10000


def _plannable() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(resource_dir("sql").glob("*.sql")):
        for name, text in queries(path.stem).items():
            if (path.stem, name) in FRAGMENTS or "{" in text or UTILITY.match(text):
                continue
            found.append((path.stem, name, text))
    return found


def _numbered(text: str) -> str:
    """psycopg's %(name)s parameters (and their binary and text twins, %(name)b and %(name)t) as
    PREPARE's $1, $2, ... (one number per name)."""
    order: list[str] = []

    def placeholder(match: re.Match) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sbt]", placeholder, text)


def test_every_named_query_is_planned_by_this_server(conn):
    """PREPARE parses and analyses a statement against the catalog without running it: a column
    this major does not have (pg_stat_wal's wal_write went in 18, pg_stat_bgwriter's checkpoint
    counters moved to pg_stat_checkpointer in 17) fails here, on that major's run."""
    failed = []
    for concern, name, text in _plannable():
        body = _numbered(text).replace("%%", "%").rstrip().rstrip(";")
        try:
            conn.execute(sql.SQL("PREPARE version_check AS ") + sql.SQL(body))  # noqa: S608 (shipped SQL)
            conn.execute("DEALLOCATE version_check")
        except psycopg.Error as exc:
            failed.append(f"sql/{concern}.sql {name}: {str(exc).splitlines()[0]}")
    assert not failed, f"on PostgreSQL {_server_major(conn)}:\n" + "\n".join(failed)
    assert len(_plannable()) > 150  # the filter above did not leave out nearly everything


def test_the_fragments_left_out_still_exist():
    for concern, name in FRAGMENTS:
        assert name in queries(concern), f"FRAGMENTS names sql/{concern}.sql {name}, which is gone"


def test_every_slru_of_this_server_has_a_name_in_one_vocabulary(conn):
    """pg_stat_slru's rows are CamelCase on 15-16 and snake_case on 17+; the collectors, the
    Database page and the advisor speak 17's names whatever the server says."""
    names = {slru_name(r[0]) for r in conn.execute("SELECT name FROM pg_stat_slru")}
    assert names >= {"multixact_member", "multixact_offset", "transaction", "subtransaction", "notify",
                     "commit_timestamp", "serializable"}


def test_the_database_page_lists_the_multixact_slrus_on_this_server(conn):
    """Its query picked the SLRUs by their 13-16 names: on 17 and 18 the panel listed none."""
    conn.execute("SELECT pg_notify('skiplock_version_check', 'x')")  # something in the Notify SLRU's stats
    panel = slru_panel(conn, Latest([]))
    assert [row["name"] for row in panel["slru"]] == list(SLRU_SHOWN)
    assert all(row["blks_hit"] is not None for row in panel["slru"])


def test_the_slru_wait_events_of_this_server_count_as_slru_waits(conn):
    """The SLRU I/O wait events are SLRURead, SLRUWrite, ... on 13-16 and SlruRead, SlruWrite,
    ... on 17+. The collectors counted them by "SLRU" in the name and the advisor by
    LIKE 'SLRU%': on 17 and 18 a session reading an SLRU from disk was no SLRU wait. pg_wait_events
    (17+) is the server's own list; before 17, the names of the 13-16 documentation."""
    if _server_major(conn) < 17:
        events = [("IO", name) for name in ("SLRUFlushSync", "SLRURead", "SLRUSync", "SLRUWrite")]
    else:
        events = conn.execute("SELECT type, name FROM pg_wait_events WHERE name ILIKE '%%slru%%' ORDER BY 1, 2").fetchall()
    io_events = [name for kind, name in events if kind == "IO"]
    assert len(io_events) == 4, events
    assert [name for _, name in events if not is_slru_wait(name)] == []
    # The advisor's pattern (sql/advisor.sql multixact_state, slru_io_waiters), tried on each name.
    pattern = re.search(r"wait_event_type = 'IO' AND a\.wait_event (I?LIKE) '([^']+)'",
                        queries("advisor")["multixact_state"]).groups()
    matched = [row[0] for row in conn.execute(
        sql.SQL("SELECT name FROM unnest(%s::text[]) AS e(name) WHERE name {} %s").format(sql.SQL(pattern[0])),
        (io_events, pattern[1].replace("%%", "%")))]
    assert matched == io_events, f"the advisor's {pattern[0]} '{pattern[1]}' misses {sorted(set(io_events) - set(matched))}"


@pytest.mark.parametrize("prefix", ["MultiXact", "Subtrans"])
def test_the_advisors_lwlock_wait_patterns_name_events_this_server_has(conn, prefix):
    """The advisor counts sessions waiting on LWLocks named MultiXact% and Subtrans%: names
    this server must still report (17+: pg_wait_events; 15 and 16 have these names)."""
    text = queries("advisor")["multixact_state"]
    assert f"a.wait_event LIKE '{prefix}%%'" in text
    if _server_major(conn) < 17:
        return  # no pg_wait_events before 17, whose names these are
    names = [r[0] for r in conn.execute("SELECT name FROM pg_wait_events WHERE type = 'LWLock' AND name LIKE %s",
                                        (prefix + "%",))]
    assert names, f"PostgreSQL {_server_major(conn)} has no LWLock wait event named {prefix}..."
