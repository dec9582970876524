"""Shared set-up of the unit tests that plan against ``golden/vschema.json`` and run the
plans on the recording fake (:class:`shardgate.testing.RecordingCursor`).

``user`` has 4 shards, ``lookup`` and ``main`` one each; ``hash`` keyspace ids are
computed here with pycryptodome's DES, independently of shardgate's ``hash`` vindex.
"""

from __future__ import annotations

import json
from pathlib import Path

from Crypto.Cipher import DES

from shardgate.keys import KeyRange, ShardMap
from shardgate.planner import build_plan
from shardgate.result import Result
from shardgate.sql.parse import parse
from shardgate.testing import RecordingCursor
from shardgate.vschema import VSchema

VSCHEMA = VSchema.from_json(
    json.loads((Path(__file__).parent / "golden" / "vschema.json").read_text())
)
FOUR = ShardMap([(kr.name, kr) for kr in KeyRange().split(4)])
ONE = ShardMap([("0", KeyRange())])
_DES = DES.new(bytes(8), DES.MODE_ECB)


def ksid(n: int) -> bytes:
    """The ``hash`` keyspace id of ``n``: null-key DES of its 8 big-endian bytes."""
    return bytes(_DES.encrypt(n.to_bytes(8, "big")))


def shard_of(n: int) -> str:
    """The ``user`` shard holding the ``hash`` keyspace id of ``n``."""
    return FOUR.find(ksid(n))


def cursor() -> RecordingCursor:
    """A recording fake with the lookup tables of the golden VSchema created."""
    vc = RecordingCursor({"user": FOUR, "lookup": ONE, "main": ONE})
    vc.lookup.script(
        "create table name_user_map (name text, keyspace_id blob);"
        "create table email_user_map (email text primary key, keyspace_id blob);"
        "create table music_user_map (music_id integer primary key, user_id blob);"
    )
    return vc


async def run(vc: RecordingCursor, sql: str, bv: dict[str, object] | None = None,
              keyspace: str = "user") -> Result:
    """Plan ``sql`` in ``keyspace`` and execute it on ``vc``."""
    plan = build_plan(parse(sql), sql, VSCHEMA, keyspace)
    return await plan.instructions.execute(vc, bv or {})
