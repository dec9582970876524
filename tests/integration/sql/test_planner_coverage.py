"""End to end: each construct of the Vitess planner coverage (issue 13, item 17)
answers on 4 shards exactly as one database holding all rows (SQLite,
PostgreSQL and MariaDB).

It reuses the differential harness (``sharded`` and ``single`` keyspaces on the
same rows) with a fixed data set holding NULLs, duplicates and negative values,
and hand-written queries, one or more per construct: routing that is right but
merged wrong would show here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import Code, ShardgateError

from .test_differential import Dataset, Harness, normalised, open_harness

CUSTOMER = (
    (1, 1, 5, "ann"), (2, 1, -3, "bob"), (3, 2, 5, None), (4, None, 0, "cy"),
    (5, 2, 12, "ann"), (6, 3, None, "dee"), (7, 1, 7, "ed"), (8, -1, -20, "bob"),
    (9, 2, 5, "cy"), (10, 4, 20, "ann"), (-2, 1, 3, "ed"), (-5, None, 8, None),
)
ORDERS = (
    (1, 1, 5, "new"), (2, 1, 7, "paid"), (3, 2, -3, "sent"), (4, 3, None, "void"),
    (5, 3, 5, "paid"), (6, 5, 12, "new"), (7, 7, 20, None), (8, 7, 1, "paid"),
    (9, 9, 5, "sent"), (10, 30, 8, "new"), (11, -2, 3, "void"), (12, 10, 0, "paid"),
)
REGIONS = ((1, "east"), (2, "north"), (3, "south"), (-1, "west"))
DATA = Dataset(customer=CUSTOMER, orders=ORDERS, regions=REGIONS)


@dataclass(frozen=True)
class Query:
    """A hand-written query; ``ordered`` when its ORDER BY is total."""

    text: str
    ordered: bool = False
    #: the backends whose plain database accepts the query
    backends: frozenset[str] = frozenset({"sqlite", "postgres", "mysql"})

    def sql(self) -> str:
        return self.text


#: PostgreSQL refuses comparing an integer with 'aa'
NOT_PG = frozenset({"sqlite", "mysql"})

#: construct -> queries that exercise it
QUERIES: dict[str, list[Query]] = {
    "constant folding": [
        Query("SELECT id, name FROM customer WHERE id = 3 + 4"),
        Query("SELECT id FROM customer WHERE id IN (2 * 2, 10 - 1, -(2))"),
    ],
    "always-false predicates": [
        Query("SELECT id FROM customer WHERE region = NULL"),
        Query("SELECT COUNT(*) AS n FROM customer WHERE 1 IN ('aa', 'bb')", backends=NOT_PG),
        Query("SELECT id FROM customer WHERE id NOT IN (NULL, 1, 2)"),
        Query("SELECT id FROM orders WHERE customer_id = 3 AND id IN (NULL)"),
    ],
    "OR/AND mixes on vindex columns": [
        Query("SELECT id, name FROM customer WHERE id = 1 OR name = 'ann' AND id IN (1, 2, 5)"),
        Query("SELECT id FROM customer WHERE (id = 1 AND score = 5) OR (id = 3 AND score = 5)"),
        Query("SELECT id FROM customer WHERE (id = 1 OR id = 2) AND (score = -3 OR id = 1)"),
    ],
    "tuple IN on a vindex column (MultiEqual)": [
        Query("SELECT id FROM customer WHERE (id, name) IN ((1, 'ann'), (2, 'bob'), (3, 'zz'))"),
        Query("SELECT customer_id, id FROM orders WHERE (status, customer_id) IN "
              "(('paid', 1), ('paid', 3), ('new', 5))"),
    ],
    "dual": [
        Query("SELECT 1 + 1 FROM dual"),
        # only MariaDB has a dual table to join with
        Query("SELECT 42, id FROM dual, customer", backends=frozenset({"mysql"})),
    ],
    "same-shard UNION and parenthesized ORDER BY/LIMIT": [
        Query("SELECT id, name FROM customer WHERE id = 3 "
              "UNION SELECT customer_id, status FROM orders WHERE customer_id = 3"),
        Query("SELECT id FROM customer UNION ALL SELECT customer_id FROM orders"),
        Query("SELECT region FROM customer UNION SELECT amount FROM orders"),
        Query("SELECT id, name FROM customer WHERE id = 1 UNION ALL "
              "SELECT id, name FROM customer WHERE id = 5"),
        # a join inside a UNION part may match rows of two shards: parts planned apart
        Query("SELECT c.id FROM customer c JOIN orders o ON c.score = o.amount "
              "UNION SELECT id FROM regions"),
        Query("(SELECT id, score FROM customer) ORDER BY score DESC, id LIMIT 3", ordered=True),
        Query("(SELECT id, score FROM customer WHERE id = 5) ORDER BY id LIMIT 1", ordered=True),
        # ORDER BY / LIMIT over a UNION across shards: finished at the gate
        Query("SELECT id FROM customer UNION SELECT customer_id FROM orders "
              "ORDER BY id DESC LIMIT 5", ordered=True),
        # SQLite takes no parenthesized UNION parts (the shards get them flattened)
        Query("(SELECT id FROM customer) UNION ALL (SELECT customer_id FROM orders) "
              "ORDER BY id DESC LIMIT 5", ordered=True,
              backends=frozenset({"postgres", "mysql"})),
        Query("SELECT id FROM customer UNION ALL SELECT customer_id FROM orders "
              "ORDER BY 1 LIMIT 7 OFFSET 2", ordered=True),
    ],
    "derived tables": [
        Query("SELECT t.id, t.score FROM (SELECT id, score FROM customer WHERE score > 0) AS t "
              "ORDER BY t.id LIMIT 4", ordered=True),
        Query("SELECT COUNT(*) AS n, SUM(t.score) AS s FROM "
              "(SELECT id, score FROM customer WHERE region = 1) AS t"),
        Query("SELECT t.id FROM (SELECT id FROM customer WHERE id = 7) AS t"),
        # derived tables joined like their table: pinned, co-located, at the gate
        Query("SELECT t.id, o.id FROM (SELECT id FROM customer WHERE id = 7) AS t "
              "JOIN orders o ON t.id = o.customer_id"),
        Query("SELECT t.id, o.id FROM (SELECT id, region FROM customer WHERE region = 1) AS t "
              "JOIN orders o ON t.id = o.customer_id"),
        Query("SELECT t.id, o.id FROM (SELECT id, score FROM customer WHERE score > 0) AS t "
              "JOIN orders o ON t.score = o.amount"),
        # derived tables the gate finishes: aggregating, sorted with LIMIT, nested
        Query("SELECT t.n FROM (SELECT COUNT(*) AS n FROM customer) AS t"),
        Query("SELECT t.r, COUNT(*) AS k FROM (SELECT region AS r, id FROM customer "
              "ORDER BY id LIMIT 6) AS t GROUP BY t.r"),
        Query("SELECT id FROM (SELECT id FROM (SELECT id FROM customer) AS u) AS t "
              "WHERE id = 5"),
        Query("SELECT * FROM (SELECT region, COUNT(*) AS n FROM customer GROUP BY region) AS t "
              "WHERE t.n > 1 ORDER BY t.region", ordered=True),
        # a LEFT JOIN whose ON names only the optional side: a cross join, NULLs if empty
        Query("SELECT c.id, o.id FROM customer c LEFT JOIN orders o ON o.amount > 10"),
        Query("SELECT c.id, o.id FROM customer c LEFT JOIN orders o ON 1 = 0"),
        # any other derived table joined at the gate: planned on its own, matched by key
        Query("SELECT c.id, t.n FROM customer c JOIN (SELECT region, COUNT(*) AS n "
              "FROM customer GROUP BY region) AS t ON c.region = t.region"),
        Query("SELECT t.region, o.id FROM (SELECT region, MAX(id) AS m FROM customer "
              "GROUP BY region) AS t JOIN orders o ON t.m = o.customer_id"),
        Query("SELECT c.id, t.* FROM customer c JOIN (SELECT region, COUNT(*) AS n "
              "FROM customer GROUP BY region) AS t ON c.region = t.region"),
        Query("SELECT c.id, t.n FROM customer c LEFT JOIN (SELECT region, COUNT(*) AS n "
              "FROM customer WHERE score > 0 GROUP BY region) AS t ON c.region = t.region"),
    ],
    "semi-joins and correlated subqueries merged on the vindex": [
        Query("SELECT c.id FROM customer c WHERE EXISTS "
              "(SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.amount > 0)"),
        Query("SELECT c.id FROM customer c WHERE NOT EXISTS "
              "(SELECT 1 FROM orders o WHERE o.customer_id = c.id)"),
        Query("SELECT c.id FROM customer c WHERE c.score IN "
              "(SELECT o.amount FROM orders o WHERE o.customer_id = c.id)"),
        Query("SELECT c.id, (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id) "
              "FROM customer c"),
        Query("SELECT c.id FROM customer c WHERE c.id = 3 AND EXISTS "
              "(SELECT 1 FROM orders o WHERE o.customer_id = 3 AND o.status = 'paid')"),
        # a correlated subquery on one side of a gate-side join goes with that side
        Query("SELECT c.id, o.id FROM orders o JOIN customer c ON o.amount = c.score "
              "WHERE EXISTS (SELECT 1 FROM orders o2 WHERE o2.customer_id = c.id "
              "AND o2.status = 'paid')"),
        Query("SELECT c.id, o.id FROM customer c JOIN orders o ON c.score = o.amount "
              "WHERE c.id IN (SELECT o2.customer_id FROM orders o2 WHERE o2.customer_id = c.id "
              "AND o2.amount > 4)"),
    ],
    "scalar and EXISTS pull-outs": [
        Query("SELECT id FROM customer WHERE score = (SELECT MAX(score) FROM customer)"),
        Query("SELECT id FROM customer WHERE id = (SELECT MIN(customer_id) FROM orders)"),
        Query("SELECT id FROM customer WHERE EXISTS (SELECT 1 FROM orders WHERE amount > 15)"),
        Query("SELECT id FROM customer WHERE NOT EXISTS "
              "(SELECT 1 FROM orders WHERE amount > 1000)"),
        Query("SELECT id, (SELECT COUNT(*) FROM orders) AS n FROM customer WHERE region = 2"),
        Query("SELECT id FROM customer WHERE EXISTS (SELECT 1 FROM orders LIMIT 0)"),
        Query("SELECT id FROM customer WHERE score = (SELECT score FROM customer WHERE id = 99)"),
    ],
    "cross joins and joins with the equality in WHERE": [
        Query("SELECT c.id, o.id FROM customer c, orders o "
              "WHERE c.region = 1 AND o.status = 'paid'"),
        Query("SELECT c.id, o.id FROM customer c JOIN orders o ON c.score < o.amount"),
        Query("SELECT c.id, o.id FROM customer c JOIN orders o WHERE c.score = o.amount"),
        Query("SELECT COUNT(*) AS n FROM customer c, orders o"),
        # a left-only ON term filters the left side (it once went to the right query)
        Query("SELECT c.id, o.id FROM customer c JOIN orders o ON c.score = o.amount "
              "AND c.region = 1"),
    ],
    "aggregates beside non-grouped columns and MIN(DISTINCT)": [
        Query("SELECT id, name, COUNT(*) AS n FROM customer GROUP BY id"),
        Query("SELECT region, MIN(DISTINCT score) AS lo, MAX(DISTINCT score) AS hi FROM customer "
              "GROUP BY region"),
        Query("SELECT DISTINCT COUNT(*) AS n FROM customer"),
    ],
}


@pytest.fixture
def harness(backend_kind: str, make_database: Callable[..., str]) -> Iterator[Harness]:
    h = open_harness(backend_kind, make_database)
    try:
        h.runner.run(h.load(DATA))
        yield h
    finally:
        try:
            h.runner.run(h.gate.close())
        finally:
            h.runner.close()


def test_each_construct_answers_like_one_database(harness: Harness, backend_kind: str) -> None:
    failures = []
    for construct, queries in QUERIES.items():
        for q in queries:
            if backend_kind not in q.backends:
                continue
            try:
                harness.runner.run(harness.check(q))  # type: ignore[arg-type]
            except (AssertionError, ShardgateError) as exc:
                failures.append(f"[{construct}] {exc}")
    assert not failures, "\n".join(failures)


def _rows(h: Harness, keyspace: str, sql: str) -> list[tuple[Any, ...]]:
    res = h.runner.run(h.gate.execute(h.sessions[keyspace], sql))
    return sorted(normalised(res.rows), key=repr)


def _both(h: Harness, sharded_sql: str, single_sql: str | None = None) -> None:
    for ks, sql in (("sharded", sharded_sql), ("single", single_sql or sharded_sql)):
        h.runner.run(h.gate.execute(h.sessions[ks], sql))


def _same_tables(h: Harness) -> None:
    for table in ("customer", "orders"):
        sql = f"SELECT * FROM {table}"
        got, want = _rows(h, "sharded", sql), _rows(h, "single", sql)
        assert got == want, f"{table}: sharded {got} != single {want}"


UPSERT = ("INSERT INTO orders (id, customer_id, amount, status) VALUES (1, 1, 9, 'dup'), "
          "(40, 7, 2, 'fresh') ON DUPLICATE KEY UPDATE amount = amount + 100, "
          "status = VALUES(status)")


def test_on_duplicate_key_update_on_a_sharded_table(harness: Harness, backend_kind: str) -> None:
    if backend_kind == "postgres":
        # PostgreSQL needs the conflicting key named: refused, and nothing written
        with pytest.raises(ShardgateError) as caught:
            harness.runner.run(harness.gate.execute(harness.sessions["sharded"], UPSERT))
        assert caught.value.code is Code.UNIMPLEMENTED
        assert _rows(harness, "sharded", "SELECT id FROM orders WHERE id = 40") == []
        return
    # SQLite spells the upsert ON CONFLICT: its plain database gets that spelling,
    # the gate the MySQL one, which it renders for the SQLite shards.
    single = UPSERT if backend_kind == "mysql" else (
        "INSERT INTO orders (id, customer_id, amount, status) VALUES (1, 1, 9, 'dup'), "
        "(40, 7, 2, 'fresh') ON CONFLICT DO UPDATE SET amount = amount + 100, "
        "status = excluded.status")
    _both(harness, UPSERT, single)
    _same_tables(harness)
    rows = _rows(harness, "sharded", "SELECT id, amount, status FROM orders WHERE id IN (1, 40)")
    assert rows == normalised([(1, 105, "dup"), (40, 2, "fresh")])


def test_aliased_single_table_delete_and_update(harness: Harness) -> None:
    _both(harness, "DELETE o FROM orders o WHERE o.customer_id = 3")
    _both(harness, "UPDATE orders o SET o.amount = o.amount * 2 WHERE o.customer_id IN (1, 7)")
    _both(harness, "DELETE c FROM customer AS c WHERE c.score < 0")
    _same_tables(harness)
    assert _rows(harness, "sharded", "SELECT id FROM orders WHERE customer_id = 3") == []


def test_multi_table_delete_and_update(harness: Harness, backend_kind: str) -> None:
    # MariaDB's plain database runs the multi-table statements as written; SQLite
    # and PostgreSQL have no such syntax, so theirs gets the EXISTS form.
    delete = ("DELETE o FROM orders o JOIN customer c ON o.customer_id = c.id "
              "WHERE c.score < 6 AND o.amount > 0")
    update = ("UPDATE orders o JOIN customer c ON o.customer_id = c.id "
              "SET o.status = 'vip', o.amount = o.amount + 1 WHERE c.name = 'ann'")
    mysql = backend_kind == "mysql"
    _both(harness, delete, delete if mysql else
          "DELETE FROM orders WHERE orders.amount > 0 AND EXISTS (SELECT 1 FROM customer c "
          "WHERE orders.customer_id = c.id AND c.score < 6)")
    _both(harness, update, update if mysql else
          "UPDATE orders SET status = 'vip', amount = amount + 1 WHERE EXISTS "
          "(SELECT 1 FROM customer c WHERE orders.customer_id = c.id AND c.name = 'ann')")
    _same_tables(harness)
    assert _rows(harness, "sharded", "SELECT id FROM orders WHERE status = 'vip'") != []
    assert _rows(harness, "sharded", "SELECT id FROM orders WHERE id IN (1, 2)") == []


def test_insert_with_default_values(harness: Harness) -> None:
    # SQLite has no DEFAULT keyword in VALUES: the gate leaves a column that is
    # DEFAULT in every row out; the single database gets the column list without it.
    _both(harness, "INSERT INTO orders (id, customer_id, amount, status) "
                   "VALUES (50, 5, DEFAULT, 'x')",
          "INSERT INTO orders (id, customer_id, status) VALUES (50, 5, 'x')")
    _same_tables(harness)
    assert _rows(harness, "sharded", "SELECT amount FROM orders WHERE id = 50") == [(None,)]


def test_shard_target_reads_each_targeted_shard(harness: Harness) -> None:
    per_shard = harness.runner.run(harness.gate.execute(
        harness.sessions["sharded"], "SELECT COUNT(*) FROM `sharded[-]`.customer"))
    assert len(per_shard.rows) == 4  # one count per shard, concatenated, as in Vitess
    assert sum(r[0] for r in per_shard.rows) == len(CUSTOMER)
    first_half = harness.runner.run(harness.gate.execute(
        harness.sessions["sharded"], "SELECT id FROM `sharded[-80]`.customer"))
    plan = harness.gate.plan("SELECT id FROM `sharded[-80]`.customer", "sharded")
    assert not isinstance(plan, str)
    route = plan.instructions
    assert isinstance(route, Route) and route.opcode is Opcode.BY_DESTINATION
    everything = {r[0] for r in _rows(harness, "single", "SELECT id FROM customer")}
    assert {r[0] for r in first_half.rows} < everything
