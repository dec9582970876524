"""Table ACL files and statement rules, without servers."""

from __future__ import annotations

import json
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
