"""The DDL a reshard runs on targets of another backend kind (sqlglot translation)."""

from __future__ import annotations

import pytest

from shardgate.errors import Unsupported
from shardgate.workflows.ddl import IndexDef, TableDef, translate_ddl
from shardgate.workflows.rowsql import MovingTable

MARIADB = ("CREATE TABLE `t` (\n  `id` bigint(20) NOT NULL AUTO_INCREMENT,\n"
           "  `v` varchar(64) NOT NULL DEFAULT '' COMMENT 'x',\n  `n` int(11) NOT NULL,\n"
           "  PRIMARY KEY (`id`),\n  UNIQUE KEY `u` (`v`),\n  KEY `n_idx` (`n`)\n"
           ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci")


def test_mariadb_table_for_postgres_keeps_columns_and_key_only() -> None:
    assert translate_ddl(MARIADB, "mysql", "postgres", "target -40") == (
        'CREATE TABLE "t" ("id" BIGINT NOT NULL, "v" VARCHAR(64) NOT NULL DEFAULT \'\', '
        '"n" INT NOT NULL, PRIMARY KEY ("id"))')


def test_sqlite_integer_becomes_bigint_on_mariadb() -> None:
    assert translate_ddl("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
                         "sqlite", "mysql", "target -40") \
        == "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT NOT NULL)"


def test_not_a_create_table_is_refused() -> None:
    with pytest.raises(Unsupported, match="create the table on the target first"):
        translate_ddl("CREATE VIEW v AS SELECT 1", "postgres", "mysql", "target -40")


def test_reference_table_rows_belong_to_every_target() -> None:
    table = MovingTable("countries", ("code", "name"), ("code",), None, None)
    targets = [("-80", None), ("80-", None)]
    assert table.reference
    assert table.owners(("fr", "France"), targets) == ["-80", "80-"]  # type: ignore[arg-type]
    assert table.ksids([("fr", "France")]) == [None]


def test_postgres_bytea_and_unbounded_varchar_get_a_length_on_mariadb() -> None:
    out = translate_ddl("CREATE TABLE l (email VARCHAR(64) NOT NULL, keyspace_id BYTEA NOT "
                        "NULL, c VARCHAR, PRIMARY KEY (email, keyspace_id))", "postgres",
                        "mysql", "x")
    assert "keyspace_id VARBINARY(255) NOT NULL" in out and "c VARCHAR(255)" in out, out
    assert "email VARCHAR(64)" in out, out
    # not a key column: any length (LONGBLOB)
    out = translate_ddl("CREATE TABLE l (email VARCHAR(64) NOT NULL, keyspace_id BYTEA NOT "
                        "NULL, PRIMARY KEY (email))", "postgres", "mysql", "x")
    assert "keyspace_id LONGBLOB NOT NULL" in out, out


def test_column_types_map_by_kind_and_the_rest_is_refused() -> None:
    pg = ("CREATE TABLE t (id BIGINT PRIMARY KEY, tz TIMESTAMPTZ, d DATE, tm TIME, "
          "num NUMERIC(12,3), j JSON, jb JSONB, u UUID)")
    my = translate_ddl(pg, "postgres", "mysql", "x", table="t")
    for part in ("tz DATETIME(6)", "d DATE", "tm TIME(6)", "num DECIMAL(12, 3)", "j JSON",
                 "jb JSON", "u UUID"):
        assert part in my, my
    lite = translate_ddl(pg, "postgres", "sqlite", "x", table="t")
    for part in ("tz TEXT", "d TEXT", "tm TEXT", "num TEXT", "j TEXT", "jb TEXT", "u TEXT"):
        assert part in lite, lite
    back = translate_ddl("CREATE TABLE `t` (`id` bigint(20) NOT NULL, `at` timestamp(6) NULL, "
                         "`j` longtext DEFAULT NULL CHECK (json_valid(`j`)), PRIMARY KEY "
                         "(`id`))", "mysql", "postgres", "x", table="t")
    assert '"at" TIMESTAMPTZ' in back and '"j" JSON' in back and "VALID" not in back, back
    for typ in ("INTERVAL", "INT[]", "INET", "INT4RANGE"):
        with pytest.raises(Unsupported, match="table t: column c: type"):
            translate_ddl(f"CREATE TABLE t (id BIGINT PRIMARY KEY, c {typ})", "postgres",
                          "mysql", "x", table="t")


def test_postgres_defaults_checks_and_uniques_for_mariadb() -> None:
    out = translate_ddl(
        "CREATE TABLE \"t\" (\"id\" bigint NOT NULL, \"s\" character varying(16) DEFAULT "
        "'new'::character varying NOT NULL, \"at\" timestamp without time zone DEFAULT now(), "
        "\"u\" text DEFAULT lower('A'::text), CONSTRAINT \"t_pkey\" PRIMARY KEY (id), "
        "CONSTRAINT \"t_s_key\" UNIQUE (s), CONSTRAINT \"t_c\" CHECK ((id > 0)))",
        "postgres", "mysql", "target -40", table="t")
    assert "`s` VARCHAR(16) DEFAULT 'new' NOT NULL" in out, out
    assert "`at` DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6)" in out, out
    assert "DEFAULT (LOWER(" in out, out
    assert "CONSTRAINT `t_s_key` UNIQUE (s)" in out and "CONSTRAINT `t_c` CHECK" in out, out


def test_mariadb_keys_become_indexes_named_per_schema() -> None:
    table = TableDef("t", "mysql", MARIADB, (
        IndexDef("u", True, (("v", False),)), IndexDef("t_n", False, (("n", True),))))
    assert table.statements("postgres", "target -40")[1:] == [
        'CREATE UNIQUE INDEX "t_u" ON "t" ("v")', 'CREATE INDEX "t_n" ON "t" ("n" DESC)']
    assert table.statements("mysql", "target -40") == [MARIADB]


def test_what_cannot_be_carried_is_refused_naming_table_and_construct() -> None:
    expr = TableDef("t", "postgres", "CREATE TABLE t (id bigint PRIMARY KEY)", (
        IndexDef("t_lower", False, (), "CREATE INDEX t_lower ON t (lower(v))",
                 "an expression index"),))
    assert len(expr.statements("postgres", "target -40")) == 2
    with pytest.raises(Unsupported, match="table t: index t_lower is an expression index"):
        expr.statements("mysql", "target -40")
    fk = TableDef("t", "sqlite", "CREATE TABLE t (id INTEGER PRIMARY KEY)",
                  refused=("a foreign key",))
    with pytest.raises(Unsupported, match="table t: a foreign key"):
        fk.statements("sqlite", "target -40")
    on_update = ("CREATE TABLE `t` (`id` bigint(20) NOT NULL, `at` timestamp NOT NULL DEFAULT "
                 "current_timestamp() ON UPDATE current_timestamp(), PRIMARY KEY (`id`))")
    with pytest.raises(Unsupported, match="table t: column at: ON UPDATE"):
        translate_ddl(on_update, "mysql", "postgres", "target -40", table="t")
