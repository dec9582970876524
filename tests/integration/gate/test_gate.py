"""The gate over real shards (SQLite files, PostgreSQL, MariaDB).

Placement is checked directly in each shard's database, with keyspace ids
computed here from DES (independently of the vindex code): every row sits on
the shard whose key range holds its keyspace id, and nowhere else.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from Crypto.Cipher import DES

from shardgate.auth.identity import TRUSTED
from shardgate.backends import open_backend
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.keys import parse_shard_name
from shardgate.topo import Topology

from ..conftest import Cluster

_DES = DES.new(b"\0" * 8, DES.MODE_ECB)


def vitess_hash(n: int) -> bytes:
    return _DES.encrypt(n.to_bytes(8, "big"))


async def shard_rows(c: Cluster, keyspace: str, sql: str) -> dict[str, list[tuple[Any, ...]]]:
    """Run ``sql`` directly on every shard database of ``keyspace``."""
    out = {}
    for name, url in c.shard_urls(keyspace).items():
        backend = open_backend(url)
        try:
            out[name] = (await backend.execute(sql)).rows
        finally:
            await backend.close()
    return out


async def test_rows_land_on_their_shard_only(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    # single-row inserts with bind variables, sequence-generated ids
    for i in range(20):
        r = await g.execute(
            s,
            "INSERT INTO customer (email, name) VALUES (:e, :n)",
            {"e": f"u{i}@x", "n": f"user {i}"},
        )
        assert r.rows_affected == 1
        assert r.insert_id is not None
    # one multi-row insert spanning shards, explicit ids
    values = ", ".join(f"({1000 + i}, 'm{i}@x', 'multi')" for i in range(30))
    r = await g.execute(s, f"INSERT INTO customer (customer_id, email, name) VALUES {values}")
    assert r.rows_affected == 30

    placed = await shard_rows(cluster, "commerce", "SELECT customer_id FROM customer")
    seen: dict[int, str] = {}
    for shard, rows in placed.items():
        kr = parse_shard_name(shard)
        for (cid,) in rows:
            assert kr.contains(vitess_hash(int(cid))), (cid, shard)
            assert cid not in seen, f"{cid} on {seen[cid]} and {shard}"
            seen[cid] = shard
    assert len(seen) == 50
    assert set(seen) >= set(range(1000, 1030))
    assert sum(1 for rows in placed.values() if rows) == 4  # the data spread over all shards

    # the owned lookup table holds exactly one row per customer, with its keyspace id
    lookup = await shard_rows(
        cluster, "lookup", "SELECT email, keyspace_id FROM customer_email_idx"
    )
    emails = {e: bytes(k) for e, k in lookup["0"]}
    assert len(emails) == 50
    by_email = await g.execute(s, "SELECT customer_id, email FROM customer")
    for cid, email in by_email.rows:
        assert emails[email] == vitess_hash(int(cid))


async def test_routing_reads(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    rows = [(i, f"e{i}@x", f"n{i % 7}") for i in range(1, 41)]
    for cid, email, name in rows:
        await g.execute(
            s,
            "INSERT INTO customer (customer_id, email, name) VALUES (:c, :e, :n)",
            {"c": cid, "e": email, "n": name},
        )
    r = await g.execute(
        s, "SELECT customer_id, email FROM customer WHERE customer_id = :id", {"id": 17}
    )
    assert r.rows == [(17, "e17@x")]
    assert r.fields == ["customer_id", "email"]
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE email = :e", {"e": "e23@x"})
    assert r.rows == [(23,)]
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE customer_id IN (3, 5, 999)")
    assert sorted(r.rows) == [(3,), (5,)]
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE customer_id = 999")
    assert r.rows == []
    r = await g.execute(
        s, "SELECT customer_id, name FROM customer ORDER BY customer_id DESC LIMIT 5 OFFSET 2"
    )
    assert [row[0] for row in r.rows] == [38, 37, 36, 35, 34]
    r = await g.execute(
        s, "SELECT customer_id FROM customer WHERE name = :n ORDER BY customer_id", {"n": "n3"}
    )
    assert [row[0] for row in r.rows] == [cid for cid, _, n in rows if n == "n3"]
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE customer_id = NULL")
    assert r.rows == [] and r.fields == ["customer_id"]
    # streaming a scatter gives every row exactly once
    got = []
    async for chunk in g.stream_execute(s, "SELECT customer_id FROM customer"):
        got.extend(row[0] for row in chunk.rows)
    assert sorted(got) == list(range(1, 41))


async def test_updates_and_deletes_route_by_vindex(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    for cid in range(1, 21):
        await g.execute(
            s,
            "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:o, :c, 'sku', 10)",
            {"o": cid * 10, "c": cid},
        )
    r = await g.execute(s, "UPDATE corder SET price = 99 WHERE customer_id = :c", {"c": 7})
    assert r.rows_affected == 1
    r = await g.execute(s, "UPDATE corder SET price = price + 1 WHERE price = 10")
    assert r.rows_affected == 19
    r = await g.execute(s, "DELETE FROM corder WHERE customer_id IN (1, 2, 3)")
    assert r.rows_affected == 3
    r = await g.execute(s, "SELECT customer_id, price FROM corder ORDER BY customer_id")
    assert r.rows == [(c, 99 if c == 7 else 11) for c in range(4, 21)]
    placed = await shard_rows(cluster, "commerce", "SELECT customer_id, price FROM corder")
    assert sorted(row for rows in placed.values() for row in rows) == r.rows


async def test_transactions(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    await g.execute(s, "BEGIN")
    for cid in (1, 2, 3, 4, 5, 6):
        await g.execute(
            s,
            "INSERT INTO corder (order_id, customer_id, price) VALUES (:o, :c, 1)",
            {"o": cid, "c": cid},
        )
    await g.execute(s, "ROLLBACK")
    assert (await g.execute(s, "SELECT order_id FROM corder")).rows == []

    await g.execute(s, "BEGIN")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (1, 1, 1)")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (2, 2, 1)")
    await g.execute(s, "COMMIT")
    assert sorted((await g.execute(s, "SELECT order_id FROM corder")).rows) == [(1,), (2,)]

    # A failed write inside a transaction is undone (savepoint); the transaction stays open.
    await g.execute(s, "BEGIN")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (3, 1, 1)")
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (1, 1, 1)")
    assert err.value.code is Code.ALREADY_EXISTS
    assert "transaction is still open" in err.value.message
    assert s.in_transaction
    # a statement the gate cannot parse or plan changes nothing either
    for bad in ("SELEC oops", "SELECT * FROM nosuch"):
        with pytest.raises(ShardgateError):
            await g.execute(s, bad)
        assert s.in_transaction
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (4, 2, 1)")
    await g.execute(s, "COMMIT")
    placed = await shard_rows(cluster, "commerce", "SELECT order_id FROM corder")
    assert sorted(r for rows in placed.values() for r in rows) == [(1,), (2,), (3,), (4,)]

    # A lookup conflict in the middle of a multi-row insert inside a transaction:
    # the statement's owner and lookup rows are undone, earlier work stays.
    await g.execute(s, "BEGIN")
    await g.execute(s, "INSERT INTO customer (customer_id, email) VALUES (10, 'first@x')")
    await g.execute(s, "INSERT INTO customer (customer_id, email) VALUES (11, 'taken@x')")
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "INSERT INTO customer (customer_id, email) VALUES "
                           "(12, 'new@x'), (13, 'taken@x'), (14, 'newer@x')")
    assert err.value.code is Code.ALREADY_EXISTS
    await g.execute(s, "COMMIT")
    customers = await shard_rows(cluster, "commerce", "SELECT customer_id FROM customer")
    assert sorted(r for rows in customers.values() for r in rows) == [(10,), (11,)]
    lookups = await shard_rows(cluster, "lookup", "SELECT email FROM customer_email_idx")
    assert sorted(lookups["0"]) == [("first@x",), ("taken@x",)]
    await g.execute(s, "DELETE FROM customer WHERE customer_id IN (10, 11)")

    # User savepoints reach every shard of the transaction, including later joiners.
    await g.execute(s, "BEGIN")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (20, 1, 1)")
    await g.execute(s, "SAVEPOINT before_more")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (21, 2, 1)")
    await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (22, 3, 1)")
    await g.execute(s, "ROLLBACK TO SAVEPOINT before_more")
    await g.execute(s, "COMMIT")
    placed = await shard_rows(cluster, "commerce", "SELECT order_id FROM corder")
    assert sorted(r for rows in placed.values() for r in rows) == [(1,), (2,), (3,), (4,), (20,)]
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "SAVEPOINT outside")
    assert err.value.code is Code.FAILED_PRECONDITION

    # Outside a transaction, a unique lookup duplicate aborts a multi-row insert whole.
    await g.execute(s, "INSERT INTO customer (customer_id, email) VALUES (1, 'dup@x')")
    with pytest.raises(ShardgateError) as err:
        await g.execute(
            s, "INSERT INTO customer (customer_id, email) VALUES (2, 'fresh@x'), (3, 'dup@x')"
        )
    assert err.value.code is Code.ALREADY_EXISTS
    customers = await shard_rows(cluster, "commerce", "SELECT customer_id FROM customer")
    assert sorted(r for rows in customers.values() for r in rows) == [(1,)]
    lookups = await shard_rows(cluster, "lookup", "SELECT email FROM customer_email_idx")
    assert lookups["0"] == [("dup@x",)]


async def test_bad_input_gets_coded_errors(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    cases = [
        ("SELEC * FROM customer", Code.INVALID_ARGUMENT),
        ("SELECT * FROM nosuch", Code.NOT_FOUND),
        ("SELECT * FROM nosuchks.customer", Code.NOT_FOUND),
        ("SELECT stddev(price) FROM corder", Code.UNIMPLEMENTED),
        ("UPDATE customer SET customer_id = 5 WHERE customer_id = 1", Code.UNIMPLEMENTED),
        ("INSERT INTO customer (email) VALUES (NULL)", Code.NOT_FOUND),
    ]
    for sql, code in cases[:-1]:
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, sql)
        assert err.value.code is code, (sql, err.value)
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "SELECT * FROM customer WHERE customer_id = :missing")
    assert err.value.code is Code.INVALID_ARGUMENT and "missing" in err.value.message


async def test_a_shard_that_is_down(cluster: Cluster) -> None:
    topo = cluster.topology.to_dict()
    shards = topo["keyspaces"]["commerce"]["shards"]
    down = {
        "sqlite": "sqlite:////etc/hostname/not-a-dir/y.db",
        "postgres": "postgresql://postgres@127.0.0.1:1/nosuch",
        "mysql": "mysql://root@127.0.0.1:1/nosuch",
    }[cluster.kind]
    shards["c0-"] = down
    g = Gate.open(Topology.from_dict(topo))
    try:
        s = g.session(identity=TRUSTED)
        await g.execute(s, "INSERT INTO corder (order_id, customer_id) VALUES (1, 1)")
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, "SELECT * FROM corder")
        assert err.value.code is Code.UNAVAILABLE
        # a shard that is up still answers
        cid = next(i for i in range(1, 100) if vitess_hash(i) >= b"\xc0")
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, "SELECT * FROM corder WHERE customer_id = :c", {"c": cid})
        assert err.value.code is Code.UNAVAILABLE
        r = await g.execute(s, "SELECT order_id FROM corder WHERE customer_id = 1")
        assert r.rows == [(1,)]
    finally:
        await g.close()


async def test_concurrent_sessions(cluster: Cluster) -> None:
    import asyncio

    g = cluster.gate

    async def worker(w: int) -> None:
        s = g.session(identity=TRUSTED)
        for i in range(25):
            oid = w * 1000 + i
            await g.execute(s, "BEGIN")
            await g.execute(
                s,
                "INSERT INTO corder (order_id, customer_id, price) VALUES (:o, :c, :p)",
                {"o": oid, "c": random.randint(1, 10**6), "p": i},
            )
            await g.execute(s, "COMMIT" if i % 5 else "ROLLBACK")

    await asyncio.gather(*(worker(w) for w in range(4)))
    r = await g.execute(g.session(identity=TRUSTED), "SELECT order_id FROM corder")
    assert len(r.rows) == 4 * 20


async def test_same_text_is_parsed_once(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardgate.gate.planning as planning_module

    calls: list[str] = []
    real_parse = planning_module.classify  # the gate's one entry from text to statement

    def counting_parse(sql: str) -> Any:
        calls.append(sql)
        return real_parse(sql)

    monkeypatch.setattr(planning_module, "classify", counting_parse)
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    sql = "SELECT customer_id FROM customer WHERE customer_id = :id"
    for i in range(50):
        await g.execute(s, sql, {"id": i})
    # another session with the same default keyspace shares the plan
    other = g.session(identity=TRUSTED)
    await g.execute(other, sql, {"id": 1})
    assert calls.count(sql) == 1
    await g.execute(g.session("lookup", identity=TRUSTED), "SELECT 1")
    assert len(calls) == 2


async def test_joins_and_subqueries(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    customers = [(i, f"c{i}@x", f"n{i % 3}") for i in range(1, 13)]
    orders = [(100 + i, (i % 12) + 1, f"sku{i % 4}", i * 10) for i in range(30)]
    for cid, email, name in customers:
        await g.execute(s, "INSERT INTO customer (customer_id, email, name) VALUES (:c, :e, :n)",
                        {"c": cid, "e": email, "n": name})
    for oid, cid, sku, price in orders:
        await g.execute(s, "INSERT INTO corder (order_id, customer_id, sku, price) "
                           "VALUES (:o, :c, :s, :p)", {"o": oid, "c": cid, "s": sku, "p": price})
    names = {cid: name for cid, _e, name in customers}

    # co-located (same hash vindex on customer_id): pushed down to the shards
    r = await g.execute(s, "SELECT c.customer_id, o.order_id FROM customer c JOIN corder o "
                           "ON c.customer_id = o.customer_id ORDER BY o.order_id")
    assert r.rows == [(cid, oid) for oid, cid, _s, _p in sorted(orders)]
    r = await g.execute(s, "SELECT c.name, COUNT(*), SUM(o.price) FROM customer c JOIN corder o "
                           "ON c.customer_id = o.customer_id GROUP BY c.name ORDER BY c.name")
    want: dict[str, list[int]] = {}
    for _o, cid, _s, price in orders:
        want.setdefault(names[cid], []).append(price)
    assert [(n, c, int(t)) for n, c, t in r.rows] == \
        [(n, len(v), sum(v)) for n, v in sorted(want.items())]

    # not co-located (name = sku never matches, price = customer_id*10 matches some):
    # a nested loop at the gate
    r = await g.execute(s, "SELECT o.order_id, c.customer_id FROM corder o JOIN customer c "
                           "ON o.price = c.customer_id ORDER BY o.order_id")
    assert r.rows == [(oid, price) for oid, _c, _s, price in sorted(orders) if 1 <= price <= 12]
    r = await g.execute(s, "SELECT c.customer_id, o.order_id FROM customer c LEFT JOIN corder o "
                           "ON c.customer_id = o.price WHERE c.customer_id < 4 "
                           "ORDER BY c.customer_id")
    assert r.rows == [(1, None), (2, None), (3, None)]

    # pulled-out subquery: its values route the outer query
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE customer_id IN "
                           "(SELECT customer_id FROM corder WHERE sku = 'sku1') "
                           "ORDER BY customer_id")
    assert r.rows == [(c,) for c in sorted({cid for _o, cid, sku, _p in orders if sku == "sku1"})]
    r = await g.execute(s, "SELECT customer_id FROM customer WHERE customer_id IN "
                           "(SELECT customer_id FROM corder WHERE sku = 'none')")
    assert r.rows == []


async def test_split_query_reads_every_row_once(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    for cid in range(1, 81):
        await g.execute(s, "INSERT INTO corder (order_id, customer_id, price) VALUES (:o, :c, 1)",
                        {"o": cid, "c": cid})
    # A stale copy of an order on a shard that does not own it (as after resharding).
    stray = next(i for i in range(1, 81) if not parse_shard_name("-40").contains(vitess_hash(i)))
    backend = open_backend(cluster.shard_urls("commerce")["-40"])
    try:
        await backend.execute(
            "INSERT INTO corder (order_id, customer_id, price) VALUES (%s, %s, 1)"
            .replace("%s", "?" if cluster.kind == "sqlite" else "%s"), [stray, stray])
    finally:
        await backend.close()
    scatter = await g.execute(s, "SELECT order_id FROM corder")
    assert len(scatter.rows) == 81  # a plain scatter sees the stale copy

    for n in (1, 4, 7, 16):
        splits = g.split_query("SELECT order_id, price FROM corder", n)
        assert len(splits) >= n
        seen: list[int] = []
        for part in splits:
            assert "keyrange(" in part.sql.lower()
            r = await g.execute(s, part.sql)
            for (oid, _price) in r.rows:
                assert part.key_range.contains(vitess_hash(oid))
            seen.extend(row[0] for row in r.rows)
        assert sorted(seen) == list(range(1, 81)), n

    r = await g.execute(s, "SELECT price FROM corder WHERE keyrange('-40') ORDER BY price")
    assert all(p == 1 for (p,) in r.rows)
    assert r.fields == ["price"]  # the hidden keyspace id column is dropped
    # ORDER BY an alias, by position, and by the (hidden) primary vindex column.
    for sql in ("SELECT order_id AS o FROM corder WHERE keyrange('40-80') ORDER BY o DESC",
                "SELECT order_id FROM corder WHERE keyrange('40-80') ORDER BY 1 DESC"):
        r = await g.execute(s, sql)
        ids = [row[0] for row in r.rows]
        assert ids and ids == sorted(ids, reverse=True), sql
    r = await g.execute(
        s, "SELECT order_id FROM corder WHERE keyrange('40-80') ORDER BY customer_id"
    )
    assert r.fields == ["order_id"] and len(r.rows) == len(ids)
    with pytest.raises(ShardgateError) as err:
        g.split_query("SELECT COUNT(*) FROM corder", 4)
    assert err.value.code is Code.UNIMPLEMENTED


async def test_explain_stats_batch_and_targeting(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    r = await g.execute(s, "EXPLAIN SELECT * FROM corder WHERE customer_id = 5")
    assert r.fields == ["plan"]
    assert '"Variant": "EqualUnique"' in r.rows[0][0]

    results = await g.execute_batch(s, [
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (1, 1, 5)", None),
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (1, 1, 5)", None),
        ("SELECT COUNT(*) FROM corder", None),
    ])
    assert not isinstance(results[0], Exception) and results[0].rows_affected == 1
    assert isinstance(results[1], ShardgateError) and results[1].code is Code.ALREADY_EXISTS
    assert not isinstance(results[2], Exception) and results[2].rows == [(1,)]
    results = await g.execute_batch(s, [
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (2, 2, 5)", None),
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (1, 1, 5)", None),
        ("INSERT INTO corder (order_id, customer_id, price) VALUES (3, 3, 5)", None),
    ], as_transaction=True)
    assert [getattr(r, "code", None) for r in results] == [None, Code.ALREADY_EXISTS,
                                                            Code.ABORTED]
    assert (await g.execute(s, "SELECT order_id FROM corder")).rows == [(1,)]

    for i in range(5):
        await g.execute(s, "SELECT * FROM corder WHERE customer_id = :c", {"c": i})
        await g.execute(s, f"SELECT * FROM corder WHERE customer_id = {i}")
    stats = {st.query: st for st in g.query_stats()}
    # literals and bind variables normalize alike (as /queryz shows them): one entry
    point = stats["SELECT * FROM corder WHERE customer_id = ?"]
    assert point.count == 10 and point.shard_calls == 10 and point.max_seconds > 0
    assert "SELECT * FROM corder WHERE customer_id = :c" not in stats
    assert stats["SELECT COUNT(*) FROM corder"].shard_calls == 4

    # Targeting a shard: statements go there unrouted.
    t = g.session(identity=TRUSTED)
    await g.execute(t, "USE `commerce:80-c0`")
    r = await g.execute(t, "SELECT COUNT(*) FROM corder")
    placed = await shard_rows(cluster, "commerce", "SELECT COUNT(*) FROM corder")
    assert r.rows[0][0] == placed["80-c0"][0][0]
    ksid = vitess_hash(1)
    await g.execute(t, f"USE `commerce[{ksid.hex()}]`")
    r = await g.execute(t, "SELECT order_id FROM corder")
    assert r.rows == [(1,)]
    # stream_execute honours the target too: only that shard's rows (here none)
    empty = next(name for name, rows in placed.items() if rows[0][0] == 0)
    await g.execute(t, f"USE `commerce:{empty}`")
    streamed = [row async for chunk in g.stream_execute(t, "SELECT order_id FROM corder")
                for row in chunk.rows]
    assert streamed == []
    await g.execute(t, "USE commerce")
    assert t.target is None
    with pytest.raises(ShardgateError) as err:
        await g.execute(t, "USE `commerce:-77`")
    assert err.value.code is Code.NOT_FOUND


async def test_gate_statements_are_typed_and_answered(cluster: Cluster) -> None:
    g = cluster.gate
    s = g.session(identity=TRUSTED)
    r = await g.execute(s, "SHOW VITESS_SHARDS")
    assert r.fields == ["Shards"]
    assert r.rows == [("commerce/-40",), ("commerce/40-80",), ("commerce/80-c0",),
                      ("commerce/c0-",), ("lookup/0",)]
    r = await g.execute(s, "show vitess_shards like '%/_0-_%'")
    assert r.rows == [("commerce/40-80",), ("commerce/80-c0",)]
    r = await g.execute(s, "SHOW VITESS_KEYSPACES")
    assert (r.fields, r.rows) == (["Database"], [("commerce",), ("lookup",)])
    assert (await g.execute(s, "SHOW KEYSPACES LIKE 'LOOK%'")).rows == [("lookup",)]
    r = await g.execute(s, "SHOW VITESS_TABLETS LIKE 'local-lookup-%'")
    assert r.fields[:4] == ["Cell", "Keyspace", "Shard", "TabletType"]
    assert r.rows == [("local", "lookup", "0", "PRIMARY", "SERVING", "local-lookup-0",
                       "localhost", "")]
    # Replica reads need tablet processes (a standby per shard); in-process tablets refuse.
    replica = () if cluster.processes is not None else ("USE commerce@replica",)
    for sql in replica:
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, sql)
        assert err.value.code is Code.UNIMPLEMENTED, sql

    # USE: comments, the Vitess '/' separator and '@primary'; a bad target changes nothing.
    await g.execute(s, "/* pin */ USE `commerce/80-c0@primary`")
    assert (s.keyspace, s.target) == ("commerce", "80-c0")
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "USE commerce@-80")
    assert err.value.code is Code.INVALID_ARGUMENT and "tablet type" in err.value.message
    assert (s.keyspace, s.target) == ("commerce", "80-c0")
    await g.execute(s, "use lookup;")
    assert (s.keyspace, s.target) == ("lookup", None)
    with pytest.raises(ShardgateError) as err:
        await g.execute(s, "USE nosuch")
    assert err.value.code is Code.NOT_FOUND

    # EXPLAIN of statements the gate answers itself names their type.
    assert g.explain("BEGIN") == {"QueryType": "BEGIN", "Original": "BEGIN"}
    assert g.explain("SAVEPOINT a")["QueryType"] == "SAVEPOINT"
    assert g.explain("ROLLBACK TO a")["QueryType"] == "ROLLBACK_TO"
    assert g.explain("SET transaction_mode = 'twopc'")["QueryType"] == "TRANSACTION_MODE"
    assert g.explain("USE `commerce:-40`")["QueryType"] == "USE"


async def test_a_scatter_stream_over_empty_shards_sends_its_fields(cluster: Cluster) -> None:
    """The first chunk of stream_execute has the fields even when no shard has a row."""
    g = cluster.gate
    chunks = [c async for c in g.stream_execute(g.session(identity=TRUSTED),
                                                "SELECT * FROM customer")]
    assert chunks and chunks[0].fields == ["customer_id", "email", "name"]
    assert sum(len(c.rows) for c in chunks) == 0
