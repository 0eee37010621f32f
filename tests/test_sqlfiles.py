"""The named-query loader: parsing, and every shipped SQL file parses."""

from __future__ import annotations

import pytest

from console.resources import resource_dir
from console.sqlfiles import parse_queries, query


def test_parse_splits_on_name_headers_and_keeps_comments_inside():
    text = """
-- a file comment before the first query is ignored
-- name: first
-- what it does
SELECT 1;

-- name: second_one
SELECT %(x)s
FROM t;
"""
    parsed = parse_queries(text)
    assert list(parsed) == ["first", "second_one"]
    assert parsed["first"] == "-- what it does\nSELECT 1;"
    assert parsed["second_one"] == "SELECT %(x)s\nFROM t;"


def test_parse_refuses_duplicate_and_empty_queries():
    with pytest.raises(ValueError, match="'a' is defined twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="'b' has no statement"):
        parse_queries("-- name: b\n\n-- name: c\nSELECT 1;\n")


def test_a_header_must_be_alone_on_its_line():
    assert parse_queries("SELECT 1; -- name: not_a_header\n") == {}


@pytest.mark.parametrize("path", sorted(p.name for p in resource_dir("sql").glob("*.sql")))
def test_every_shipped_sql_file_parses(path):
    parsed = parse_queries((resource_dir("sql") / path).read_text(encoding="utf-8"))
    assert parsed, f"sql/{path} holds no named query"


def test_an_unknown_query_name_is_a_clear_error():
    assert "FOR UPDATE SKIP LOCKED" in query("queue", "claim")
    with pytest.raises(KeyError, match="no query named 'nope' in sql/queue.sql"):
        query("queue", "nope")
