"""INSERT planning: one route where the keyspace's database takes the statement
whole, else an :class:`~shardgate.engine.insert.Insert` that routes each row by its
primary vindex (an INSERT ... SELECT or VALUES' subqueries run at the gate first);
and the values the gate resolves itself: ``DEFAULT`` and ON DUPLICATE KEY UPDATE.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from sqlglot import exp

from shardgate.engine.cursor import ShardQuery
from shardgate.engine.insert import Insert, OwnedLookup
from shardgate.engine.insert_select import InsertSelect
from shardgate.engine.primitive import Opcode, Primitive
from shardgate.engine.route import Route
from shardgate.engine.scalar import ScalarSubqueries
from shardgate.errors import InvalidArgument, Unsupported
from shardgate.evalengine.values import Literal, SQLExpr, Value, from_expression
from shardgate.planner.ddl import reads_other_keyspace
from shardgate.planner.query import plan_select, route_for
from shardgate.planner.routing import pinned_choice
from shardgate.sql.dialects.render import strip_qualifiers
from shardgate.vindexes import Lookup
from shardgate.vindexes.consistent_lookup import ConsistentLookupBase
from shardgate.vindexes.lookup import LookupBase
from shardgate.vschema import Table, TableType, VSchema

#: plans a query of the statement on its own (``build_plan``'s instructions): the
#: subqueries of an INSERT's VALUES
PlanQuery = Callable[[exp.Expr, VSchema, str | None], Primitive]


def on_duplicate(stmt: exp.Insert, table: Table) -> tuple[tuple[str, SQLExpr], ...]:
    """The ``ON DUPLICATE KEY UPDATE`` assignments of an insert into a sharded table.

    The existing row stays on its shard, so the clause runs there. Into a table
    owning lookup vindexes the gate runs it row by row (:mod:`shardgate.engine.upsert`)
    and moves the lookup rows of the columns it changes; there the primary vindex
    column may be assigned ``VALUES()`` of itself (Vitess's rule: the update is
    checked not to move the row). Assigning a non-owned lookup column leaves that
    lookup alone (as an UPDATE does); any other vindex column is refused (the row
    would no longer map to its shard).
    """
    conflict = stmt.args.get("conflict")
    if conflict is None:
        return ()
    if not conflict.args.get("duplicate"):
        raise Unsupported("INSERT ... ON CONFLICT is not supported: use ON DUPLICATE KEY UPDATE")
    lookups = [cv for cv in table.column_vindexes[1:] if isinstance(cv.vindex, Lookup)]
    by_gate = any(cv.owned for cv in lookups)
    if by_gate and stmt.args.get("ignore"):
        raise Unsupported(
            f"INSERT IGNORE ... ON DUPLICATE KEY UPDATE into {table.name}, which owns lookup "
            "vindexes, is not supported: use one or the other"
        )
    free = {c for cv in lookups for c in cv.columns}  # owned: moved; others: left alone
    primary = table.primary
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    out: list[tuple[str, SQLExpr]] = []
    for a in conflict.expressions:
        if not (isinstance(a, exp.EQ) and isinstance(a.this, exp.Column)):
            raise InvalidArgument("ON DUPLICATE KEY UPDATE takes col = expr assignments")
        col = a.this.name.lower()
        if col in vindex_columns and col not in free and not (
            by_gate and primary is not None and col in primary.columns
            and _values_of(a.expression) == col
        ):
            raise Unsupported(
                f"ON DUPLICATE KEY UPDATE of vindex column {table.name}.{col} is not "
                "supported: it would move the row to another shard"
            )
        if a.expression.find(exp.Select) is not None:
            raise Unsupported("a subquery in ON DUPLICATE KEY UPDATE is not supported")
        out.append((a.this.name, SQLExpr(strip_qualifiers(a.expression))))
    return tuple(out)


def _values_of(node: exp.Expr) -> str | None:
    """``c`` if ``node`` is ``VALUES(c)``."""
    if isinstance(node, exp.Anonymous) and str(node.this).upper() == "VALUES" and \
            len(node.expressions) == 1:
        return str(node.expressions[0].name).lower()
    return None


def is_default(node: exp.Expr) -> bool:
    """Whether a VALUES item is the ``DEFAULT`` keyword."""
    return isinstance(node, exp.Var) and node.name.upper() == "DEFAULT"


def without_defaults(
    table: Table, columns: list[str], rows: list[list[exp.Expr]]
) -> tuple[list[str], list[tuple[Value, ...]]]:
    """Row values with ``DEFAULT`` resolved where the gate must know them.

    ``DEFAULT`` in the auto-increment column asks for the next sequence value
    (NULL does the same); a column that is ``DEFAULT`` in every row is left
    out (its default applies, and SQLite has no ``DEFAULT`` keyword in VALUES).
    ``DEFAULT`` in a vindex column otherwise is refused: the gate cannot route
    by a value only the shard knows.
    """
    ai = table.auto_increment.column if table.auto_increment is not None else None
    vindex_columns = {c for cv in table.column_vindexes for c in cv.columns}
    keep = [
        i for i, c in enumerate(columns)
        if c == ai or not rows or not all(is_default(r[i]) for r in rows)
    ]
    out_rows: list[tuple[Value, ...]] = []
    for r in rows:
        values: list[Value] = []
        for i in keep:
            if is_default(r[i]):
                if columns[i] == ai:
                    values.append(Literal(None))
                    continue
                if columns[i] in vindex_columns:
                    raise InvalidArgument(
                        f"DEFAULT for vindex column {table.name}.{columns[i]} cannot be "
                        "routed: give its value"
                    )
            values.append(from_expression(r[i]))
        out_rows.append(tuple(values))
    return [columns[i] for i in keep], out_rows


def plan_insert(stmt: exp.Insert, vschema: VSchema, default_ks: str | None,
                plan_query: PlanQuery) -> Primitive:
    """Plan an INSERT: one route where the keyspace's database can take it whole, else
    an :class:`~shardgate.engine.insert.Insert` routing each row (after the gate runs
    its SELECT, or its VALUES' subqueries, each planned by ``plan_query``)."""
    target = stmt.this
    columns_given: list[str] | None = None
    quoted: set[str] = set()
    if isinstance(target, exp.Schema):
        columns_given = [c.name.lower() for c in target.expressions]
        quoted = {c.name.lower() for c in target.expressions if c.args.get("quoted")}
        target = target.this
    if not isinstance(target, exp.Table):
        raise InvalidArgument("INSERT needs a table")
    table = vschema.find_table(target.name, target.db or None, default_ks)
    if columns_given is not None:
        _refuse_duplicates(columns_given, table)
    ks = vschema.keyspace(table.keyspace)
    pulled = _value_subqueries(stmt, table, vschema, default_ks, plan_query)
    if pulled is not None:
        return pulled
    tree = strip_qualifiers(stmt)
    source = stmt.expression
    simple = isinstance(source, exp.Values) and stmt.args.get("conflict") is None
    # A SELECT reading another keyspace cannot run in this keyspace's database: the
    # gate runs it and inserts its rows (engine/insert_select.py).
    elsewhere = isinstance(source, exp.Query) and reads_other_keyspace(
        source, ks.name, vschema, default_ks)
    if not ks.sharded and (table.auto_increment is None or not simple) and not elsewhere:
        if table.auto_increment is not None:
            raise Unsupported(
                f"INSERT into {table.name} with a sequence needs a plain VALUES list"
            )
        return Route(Opcode.UNSHARDED, ks.name, False, ShardQuery(tree), table=table.name,
                     write=True)
    pinned = pinned_choice(table)
    if pinned is not None:
        if table.auto_increment is not None or table.column_vindexes:
            raise Unsupported(
                f"INSERT into pinned table {table.qualified} with column vindexes or an "
                "auto_increment sequence is not supported"
            )
        if not isinstance(source, exp.Values) or source.find(exp.Query) is not None:
            raise Unsupported(
                f"INSERT into pinned table {table.qualified} takes a VALUES list without "
                "subqueries (a SELECT would read the pinned shard only)"
            )
        return route_for(pinned, ks.name, tree, table.name, write=True)
    selected: Primitive | None = None
    if isinstance(source, exp.Query):
        # The gate runs the SELECT, then inserts its rows as VALUES (engine/insert_select.py).
        if columns_given is None and vschema.table_columns(table) is None:
            raise InvalidArgument(
                f"INSERT ... SELECT into sharded table {table.qualified} must list its "
                f"columns: INSERT INTO {table.name} (col, ...) SELECT ..."
            )
        selected = plan_select(cast(exp.Expression, source), vschema, default_ks)
        stmt = stmt.copy()
        source = exp.Values(expressions=[])
        stmt.set("expression", source)
    if not isinstance(source, exp.Values):
        raise Unsupported(f"INSERT ... SELECT into sharded table {table.name} is not supported")
    duplicate_sets = on_duplicate(stmt, table)
    if columns_given is None and selected is None and all(
        isinstance(row, exp.Tuple) and not row.expressions for row in source.expressions
    ):
        columns_given = []  # INSERT INTO t VALUES (): every column takes its default
    if columns_given is None:  # the VSchema's authoritative columns, else the tracked ones
        known = vschema.table_columns(table)
        columns_given = list(known) if known is not None else None
    if columns_given is None:
        raise InvalidArgument(
            f"INSERT into {table.qualified} must list its columns: "
            f"INSERT INTO {table.name} (col, ...) VALUES (...)"
        )
    raw_rows: list[list[exp.Expr]] = []
    for i, row in enumerate(source.expressions):
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(columns_given):
            raise InvalidArgument(
                f"INSERT row {i + 1} has {len(items)} values for {len(columns_given)} columns"
            )
        raw_rows.append(list(items))
    columns_given, rows = without_defaults(table, columns_given, raw_rows)
    primary = table.primary
    ai = table.auto_increment
    if ks.sharded and table.type != TableType.REFERENCE and primary is not None and any(
        c not in columns_given and (ai is None or ai.column != c) for c in primary.columns
    ):
        raise InvalidArgument(
            f"insert into {table.name} must give the primary vindex column(s) "
            f"{list(primary.columns)}"
        )
    owned = tuple(
        OwnedLookup(cv.columns, cv.vindex)
        for cv in table.owned_vindexes
        if isinstance(cv.vindex, Lookup)
    )
    if stmt.args.get("ignore") and ks.sharded:
        _check_ignorable(table, owned)
    secondary = tuple(
        (cv.columns, cv.vindex)
        for cv in table.column_vindexes[1:]
        if not (cv.owned and isinstance(cv.vindex, Lookup))
        and not (isinstance(cv.vindex, Lookup) and cv.vindex.write_only)
    )
    insert = Insert(
        keyspace=ks.name,
        sharded=ks.sharded and table.type != TableType.REFERENCE,
        table=table.name,
        columns=tuple(columns_given),
        rows=tuple(rows),
        primary_columns=primary.columns if primary and ks.sharded else (),
        primary_vindex=primary.vindex if primary and ks.sharded else None,
        owned_lookups=owned if ks.sharded else (),
        secondary=secondary if ks.sharded else (),
        auto_increment=(ai.column, ai.sequence) if ai else None,
        ignore=bool(stmt.args.get("ignore")),
        broadcast=ks.sharded and table.type == TableType.REFERENCE,
        on_duplicate=duplicate_sets,
        quoted=frozenset(quoted | ({table.name} if target.this.args.get("quoted") else set())),
    )
    return insert if selected is None else InsertSelect(selected, insert)


def _check_ignorable(table: Table, owned: tuple[OwnedLookup, ...]) -> None:
    """INSERT IGNORE keeps owned lookups exact only if their writes join the statement's
    transaction (see shardgate.engine.insert_ignore)."""
    for lk in owned:
        v = lk.vindex
        if (not isinstance(v, LookupBase) or isinstance(v, ConsistentLookupBase)
                or v.autocommit or len(lk.columns) != 1):
            raise Unsupported(
                f"INSERT IGNORE into {table.name} is not supported with its lookup vindex "
                f"{v.name!r} ({v.type_name}{', autocommit' if v.autocommit else ''}, "
                f"{len(lk.columns)} column(s)): a skipped row's lookup rows could not be "
                "removed in the same transaction; use a plain INSERT"
            )


def _refuse_duplicates(columns: list[str], table: Table) -> None:
    """A column named twice: the row would be routed by one value and store the other."""
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise InvalidArgument(f"INSERT into {table.name} names column {c!r} twice")
        seen.add(c)


VALUE_SUBQUERY_VAR = "__sg_vsq{}"


def _value_subqueries(
    stmt: exp.Insert, table: Table, vschema: VSchema, default_ks: str | None,
    plan_query: PlanQuery,
) -> Primitive | None:
    """Plan subqueries in VALUES that cannot run where the row goes (engine/scalar.py).

    Into a sharded table a subquery would see one shard's rows; in an unsharded
    keyspace it may stay inline unless it reads another keyspace. Each pulled
    subquery is planned as a SELECT of its own and becomes a bind variable of
    the insert. None when there is nothing to pull.
    """
    source = stmt.expression
    if not isinstance(source, exp.Values) or source.find(exp.Query) is None:
        return None
    ks = vschema.keyspace(table.keyspace)
    if not ks.sharded and not reads_other_keyspace(source, ks.name, vschema, default_ks):
        return None
    stmt = stmt.copy()
    values = stmt.expression
    subqueries: list[tuple[str, Primitive]] = []
    while (sub := values.find(exp.Subquery)) is not None:
        alone = isinstance(sub.parent, exp.Tuple | exp.Values)
        if (ks.sharded and not alone) or not isinstance(sub.this, exp.Query):
            break  # refused below
        var = VALUE_SUBQUERY_VAR.format(len(subqueries))
        subqueries.append((var, plan_query(sub.this, vschema, default_ks)))
        sub.replace(exp.Placeholder(this=var))
    if values.find(exp.Query) is not None:
        raise Unsupported(
            f"this subquery in the VALUES of an INSERT into {table.qualified} cannot be "
            "computed across shards: only a subquery alone as a value, (SELECT ...), is"
        )
    return ScalarSubqueries(tuple(subqueries), plan_insert(stmt, vschema, default_ks, plan_query))
