"""``%s`` placeholders become PostgreSQL's own ``$n`` once per statement text."""

from __future__ import annotations

from shardgate.backends.postgres import native_placeholders


def test_placeholders_are_numbered_and_escaped_percents_unescaped() -> None:
    assert native_placeholders("SELECT %s, %s FROM t WHERE a LIKE 'x%%'") == (
        "SELECT $1, $2 FROM t WHERE a LIKE 'x%'", 2)
    assert native_placeholders("SELECT 1") == ("SELECT 1", 0)


def test_anything_else_is_left_to_psycopg() -> None:
    for sql in ("SELECT %(a)s", "SELECT 'a%' ", "SELECT 50%", "SELECT %b"):
        assert native_placeholders(sql) is None


def test_a_long_insert_is_converted_once() -> None:
    sql = "INSERT INTO t (a, b) VALUES " + ", ".join(["(%s, %s)"] * 128)
    first = native_placeholders(sql)
    assert first is not None and first[1] == 256 and first[0].endswith("($255, $256)")
    assert native_placeholders(sql) is first
