"""MySQL forms SQLite and PostgreSQL cannot parse, translated for their shards.

The gate's SQL is MySQL's (as Vitess's). A statement to an unsharded keyspace
goes to its shard as written, so on a SQLite or PostgreSQL shard the forms
below are rewritten node by node while the statement is rendered
(:meth:`~shardgate.sql.dialects.base.SQLDialect.fix` of ``sqlite.py`` and
``postgres.py`` call :func:`translate`), or refused with ``UNIMPLEMENTED``
naming the form where the database has no equivalent:

========================================  =========================================
MySQL                                     SQLite / PostgreSQL
========================================  =========================================
``FROM dual``                             no FROM (every dialect, MariaDB too: sqlglot
                                          quotes ``dual`` in a subquery)
``SELECT STRAIGHT_JOIN``, ``a STRAIGHT_   the hint dropped; an inner ``JOIN``
JOIN b``
``_binary 'abc'``, ``_utf8mb4'x'``        the literal (``_binary X'ff'``: a blob /
                                          ``bytea``)
``LAST_INSERT_ID()``                      ``last_insert_rowid()`` / ``lastval()``
``LAST_INSERT_ID(x)``, ``@@[session.]v``  refused
``(SELECT ...) UNION (SELECT ...)``       SQLite: arms unwrapped (an arm with ORDER BY
                                          or LIMIT as ``SELECT * FROM (arm)``)
``DELETE t FROM t JOIN u ...``,           ``DELETE FROM t WHERE rowid IN (SELECT
``DELETE FROM t USING t JOIN u ...``      t.rowid FROM t JOIN u ...)`` (``ctid``)
``UPDATE t JOIN u ON c SET t.x = u.y``    ``UPDATE t SET x = u.y FROM u WHERE c``
                                          (inner joins; SET of the first table only)
``ON DUPLICATE KEY UPDATE c = VALUES(c)`` SQLite: ``ON CONFLICT DO UPDATE SET c =
                                          excluded.c``; PostgreSQL: refused
========================================  =========================================

The functions mutate the node they are given (``render`` walks its own copy
of the tree) and return it, so the walk goes on into its children; a
replaced leaf is returned instead.
"""

from __future__ import annotations

from sqlglot import exp

from shardgate.errors import Unsupported
from shardgate.sql.dialects.base import SQLDialect, is_dual


def translate(node: exp.Expr, target: SQLDialect) -> exp.Expr | None:
    """``node`` as ``target``'s database (SQLite, PostgreSQL) takes it (see the module
    docstring); what the translation needs of the dialect are its constants
    ``rowid``, ``last_insert_id``, ``union_parens``, ``hex_blob`` and whether
    :meth:`~shardgate.sql.dialects.base.SQLDialect.on_duplicate_key_update` has a form."""
    dialect = target.name.value
    if is_dual(node):
        return None
    if isinstance(node, exp.Var) and node.arg_key == "operation_modifiers" and \
            node.name.upper() == "STRAIGHT_JOIN":
        return None
    if isinstance(node, exp.Join) and str(node.args.get("kind") or "").upper() == \
            "STRAIGHT_JOIN":
        node.set("kind", None)
        return node
    if isinstance(node, exp.Introducer):
        return _introduced(node, target.hex_blob)
    if isinstance(node, exp.SessionParameter):
        raise Unsupported(
            f"{node.sql(dialect='mysql')}: MySQL system variables cannot be read on a "
            f"{dialect} shard"
        )
    if isinstance(node, exp.Anonymous) and str(node.this).upper() == "LAST_INSERT_ID":
        if node.expressions:
            raise Unsupported(f"LAST_INSERT_ID(expr) has no equivalent on a {dialect} shard")
        return exp.Anonymous(this=target.last_insert_id)
    if isinstance(node, exp.Union) and not target.union_parens:
        _unwrap_arms(node)
        return node
    if isinstance(node, exp.Delete) and (node.args.get("tables") or node.args.get("using")
                                         or node.this.args.get("joins")):
        return _delete_by_rowid(node, target.rowid)
    if isinstance(node, exp.Update) and isinstance(node.this, exp.Table) and \
            node.this.args.get("joins"):
        return _update_from(node, dialect)
    if isinstance(node, exp.OnConflict) and node.args.get("duplicate"):
        if target.on_duplicate_key_update([]) is None:
            raise Unsupported(
                f"INSERT ... ON DUPLICATE KEY UPDATE cannot run on a {dialect} shard (it "
                "needs the conflicting key named): write INSERT ... ON CONFLICT (key) DO "
                "UPDATE for it"
            )
        return _on_conflict(node)
    return node


def _introduced(node: exp.Introducer, hex_blob: bool) -> exp.Expr:
    """``_charset 'text'`` as the text; ``_binary X'ff'`` as the dialect's blob literal
    (``hex_blob``: ``X'ff'`` is one; else ``'\\xff'::bytea``)."""
    value = node.expression
    if isinstance(value, exp.HexString) and not hex_blob:
        return exp.Cast(this=exp.Literal.string("\\x" + str(value.this)),
                        to=exp.DataType.build("bytea", dialect="postgres"))
    if isinstance(value, exp.Literal | exp.HexString):
        return value.copy()
    raise Unsupported(
        f"{node.sql(dialect='mysql')}: a character set introducer takes a string literal"
    )


def _unwrap_arms(node: exp.Union) -> None:
    """SQLite parses no parentheses around UNION arms: a plain arm loses them, one with
    its own ORDER BY or LIMIT becomes a derived table."""
    for key in ("this", "expression"):
        arm = node.args.get(key)
        if not isinstance(arm, exp.Subquery) or arm.alias:
            continue
        inner = arm.this
        while isinstance(inner, exp.Subquery) and not inner.alias:
            inner = inner.this
        if isinstance(inner, exp.Select) and not any(
            inner.args.get(k) for k in ("order", "limit", "offset")
        ):
            node.set(key, inner)
        else:
            n = len(list(node.find_all(exp.Subquery)))
            node.set(key, exp.select("*").from_(
                exp.Subquery(this=inner, alias=exp.TableAlias(
                    this=exp.to_identifier(f"__sg_u{n}_{key}")))))


def _target(node: exp.Delete) -> exp.Table:
    """The one table a multi-table DELETE deletes from, as named in its FROM."""
    targets = node.args.get("tables") or []
    if len(targets) > 1:
        raise Unsupported("DELETE from several tables at once (DELETE a, b FROM ...) is not "
                          "supported on SQLite or PostgreSQL shards: one DELETE per table")
    first = node.this
    assert isinstance(first, exp.Table)
    tables = [first, *(j.this for j in first.args.get("joins") or [])]
    if not targets:
        return first
    name = targets[0].name.lower()
    for t in tables:
        if isinstance(t, exp.Table) and (t.alias_or_name.lower() == name):
            return t
    raise Unsupported(f"DELETE {targets[0].sql(dialect='mysql')}: not a table of its FROM")


def _delete_by_rowid(node: exp.Delete, rowid: str) -> exp.Expr:
    """``DELETE t FROM <tables> WHERE w`` (or ``DELETE FROM t USING <tables> WHERE w``):
    the rows of ``t`` the join selects, by address."""
    using = list(node.args.get("using") or [])
    if using:
        if node.args.get("tables"):
            raise Unsupported("DELETE from several tables at once (DELETE FROM a, b USING "
                              "...) is not supported on SQLite or PostgreSQL shards")
        name = node.this.name.lower()
        refs = [t for u in using for t in (u, *(j.this for j in u.args.get("joins") or []))]
        found = [t for t in refs if isinstance(t, exp.Table) and t.alias_or_name.lower() == name]
        if len(found) != 1:
            raise Unsupported(f"DELETE FROM {node.this.sql(dialect='mysql')} USING ...: the "
                              "table must be named once in USING")
        target: exp.Table = found[0]
        source = using[0].copy()
        rest = [exp.Join(this=u.copy()) for u in using[1:]]
    else:
        target = _target(node)
        source = node.this.copy()
        rest = []
    pick = exp.Select(expressions=[exp.column(rowid, table=target.alias_or_name)]).from_(source)
    for j in rest:
        pick = pick.join(j)
    for arg in ("where", "order", "limit"):
        if node.args.get(arg) is not None:
            if arg != "where":
                raise Unsupported("a multi-table DELETE with ORDER BY or LIMIT is not valid "
                                  "MySQL")
            pick.set(arg, node.args[arg])
    bare = exp.Table(this=target.this.copy(), db=target.args.get("db"))
    where = exp.Where(this=exp.In(this=exp.column(rowid), query=exp.Subquery(this=pick)))
    return exp.Delete(this=bare, where=where)


def _update_from(node: exp.Update, dialect: str) -> exp.Expr:
    """``UPDATE t JOIN u ON c SET t.x = e WHERE w`` as ``UPDATE t SET x = e FROM u WHERE
    c AND w`` (SQLite 3.33+, PostgreSQL)."""
    table = node.this
    names = {table.alias_or_name.lower(), table.name.lower()}
    joins = list(table.args.get("joins") or [])
    for j in joins:
        if j.side or (j.kind and str(j.kind).upper() not in ("INNER", "CROSS")) or \
                j.args.get("using"):
            raise Unsupported(
                f"UPDATE with {j.side or j.kind} JOIN ... USING/ON cannot run on a {dialect} "
                "shard: write the update with inner joins, or with a subquery"
            )
    sets = []
    for a in node.expressions:
        col = a.this if isinstance(a, exp.EQ) else None
        if not isinstance(col, exp.Column) or (col.table and col.table.lower() not in names):
            raise Unsupported(
                f"a multi-table UPDATE setting {a.this.sql(dialect='mysql')} cannot run on "
                f"a {dialect} shard: it may set only the first table's columns"
            )
        sets.append(exp.EQ(this=exp.column(col.name, quoted=col.this.quoted),
                           expression=a.expression))
    first = joins[0].this.copy()
    rest = [j.copy() for j in joins[1:]]
    if rest:
        first.set("joins", rest)
    terms = [j.args["on"] for j in joins[:1] if j.args.get("on") is not None]
    if node.args.get("where") is not None:
        terms.append(node.args["where"].this)
    bare = table.copy()
    bare.set("joins", None)
    out = exp.Update(this=bare, expressions=sets, from_=exp.From(this=first))
    if terms:
        out.set("where", exp.Where(this=exp.and_(*terms)))
    if node.args.get("order") is not None or node.args.get("limit") is not None:
        raise Unsupported("a multi-table UPDATE with ORDER BY or LIMIT is not valid MySQL")
    return out


def _on_conflict(node: exp.OnConflict) -> exp.Expr:
    """MySQL's upsert as SQLite's (no conflict target: any unique constraint)."""

    def excluded(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Anonymous) and str(n.this).upper() == "VALUES" and \
                len(n.expressions) == 1:
            return exp.column(n.expressions[0].name, table="excluded")
        return n

    sets = [exp.EQ(this=exp.column(a.this.name), expression=a.expression.transform(excluded))
            for a in node.expressions]
    return exp.OnConflict(duplicate=False, expressions=sets, action=exp.var("DO UPDATE"))
