"""Random writes on t1/t2, each in gate SQL and in the reference engine's SQL.

The gate speaks MySQL-flavoured SQL; the reference database gets the same
statement in its own dialect where they differ: ``INSERT IGNORE`` is
``INSERT OR IGNORE`` on SQLite and ``... ON CONFLICT DO NOTHING`` on
PostgreSQL; ``ON DUPLICATE KEY UPDATE c = VALUES(c)`` is ``ON CONFLICT (id)
DO UPDATE SET c = excluded.c``; ``REPLACE`` exists on SQLite and MariaDB only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .queries import Generator
from .schema import COLUMNS, EMAILS, FLOATS, TAGS, WORDS, any_id, any_k, any_n, literal, maybe

#: every write construct, with what it covers (issue 13 item)
DML_CONSTRUCTS: dict[str, str] = {
    "insert": "single-row INSERT",
    "insert_multi": "multi-row INSERT (rows on several shards)",
    "insert_literal_type": "vindex value given as '03' / 5.0 text (item 1)",
    "insert_duplicate_column": "INSERT naming one column twice (item 2)",
    "insert_ignore": "INSERT IGNORE (item 3)",
    "insert_odku": "INSERT ... ON DUPLICATE KEY UPDATE (items 3, 17)",
    "replace": "REPLACE (item 3; SQLite and MariaDB)",
    "insert_subquery": "subquery in VALUES (item 6)",
    "update_by_vindex": "UPDATE ... WHERE primary vindex = / IN",
    "update_by_lookup": "UPDATE ... WHERE lookup column = ",
    "update_lookup_is_null": "UPDATE ... WHERE lookup column IS NULL (item 4)",
    "update_lookup_column": "UPDATE SET of a lookup column",
    "update_scatter": "UPDATE ... WHERE non-vindex column",
    "update_vindex_column": "UPDATE SET of the primary vindex column (the row must move "
                            "or the write be refused)",
    "update_vindex_literal_type": "UPDATE ... WHERE id = 5.0 (item 1)",
    "delete_by_vindex": "DELETE ... WHERE primary vindex = / IN",
    "delete_by_lookup": "DELETE ... WHERE lookup column =",
    "delete_lookup_is_null": "DELETE ... WHERE lookup column IS NULL (item 4)",
    "delete_scatter": "DELETE ... WHERE non-vindex column",
    "delete_limit": "DELETE ... ORDER BY id LIMIT n (item 12; the engine may reject it)",
    "rollback": "the write inside BEGIN ... ROLLBACK: nothing may change, lookups included",
    "transaction": "2-3 writes in one BEGIN ... COMMIT (rolled back on both sides at the "
                   "first write either side does not apply)",
}


@dataclass
class Write:
    """One generated write."""

    sql: str
    plain_sql: str
    constructs: frozenset[str]
    #: run inside BEGIN ... ROLLBACK on both sides: nothing may change
    rollback: bool = False


@dataclass
class DmlGen(Generator):
    """A write generator."""

    #: id -> k of the t2 rows the reference holds now (kept current by the harness).
    #: t2's primary key ``id`` is not its vindex column, so an id reused with another
    #: ``k`` would land on another shard where no constraint can see it (as in
    #: Vitess); the generator reuses an id only with its own ``k`` (a real duplicate)
    t2_keys: dict[int, int] = field(default_factory=dict)
    fresh: int = 1000

    def _t2_id(self) -> tuple[int, int]:
        if self.t2_keys and self.rng.random() < 0.2:
            i = self.rng.choice(sorted(self.t2_keys))
            return i, self.t2_keys[i]
        self.fresh += 1
        return self.fresh, any_k(self.rng)

    def _row(self, table: str) -> dict[str, Any]:
        r = self.rng
        if table == "t1":
            return {"id": any_id(r), "n": any_n(r), "s": maybe(r, WORDS),
                    "f": maybe(r, FLOATS), "tag": maybe(r, TAGS, 0.25)}
        i, k = self._t2_id()
        return {"id": i, "k": k, "email": maybe(r, EMAILS, 0.3), "n": any_n(r)}

    def _values(self, table: str, rows: list[dict[str, Any]]) -> str:
        return ", ".join("(" + ", ".join(literal(row[c]) for c in COLUMNS[table]) + ")"
                         for row in rows)

    def generate(self, alone: bool = True) -> Write:
        """One random write; its constructs are those it used. Only a write run
        ``alone`` (not inside a generated transaction) may be a rolled-back one."""
        self.used = set()
        options: list[tuple[str, Callable[[], tuple[str, str]]]] = [
            ("insert", self.insert), ("insert", self.insert), ("insert_multi", self.insert),
            ("insert_multi", self.insert), ("insert_literal_type", self.insert_literal),
            ("insert_duplicate_column", self.insert_dup_column),
            ("insert_ignore", self.insert_ignore), ("insert_odku", self.insert_odku),
            ("insert_subquery", self.insert_subquery),
            ("update_by_vindex", self.update), ("update_by_lookup", self.update),
            ("update_lookup_is_null", self.update), ("update_lookup_column", self.update),
            ("update_scatter", self.update), ("update_vindex_literal_type", self.update),
            ("delete_by_vindex", self.delete), ("delete_by_lookup", self.delete),
            ("delete_lookup_is_null", self.delete), ("delete_scatter", self.delete),
            ("delete_limit", self.delete_limit),
            ("update_vindex_column", self.update_vindex_column),
        ]
        if self.kind != "postgres":
            options.append(("replace", self.replace))
        live = [o for o in options if o[0] not in self.disabled]
        name, build = self.rng.choice(live)
        self.used.add(name)
        sql, plain = build()
        rollback = alone and "rollback" not in self.disabled and self.rng.random() < 0.1
        if rollback:
            self.used.add("rollback")
        return Write(sql, plain, frozenset(self.used), rollback)

    # -------------------------------------------------------------- inserts --

    def insert(self) -> tuple[str, str]:
        t = self.rng.choice(("t1", "t2"))
        n = self.rng.randrange(2, 5) if "insert_multi" in self.used else 1
        sql = (f"INSERT INTO {t} ({', '.join(COLUMNS[t])}) "
               f"VALUES {self._values(t, [self._row(t) for _ in range(n)])}")
        return sql, sql

    def insert_literal(self) -> tuple[str, str]:
        r = self.rng
        if r.random() < 0.5:
            row = self._row("t2")
            self.fresh += 1
            row["id"] = self.fresh
            k = r.randrange(0, 20)
            text = r.choice((f"'0{k}'", f"'{k}'", f"{k}.0"))
            sql = (f"INSERT INTO t2 (id, k, email, n) VALUES ({row['id']}, {text}, "
                   f"{literal(row['email'])}, {literal(row['n'])})")
        else:
            row = self._row("t1")
            i = r.randrange(0, 60)
            sql = (f"INSERT INTO t1 (id, n, tag) VALUES ({r.choice((f'{i}.0', repr(str(i))))}, "
                   f"{literal(row['n'])}, {literal(row['tag'])})")
        return sql, sql

    def insert_dup_column(self) -> tuple[str, str]:
        a, b = any_id(self.rng), any_id(self.rng)
        sql = f"INSERT INTO t1 (id, id) VALUES ({a}, {b})"
        return sql, sql

    def insert_ignore(self) -> tuple[str, str]:
        t = self.rng.choice(("t1", "t2"))
        rows = [self._row(t) for _ in range(self.rng.randrange(1, 3))]
        body = f"INTO {t} ({', '.join(COLUMNS[t])}) VALUES {self._values(t, rows)}"
        plain = {"sqlite": f"INSERT OR IGNORE {body}",
                 "postgres": f"INSERT {body} ON CONFLICT DO NOTHING"}.get(
            self.kind, f"INSERT IGNORE {body}")
        return f"INSERT IGNORE {body}", plain

    def insert_odku(self) -> tuple[str, str]:
        row = self._row("t1")
        body = f"INSERT INTO t1 ({', '.join(COLUMNS['t1'])}) VALUES {self._values('t1', [row])}"
        cols = self.rng.sample(["n", "s", "tag"], self.rng.randrange(1, 3))
        gate = body + " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in cols)
        plain = gate if self.kind == "mysql" else (
            body + " ON CONFLICT (id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in cols))
        return gate, plain

    def replace(self) -> tuple[str, str]:
        t = self.rng.choice(("t1", "t2"))
        sql = (f"REPLACE INTO {t} ({', '.join(COLUMNS[t])}) "
               f"VALUES {self._values(t, [self._row(t)])}")
        return sql, sql

    def insert_subquery(self) -> tuple[str, str]:
        i = any_id(self.rng)
        tag = literal(maybe(self.rng, TAGS, 0.3))
        sql = (f"INSERT INTO t1 (id, n, s, f, tag) VALUES "
               f"({i}, (SELECT COUNT(*) FROM t2), NULL, NULL, {tag})")
        return sql, sql

    # ------------------------------------------------------ updates, deletes --

    def _where(self, t: str) -> str:
        r = self.rng
        vcol = "id" if t == "t1" else "k"
        lcol = "tag" if t == "t1" else "email"
        if "update_by_vindex" in self.used or "delete_by_vindex" in self.used:
            vals = [str(any_id(r) if t == "t1" else any_k(r)) for _ in range(r.randrange(1, 4))]
            return f"{vcol} = {vals[0]}" if len(vals) == 1 else f"{vcol} IN ({', '.join(vals)})"
        if "update_vindex_literal_type" in self.used:
            return f"{vcol} = {r.randrange(0, 20)}.0"
        if "update_by_lookup" in self.used or "delete_by_lookup" in self.used:
            return f"{lcol} = {literal(r.choice(TAGS if t == 't1' else EMAILS))}"
        if "update_lookup_is_null" in self.used or "delete_lookup_is_null" in self.used:
            return f"{lcol} IS NULL"
        return r.choice((f"n > {r.randrange(0, 10)}", "n IS NULL", f"id < {r.randrange(0, 40)}"))

    def update(self) -> tuple[str, str]:
        r = self.rng
        t = r.choice(("t1", "t2"))
        if "update_lookup_column" in self.used:
            lcol = "tag" if t == "t1" else "email"
            value = maybe(r, TAGS if t == "t1" else EMAILS, 0.3)
            where = f"id = {any_id(r) if r.random() < 0.5 else r.randrange(1, 300)}"
            sql = f"UPDATE {t} SET {lcol} = {literal(value)} WHERE {where}"
        else:
            sets = r.choice(("n = n + 1", f"n = {literal(any_n(r))}",
                             f"n = {literal(any_n(r))}, {'s' if t == 't1' else 'email'} = NULL"))
            if t == "t2" and "email" in sets:
                sets = f"n = {literal(any_n(r))}"
            sql = f"UPDATE {t} SET {sets} WHERE {self._where(t)}"
        return sql, sql

    def delete(self) -> tuple[str, str]:
        t = self.rng.choice(("t1", "t2"))
        sql = f"DELETE FROM {t} WHERE {self._where(t)}"
        return sql, sql

    def delete_limit(self) -> tuple[str, str]:
        t = self.rng.choice(("t1", "t2"))
        sql = f"DELETE FROM {t} WHERE n > {self.rng.randrange(-3, 8)} ORDER BY id LIMIT 2"
        return sql, sql

    def update_vindex_column(self) -> tuple[str, str]:
        if self.rng.random() < 0.5:
            sql = f"UPDATE t1 SET id = {any_id(self.rng)} WHERE id = {any_id(self.rng)}"
        else:
            sql = f"UPDATE t2 SET k = {any_k(self.rng)} WHERE n = {self.rng.randrange(-3, 11)}"
        return sql, sql
