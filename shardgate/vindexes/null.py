"""``null``: every value, NULL included, maps to the keyspace id ``b"\\x00"`` (cost 0, unique).

As Vitess ``null.go``: all rows go to the first shard. Useful while moving an
unsharded keyspace to sharded, and for auto-increment columns left unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardgate.vindexes.base import KeyspaceId
from shardgate.vindexes.functional import Hashing

NULL_KSID = b"\x00"


class Null(Hashing):
    """Maps everything to ``b"\\x00"``."""

    type_name = "null"

    @property
    def cost(self) -> int:
        return 0

    def hash_value(self, value: Any) -> KeyspaceId | None:
        return NULL_KSID

    def map(self, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        return [[NULL_KSID] for _ in values]
