"""Columns resolved from what the planner knows of each table's columns.

A join the gate runs itself needs every column named with its table, and a
merge sort needs to know what ``ORDER BY 2`` means under ``SELECT *``. A
table's columns are its VSchema ``columns`` marked ``column_list_authoritative``
or, without them, the columns the gate tracked from the shards
(:meth:`~shardgate.vschema.VSchema.table_columns`, :mod:`shardgate.sql.schema`;
data in the planning context, never read here); a derived table's are its
select list's names. With them, as Vitess does:

- :func:`expand_stars`: ``*`` (all tables, FROM order) and ``t.*`` become the
  qualified columns, in the table's order; their result names are the bare
  column names, as the database gives them for ``*``;
- :func:`qualify_columns`: an unqualified column becomes ``alias.column`` of the
  one table that has it (a column of several is ambiguous, one of none unknown:
  both refused ``INVALID_ARGUMENT``, as the database refuses them); a name in
  ORDER BY, GROUP BY or HAVING that is a select-list alias stays the alias;
- :func:`name_star_positions`: ``ORDER BY <position>`` under ``SELECT *``
  becomes the column (or expression) at that position;
- :func:`declare_integer_types`: a column the gate does arithmetic on carries its
  declared type (PostgreSQL's ``int4 * int4`` overflows at int4's range).

When a table's columns are not known (no such table in the tracked schema, a
shard down, a derived table selecting ``*``) the statement is left as it is,
and the planner refuses the join as before; the keyspace's columns not read
yet raise :class:`~shardgate.sql.schema.ColumnsUnknown` (the gate reads them
and plans again). Joins with ``USING`` or ``NATURAL``, whose ``*`` merges the
joined columns, are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from shardgate.errors import InvalidArgument
from shardgate.evalengine.evaluate import DECLARED_TYPE
from shardgate.planner.join import TableRef
from shardgate.planner.union import output_names
from shardgate.vschema import VSchema


def _is_star(e: exp.Expr) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)


def columns_of(ref: TableRef, vschema: VSchema) -> Sequence[str] | None:
    """The columns of one table of a FROM clause, in order (None: not known)."""
    if isinstance(ref.node, exp.Subquery):  # a derived table: its select list
        return output_names(ref.node.this)
    return vschema.table_columns(ref.table)


def _qualifier(ref: TableRef) -> exp.Identifier:
    """The name ``ref``'s columns are qualified with (its alias, or table name)."""
    node = ref.node
    name = node.alias or (node.name if isinstance(node, exp.Table) else ref.alias)
    return exp.to_identifier(name)


def _column(name: str, ref: TableRef) -> exp.Column:
    quoted = name != name.lower() or not exp.SAFE_IDENTIFIER_RE.match(name)
    return exp.Column(this=exp.to_identifier(name, quoted=quoted), table=_qualifier(ref))


def _merging_joins(stmt: exp.Select) -> bool:
    return any(j.args.get("using") or j.args.get("method") for j in stmt.args.get("joins") or [])


def _star_columns(stmt: exp.Select, refs: Sequence[TableRef],
                  vschema: VSchema) -> list[exp.Expr] | None:
    """The select list with its stars expanded (None: a star's columns are unknown)."""
    by_alias = {r.alias: r for r in refs}
    expressions: list[exp.Expr] = []
    for e in stmt.expressions:
        if isinstance(e, exp.Star):
            tables = list(refs)
        elif isinstance(e, exp.Column) and e.is_star:
            found = by_alias.get(e.table.lower())
            if found is None:
                return None
            tables = [found]
        else:
            expressions.append(e)
            continue
        for ref in tables:
            columns = columns_of(ref, vschema)
            if columns is None:
                return None
            expressions.extend(_column(c, ref) for c in columns)
    return expressions


def expand_stars(stmt: exp.Select, refs: Sequence[TableRef], vschema: VSchema) -> exp.Select:
    """``stmt`` with its select-list stars expanded, or ``stmt`` itself if it cannot be."""
    if not any(_is_star(e) for e in stmt.expressions) or _merging_joins(stmt):
        return stmt
    expressions = _star_columns(stmt, refs, vschema)
    if expressions is None:
        return stmt
    out = stmt.copy()
    out.set("expressions", expressions)
    return out


#: the clauses where a select-list alias may stand for its expression
_ALIAS_CLAUSES = frozenset({"order", "group", "having"})


def _clause(node: exp.Expr, stmt: exp.Select) -> str:
    """The argument of ``stmt`` (``where``, ``order``...) that holds ``node``."""
    while node.parent is not None and node.parent is not stmt:
        node = node.parent
    return str(node.arg_key)


def qualify_columns(stmt: exp.Select, refs: Sequence[TableRef], vschema: VSchema) -> exp.Select:
    """``stmt`` with each unqualified column of its own scope (not of its subqueries)
    qualified by the one table that has it, or ``stmt`` itself when there is none
    or a table's columns are not known (see the module docstring)."""
    aliases = {e.alias.lower() for e in stmt.expressions if isinstance(e, exp.Alias)}

    def unqualified(root: exp.Select) -> list[exp.Column]:
        return [c for c in root.find_all(exp.Column)
                if not c.table and not c.is_star and c.find_ancestor(exp.Select) is root
                and not (c.name.lower() in aliases and _clause(c, root) in _ALIAS_CLAUSES)]

    if not unqualified(stmt) or _merging_joins(stmt):
        return stmt
    known: list[tuple[TableRef, set[str]]] = []
    for ref in refs:
        columns = columns_of(ref, vschema)
        if columns is None:
            return stmt
        known.append((ref, {c.lower() for c in columns}))
    out = stmt.copy()
    for col in unqualified(out):
        owners = [ref for ref, names in known if col.name.lower() in names]
        clause = _clause(col, out)
        where = _CLAUSE_NAMES.get(clause, clause)
        if not owners:
            raise InvalidArgument(f"unknown column {col.name!r} in {where}: no table of the "
                                  "join has it")
        if len(owners) > 1:
            raise InvalidArgument(
                f"column {col.name!r} in {where} is ambiguous: tables "
                f"{', '.join(r.alias for r in owners)} have it; qualify it")
        col.set("table", _qualifier(owners[0]))
    return out


_CLAUSE_NAMES = {"expressions": "the select list", "where": "WHERE", "joins": "ON",
                 "group": "GROUP BY", "having": "HAVING", "order": "ORDER BY"}


def name_star_positions(stmt: exp.Select, refs: Sequence[TableRef],
                        vschema: VSchema) -> exp.Select:
    """``ORDER BY <position>`` under ``SELECT *`` rewritten to the column (or
    expression) at that position, or ``stmt`` itself when there is none or the
    star's columns are not known."""
    order = stmt.args.get("order")
    if order is None or not any(_is_star(e) for e in stmt.expressions) or not any(
            isinstance(o.this, exp.Literal) and o.this.is_int for o in order.expressions):
        return stmt
    if _merging_joins(stmt):
        return stmt
    items = _star_columns(stmt, refs, vschema)
    if items is None:
        return stmt
    out = stmt.copy()
    for o in out.args["order"].expressions:
        if not (isinstance(o.this, exp.Literal) and o.this.is_int):
            continue
        position = int(o.this.name)
        if not 1 <= position <= len(items):
            raise InvalidArgument(
                f"ORDER BY position {position} is not in the select list "
                f"(it has {len(items)} columns)")
        item = items[position - 1]
        o.set("this", (item.this if isinstance(item, exp.Alias) else item).copy())
    return out


#: arithmetic the gate may evaluate after merging shards (over aggregates, joined rows)
_ARITH = (exp.Add, exp.Sub, exp.Mul, exp.Neg)
_THROUGH = (exp.Paren, exp.Min, exp.Max, exp.AnyValue, exp.Sum, exp.Distinct)


def declare_integer_types(stmt: exp.Select, refs: Sequence[TableRef],
                          vschema: VSchema) -> exp.Select:
    """``stmt`` with each column that is an operand of arithmetic (itself, or under
    MIN / MAX / SUM) marked with its tracked declared type
    (:data:`~shardgate.evalengine.evaluate.DECLARED_TYPE` in ``Column.meta``), so the
    gate computes ``MIN(int4_col) * 2`` in the column's type as PostgreSQL does
    (:func:`~shardgate.evalengine.evaluate.integer_type`). Marks in place (metadata
    only: node identities stay). A keyspace whose columns were not read yet raises
    :class:`~shardgate.sql.schema.ColumnsUnknown`; a table the tracked schema lacks,
    or a derived table, leaves its columns unmarked."""
    for col in list(stmt.find_all(exp.Column)):
        if col.is_star or col.find_ancestor(exp.Select) is not stmt:
            continue
        node: exp.Expr = col
        while isinstance(node.parent, _THROUGH):
            node = node.parent
        if not isinstance(node.parent, _ARITH):
            continue
        qualifier = col.table.lower()
        owners = [r for r in refs if isinstance(r.node, exp.Table)
                  and (r.alias.lower() == qualifier or (not qualifier and len(refs) == 1))]
        if len(owners) != 1:
            continue
        table = owners[0].table
        found = vschema.schema.table(table.keyspace, table.name)
        info = found.find(col.name) if found is not None else None
        if info is not None and info.type:
            col.meta[DECLARED_TYPE] = info.type
    return stmt
