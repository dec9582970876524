"""Column definition packets of a shard, their schema replaced by the keyspace."""

from __future__ import annotations

from mysql_mimic.packets import make_column_definition_41

from shardgate.api.mysql.connection import with_schema


def _lenenc_str(value: bytes) -> bytes:
    assert len(value) < 0xFB
    return bytes((len(value),)) + value


def _column(schema: bytes, table: bytes = b"t", name: bytes = b"v") -> bytes:
    fixed = bytes([0x0C, 0x2D, 0x00, 0x50, 0, 0, 0, 0xFD, 0x00, 0x00, 0x00, 0x00, 0x00])
    return b"".join([_lenenc_str(b"def"), _lenenc_str(schema), _lenenc_str(table),
                     _lenenc_str(table), _lenenc_str(name), _lenenc_str(name), fixed])


def test_the_schema_is_replaced_and_nothing_else() -> None:
    shard = _column(b"sg_test_db_0123456789")
    assert with_schema(shard, "commerce") == _column(b"commerce")
    assert with_schema(_column(b""), "ks") == _column(b"ks")
    assert with_schema(_column(b"x" * 200), "é") == _column("é".encode())


def test_a_packet_made_by_mysql_mimic_round_trips() -> None:
    from mysql_mimic.charset import CharacterSet
    from mysql_mimic.types import ColumnType

    packet = make_column_definition_41(server_charset=CharacterSet.utf8mb4, name="v",
                                       column_type=ColumnType.VARCHAR,
                                       character_set=CharacterSet.utf8mb4)
    assert with_schema(with_schema(packet, "a"), "") == with_schema(packet, "")
