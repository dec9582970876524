"""The statement classifier: text to a typed statement (shardgate.sql.classify)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from shardgate.errors import Code, InvalidArgument, ShardgateError, SyntaxError_
from shardgate.sql.classify import classify, head_words, write_target
from shardgate.sql.parse import parse
from shardgate.sql.statements import (
    AddAutoIncrement,
    AddColumnVindex,
    AddVSchemaSequence,
    AddVSchemaTable,
    Begin,
    Commit,
    CreateQueueStatement,
    CreateVSchemaVindex,
    DropAutoIncrement,
    DropColumnVindex,
    DropQueueStatement,
    DropVSchemaTable,
    DropVSchemaVindex,
    ReleaseSavepoint,
    Rollback,
    RollbackToSavepoint,
    Savepoint,
    SetQueryTimeout,
    SetTransactionMode,
    ShowVitessKeyspaces,
    ShowVitessShards,
    ShowVitessTablets,
    Use,
    like_match,
)


@pytest.mark.parametrize(
    "sql,expected",
    [
        ("USE commerce", Use("commerce")),
        ("use `commerce`", Use("commerce")),
        ("USE `commerce:-80`", Use("commerce", shard="-80")),
        ("USE commerce:80-c0;", Use("commerce", shard="80-c0")),
        ("USE `commerce/80-`", Use("commerce", shard="80-")),
        ("USE `lookup:0`", Use("lookup", shard="0")),
        ("USE `commerce[0a1b]`", Use("commerce", keyspace_id=b"\x0a\x1b")),
        ("USE commerce[FF]", Use("commerce", keyspace_id=b"\xff")),
        ("USE commerce@primary", Use("commerce", tablet_type="primary")),
        ("USE `commerce:-80@MASTER`", Use("commerce", shard="-80", tablet_type="primary")),
        ("USE `commerce@replica`", Use("commerce", tablet_type="replica")),
        ("  /* leading */ use -- a comment\n `commerce:-80` ; ", Use("commerce", shard="-80")),
        ("# mysql comment\nUSE commerce", Use("commerce")),
        ("USE commerce:-80 -- trailing comment", Use("commerce", shard="-80")),
        ("USE commerce/* c */;", Use("commerce")),
        ("SAVEPOINT a", Savepoint("a")),
        ("savepoint `Before_More`;", Savepoint("before_more")),
        ("RELEASE SAVEPOINT a", ReleaseSavepoint("a")),
        ("ROLLBACK TO a", RollbackToSavepoint("a")),
        ("rollback work to savepoint A", RollbackToSavepoint("a")),
        ("/* c */ ROLLBACK TO SAVEPOINT a;", RollbackToSavepoint("a")),
        ("BEGIN", Begin()),
        ("begin work", Begin()),
        ("START TRANSACTION", Begin()),
        ("start transaction read only", Begin()),
        ("COMMIT", Commit()),
        ("commit work;", Commit()),
        ("ROLLBACK", Rollback()),
        ("rollback work", Rollback()),
        ("SET transaction_mode = 'twopc'", SetTransactionMode("twopc")),
        ("set session transaction_mode = 'BEST_EFFORT'", SetTransactionMode("BEST_EFFORT")),
        ("SET @@transaction_mode = \"twopc\"", SetTransactionMode("twopc")),
        ("SET query_timeout_ms = 250", SetQueryTimeout(250)),
        ("set session query_timeout_ms = 0;", SetQueryTimeout(0)),
        ("SHOW VITESS_SHARDS", ShowVitessShards()),
        ("show vitess_shards like 'commerce/%';", ShowVitessShards("commerce/%")),
        ("SHOW VITESS_KEYSPACES", ShowVitessKeyspaces()),
        ("show keyspaces like \"c%\"", ShowVitessKeyspaces("c%")),
        ("SHOW VITESS_TABLETS", ShowVitessTablets()),
        ("ALTER VSCHEMA ADD TABLE t;", AddVSchemaTable(None, "t")),
        ("alter vschema on t add vindex hash(id)", AddColumnVindex(None, "t", "hash", ("id",))),
        ("ALTER VSCHEMA ON ks.`t` ADD VINDEX v(a, b) USING multicol WITH "
         "column_count=2, column_bytes='1,7'",
         AddColumnVindex("ks", "t", "v", ("a", "b"), "multicol",
                         (("column_count", "2"), ("column_bytes", "1,7")))),
        ("alter vschema on t drop vindex v", DropColumnVindex(None, "t", "v")),
        ("ALTER VSCHEMA DROP TABLE lookup.t", DropVSchemaTable("lookup", "t")),
        ("ALTER VSCHEMA ADD SEQUENCE lookup.s", AddVSchemaSequence("lookup", "s")),
        ("alter vschema on t add auto_increment id using lookup.s",
         AddAutoIncrement(None, "t", "id", "lookup.s")),
        ("alter vschema on t drop auto_increment", DropAutoIncrement(None, "t")),
        ("ALTER VSCHEMA CREATE VINDEX ks.h USING Hash", CreateVSchemaVindex("ks", "h", "hash")),
        ("alter vschema drop vindex h", DropVSchemaVindex(None, "h")),
        ("DROP QUEUE IF EXISTS app.jobs", DropQueueStatement("jobs", "app", True)),
        ("drop queue jobs;", DropQueueStatement("jobs", None, False)),
    ],
)
def test_own_statements(sql: str, expected: object) -> None:
    assert classify(sql) == expected


@pytest.mark.parametrize(
    "sql,kind",
    [
        ("SELECT * FROM t WHERE a = 1", exp.Select),
        ("/* use ks */ SELECT 1", exp.Select),
        ("SET autocommit = 1", exp.Set),
        ("SHOW TABLES", exp.Show),
        ("ALTER TABLE t ADD COLUMN b INT", exp.Alter),
        ("CREATE TABLE t (a INT)", exp.Create),
        ("INSERT INTO savepoint_log (a) VALUES (1)", exp.Insert),
        ("UPDATE t SET a = 1", exp.Update),
        ("DROP TABLE queue", exp.Drop),
    ],
)
def test_standard_sql_stays_sqlglot(sql: str, kind: type[exp.Expression]) -> None:
    assert isinstance(classify(sql), kind)


def test_create_queue() -> None:
    stmt = classify(
        "/* q */ CREATE QUEUE IF NOT EXISTS app.`jobs` (user_id BIGINT NOT NULL, body TEXT) "
        "SHARD BY User_Id USING xx WITH (ack_wait = 2, ordering_key = 'user_id');"
    )
    assert isinstance(stmt, CreateQueueStatement)
    assert (stmt.name, stmt.keyspace, stmt.if_not_exists) == ("jobs", "app", True)
    assert (stmt.shard_column, stmt.vindex) == ("user_id", "xx")
    assert [c.name for c in stmt.columns] == ["user_id", "body"]
    assert stmt.options == (("ack_wait", "2"), ("ordering_key", "user_id"))
    plain = classify("create queue q (a int)")
    assert isinstance(plain, CreateQueueStatement)
    assert (plain.keyspace, plain.if_not_exists, plain.shard_column, plain.vindex,
            plain.options) == (None, False, None, None, ())


@pytest.mark.parametrize(
    "sql,fragment",
    [
        ("USE", "USE needs a keyspace"),
        ("USE ;", "USE needs a keyspace"),
        ("USE `commerce:-80", "unterminated quoted identifier"),
        ("USE commerce@-80", "not a tablet type"),
        ("USE `commerce:-80@fast`", "not a tablet type"),
        ("USE 1commerce", "bad keyspace name"),
        ("USE commerce extra", "unexpected text after the USE target"),
        ("USE `commerce:`", "bad shard name"),
        ("USE `commerce:-80;drop`", "bad shard name"),
        ("USE `commerce[40-80]`", "key range targets are not supported"),
        ("USE `commerce[zz]`", "bad keyspace id"),
        ("USE `commerce[]`", "keyspace id"),
        ("USE `commerce` junk", "unexpected text"),
        ("SAVEPOINT", "needs a savepoint name"),
        ("SAVEPOINT a b", "unexpected text"),
        ("SAVEPOINT `a;b`", "bad savepoint name"),
        ("RELEASE SAVEPOINT", "needs a savepoint name"),
        ("ROLLBACK TO", "needs a savepoint name"),
        ("ROLLBACK TO SAVEPOINT 1a", "bad savepoint name"),
        ("SHOW VITESS_SHARDS junk", "unexpected text"),
        ("SHOW VITESS_SHARDS LIKE commerce", "quoted pattern"),
        ("SHOW VITESS_SHARDS LIKE 'c", "unterminated string"),
        ("/* never closed USE ks", "unterminated comment"),
        ("CREATE QUEUE", "CREATE QUEUE syntax"),
        ("CREATE QUEUE q", "CREATE QUEUE syntax"),
        ("CREATE QUEUE IF EXISTS q (a int)", "expected NOT"),
        ("CREATE QUEUE q (a int", "unbalanced parentheses"),
        ("CREATE QUEUE q (a int) SHARD a", "expected BY"),
        ("CREATE QUEUE q (a int) WITH ack_wait = 2", "WITH takes"),
        ("CREATE QUEUE q (a int) WITH (ack_wait)", "is not key = value"),
        ("CREATE QUEUE q (a int) junk", "unexpected text"),
        ("CREATE QUEUE q (a int, PRIMARY KEY (a))", "only column definitions"),
        ("SELECT * FROM t WHERE a = 1 *", "incomplete expression"),
    ],
)
def test_malformed_statements_get_coded_errors(sql: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        classify(sql)
    assert err.value.code is Code.INVALID_ARGUMENT
    assert fragment in err.value.message, err.value.message
    assert "<class" not in err.value.message and "<Token" not in err.value.message


def test_own_syntax_errors_point_at_the_position() -> None:
    with pytest.raises(SyntaxError_) as err:
        classify("USE `commerce:-80`\n  extra")
    assert err.value.message.startswith("syntax error at line 2, column 3 near 'extra'")
    with pytest.raises(SyntaxError_) as err:
        classify("SAVEPOINT a b")
    assert err.value.message.startswith("syntax error at line 1, column 13 near 'b'")


@pytest.mark.parametrize(
    "sql,expected",
    [
        # Columns counted from 1 at the first character of the offending token.
        ("SELECT * FROM t WHERE a = 1 *",
         "syntax error at line 1, column 29 near '*': incomplete expression"),
        ("SELECT * FROM t WHERE",
         "syntax error at line 1, column 17 near 'WHERE': incomplete WHERE clause"),
        ("INSERT INTO t VALUES",
         "syntax error at line 1, column 15 near 'VALUES': incomplete VALUES list"),
        ("SELECT 1 FROM",
         "syntax error at line 1, column 10 near 'FROM': "
         "expected table name but got the end of the statement"),
        # a misspelt first word is the first bad token, not where sqlglot gave up (issue 34)
        ("SELEC 1", "syntax error at line 1, column 1 near 'SELEC': "
         "no statement starts with 'SELEC'"),
        ("SELCT * FROM customer", "syntax error at line 1, column 1 near 'SELCT': "
         "no statement starts with 'SELCT'"),
        ("SELCT", "syntax error at line 1, column 1 near 'SELCT': "
         "no statement starts with 'SELCT'"),
        ("SELECT * FRM customer",
         "syntax error at line 1, column 14 near 'customer': unexpected token"),
        ("SELECT (1", "syntax error at line 1, column 9 near '1': expected ')'"),
        ("SELECT 'abc", "syntax error at line 1, column 8 near \"'\": unterminated string"),
        ("SELECT a,\n  `b", "syntax error at line 2, column 3 near '`': "
         "unterminated quoted identifier"),
        ("SELECT a\nFROM t\nWHERE a IN (1,",
         "syntax error at line 3, column 14 near ',': expected ')'"),
    ],
)
def test_parse_errors_name_position_and_token(sql: str, expected: str) -> None:
    with pytest.raises(SyntaxError_) as err:
        parse(sql)
    assert err.value.message == expected
    assert "<class" not in str(err.value) and "<Token" not in str(err.value)
    assert "sqlglot" not in str(err.value)


@pytest.mark.parametrize(
    "sql,line,near",
    [
        ("SELCT * FROM customer", 1, "SELCT * FROM customer"),
        ("SELECT * FRM customer", 1, "customer"),
        ("SELECT a,\n  2 frm x y", 2, "x y"),
        ("SELECT 'abc", 1, "'abc"),
        ("USE `a", 1, "`a"),
    ],
)
def test_parse_errors_carry_the_line_and_the_text_from_the_first_bad_token(
    sql: str, line: int, near: str
) -> None:
    """What the MySQL listener quotes in error 1064 (``near '...' at line N``)."""
    with pytest.raises(SyntaxError_) as err:
        classify(sql)
    assert (err.value.line, err.value.near) == (line, near)


def test_other_parse_errors_keep_their_codes() -> None:
    with pytest.raises(ShardgateError) as err:
        classify("")
    assert err.value.code is Code.INVALID_ARGUMENT and "empty statement" in err.value.message
    with pytest.raises(InvalidArgument, match="statement of its own"):
        classify("SET transaction_mode = 'twopc', autocommit = 1")
    with pytest.raises(InvalidArgument, match="send one statement per call"):
        classify("SELECT 1; SELECT 2")


@pytest.mark.parametrize(
    "sql,expected",
    [
        ("INSERT INTO q (a) VALUES (1)", ("insert", "q")),
        ("insert ignore into `Q` values (1)", ("insert", "Q")),
        ("INSERT OR IGNORE INTO \"q\" VALUES (1)", ("insert", "q")),
        ("REPLACE INTO q VALUES (1)", ("replace", "q")),
        ("/* marker */ UPDATE q SET state = 'acked'", ("update", "q")),
        ("DELETE FROM q WHERE id = 1", ("delete", "q")),
        ("SELECT * FROM q", None),
        ("INSERT", None),
        ("/* unterminated", None),
    ],
)
def test_write_target(sql: str, expected: tuple[str, str] | None) -> None:
    assert write_target(sql) == expected


def test_write_target_reads_only_the_head() -> None:
    # An unterminated string far into a large statement does not matter.
    big = "INSERT INTO q (a) VALUES " + ", ".join(["(1)"] * 10_000) + ", ('oops"
    assert write_target(big) == ("insert", "q")


def test_head_words() -> None:
    assert head_words("  /* x */ Create\n QUEUE q (a int)", 2) == ("create", "queue")
    assert head_words("create `queue`", 2) == ("create",)


@pytest.mark.parametrize(
    "text,pattern,expected",
    [
        ("commerce/-80", "commerce/%", True),
        ("commerce/-80", "COMMERCE/%", True),
        ("commerce/-80", "%80", True),
        ("commerce/-80", "%80-", False),
        ("lookup", "l_okup", True),
        ("lookup", "l_kup", False),
        ("a_b", "a\\_b", True),
        ("axb", "a\\_b", False),
        ("50%", "50\\%", True),
        ("500", "50\\%", False),
        ("", "%", True),
        ("x", "", False),
    ],
)
def test_like_match(text: str, pattern: str, expected: bool) -> None:
    assert like_match(text, pattern) is expected


@pytest.mark.parametrize(
    "sql", ["SET query_timeout_ms = 'soon'", "SET query_timeout_ms = -5",
            "SET query_timeout_ms = 1.5", "SET query_timeout_ms = 10, autocommit = 1"])
def test_query_timeout_needs_whole_milliseconds_alone(sql: str) -> None:
    with pytest.raises(InvalidArgument, match="query_timeout_ms"):
        classify(sql)


@pytest.mark.parametrize(
    "sql,detail",
    [
        ("ALTER VSCHEMA ADD VINDEX x", "ALTER VSCHEMA forms"),
        ("ALTER VSCHEMA ON t ADD VINDEX v", "column(s)"),
        ("ALTER VSCHEMA ON t ADD VINDEX v(a) USING", "vindex type"),
        ("ALTER VSCHEMA ON t ADD VINDEX v(a) USING hash WITH a", "expected '='"),
        ("ALTER VSCHEMA ON t ADD VINDEX v(a) USING hash WITH a=1, a=2", "twice"),
        ("ALTER VSCHEMA ON t ADD VINDEX v(a b) USING hash", "plain column names"),
        ("ALTER VSCHEMA ON t ADD AUTO_INCREMENT id", "USING"),
        ("ALTER VSCHEMA DROP TABLE t extra", "unexpected text"),
        ("DROP QUEUE", "queue name"),
    ],
)
def test_alter_vschema_refusals(sql: str, detail: str) -> None:
    with pytest.raises(SyntaxError_) as err:
        classify(sql)
    assert detail in err.value.message
