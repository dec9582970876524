"""Table ACL files and statement rules, without servers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from shardgate.auth import Identity
from shardgate.auth.acl import Role, TableACL
from shardgate.auth.guard import Guard, gate_tables
from shardgate.auth.rules import analyze
from shardgate.errors import Code, InvalidArgument, PermissionDenied, ShardgateError
from shardgate.topo.embedded import COMMERCE_VSCHEMA, LOOKUP_VSCHEMA
from shardgate.vschema import VSchema

VSCHEMA = VSchema.from_json({"commerce": COMMERCE_VSCHEMA, "lookup": LOOKUP_VSCHEMA})


def acl(*groups: dict[str, object]) -> TableACL:
    return TableACL.from_mapping({"table_groups": list(groups)})


def test_groups_exact_prefix_qualified_and_roles_nest() -> None:
    a = acl(
        {"name": "orders", "table_names_or_prefixes": ["order_%", "corder"],
         "readers": ["r"], "writers": ["w"], "admins": ["a"]},
        {"name": "seq", "table_names_or_prefixes": ["lookup.%"], "admins": ["a"]},
        {"name": "all", "table_names_or_prefixes": ["%"], "readers": ["%"]},
    )
    assert a.role("w", "commerce", "corder") is Role.WRITER
    assert a.role("a", "commerce", "order_items") is Role.ADMIN
    assert a.role("r", "commerce", "ORDER_x") is Role.READER
    assert a.role("nobody", "commerce", "corder") is None
    assert a.role("nobody", "commerce", "customer") is Role.READER  # the % group
    assert a.role("r", "lookup", "customer_seq") is None  # lookup.% wins over %
    assert a.group_of("lookup", "x").name == "seq"  # type: ignore[union-attr]
    assert acl({"name": "x", "table_names_or_prefixes": ["t"]}).group_of("", "u") is None


@pytest.mark.parametrize(("doc", "where"), [
    ({"groups": []}, "$:"),
    ({"table_groups": [{"name": "x"}]}, "$.table_groups[0]: missing table_names_or_prefixes"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": []}]}, "at least one"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": ["a b"]}]},
     "$.table_groups[0].table_names_or_prefixes[0]"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": ["t"], "readers": "a"}]},
     "$.table_groups[0].readers"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": ["t"], "reader": ["a"]}]},
     "unknown key(s) reader"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": ["t"]},
                       {"name": "x", "table_names_or_prefixes": ["u"]}]}, "defined twice"),
    ({"table_groups": [{"name": "x", "table_names_or_prefixes": ["t%"]},
                       {"name": "y", "table_names_or_prefixes": ["T%"]}]}, "already in group"),
])
def test_bad_acl_files_name_the_json_path(tmp_path: Path, doc: object, where: str) -> None:
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidArgument) as info:
        TableACL.load(path)
    assert where in info.value.message and str(path) in info.value.message


def test_analyze_roles_per_table() -> None:
    a = analyze("INSERT INTO corder (order_id) SELECT customer_id FROM lookup.customer_seq")
    assert {(t.keyspace, t.table, t.role) for t in a.tables} == {
        ("", "corder", Role.WRITER), ("lookup", "customer_seq", Role.READER)}
    assert analyze("BEGIN").kind == "SESSION"
    assert analyze("USE `commerce:-40`").tables == ()
    assert analyze("CREATE QUEUE q (a BIGINT) SHARD BY a").tables[0].role is Role.ADMIN
    with_cte = analyze("WITH x AS (SELECT 1 AS a FROM customer) SELECT a FROM x")
    assert [t.table for t in with_cte.tables] == ["customer"]
    for sql in ("SET @a = 1", "KILL 3", "ANALYZE customer", "SELECT 1 INTO @a",
                "CREATE FUNCTION f() RETURNS INT RETURN 1"):
        with pytest.raises(ShardgateError) as info:
            analyze(sql)
        assert info.value.code in (Code.PERMISSION_DENIED, Code.INVALID_ARGUMENT), sql


@pytest.mark.parametrize("sql", [
    "SELECT pg_catalog.pg_read_file('x')", 'SELECT "pg_ls_dir"(\'.\')',
    "SELECT Load_File('/etc/passwd')", "select dblink_exec('x', 'y')",
    "SELECT query_to_xml('select pg_read_file(''x'')', true, true, '')",
    "SELECT * FROM t INTO OUTFILE '/tmp/x'", "VACUUM", "DETACH x",
    "CREATE TABLE t (a INT) ENGINE=CONNECT", "INSTALL PLUGIN x SONAME 'x.so'",
])
def test_deny_list(sql: str) -> None:
    with pytest.raises(PermissionDenied) as info:
        analyze(sql)
    assert "deny-list" in info.value.message


@pytest.mark.parametrize("sql", [
    "SELECT edit, readfile, program FROM t", "SELECT 'pg_read_file(x)' FROM t",
    "SELECT `outfile` FROM t", "UPDATE t SET extension = 1",
])
def test_names_that_only_look_denied_pass(sql: str) -> None:
    analyze(sql)


def test_guard_gate_tables_need_admin_and_trusted_code_is_not_checked() -> None:
    assert ("lookup", "customer_seq") in gate_tables(VSCHEMA)
    assert ("lookup", "customer_email_idx") in gate_tables(VSCHEMA)
    g = Guard(acl({"name": "all", "table_names_or_prefixes": ["%"], "writers": ["w"],
                   "admins": ["a"]}))
    g.authorize(Identity("w"), "UPDATE customer SET name = 'x'", "commerce", VSCHEMA)
    with pytest.raises(PermissionDenied) as info:
        g.authorize(Identity("w"), "UPDATE customer_seq SET next_id = 1", "lookup", VSCHEMA)
    assert "admin role on table lookup.customer_seq" in info.value.message
    g.authorize(Identity("a"), "UPDATE customer_seq SET next_id = 1", "lookup", VSCHEMA)
    g.authorize(None, "UPDATE customer_seq SET next_id = 1", "lookup", VSCHEMA)
    # unqualified, no session keyspace: the one keyspace whose VSchema has the table
    with pytest.raises(PermissionDenied):
        g.authorize(Identity("w"), "DELETE FROM customer_email_idx", None, VSCHEMA)
    with pytest.raises(PermissionDenied):  # denials are cached, and still raised
        g.authorize(None, "SELECT LOAD_FILE('x')", None, VSCHEMA)
    with pytest.raises(PermissionDenied):
        g.authorize(None, "SELECT LOAD_FILE('x')", None, VSCHEMA)


# -- issue 30: scopes, writes at any depth, functions, catalogs, never-sent statements ------


def _tables(sql: str) -> set[tuple[str, str, Role]]:
    return {(t.keyspace, t.table, t.role) for t in analyze(sql).tables}


@pytest.mark.parametrize(("sql", "tables"), [
    # a CTE's body does not see its own name (unless RECURSIVE): the inner biz is the table
    ("WITH biz AS (SELECT * FROM biz) SELECT * FROM biz", {"biz"}),
    ("WITH RECURSIVE biz AS (SELECT * FROM biz) SELECT * FROM biz", set()),
    # a CTE hides a table only after it: b is a table in a's body
    ("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a, b", {"b"}),
    ("WITH a AS (SELECT 1), b AS (SELECT * FROM a) SELECT * FROM b", set()),
    # a nested WITH's scope ends with its query
    ("SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) s, x", {"x"}),
    # a nested WITH's bodies see only their own CTEs (MariaDB reads the table there)
    ("WITH c AS (SELECT 1) SELECT * FROM (WITH y AS (SELECT * FROM c) SELECT * FROM y) z",
     {"c"}),
    ("WITH c AS (SELECT 1) SELECT * FROM (WITH y AS (SELECT 2) SELECT * FROM c) z", set()),
    # PostgreSQL folds unquoted names: "BIZ" (quoted) is not BIZ (unquoted, = biz)
    ('WITH "BIZ" AS (SELECT 1) SELECT * FROM BIZ', {"BIZ"}),
    ("WITH biz AS (SELECT 1) SELECT * FROM `biz`", set()),
    # a CTE never hides a written table, nor a qualified one
    ("WITH t AS (SELECT 1) DELETE FROM t", {"t"}),
    ("WITH customer AS (SELECT 1) SELECT * FROM commerce.customer", {"customer"}),
])
def test_cte_names_are_resolved_by_scope(sql: str, tables: set[str]) -> None:
    assert {t for _, t, _ in _tables(sql)} == tables


def test_writes_at_any_depth_and_locking_reads_need_the_writer_role() -> None:
    w, r = Role.WRITER, Role.READER
    assert _tables("WITH d AS (DELETE FROM t WHERE a = 1 RETURNING id) SELECT * FROM d") == {
        ("", "t", w)}
    assert _tables("WITH u AS (UPDATE t SET a = 1 RETURNING id) SELECT * FROM u, v") == {
        ("", "t", w), ("", "v", r)}
    assert _tables("SELECT * FROM (WITH i AS (INSERT INTO t (a) SELECT b FROM s RETURNING a) "
                   "SELECT * FROM i) x") == {("", "t", w), ("", "s", r)}
    assert _tables("SELECT * FROM t JOIN u ON t.a = u.a WHERE t.b IN (SELECT b FROM v) "
                   "FOR UPDATE") == {("", "t", w), ("", "u", w), ("", "v", r)}
    assert _tables("SELECT * FROM t LOCK IN SHARE MODE") == {("", "t", w)}
    assert _tables("SELECT * FROM t FOR SHARE") == {("", "t", w)}
    assert _tables("UPDATE t SET a = (SELECT b FROM u)") == {("", "t", w), ("", "u", r)}


@pytest.mark.parametrize(("sql", "form"), [
    ("DROP DATABASE other", "DROP DATABASE"), ("create database x", "CREATE DATABASE"),
    ("CREATE OR REPLACE USER x", "CREATE USER"), ("ALTER ROLE x SUPERUSER", "ALTER ROLE"),
    ("DROP SCHEMA public", "DROP SCHEMA"), ("CREATE SCHEMA s", "CREATE SCHEMA"),
    ("GRANT ALL ON t TO x", "GRANT"), ("REVOKE ALL ON t FROM x", "REVOKE"),
    ("ALTER SYSTEM SET work_mem = 1", "ALTER SYSTEM"), ("SET GLOBAL x = 1", "SET GLOBAL"),
    ("FLUSH PRIVILEGES", "FLUSH"), ("SHUTDOWN", "SHUTDOWN"), ("RESET MASTER", "RESET"),
    ("PURGE BINARY LOGS TO 'x'", "PURGE"), ("CHANGE MASTER TO MASTER_HOST='x'", "CHANGE"),
    ("DROP TABLESPACE t", "DROP TABLESPACE"), ("DROP SERVER s", "DROP SERVER"),
    ("SHOW BINLOG EVENTS", "SHOW BINLOG"), ("DO $$ BEGIN EXECUTE 'x'; END $$", "DO"),
    ("PREPARE s FROM 'SELECT 1'", "PREPARE"), ("LOCK TABLES t WRITE", "LOCK"),
    ("/* hi */ drop /* there */ database x", "DROP DATABASE"),
])
def test_statements_about_the_server_are_never_sent(sql: str, form: str) -> None:
    with pytest.raises(PermissionDenied) as info:
        analyze(sql)
    assert form in info.value.message and "deny-list" in info.value.message


@pytest.mark.parametrize("sql", [
    "SELECT set_config('default_transaction_read_only', 'on', false)",
    "SELECT pg_catalog.set_config('a', 'b', false)", "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_xact_lock(1)", "SELECT GET_LOCK('a', 1)", "SELECT release_lock('a')",
    "SELECT ts_stat('SELECT v FROM t')", "SELECT * FROM t WHERE a = ts_rewrite('a', 'SELECT 1')",
    "SELECT table_to_xml('t', true, true, '')", "SELECT dblink('x', 'SELECT 1')",
    "SELECT LAST_INSERT_ID(5)", "SELECT @a := v FROM t", "SELECT eval('SELECT 1')",
    "SELECT pg_create_logical_replication_slot('s', 'x')", "SELECT pg_drop_replication_slot('s')",
])
def test_sql_in_a_string_and_session_state_functions_are_refused_for_everyone(sql: str) -> None:
    with pytest.raises(PermissionDenied) as info:
        analyze(sql)
    assert "deny-list" in info.value.message


def test_functions_as_each_dialect_sees_them_and_catalogs() -> None:
    a = analyze("SELECT IF(a, 1, 2), GROUP_CONCAT(b), DATE_FORMAT(c, '%Y'), upper(d), "
                "my_udf(e) FROM t")
    assert a.functions["postgres"] == {"string_agg", "to_char", "upper", "my_udf"}
    assert a.functions["mysql"] == {"group_concat", "date_format", "upper", "my_udf"}
    assert a.functions["sqlite"] == {"group_concat", "strftime", "upper", "my_udf"}
    assert analyze("SELECT s.f(1)").admin_only  # a schema-qualified (user) function
    assert not analyze("SELECT pg_catalog.upper('a')").admin_only
    assert analyze("SELECT * FROM pg_stat_activity").catalogs == ("pg_catalog.pg_stat_activity",)
    assert analyze("SELECT * FROM INFORMATION_SCHEMA.Tables t").catalogs == (
        "information_schema.tables",)
    assert analyze("SELECT * FROM pragma_table_info('t')").catalogs == ("pragma_table_info",)
    assert analyze("SELECT * FROM pragma_table_info('t')").functions["sqlite"] == frozenset()
    assert analyze("SELECT * FROM main.sqlite_master").catalogs == ("sqlite_master",)
    assert analyze("SHOW PROCESSLIST").admin_only and not analyze("SHOW TABLES").admin_only
    assert analyze("SHOW TABLES FROM mysql").admin_only


def test_guard_below_admin_functions_catalogs_per_dialect() -> None:
    g = Guard(acl({"name": "secret", "table_names_or_prefixes": ["corder"], "admins": ["a"]},
                  {"name": "all", "table_names_or_prefixes": ["%"], "readers": ["r"],
                   "admins": ["a"]}))

    def on(dialect: str | None) -> Callable[[str], str | None]:
        return lambda ks: dialect

    r, a = Identity("r"), Identity("a")
    g.authorize(r, "SELECT upper(name), jsonb_typeof('{}') FROM customer", "commerce", VSCHEMA,
                on("postgres"))
    with pytest.raises(PermissionDenied) as info:  # not a SQLite function
        g.authorize(r, "SELECT jsonb_typeof('{}') FROM customer", "commerce", VSCHEMA,
                    on("sqlite"))
    assert "jsonb_typeof()" in info.value.message and "sqlite allow-list" in info.value.message
    for sql in ("SELECT version() FROM customer", "SELECT pg_sleep(1)",
                "SELECT current_setting('data_directory')", "SELECT x.f(1) FROM customer",
                "SELECT * FROM pg_stat_activity",
                "SELECT * FROM information_schema.user_privileges"):
        with pytest.raises(PermissionDenied) as info:
            g.authorize(r, sql, "commerce", VSCHEMA, on("postgres"))
        assert "needs the admin role" in info.value.message, sql
        g.authorize(a, sql, "commerce", VSCHEMA, on("postgres"))  # admin of all it names
    g.authorize(r, "SELECT table_name FROM information_schema.tables", "commerce:-80", VSCHEMA,
                on("mysql"))
    g.authorize(r, "SELECT name FROM sqlite_master", "commerce:-80", VSCHEMA, on("sqlite"))
    with pytest.raises(PermissionDenied):  # dialect not known: no catalog
        g.authorize(r, "SELECT type FROM sqlite_master", "commerce:-80", VSCHEMA)
    # admin means admin on every table named: admin of corder only is not admin of customer
    g2 = Guard(acl({"name": "secret", "table_names_or_prefixes": ["corder"], "admins": ["x"]},
                   {"name": "all", "table_names_or_prefixes": ["%"], "readers": ["x"]}))
    g2.authorize(Identity("x"), "SELECT version() FROM corder", "commerce", VSCHEMA,
                 on("postgres"))
    with pytest.raises(PermissionDenied):
        g2.authorize(Identity("x"), "SELECT version() FROM corder, customer", "commerce",
                     VSCHEMA, on("postgres"))
    with pytest.raises(PermissionDenied):  # no table: the % entry decides, x is a reader
        g2.authorize(Identity("x"), "SELECT version()", "commerce", VSCHEMA, on("postgres"))
