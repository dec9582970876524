"""``auto_shard``: CREATE TABLE through the gate shards a new table (SQLite shards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import Code, ShardgateError
from shardgate.gate import Gate
from shardgate.topo import Topology


async def test_create_table_adds_it_to_the_vschema_sharded_by_its_primary_key(
        tmp_path: Path) -> None:
    topo = Topology.from_dict({"default_keyspace": "main", "keyspaces": {"main": {
        "shards": {"-80": f"sqlite:///{tmp_path}/a.db", "80-": f"sqlite:///{tmp_path}/b.db"},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "auto_shard": {"vindex": "hash"}, "tables": {}}}}})
    g = Gate.open(topo)
    try:
        s = g.session(identity=TRUSTED)
        await g.execute(s, "CREATE TABLE item (name VARCHAR(20), id INT, PRIMARY KEY (id))")
        table = g.vschema.keyspace("main").tables["item"]
        assert table.primary is not None and table.primary.columns == ("id",)
        for i in range(1, 21):
            await g.execute(s, "INSERT INTO item (id, name) VALUES (:i, :n)",
                            {"i": i, "n": f"n{i}"})
        assert (await g.execute(s, "SELECT COUNT(*) FROM item")).rows == [(20,)]
        per_shard = []
        for shard in ("-80", "80-"):
            t = g.session(identity=TRUSTED)
            await g.execute(t, f"USE `main:{shard}`")
            per_shard.append((await g.execute(t, "SELECT COUNT(*) FROM item")).rows[0][0])
        assert sum(per_shard) == 20 and min(per_shard) > 0
        planned = g.plan("SELECT name FROM item WHERE id = 7", "main")
        assert isinstance(planned, Plan) and isinstance(planned.instructions, Route)
        assert planned.instructions.opcode is Opcode.EQUAL_UNIQUE
        assert (await g.execute(s, "SELECT name FROM item WHERE id = 7")).rows == [("n7",)]
        # no primary key: the first column shards it
        await g.execute(s, "CREATE TABLE note (body INT, extra INT)")
        note = g.vschema.keyspace("main").tables["note"].primary
        assert note is not None and note.columns == ("body",)
        # dropping it takes it out of the VSchema again
        await g.execute(s, "DROP TABLE item")
        assert "item" not in g.vschema.keyspace("main").tables
        with pytest.raises(ShardgateError):
            await g.execute(s, "SELECT * FROM item")
    finally:
        await g.close()


def _with_sequences(tmp_path: Path) -> Topology:
    return Topology.from_dict({"default_keyspace": "main", "keyspaces": {
        "main": {"shards": {"-80": f"sqlite:///{tmp_path}/a.db",
                            "80-": f"sqlite:///{tmp_path}/b.db"},
                 "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                             "auto_shard": {"vindex": "hash", "sequence_keyspace": "seqs"},
                             "tables": {}}},
        "seqs": {"shards": {"0": f"sqlite:///{tmp_path}/s.db"},
                 "vschema": {"sharded": False, "tables": {}}}}})


async def test_an_auto_increment_key_draws_from_a_sequence_the_gate_creates(
        tmp_path: Path) -> None:
    g = Gate.open(_with_sequences(tmp_path))
    try:
        s = g.session(identity=TRUSTED)
        await g.execute(s, "CREATE TABLE item (id INTEGER NOT NULL AUTO_INCREMENT, "
                           "name VARCHAR(20), PRIMARY KEY (id))")
        table = g.vschema.keyspace("main").tables["item"]
        assert table.auto_increment is not None
        assert (table.auto_increment.column, table.auto_increment.sequence) == (
            "id", "seqs.item_seq")
        assert g.vschema.keyspace("seqs").tables["item_seq"].type == "sequence"
        first = await g.execute(s, "INSERT INTO item (name) VALUES ('a')")
        assert first.insert_id == 1
        many = await g.execute(s, "INSERT INTO item (name) VALUES ('b'), ('c'), ('d')")
        assert many.insert_id == 2 and many.rows_affected == 3
        await g.execute(s, "INSERT INTO item (id, name) VALUES (NULL, 'e')")
        rows = (await g.execute(s, "SELECT id, name FROM item ORDER BY id")).rows
        assert rows == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
        per_shard = []
        for shard in ("-80", "80-"):
            t = g.session(identity=TRUSTED)
            await g.execute(t, f"USE `main:{shard}`")
            per_shard.append((await g.execute(t, "SELECT COUNT(*) FROM item")).rows[0][0])
        assert sum(per_shard) == 5 and min(per_shard) > 0
        # dropping the table drops its sequence; created again, it starts at 1
        await g.execute(s, "DROP TABLE item")
        assert "item_seq" not in g.vschema.keyspace("seqs").tables
        await g.execute(s, "CREATE TABLE item (id INT PRIMARY KEY AUTO_INCREMENT, name TEXT)")
        assert (await g.execute(s, "INSERT INTO item (name) VALUES ('x')")).insert_id == 1
        # a key the database does not number gets no sequence
        await g.execute(s, "CREATE TABLE plain (id INT PRIMARY KEY, name TEXT)")
        assert g.vschema.keyspace("main").tables["plain"].auto_increment is None
        assert "plain_seq" not in g.vschema.keyspace("seqs").tables
    finally:
        await g.close()


async def test_a_sequence_another_table_draws_from_is_not_taken_over(tmp_path: Path) -> None:
    g = Gate.open(_with_sequences(tmp_path))
    try:
        s = g.session(identity=TRUSTED)
        await g.execute(s, "CREATE TABLE item (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        await g.execute(s, "ALTER VSCHEMA ON main.other ADD VINDEX hash(id) USING hash")
        await g.execute(s, "ALTER VSCHEMA ON main.other ADD AUTO_INCREMENT id USING "
                           "seqs.item_seq")
        await g.execute(s, "DROP TABLE item")  # other still draws from it: kept
        assert "item_seq" in g.vschema.keyspace("seqs").tables
        with pytest.raises(ShardgateError) as err:
            await g.execute(s, "CREATE TABLE item (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        assert err.value.code is Code.FAILED_PRECONDITION
        assert "main.other already draws from" in err.value.message
    finally:
        await g.close()
