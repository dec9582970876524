"""DDL planning (run on every shard of the keyspace), and what the gate reads of a
CREATE TABLE: its first primary key column and the column the database numbers.
Pure: no I/O.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.engine.cursor import ShardQuery
from shardgate.engine.ddl import DDL
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument, ShardgateError, Unsupported
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.vschema import VSchema


def reads_other_keyspace(source: exp.Expr, keyspace: str, vschema: VSchema,
                         default_ks: str | None) -> bool:
    """Whether ``source`` (of a statement run in ``default_ks``, where its unqualified
    tables resolve) reads a table of another keyspace than ``keyspace``."""
    for t in source.find_all(exp.Table):
        try:
            found = vschema.find_table(t.name, t.db or None, default_ks or keyspace)
        except ShardgateError:
            continue  # not in the VSchema: the unsharded database resolves it
        if found.keyspace != keyspace:
            return True
    return False


def plan_ddl(stmt: exp.Expression, vschema: VSchema, default_ks: str | None) -> Primitive:
    """Plan a DDL statement: run on every shard of its keyspace, or refused when it
    cannot be (temporary tables, views over sharded keyspaces, cross-keyspace sources)."""
    if isinstance(stmt, exp.Create) and stmt.find(exp.TemporaryProperty) is not None:
        raise Unsupported(
            "CREATE TEMPORARY TABLE: a temporary table lives in one database connection, and "
            "the gate runs each statement on a pooled connection of each shard (the next "
            "statement may not see it); create a regular table"
        )
    table = stmt.find(exp.Table)
    ks_name = (table.db if table is not None and table.db else None) or default_ks
    if ks_name is None:
        raise InvalidArgument(
            "DDL needs a keyspace: qualify the table (keyspace.table) or set a default keyspace"
        )
    ks = vschema.keyspace(ks_name)
    kind = str(stmt.args.get("kind", "")).upper()
    if isinstance(stmt, exp.Create) and kind == "VIEW" and ks.sharded:
        raise Unsupported(
            f"CREATE VIEW in sharded keyspace {ks.name}: a view is a query stored in each "
            "shard's database, where it would see only that shard's rows; create the view "
            "in an unsharded keyspace"
        )
    if isinstance(stmt, exp.Create) and isinstance(stmt.expression, exp.Query):
        for source in stmt.expression.find_all(exp.Table):
            if (source.db or default_ks or ks.name) != ks.name:
                raise Unsupported(
                    f"CREATE {kind} in keyspace {ks.name} from {source.db}.{source.name}: "
                    "the statement runs inside the keyspace's databases, which do not hold "
                    "other keyspaces' tables; create it, then INSERT ... SELECT through "
                    "the gate"
                )
    for ref in stmt.find_all(exp.Reference):
        for target in ref.find_all(exp.Table):
            if target.db and target.db != ks.name:
                raise Unsupported(
                    f"a foreign key from keyspace {ks.name} to {target.db}.{target.name}: "
                    "keyspaces are separate databases, which cannot check a foreign key "
                    "between them"
                )
    return DDL(ks.name, ks.sharded, ShardQuery(strip_qualifiers(stmt)))


def first_primary_key_column(stmt: exp.Create) -> str | None:
    """The first column of a CREATE TABLE's primary key (table or column constraint)."""
    pk = stmt.find(exp.PrimaryKey)
    if pk is not None and pk.expressions:
        first = pk.expressions[0]
        if isinstance(first, exp.Ordered):
            first = first.this
        return str(first.name)
    for constraint in stmt.find_all(exp.PrimaryKeyColumnConstraint):
        column = constraint.find_ancestor(exp.ColumnDef)
        if column is not None:
            return str(column.name)
    return None


_SERIAL_TYPES = (exp.DataType.Type.SERIAL, exp.DataType.Type.BIGSERIAL,
                 exp.DataType.Type.SMALLSERIAL)


def auto_increment_column(stmt: exp.Create) -> str | None:
    """The CREATE TABLE column the database numbers itself: ``AUTO_INCREMENT``,
    ``SERIAL`` (``BIGSERIAL``, ``SMALLSERIAL``) or ``GENERATED ... AS IDENTITY``; None
    when there is none. Only a primary key column counts (as the database's own
    counter, a sequence fills a key)."""
    if not isinstance(stmt.this, exp.Schema):
        return None
    pk = first_primary_key_column(stmt)
    keys = {pk.lower()} if pk is not None else set()
    found = stmt.find(exp.PrimaryKey)
    if found is not None:
        keys |= {str((e.this if isinstance(e, exp.Ordered) else e).name).lower()
                 for e in found.expressions}
    for column in stmt.this.expressions:
        if not isinstance(column, exp.ColumnDef) or column.name.lower() not in keys:
            continue
        kind = column.args.get("kind")
        if (isinstance(kind, exp.DataType) and kind.this in _SERIAL_TYPES) or column.find(
                exp.AutoIncrementColumnConstraint, exp.GeneratedAsIdentityColumnConstraint):
            return str(column.name)
    return None
