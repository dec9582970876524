"""``CREATE TABLE [ks.]t [(defs)] AS SELECT ...`` run by the gate.

A shard cannot run the statement when its table is sharded (each shard's
SELECT would read its own rows, and the rows belong on the shards their vindex
values name) or when the SELECT reads another keyspace (keyspaces are separate
databases). The gate then does what one MySQL server does, in three steps:

1. runs the SELECT, planned on its own (it may scatter, aggregate, join or
   read any keyspace);
2. creates the table through the same path as any ``CREATE TABLE`` through
   the gate (so ``auto_shard`` applies: without a primary key the first
   column shards it). Its columns are the definitions written in the
   statement, then the SELECT's result columns not defined there, typed as
   the column they read is declared (a projection that names a column of a
   table in FROM, its catalog type in MySQL's terms), else from the values
   (integers BIGINT, floats DOUBLE, decimals DECIMAL, text VARCHAR(255) or
   TEXT, bytes LONGBLOB, dates and times as such; no non-NULL value: TEXT);
3. inserts the rows as ``INSERT INTO t (cols) SELECT`` does
   (:mod:`shardgate.engine.insert_select`): each routed by its vindex; the gate
   runs that insert as a statement of its own (rows of several shards in one
   implicit transaction). If the insert fails, it is rolled back and the table
   dropped again (MySQL leaves no table behind a failed CREATE ... SELECT
   either) and the insert's error is raised.

``IF NOT EXISTS`` with the table already there does nothing. A SELECT whose
result names a column twice is INVALID_ARGUMENT (MySQL's 1060). Within an
unsharded keyspace, reading that keyspace only, the statement is not planned
here: the database runs it with its exact types.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.insert import Insert
from shardgate.engine.insert_select import InsertSelect, with_rows
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument, ShardgateError, Unsupported
from shardgate.gate.catalog import TableInfo
from shardgate.planner.build import build_plan
from shardgate.result import Result
from shardgate.sql.statements import GateStatement
from shardgate.vschema import VSchema


class TableCreator(Protocol):
    """What the primitive needs of the gate."""

    @property
    def vschema(self) -> VSchema:
        """The VSchema served now."""
        ...

    def plan(self, sql: str, keyspace: str | None) -> Plan | GateStatement:
        """The plan of ``sql`` (the one path from text to plan)."""
        ...

    async def catalog(self, keyspace: str, table: str | None = None) -> list[TableInfo]:
        """The tables of ``keyspace`` with their columns, in MySQL's terms."""
        ...


@dataclass(frozen=True)
class CreateTableAsSelect(Primitive):
    """``CREATE TABLE keyspace.table AS <select>`` (see the module docstring)."""

    keyspace: str
    table: str
    #: the statement's own column definitions and constraints (``CREATE TABLE t (defs) AS``)
    definitions: tuple[exp.Expr, ...]
    select: exp.Query
    source: Primitive
    #: the session's keyspace, where the SELECT's unqualified tables resolve
    default_keyspace: str | None
    if_not_exists: bool
    gate: TableCreator

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        insert = await self.create(vc, bind_vars)
        if insert is None:
            return Result()
        try:
            return await insert.execute(vc, bind_vars)
        except ShardgateError:
            await self.undo(vc, bind_vars)
            raise

    async def create(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Insert | None:
        """Steps 1 and 2: select, create the table; the insert of the rows (step 3) to
        run in the statement's transaction, or None (``IF NOT EXISTS``, it exists)."""
        if self.if_not_exists and await self.gate.catalog(self.keyspace, self.table):
            return None
        selected = await self.source.execute(vc, bind_vars)
        names = list(selected.fields)
        seen: set[str] = set()
        for name in names:
            if name.lower() in seen:
                raise InvalidArgument(
                    f"CREATE TABLE {self.keyspace}.{self.table} AS SELECT: the SELECT returns "
                    f"column {name!r} twice; give the columns distinct aliases"
                )
            seen.add(name.lower())
        declared = await self._declared_types(names)
        defined = {str(d.name).lower() for d in self.definitions if isinstance(d, exp.ColumnDef)}
        columns: list[exp.Expr] = list(self.definitions)
        for i, name in enumerate(names):
            if name.lower() not in defined:
                kind = declared[i] or type_of_values([row[i] for row in selected.rows])
                columns.append(exp.ColumnDef(this=exp.to_identifier(name, quoted=True),
                                             kind=kind))
        create = exp.Create(kind="TABLE",
                            this=exp.Schema(this=self._target(), expressions=columns))
        await self._run(create.sql(dialect="mysql"), vc, bind_vars)
        try:
            return with_rows(self._insert(names), selected.rows)
        except ShardgateError:
            await self.undo(vc, bind_vars)
            raise

    async def undo(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> None:
        """Drop the table again after its rows failed to go in (errors ignored: the
        insert's error is the one to report)."""
        drop = exp.Drop(kind="TABLE", tables=[self._target()], exists=True)
        with contextlib.suppress(ShardgateError):
            await self._run(drop.sql(dialect="mysql"), vc, bind_vars)

    def _target(self) -> exp.Table:
        return exp.Table(this=exp.to_identifier(self.table, quoted=True),
                         db=exp.to_identifier(self.keyspace, quoted=True))

    async def _run(self, sql: str, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> None:
        planned = self.gate.plan(sql, self.keyspace)
        assert isinstance(planned, Plan)
        await planned.instructions.execute(vc, bind_vars)

    def _insert(self, names: list[str]) -> Insert:
        """The Insert primitive of ``INSERT INTO target (names) <select>``, planned now
        (the table is in the VSchema); its rows are the ones already selected."""
        stmt = exp.Insert(
            this=exp.Schema(this=self._target(),
                            expressions=[exp.to_identifier(n, quoted=True) for n in names]),
            expression=self.select.copy())
        planned = build_plan(stmt, "", self.gate.vschema, self.default_keyspace).instructions
        if not isinstance(planned, InsertSelect):
            raise Unsupported(  # not reached: the gate plans this statement only then
                f"CREATE TABLE {self.keyspace}.{self.table} AS SELECT: the insert of its "
                "rows is not planned at the gate"
            )
        return planned.insert

    async def _declared_types(self, names: Sequence[str]) -> list[exp.DataType | None]:
        """The declared type of each result column that reads a column of a table in
        the SELECT's FROM (None where it does not, or the type is unknown)."""
        select = self.select
        if not isinstance(select, exp.Select):
            return [None] * len(names)
        tables: dict[str, tuple[str, str]] = {}  # alias or name -> (keyspace, table)
        for t in [*(f.this for f in [select.args.get("from")] if f is not None),
                  *(j.this for j in select.args.get("joins") or [])]:
            if not isinstance(t, exp.Table):
                continue
            try:
                found = self.gate.vschema.find_table(t.name, t.db or None,
                                                     self.default_keyspace)
            except ShardgateError:
                continue
            tables[(t.alias_or_name).lower()] = (found.keyspace, t.name)
        catalogs: dict[tuple[str, str], dict[str, str]] = {}
        for key in set(tables.values()):
            infos = await self.gate.catalog(*key)
            catalogs[key] = {c.name.lower(): c.column_type for i in infos for c in i.columns}
        projections = select.expressions
        star = any(isinstance(p, exp.Star) or (isinstance(p, exp.Column)
                                               and isinstance(p.this, exp.Star))
                   for p in projections)
        out: list[exp.DataType | None] = []
        for i, name in enumerate(names):
            column, qualifier = name.lower(), ""
            if not star and i < len(projections):
                p = projections[i].unalias()
                if not isinstance(p, exp.Column):
                    out.append(None)
                    continue
                column, qualifier = p.name.lower(), p.table.lower()
            candidates = [tables[qualifier]] if qualifier in tables else (
                [] if qualifier else list(tables.values()))
            out.append(_parse_type(next(
                (catalogs[c][column] for c in candidates if column in catalogs[c]), None)))
        return out

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "CreateTableAsSelect",
                "Keyspace": {"Name": self.keyspace}, "Table": self.table,
                "Inputs": [self.source.describe()]}


def _parse_type(column_type: str | None) -> exp.DataType | None:
    if not column_type:
        return None
    try:
        return exp.DataType.build(column_type, dialect="mysql")
    except Exception:  # sqlglot's parse errors vary: fall back to the values
        return None


def type_of_values(values: Sequence[Any]) -> exp.DataType:
    """The MySQL column type that stores every value of ``values`` (None: any)."""
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}

    def build(t: str) -> exp.DataType:
        return exp.DataType.build(t, dialect="mysql")

    if not present:
        return build("TEXT")
    if kinds <= {bool}:
        return build("BOOLEAN")
    if kinds <= {int, bool}:
        return build("BIGINT")
    if kinds <= {int, bool, decimal.Decimal}:
        exps = [v.as_tuple().exponent for v in present if isinstance(v, decimal.Decimal)]
        scale = min(30, max((-e for e in exps if isinstance(e, int) and e < 0), default=0))
        return build(f"DECIMAL(65, {scale})")
    if kinds <= {int, bool, float, decimal.Decimal}:
        return build("DOUBLE")
    if kinds <= {str}:
        longest = max(len(v) for v in present)
        return build("VARCHAR(255)" if longest <= 255 else "LONGTEXT")
    if kinds <= {bytes, bytearray, memoryview}:
        return build("LONGBLOB")
    if kinds <= {datetime.datetime}:
        fraction = any(v.microsecond for v in present)
        return build("DATETIME(6)" if fraction else "DATETIME")
    if kinds <= {datetime.date}:
        return build("DATE")
    if kinds <= {datetime.time, datetime.timedelta}:
        return build("TIME(6)")
    return build("LONGTEXT")
