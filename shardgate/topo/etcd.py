"""The topo store on etcd (``etcd://HOST:PORT/prefix``), as Vitess keeps its topology.

Records are etcd keys under the URL's prefix (default ``/shardgate``)::

    <prefix>/global/keyspaces/<keyspace>       kind keyspace: shards, VSchema, collation
    <prefix>/global/cluster/<name>             kind cluster (``global``: default keyspace,
                                               routing rules)
    <prefix>/global/workflows/<name>           kind workflow
    <prefix>/cells/<cell>/tablets/<alias>      kind tablet (leased: see below)

A keyspace's shards live in its record, as in the cluster file: a reshard's
cut-over changes shards and VSchema together in one compare-and-swap. The
cell is the URL's ``?cell=`` (default ``local``); a tablet registers in its
process's cell, and readers list the tablets of every cell.

Invariants (the :class:`~shardgate.topo.base.TopoStore` ones, in etcd's terms):

* **Versions are etcd revisions.** A record's version is its key's
  ``mod_revision``; etcd gives every write the next value of one cluster-wide
  revision counter, so versions are unique and increase with commit order.
  ``clock()`` is the newest ``mod_revision`` under the prefix (0 for an empty
  store): writes to other prefixes of the same etcd do not move it.
* **Compare-and-swap is a Txn on ``mod_revision``.** A write with ``expect``
  reads the key, checks the expectation, then commits in one etcd Txn guarded
  by ``mod_revision == <the revision read>``: a write in between fails the
  guard and the store answers :class:`~shardgate.topo.base.TopoConflict`.
* **Deletes leave tombstones.** :meth:`EtcdTopoStore.delete` writes an empty
  value (no JSON document is empty), so ``changes_since`` (a range read with
  ``min_mod_revision``) reports deletes as the SQL store does.
* **Leases.** A tablet record is put with an etcd lease that the tablet keeps
  alive on every heartbeat (:meth:`grant_lease`, :meth:`keep_alive`). When the
  tablet dies the lease expires and etcd deletes the key itself: the watch
  reports that delete (a tombstone) to every watcher; no heartbeat expiry or
  purge is needed for it to go.
* **Watches, not polling.** :meth:`changed` returns as soon as the store's
  one watch on the prefix sees a revision newer than the caller's; deletes
  the watch saw (lease expiry) are merged into ``changes_since`` and the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import aetcd
from aetcd import rpc

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.errors import InvalidArgument, NotFound, Unavailable
from shardgate.topo.base import KINDS, Record, TopoStore, check_record, conflict

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "/shardgate"
DEFAULT_CELL = "local"
#: seconds an etcd request may take before the store counts as unreachable
REQUEST_TIMEOUT_S = 5.0
#: gRPC channel options: reconnect within a second of etcd coming back (gRPC's default
#: backoff grows to two minutes, a gate would stay degraded that long), and notice a dead
#: link by keepalive pings (no more often than etcd's default minimum of 5 s allows)
CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}
#: the tombstone: an empty value (a live record's value is a JSON document, never empty)
TOMBSTONE = b""
#: the longest a watcher waits without an event before it reads the clock anyway (a watch
#: stream that hangs without an error, as behind a dropped network link, is noticed so)
RESYNC_S = 5.0
#: deletes seen by the watch that are remembered for ``changes_since`` (oldest dropped first)
_DELETES_KEPT = 10_000

_KIND_DIRS = {"keyspace": "global/keyspaces", "cluster": "global/cluster",
              "workflow": "global/workflows"}


def parse_etcd_url(url: str) -> tuple[str, int, str, str, str | None, str | None]:
    """``etcd://[user:password@]host[:port][/prefix][?cell=NAME]`` ->
    ``(host, port, prefix, cell, user, password)``."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.hostname:
        raise InvalidArgument(
            f"topo store URL {url!r}: expected etcd://HOST:PORT/prefix (e.g. "
            "etcd://127.0.0.1:2379/shardgate)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise InvalidArgument(f"topo store URL {url!r}: bad port") from exc
    prefix = "/" + parts.path.strip("/") if parts.path.strip("/") else DEFAULT_PREFIX
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"cell"})
    if unknown:
        raise InvalidArgument(f"topo store URL {url!r}: unknown options {unknown}; "
                              "the one option is ?cell=NAME")
    cell = query.get("cell", [DEFAULT_CELL])[-1]
    if not cell or "/" in cell:
        raise InvalidArgument(f"topo store URL {url!r}: cell {cell!r} must be a name without /")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return parts.hostname, port, prefix, cell, user, password


def _range_end(prefix: bytes) -> bytes:
    """The end of etcd's range of keys starting with ``prefix`` (the prefix plus one)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdTopoStore(TopoStore):
    """The topo store in etcd v3 (see the module docstring for the layout and invariants).

    One client (one gRPC channel) per store; one watch on the prefix, started by
    the first :meth:`changed` and kept until :meth:`close`.
    """

    has_leases = True

    def __init__(self, url: str) -> None:
        host, port, prefix, cell, user, password = parse_etcd_url(url)
        self.prefix = prefix
        self.cell = cell
        self.location = f"etcd://{host}:{port}{prefix}" + (
            f"?cell={cell}" if cell != DEFAULT_CELL else "")
        self._root = (prefix.rstrip("/") + "/").encode()
        self._client = aetcd.Client(host=host, port=port, username=user, password=password,
                                    timeout=REQUEST_TIMEOUT_S, options=CHANNEL_OPTIONS)
        #: the newest revision the watch has seen (0: no watch yet)
        self._seen = 0
        #: key -> tombstone of keys the watch saw deleted (lease expiry), newest last
        self._deleted: dict[bytes, Record] = {}
        self._wake = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._watch_from = 0

    # ----------------------------------------------------------------- keys --

    def _key(self, kind: str, name: str) -> bytes:
        if kind == "tablet":
            return self._root + f"cells/{self.cell}/tablets/{name}".encode()
        return self._root + f"{_KIND_DIRS[kind]}/{name}".encode()

    def _kind_prefixes(self, kind: str) -> bytes:
        if kind == "tablet":
            return self._root + b"cells/"
        return self._root + f"{_KIND_DIRS[kind]}/".encode()

    def _parse_key(self, key: bytes) -> tuple[str, str] | None:
        """``(kind, name)`` of a key under the prefix, None for a key of no record."""
        rest = key[len(self._root):].decode()
        for kind, path in _KIND_DIRS.items():
            if rest.startswith(path + "/"):
                return kind, rest[len(path) + 1:]
        if rest.startswith("cells/"):
            _, _cell, what, *name = rest.split("/", 3)
            if what == "tablets" and name:
                return "tablet", name[0]
        return None

    def _record(self, kv: Any) -> Record | None:
        parsed = self._parse_key(bytes(kv.key))
        if parsed is None:
            return None
        value = bytes(kv.value)
        doc = json.loads(value) if value != TOMBSTONE else None
        return Record(parsed[0], parsed[1], doc, int(kv.mod_revision))

    # ------------------------------------------------------------- requests --

    async def _call(self, aw: Awaitable[T]) -> T:
        try:
            return await wait_for(aw, REQUEST_TIMEOUT_S)
        except rpc.AioRpcError as exc:
            if exc.code() == rpc.StatusCode.NOT_FOUND:  # e.g. a put with an expired lease
                raise NotFound(f"the topo store at {self.location}: {exc.details()}") from exc
            raise self._unreachable(exc) from exc
        except (aetcd.ClientError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: BaseException) -> Unavailable:
        detail = exc.details() if isinstance(exc, rpc.AioRpcError) else str(exc)
        return Unavailable(f"the topo store at {self.location} is unreachable: "
                           f"{detail or type(exc).__name__}")

    async def _range(self, key: bytes, range_end: bytes | None = None, **fields: Any) -> Any:
        await self._call(self._client.connect())
        request = rpc.RangeRequest(key=key, **fields)
        if range_end is not None:
            request.range_end = range_end
        return await self._call(self._client.kvstub.Range(
            request, timeout=REQUEST_TIMEOUT_S, metadata=self._client.metadata))

    async def _txn(self, compare: list[Any], success: list[Any]) -> Any:
        await self._call(self._client.connect())
        request = rpc.TxnRequest(compare=compare, success=success, failure=[])
        return await self._call(self._client.kvstub.Txn(
            request, timeout=REQUEST_TIMEOUT_S, metadata=self._client.metadata))

    @staticmethod
    def _mod_is(key: bytes, revision: int) -> Any:
        return rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                           mod_revision=revision)

    @staticmethod
    def _put_op(key: bytes, value: bytes, lease: int) -> Any:
        return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))

    # ---------------------------------------------------------------- reads --

    async def get(self, kind: str, name: str) -> Record | None:
        check_record(kind, name)
        resp = await self._range(self._key(kind, name))
        rec = self._record(resp.kvs[0]) if resp.kvs else None
        return rec if rec is not None and rec.doc is not None else None

    async def list_records(self, kind: str) -> list[Record]:
        if kind not in KINDS:
            check_record(kind, "x")
        start = self._kind_prefixes(kind)
        resp = await self._range(start, _range_end(start))
        recs = [r for r in map(self._record, resp.kvs)
                if r is not None and r.kind == kind and r.doc is not None]
        return sorted(recs, key=lambda r: r.name)

    async def clock(self) -> int:
        resp = await self._range(self._root, _range_end(self._root), limit=1, keys_only=True,
                                 sort_order=rpc.RangeRequest.DESCEND,
                                 sort_target=rpc.RangeRequest.MOD)
        newest = int(resp.kvs[0].mod_revision) if resp.kvs else 0
        return max(newest, self._newest_delete())

    def _newest_delete(self) -> int:
        return max((r.version for r in self._deleted.values()), default=0)

    async def changes_since(self, version: int) -> tuple[int, list[Record]]:
        resp = await self._range(self._root, _range_end(self._root), min_mod_revision=version + 1,
                                 sort_order=rpc.RangeRequest.ASCEND,
                                 sort_target=rpc.RangeRequest.MOD)
        changed = {bytes(kv.key): rec for kv in resp.kvs
                   if (rec := self._record(kv)) is not None}
        if changed:
            clock = max(r.version for r in changed.values())
        else:  # the newest write, read at the same revision as the (empty) change list
            newest = await self._range(self._root, _range_end(self._root), limit=1,
                                       keys_only=True, revision=int(resp.header.revision),
                                       sort_order=rpc.RangeRequest.DESCEND,
                                       sort_target=rpc.RangeRequest.MOD)
            clock = int(newest.kvs[0].mod_revision) if newest.kvs else 0
        seen_at = int(resp.header.revision)
        for key, tomb in self._deleted.items():  # deletes only the watch saw (lease expiry)
            later = changed.get(key)
            newer = later is None or later.version < tomb.version
            if version < tomb.version <= seen_at and newer:
                changed[key] = tomb
                clock = max(clock, tomb.version)
        return clock, sorted(changed.values(), key=lambda r: r.version)

    # --------------------------------------------------------------- writes --

    async def put(
        self, kind: str, name: str, doc: dict[str, Any], *, expect: int | None = None,
        lease: int | None = None,
    ) -> int:
        check_record(kind, name)
        value = json.dumps(doc, sort_keys=True).encode()
        return await self._write(kind, name, value, expect, lease or 0)

    async def delete(self, kind: str, name: str, *, expect: int | None = None) -> int:
        check_record(kind, name)
        return await self._write(kind, name, TOMBSTONE, expect, 0)

    async def _write(self, kind: str, name: str, value: bytes, expect: int | None,
                     lease: int) -> int:
        key = self._key(kind, name)
        if expect is None and value != TOMBSTONE:  # unconditional: one put
            resp = await self._txn([], [self._put_op(key, value, lease)])
            return int(resp.header.revision)
        cur = await self._range(key)
        kv = cur.kvs[0] if cur.kvs else None
        read_at = int(kv.mod_revision) if kv is not None else 0
        live = read_at if kv is not None and bytes(kv.value) != TOMBSTONE else None
        if expect is not None and (live or 0) != expect:
            raise conflict(kind, name, expect, live)
        if value == TOMBSTONE and kv is None:  # nothing to delete
            return await self.clock()
        resp = await self._txn([self._mod_is(key, read_at)], [self._put_op(key, value, lease)])
        if resp.succeeded:
            return int(resp.header.revision)
        if expect is None:  # an unconditional delete raced a write: delete what is there now
            return await self._write(kind, name, value, None, lease)
        now = await self._range(key)
        found = (int(now.kvs[0].mod_revision)
                 if now.kvs and bytes(now.kvs[0].value) != TOMBSTONE else None)
        raise conflict(kind, name, expect, found)

    # --------------------------------------------------------------- leases --

    async def grant_lease(self, ttl: float) -> int | None:
        """A lease of ``ttl`` seconds (rounded up to whole seconds, etcd's unit)."""
        await self._call(self._client.connect())
        lease = await self._call(self._client.lease(max(1, math.ceil(ttl))))
        return int(lease.id)

    async def keep_alive(self, lease: int) -> bool:
        """Renew ``lease``; False if it had expired already (its keys are gone)."""
        reply = await self._call(self._client.refresh_lease(lease))
        return reply is not None and int(reply.TTL) > 0

    async def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now: etcd deletes the keys still attached to it."""
        await self._call(self._client.revoke_lease(lease))

    # ---------------------------------------------------------------- watch --

    async def changed(self, version: int, timeout: float) -> None:
        """Return when the watch saw a revision newer than ``version`` or (re)started, or
        after ``RESYNC_S`` (``timeout``, the polling interval, if longer)."""
        if self._watch_task is None:
            self._watch_from = version + 1
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"topo-etcd-watch {self.location}")
        if self._seen > version:
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(self._wake.wait(), max(timeout, RESYNC_S))

    async def _events(self) -> AsyncIterator[Any]:
        await self._call(self._client.connect())
        watch = await self._call(self._client.watch_prefix(
            self._root, start_revision=self._watch_from))
        self._wake.set()  # (re)started: a watcher reads once what it may have missed
        try:
            async for event in watch:
                yield event
        finally:
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def _watch(self) -> None:
        """The prefix's watch: note each event's revision, remember deletes, wake waiters.

        Restarts after an error from the revision after the last one seen (or,
        if etcd compacted that away, from now: changes_since still covers
        puts and tombstones; only lease-expiry deletes in between are lost).
        """
        while True:
            try:
                async for event in self._events():
                    revision = int(event.kv.mod_revision)
                    if event.kind == aetcd.rtypes.EventKind.DELETE:
                        self._note_delete(bytes(event.kv.key), revision)
                    self._seen = max(self._seen, revision)
                    self._watch_from = self._seen + 1
                    self._wake.set()
            except asyncio.CancelledError:
                raise
            except aetcd.exceptions.RevisionCompactedError as exc:
                log.warning("topo watch on %s: history compacted at %d; watching from now",
                            self.location, exc.compacted_revision)
                self._watch_from = 0
            except Exception as exc:  # etcd down or the stream broke: wake pollers, retry
                log.debug("topo watch on %s broke: %r", self.location, exc)
            self._wake.set()
            await asyncio.sleep(0.5)

    def _note_delete(self, key: bytes, revision: int) -> None:
        parsed = self._parse_key(key)
        if parsed is None:
            return
        self._deleted.pop(key, None)
        self._deleted[key] = Record(parsed[0], parsed[1], None, revision)
        while len(self._deleted) > _DELETES_KEPT:
            del self._deleted[next(iter(self._deleted))]

    async def close(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None:
            await cancel_and_wait([task])
        with contextlib.suppress(Exception):
            await self._client.close()
