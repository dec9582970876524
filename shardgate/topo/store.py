"""The topo store: versioned records of the cluster in a small SQL database.

A record is ``(kind, name) -> JSON document`` with a version. Kinds used by
shardgate: ``keyspace`` (shards, VSchema, collation), ``cluster`` (name
``global``: default keyspace, routing rules), ``workflow`` (one per running
workflow) and ``tablet`` (registered tablet processes).

Invariants:

* **One clock.** Every write (put or delete) takes the next value of a single
  store-wide counter, ``sg_topo_clock``, inside the same database
  transaction, and that value becomes the record's version. Versions are
  therefore unique, increase with commit order, and "what changed since
  version V" is ``version > V`` (deleted records stay as tombstones so the
  question covers deletes too).
* **Compare-and-swap.** A write that names the version it read (``expect``)
  succeeds only if the record still has that version; otherwise it raises
  :class:`TopoConflict` and changes nothing. ``expect=0`` means "create: the
  record must not exist". The clock row is updated first, so concurrent
  writers queue on its row lock (SQLite: the database write lock) and the
  check-then-write inside the transaction cannot interleave.
* **Watching is polling the clock.** One primary-key read of the clock row
  tells a watcher whether anything changed (:class:`shardgate.topo.watch.TopoWatcher`);
  :meth:`TopoStore.changed` is the wait between two reads (a sleep here, etcd's
  watch in :mod:`shardgate.topo.etcd`).
* **Leases** exist only where ``has_leases`` is true (etcd): a record put with a
  lease is deleted by the store when the lease expires. The SQL and memory
  stores have none; their tablet records expire on the readers' side.

Backends: ``sqlite:///path`` (the embedded default, a file in the data
directory), ``postgresql://…`` and ``mysql://…`` through the same seam as
shards (:func:`shardgate.backends.open_backend`), ``etcd://host:port/prefix``
(:mod:`shardgate.topo.etcd`) and ``memory:`` (one process only: gates built in
tests and :meth:`Gate.open` without a store).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from shardgate.backends import open_backend
from shardgate.backends.base import Backend, transaction
from shardgate.backends.urls import redacted
from shardgate.errors import NotFound, ShardgateError, Unavailable
from shardgate.sql.dialects import sql_dialect
from shardgate.topo.base import (
    KINDS,
    Record,
    TopoConflict,
    TopoStore,
    check_record,
    conflict,
    no_lease,
)
from shardgate.topo.model import Topology

__all__ = ["KINDS", "MemoryTopoStore", "Record", "SqlTopoStore", "TopoConflict", "TopoStore",
           "open_topo_store"]


class MemoryTopoStore(TopoStore):
    """A store in this process's memory: same semantics, nothing durable."""

    location = "memory:"

    def __init__(self) -> None:
        self._clock = 0
        self._records: dict[tuple[str, str], Record] = {}

    @classmethod
    def seeded(cls, topology: Topology) -> MemoryTopoStore:
        """A store holding ``topology`` (its keyspaces and global record)."""
        store = cls()
        doc = topology.to_dict()
        for name, spec in doc["keyspaces"].items():
            store._write("keyspace", name, spec, None)
        glob: dict[str, Any] = {
            k: doc[k] for k in ("default_keyspace", "routing_rules") if k in doc
        }
        store._write("cluster", "global", glob, None)
        topology.version = store._clock
        return store

    async def get(self, kind: str, name: str) -> Record | None:
        rec = self._records.get((kind, name))
        return rec if rec is not None and rec.doc is not None else None

    async def list_records(self, kind: str) -> list[Record]:
        return sorted(
            (r for (k, _), r in self._records.items() if k == kind and r.doc is not None),
            key=lambda r: r.name,
        )

    async def put(
        self, kind: str, name: str, doc: dict[str, Any], *, expect: int | None = None,
        lease: int | None = None,
    ) -> int:
        check_record(kind, name)
        no_lease(self.location, lease)
        text = json.dumps(doc)  # same check as the SQL store: the doc must be JSON
        return self._write(kind, name, json.loads(text), expect)

    async def delete(self, kind: str, name: str, *, expect: int | None = None) -> int:
        check_record(kind, name)
        if (kind, name) not in self._records and expect is None:
            return self._clock
        return self._write(kind, name, None, expect)

    def _write(self, kind: str, name: str, doc: dict[str, Any] | None, expect: int | None) -> int:
        cur = self._records.get((kind, name))
        live = cur.version if cur is not None and cur.doc is not None else None
        if expect is not None and (live or 0) != expect:
            raise conflict(kind, name, expect, live)
        self._clock += 1
        self._records[(kind, name)] = Record(kind, name, doc, self._clock)
        return self._clock

    async def clock(self) -> int:
        return self._clock

    async def close(self) -> None:
        pass

    async def changes_since(self, version: int) -> tuple[int, list[Record]]:
        changed = sorted(
            (r for r in self._records.values() if r.version > version), key=lambda r: r.version
        )
        return self._clock, changed


class SqlTopoStore(TopoStore):
    """The store in a SQL database reached through a shardgate backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.location = redacted(backend.url)
        self._ready = False
        self._setup_lock = asyncio.Lock()
        p = backend.placeholder
        self._p = p
        doc_type = sql_dialect(backend.dialect).long_text
        self._ddl = [
            "CREATE TABLE IF NOT EXISTS sg_topo_clock "
            "(id INT PRIMARY KEY, version BIGINT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS sg_topo_record (kind VARCHAR(32) NOT NULL, "
            f"name VARCHAR(255) NOT NULL, doc {doc_type}, version BIGINT NOT NULL, "
            "PRIMARY KEY (kind, name))",
            "CREATE INDEX IF NOT EXISTS sg_topo_record_version ON sg_topo_record (version)",
        ]

    async def _setup(self) -> None:
        if self._ready:
            return
        async with self._setup_lock:
            if self._ready:
                return
            p = self._p
            clock_row = f"SELECT version FROM sg_topo_clock WHERE id = {p}"
            try:
                # A store set up already (its clock row is written last) is only read:
                # no DDL, so a reader never waits for a SQLite store's write lock.
                with contextlib.suppress(NotFound):
                    if (await self.backend.execute(clock_row, (1,))).rows:
                        self._ready = True
                        return
                for ddl in self._ddl:
                    await self.backend.execute(ddl)
                res = await self.backend.execute(clock_row, (1,))
                if not res.rows:
                    try:
                        await self.backend.execute(
                            f"INSERT INTO sg_topo_clock (id, version) VALUES ({p}, {p})", (1, 0))
                    except ShardgateError as exc:
                        if exc.code.name != "ALREADY_EXISTS":  # another process won the race
                            raise
            except Unavailable as exc:
                raise Unavailable(
                    f"the topo store at {self.location} is unreachable: {exc.message}"
                ) from exc
            self._ready = True

    async def get(self, kind: str, name: str) -> Record | None:
        await self._setup()
        p = self._p
        res = await self._read(
            f"SELECT doc, version FROM sg_topo_record WHERE kind = {p} AND name = {p}",
            (kind, name))
        if not res or res[0][0] is None:
            return None
        return Record(kind, name, json.loads(res[0][0]), int(res[0][1]))

    async def list_records(self, kind: str) -> list[Record]:
        await self._setup()
        rows = await self._read(
            f"SELECT name, doc, version FROM sg_topo_record WHERE kind = {self._p} "
            "AND doc IS NOT NULL ORDER BY name", (kind,))
        return [Record(kind, str(n), json.loads(d), int(v)) for n, d, v in rows]

    async def clock(self) -> int:
        await self._setup()
        rows = await self._read(f"SELECT version FROM sg_topo_clock WHERE id = {self._p}", (1,))
        return int(rows[0][0]) if rows else 0

    async def changes_since(self, version: int) -> tuple[int, list[Record]]:
        await self._setup()
        p = self._p
        # One statement, so one snapshot on every backend and no transaction: the clock and
        # every record at or below it are read together (writers bump the clock and write the
        # record in one transaction), and a SQLite reader takes no write lock (a poller that
        # held BEGIN IMMEDIATE starved a CLI writer past its busy timeout under load).
        rows = await self._read(
            "SELECT c.version, r.kind, r.name, r.doc, r.version FROM sg_topo_clock c "
            f"LEFT JOIN sg_topo_record r ON r.version > {p} AND r.version <= c.version "
            f"WHERE c.id = {p} ORDER BY r.version", (version, 1))
        clock = int(rows[0][0]) if rows else 0
        return clock, [
            Record(str(k), str(n), None if d is None else json.loads(d), int(v))
            for _, k, n, d, v in rows if k is not None
        ]

    async def put(
        self, kind: str, name: str, doc: dict[str, Any], *, expect: int | None = None,
        lease: int | None = None,
    ) -> int:
        check_record(kind, name)
        no_lease(self.location, lease)
        return await self._write(kind, name, json.dumps(doc, sort_keys=True), expect)

    async def delete(self, kind: str, name: str, *, expect: int | None = None) -> int:
        check_record(kind, name)
        return await self._write(kind, name, None, expect)

    async def _write(self, kind: str, name: str, text: str | None, expect: int | None) -> int:
        await self._setup()
        p = self._p
        conn = await self.backend.acquire()
        try:
            async with transaction(conn):
                await conn.execute(f"UPDATE sg_topo_clock SET version = version + 1 WHERE id = {p}",
                                   (1,))
                clock = int((await conn.execute(
                    f"SELECT version FROM sg_topo_clock WHERE id = {p}", (1,))).rows[0][0])
                cur = (await conn.execute(
                    f"SELECT doc, version FROM sg_topo_record WHERE kind = {p} AND name = {p}",
                    (kind, name))).rows
                live = int(cur[0][1]) if cur and cur[0][0] is not None else None
                if expect is not None and (live or 0) != expect:
                    raise conflict(kind, name, expect, live)
                if text is None and not cur:
                    raise _NothingToDelete(clock - 1)
                if cur:
                    await conn.execute(
                        f"UPDATE sg_topo_record SET doc = {p}, version = {p} "
                        f"WHERE kind = {p} AND name = {p}", (text, clock, kind, name))
                else:
                    await conn.execute(
                        "INSERT INTO sg_topo_record (kind, name, doc, version) "
                        f"VALUES ({p}, {p}, {p}, {p})", (kind, name, text, clock))
        except _NothingToDelete as nothing:
            return nothing.clock
        except Unavailable as exc:
            raise self._unreachable(exc) from exc
        finally:
            await self.backend.release(conn)
        return clock

    async def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return [tuple(r) for r in (await self.backend.execute(sql, params)).rows]
        except Unavailable as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: Unavailable) -> Unavailable:
        return Unavailable(f"the topo store at {self.location} is unreachable: {exc.message}")

    async def close(self) -> None:
        await self.backend.close()


class _NothingToDelete(ShardgateError):
    """Internal: rolls back the clock bump of a delete of a missing record."""

    def __init__(self, clock: int) -> None:
        super().__init__("nothing to delete")
        self.clock = clock


def open_topo_store(url: str) -> TopoStore:
    """The store at ``url``: ``memory:``, ``sqlite:///path``, ``postgresql://…``, ``mysql://…``,
    ``etcd://host:port/prefix``."""
    if url == "memory:":
        return MemoryTopoStore()
    if url.startswith("etcd://"):
        from shardgate.topo.etcd import EtcdTopoStore  # its client loads only when used

        return EtcdTopoStore(url)
    return SqlTopoStore(open_backend(url, pool_size=2))
