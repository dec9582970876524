"""Nested query forms of issue 32 the gate answers at the gate (Vitess answers them too).

* correlated ``[NOT] EXISTS`` / ``[NOT] IN`` subqueries not tied to the outer
  rows' shard by the primary vindex (semi- and anti-joins), also correlated by
  inequalities, and scalar subqueries correlated to each outer row;
* derived tables containing joins (filtered, grouped, sorted, joined again);
* ``(SELECT ... ORDER BY x LIMIT n) ORDER BY y LIMIT m`` and UNION arms with their
  own ORDER BY / LIMIT.

SQLite parses no parenthesized statement, and PostgreSQL refuses ``(SELECT ...
ORDER BY x LIMIT n) ORDER BY y`` (the gate's SQL is MySQL's, which takes it):
there the reference gets each ``(SELECT ...)`` marked with :data:`PAREN` as
``SELECT * FROM (SELECT ...) AS p``, which has the same rows (:func:`render_parens`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queries import Gen

NESTED_CONSTRUCTS: dict[str, str] = {
    "correlated_exists": "[NOT] EXISTS correlated on non-vindex columns: a semi-join at the gate "
                         "(issue 32)",
    "correlated_in": "x [NOT] IN (SELECT ... correlated) with NULLs: a semi/anti-join (issue 32)",
    "correlated_per_row": "subqueries correlated by inequalities, or aggregating (scalar), "
                          "run per outer row (issue 32)",
    "derived_join": "derived tables containing joins (issue 32)",
    "paren_order_limit": "(SELECT ... ORDER BY LIMIT) ORDER BY ... LIMIT (issue 32)",
    "union_arm_order_limit": "UNION arms with their own ORDER BY / LIMIT (issue 32)",
}

#: an opening and closing parenthesis around a statement (see the module doc)
PAREN = ("\x10", "\x11")


def render_parens(sql: str, plain: str, kind: str) -> tuple[str, str]:
    """The gate's and the reference's text of the marked parentheses."""
    start, end = PAREN
    sql = sql.replace(start, "(").replace(end, ")")
    if kind in ("sqlite", "postgres"):  # PostgreSQL: "multiple ORDER BY clauses not allowed"
        plain = plain.replace(start, "SELECT * FROM (").replace(end, ") AS p")
    else:
        plain = plain.replace(start, "(").replace(end, ")")
    return sql, plain


def q_nested(g: Gen) -> tuple[str, bool]:
    """One query of a nested form."""
    form = g.choose([
        ("correlated_exists", lambda: "exists"), ("correlated_in", lambda: "in"),
        ("correlated_per_row", lambda: "per_row"), ("derived_join", lambda: "derived"),
        ("paren_order_limit", lambda: "paren"), ("union_arm_order_limit", lambda: "union"),
    ])
    if form == "derived":
        return _derived_join(g)
    if form == "paren":
        return _paren(g)
    if form == "union":
        return _union(g)
    return _correlated(g, form)


def _correlated(g: Gen, form: str) -> tuple[str, bool]:
    r = g.rng
    inner_pred = f" AND {g.predicate(g.columns('t2', 'b'))}" if r.random() < 0.4 else ""
    colocated = r.random() < 0.25  # the outer query a co-located join of t1 with itself
    o = "a" if colocated else "t1"
    if form == "exists":
        corr = r.choice((f"b.n = {o}.n", f"b.email = {o}.s", f"b.id = {o}.n",
                         f"b.n = {o}.n AND b.id = {o}.id"))
        cond = f"{r.choice(('', 'NOT '))}EXISTS (SELECT 1 FROM t2 b WHERE {corr}{inner_pred})"
    elif form == "in":
        needle = r.choice((f"{o}.n", f"{o}.id"))
        value = r.choice(("b.n", "b.id", "b.k"))
        corr = r.choice((f"b.n = {o}.n", f"b.id = {o}.n", f"b.email = {o}.tag"))
        neg = r.choice(("", "NOT "))
        cond = f"{needle} {neg}IN (SELECT {value} FROM t2 b WHERE {corr}{inner_pred})"
        if neg and r.random() < 0.5:
            cond = f"NOT ({needle} IN (SELECT {value} FROM t2 b WHERE {corr}{inner_pred}))"
    else:
        cond = r.choice((
            f"EXISTS (SELECT 1 FROM t2 b WHERE b.n < {o}.n AND b.id > {o}.id % 7{inner_pred})",
            f"NOT EXISTS (SELECT 1 FROM t2 b WHERE b.k > {o}.n{inner_pred})",
            f"{o}.n > (SELECT COUNT(*) FROM t2 b WHERE b.n = {o}.n{inner_pred})",
            f"{o}.id IN (SELECT b.id FROM t2 b WHERE b.n <= {o}.n{inner_pred})",
        ))
    src = "t1 a JOIN t1 b2 ON a.id = b2.id" if colocated else "t1"
    cols = g.columns("t1", "a") if colocated else g.columns("t1")
    if r.random() < 0.5:
        cond = f"{cond} {r.choice(('AND', 'OR'))} {g.predicate(cols)}"
    where = f" WHERE {cond}"
    if colocated:
        shown = "a.id, a.n, b2.s"
    else:
        shown = ", ".join(c.sql() for c in r.sample(cols, r.randrange(1, 4)))
    shape = r.randrange(4)
    if shape == 0:
        return f"SELECT COUNT(*), MAX({o}.n) FROM {src}{where}", False
    if shape == 1:
        value = (f"(SELECT MAX(b.id) FROM t2 b WHERE b.n = {o}.n) AS m" if r.random() < 0.5
                 else f"EXISTS (SELECT 1 FROM t2 b WHERE b.n = {o}.n) AS e")
        g.used.add("correlated_per_row" if "MAX" in value else "correlated_exists")
        return f"SELECT {o}.id, {value} FROM {src}{where}", False
    if shape == 2:
        g.used.add("limit")
        return (f"SELECT {o}.id, {o}.n FROM {src}{where} ORDER BY {o}.n{g.direction()}, "
                f"{o}.id{g.direction()} LIMIT {r.randrange(0, 8)}"), True
    return f"SELECT {shown} FROM {src}{where}", False


def _derived_join(g: Gen) -> tuple[str, bool]:
    r = g.rng
    jk = "LEFT JOIN" if g.on("join_left", 0.4) else "JOIN"
    on = r.choice(("a.n = b.n", "a.id = b.k", "a.s = b.email", "a.n = b.id"))
    where = f" WHERE {g.predicate(g.columns('t1', 'a'))}" if r.random() < 0.5 else ""
    inner = (f"SELECT a.id AS x, b.id AS y, a.n AS an, b.k AS bk FROM t1 a {jk} t2 b ON {on}"
             f"{where}")
    shape = r.randrange(4)
    if shape == 0:
        outer_where = f" WHERE d.an > {r.randrange(-2, 6)}" if r.random() < 0.5 else ""
        return f"SELECT d.x, d.y, d.bk FROM ({inner}) AS d{outer_where}", False
    if shape == 1:
        g.used.add("aggregate")
        return f"SELECT d.an, COUNT(*), MAX(d.y) FROM ({inner}) AS d GROUP BY d.an", False
    if shape == 2:
        tail = f" LIMIT {r.randrange(0, 10)}" if g.on("limit", 0.5) else ""
        return (f"SELECT d.x, d.y FROM ({inner}) AS d ORDER BY d.x{g.direction()}, "
                f"d.y{g.direction()}{tail}"), True
    return (f"SELECT d.x, d.y, c.label FROM ({inner}) AS d JOIN t3 c ON d.an = c.id"), False


def _paren(g: Gen) -> tuple[str, bool]:
    r = g.rng
    start, end = PAREN
    t = r.choice(("t1", "t2"))
    where = g.where(g.columns(t), 0.4)
    inner = (f"SELECT id, n FROM {t}{where} ORDER BY n{g.direction()}, id{g.direction()} "
             f"LIMIT {r.randrange(0, 10)}")
    if r.random() < 0.3:
        inner += f" OFFSET {r.randrange(0, 3)}"
    tail = f" ORDER BY id{g.direction()}"
    if g.on("limit", 0.5):
        tail += f" LIMIT {r.randrange(0, 6)}"
    return f"{start}{inner}{end}{tail}", True


def _union(g: Gen) -> tuple[str, bool]:
    r = g.rng
    start, end = PAREN

    def arm(t: str) -> str:
        where = g.where(g.columns(t), 0.4)
        if r.random() < 0.25:
            return f"SELECT id, n FROM {t}{where}"  # an arm without parentheses
        return (f"{start}SELECT id, n FROM {t}{where} ORDER BY n{g.direction()}, "
                f"id{g.direction()} LIMIT {r.randrange(0, 6)}{end}")

    op = r.choice(("UNION", "UNION ALL"))
    sql = f"{arm('t1')} {op} {arm(r.choice(('t1', 't2')))}"
    if r.random() < 0.3:
        sql += f" {op} {arm('t2')}"
    if r.random() < 0.5:
        tail = f" ORDER BY id{g.direction()}, n{g.direction()}"
        if g.on("limit", 0.5):
            tail += f" LIMIT {r.randrange(0, 8)}"
        return sql + tail, True
    return sql, False
