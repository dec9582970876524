"""The shards of one inbox's keyspace (:class:`InboxShards`): a statement on every shard at
once, the VSchema declarations of the inbox's tables, and the shard of each user.

Stateless beyond its gate, keyspace and inbox name: it reads the topology and the VSchema
at each call, so a store's options (its vindex) may change between calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shardgate.errors import AlreadyExists, InvalidArgument
from shardgate.ports import GateView, SqlShard
from shardgate.queues.inbox import sql
from shardgate.sql.dialects import Dialect
from shardgate.vindexes.base import SingleColumn
from shardgate.vindexes.hash import Hash


class InboxShards:
    """The shards of the keyspace holding inbox ``name``."""

    def __init__(self, gate: GateView[SqlShard], keyspace: str, name: str) -> None:
        self.gate = gate
        self.keyspace = keyspace
        self.name = name
        #: the keyspace is sharded (users are placed by a vindex)
        self.sharded = gate.topology.keyspace(keyspace).sharded

    def count(self) -> int:
        """How many shards the keyspace has now."""
        return len(self.gate.topology.keyspace(self.keyspace).shards)

    async def each(
        self, statement: Callable[[Dialect], str], *, suppress: type[Exception] | None = None
    ) -> list[Any]:
        """``statement(dialect)`` on every shard at once (``suppress``: that error is fine)."""
        return await self.each_with(lambda d: (statement(d), []), suppress=suppress)

    async def each_with(
        self, statement: Callable[[Dialect], tuple[str, list[Any]]], *,
        suppress: type[Exception] | None = None,
    ) -> list[Any]:
        """``statement(dialect)`` -> (text, parameters) on every shard at once, results in
        the shards' order (None where ``suppress``'s error was raised)."""
        ks = self.gate.topology.keyspace(self.keyspace)
        clients = [self.gate.tablets[(self.keyspace, s.name)] for s in ks.shards]

        async def one(c: Any) -> Any:
            text, params = statement(c.dialect)
            if suppress is None:
                return await c.execute(text, params)
            with contextlib.suppress(suppress):
                return await c.execute(text, params)
            return None

        return list(await asyncio.gather(*(one(c) for c in clients)))

    async def drop_table(self, table: str) -> None:
        """Drop ``table`` on every shard."""
        await self.each(lambda _dialect: sql.drop_ddl(table))

    def register(self, add: Iterable[str], remove: Iterable[str], vindex: str) -> None:
        """Declare tables in (and remove them from) the keyspace's VSchema, sharded by
        ``user_id`` through ``vindex`` in a sharded keyspace. A table already declared
        otherwise fails with ``ALREADY_EXISTS``; a VSchema that does not build is rolled
        back."""
        ks_topo = self.gate.topology.keyspace(self.keyspace)
        doc: dict[str, Any] = (
            {"column_vindexes": [{"column": "user_id", "name": vindex}]}
            if self.sharded else {}
        )
        vdoc = copy.deepcopy(ks_topo.vschema)
        tables = vdoc.setdefault("tables", {})
        changed = False
        for t in add:
            if t in tables:
                if tables[t] != doc:
                    raise AlreadyExists(
                        f"inbox {self.name}: table {self.keyspace}.{t} is already in the "
                        "VSchema with another definition; choose another inbox name"
                    )
                continue
            tables[t] = copy.deepcopy(doc)
            changed = True
        for t in remove:
            if tables.pop(t, None) is not None:
                changed = True
        if changed:
            old = ks_topo.vschema
            ks_topo.vschema = vdoc
            try:
                self.gate.rebuild_vschema()
            except BaseException:
                ks_topo.vschema = old
                self.gate.rebuild_vschema()
                raise

    def shards_of(self, users: Sequence[Any], vindex_name: str) -> list[str]:
        """The shard holding each user's inbox, placed by ``vindex_name`` (no I/O)."""
        ks = self.gate.topology.keyspace(self.keyspace)
        if not self.sharded:
            return [ks.shards[0].name] * len(users)
        vindex = self.gate.vschema.keyspace(self.keyspace).vindexes[vindex_name]
        assert isinstance(vindex, SingleColumn)
        if isinstance(vindex, Hash) and all(type(u) is int and 0 <= u < 2**63 for u in users):
            # One DES call for all users (ECB: each 8-byte block on its own).
            packed = vindex.hash_blocks(struct.pack(f">{len(users)}Q", *users))
            return [ks.shard_map.find(packed[i:i + 8]) for i in range(0, len(packed), 8)]
        out: list[str] = []
        for user, ksids in zip(users, vindex.map(list(users)), strict=True):
            if not ksids:
                raise InvalidArgument(
                    f"inbox {self.name}: user {user!r} maps to no keyspace id through "
                    f"vindex {vindex_name!r}"
                )
            out.append(ks.shard_map.find(ksids[0]))
        return out
