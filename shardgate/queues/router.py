"""The gate's side of queues: CREATE QUEUE, receiving from shards, routing acks.

Transport-free: :class:`~shardgate.gate.Gate` delegates its ``queue_*``
methods here, and the gRPC servicer calls those methods.

* **Receive** merges one subscription per target shard into one stream:
  the first batch carries the user's column names, later ones events, each
  event naming its shard. A shard whose tablet ends the subscription (lease
  moved, tablet restarted) is re-subscribed after a short pause; its unacked
  events are fired again after their ack wait (at least once).
* **Ack** goes to the one shard the event names: no scatter. After a
  reshard's write switch that shard may no longer serve: the ack goes to the
  serving shards covering its key range (the event's row moved to exactly one
  of them; an ack is an idempotent conditional UPDATE by id, so the others
  change nothing).
* **Reshards.** A receive follows the keyspace's serving shards: every
  :data:`FOLLOW_S` it compares them with the shards it reads, subscribes to
  new ones (the targets, once the write switch is published) and ends its
  subscriptions to shards that left (the sources): the receiver is not
  re-subscribed, and the sources' fired, unacked events fire again from the
  targets after their ack wait (at least once).

Both storage modes take this path: a queue table is served by the tablets'
queue managers, a segmented queue (``"storage": "segmented"``) by the
tablets' segmented consumers (:mod:`shardgate.queues.segmented.served`),
whose events are jobs: ``id`` = job id, ``epoch`` = attempt, fields
``job_key``, ``payload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardgate.aio import cancel_and_wait
from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.errors import InvalidArgument, NotFound, ShardgateError, Unsupported
from shardgate.keys import parse_shard_name
from shardgate.ports import GateView, SqlShard
from shardgate.queues.ddl import CreateQueue
from shardgate.queues.events import QueueBatch
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.store import Execute, SegmentedStore

__all__ = ["Execute", "JoinTransaction", "QueueGate", "QueueShard"]
from shardgate.result import Result
from shardgate.sql.statements import DropQueueStatement
from shardgate.topo.vschema_edits import add_table, drop_table
from shardgate.vindexes import SingleColumn
from shardgate.vschema import TableType, VSchema

log = logging.getLogger(__name__)



class QueueShard(SqlShard, Protocol):
    """What the router needs of a tablet client: its SQL and its queue calls."""

    @property
    def placeholder(self) -> str:
        """The shard database's parameter placeholder (``?`` or ``%s``)."""
        ...

    def queue_receive(self, queue: str, max_batch: int = 0) -> AsyncIterator[QueueBatch]:
        """The receiver stream of ``queue`` on the shard (fields first, then batches)."""
        ...

    async def queue_ack(self, queue: str, ids: Sequence[int]) -> int:
        """Ack ``ids`` of ``queue``; how many were acked."""
        ...

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        """The shard's figures of ``queue``."""
        ...

    async def queue_configure(self, queues: Mapping[str, QueueOptions]) -> None:
        """Declare (or update) the shard's queue tables and their options."""
        ...

    async def queue_admin(self, queue: str, action: str, ids: Sequence[int] = ()) -> int:
        """An operator's action on the shard's queue; events changed."""
        ...

    async def queue_nack(self, queue: str, ids: Sequence[int], reason: str,
                         retry_at: int | None = None) -> int:
        """Record a failed attempt of segmented-queue jobs ``ids``."""
        ...

    async def execute(
        self, sql: str, params: Sequence[Any], transaction_id: int | None = None
    ) -> Result:
        """Run ``sql`` on the shard, in tablet transaction ``transaction_id`` if given."""
        ...

    async def begin(self) -> int:
        """Open a tablet transaction; its id."""
        ...

    async def commit(self, transaction_id: int) -> None:
        ...

    async def rollback(self, transaction_id: int) -> None:
        ...

    @property
    def shard(self) -> str:
        """The shard's name."""
        ...

    @property
    def forgets_queues(self) -> bool:
        """Whether :meth:`queue_forget` works here."""
        ...

    async def queue_forget(self, queue: str) -> None:
        """Stop serving ``queue`` (its tables are about to be dropped)."""
        ...

    async def queue_enqueue(self, queue: str, jobs: Sequence[tuple[str, str | None]]) -> list[int]:
        """Store ``(key, payload)`` jobs of a segmented queue; their ids once committed."""
        ...


class QueueDDLGate(GateView[QueueShard], Protocol):
    """The gate as CREATE QUEUE and DROP QUEUE need it: it saves VSchema changes."""

    async def change_vschema(
        self, keyspace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Save a change of the keyspace's VSchema (topo store) and serve it."""
        ...


#: Joins the caller's transaction on ``(keyspace, shard)``: an ``execute(sql, params)``
#: running in it (see :meth:`shardgate.gate.Gate.queue_enqueue`).
JoinTransaction = Callable[[str, str], Awaitable[Execute]]


#: What the router needs of the gate that composes it.
QueueGate = GateView[QueueShard]

#: Seconds before a shard's ended subscription is opened again.
RESUBSCRIBE_PAUSE_S = 0.2
#: Seconds between a receiver's checks that its queue was not dropped.
DROP_CHECK_S = 1.0
#: Seconds between a receive's checks of the keyspace's serving shards (reshards).
FOLLOW_S = 0.1
#: Acked ids a gate remembers per queue to drop copies still on their way.
RECENT_ACKS = 200_000


class _RecentAcks:
    """Ids acked through this gate, newest last (bounded).

    A copy of an event fired again before an earlier copy's ack committed may
    still be buffered between the tablet and the receiver; dropping it here
    means no receiver of this gate gets an event after its ack returned.
    Ids are remembered with their shard: a segmented queue's job ids are only
    unique per shard.
    """

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str, str, int], None] = {}

    def add(self, keyspace: str, queue: str, shard: str, ids: Sequence[int]) -> None:
        for i in ids:
            self.ids[(keyspace, queue, shard, int(i))] = None
        while len(self.ids) > RECENT_ACKS:
            del self.ids[next(iter(self.ids))]

    def live(self, keyspace: str, queue: str, batch: QueueBatch) -> QueueBatch:
        if self.ids:
            batch.events = [e for e in batch.events
                            if (keyspace, queue, e.shard, e.id) not in self.ids]
        return batch


_recent: weakref.WeakKeyDictionary[QueueGate, _RecentAcks] = weakref.WeakKeyDictionary()


def _recent_acks(gate: QueueGate) -> _RecentAcks:
    found = _recent.get(gate)
    if found is None:
        found = _recent[gate] = _RecentAcks()
    return found


@dataclass(frozen=True)
class CreateQueuePrimitive(Primitive):
    """``CREATE QUEUE``: the table on every shard, then the VSchema entry."""

    statement: CreateQueue
    keyspace: str
    gate: QueueDDLGate

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        await create_queue(self.gate, self.statement, self.keyspace)
        return Result()

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "CreateQueue", "Keyspace": {"Name": self.keyspace},
                "Table": self.statement.name}


class HasVSchema(Protocol):
    """A gate as :func:`queue_options_of` reads it."""

    @property
    def vschema(self) -> VSchema: ...


class LocalTablets(HasVSchema, Protocol):
    """A gate as :func:`configure_local` reads it."""

    @property
    def tablets(self) -> Mapping[tuple[str, str], object]: ...


def queue_options_of(gate: HasVSchema, keyspace: str) -> dict[str, QueueOptions]:
    """The queues of ``keyspace`` per the VSchema (both storage modes), with their options."""
    ks = gate.vschema.keyspace(keyspace)
    return {
        t.name.lower(): QueueOptions.from_mapping(t.options, path=f"{keyspace}.tables.{t.name}")
        for t in ks.tables.values()
        if t.type == TableType.QUEUE
    }


def configure_local(gate: LocalTablets) -> None:
    """Tell in-process tablets which of their tables are queues (from the VSchema): when
    the gate opens, and whenever it serves a newer topology (another gate's CREATE QUEUE)."""
    for (ks, _shard), client in gate.tablets.items():
        tablet = getattr(client, "tablet", None)
        queues = getattr(tablet, "queues", None)
        if queues is not None:
            opts = queue_options_of(gate, ks)
            if opts:
                queues.configure(opts)


async def create_queue(gate: QueueDDLGate, cq: CreateQueue, keyspace: str) -> None:
    """``CREATE QUEUE``: check the VSchema change, create the tables on every shard,
    save the VSchema entry (topo store), then declare the queue to the tablets."""
    ks_topo = gate.topology.keyspace(keyspace)
    if ks_topo.sharded and cq.shard_column is None:
        raise InvalidArgument(
            f"CREATE QUEUE {cq.name} in sharded keyspace {keyspace}: add SHARD BY column "
            "[USING vindex] so each event can be placed on a shard"
        )

    if cq.name in gate.vschema.keyspace(keyspace).tables and not cq.if_not_exists:
        raise InvalidArgument(f"table {keyspace}.{cq.name} already exists in the VSchema")

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        return add_table(doc, keyspace, cq.name, cq.vschema_table(),
                         if_not_exists=cq.if_not_exists)

    # Validate the new VSchema before touching any shard.
    trial = {k.name: k.vschema for k in gate.topology.keyspaces.values()}
    trial[keyspace] = change(ks_topo.vschema)
    new_vschema = VSchema.from_json(trial, gate.topology.routing_rules)
    if new_vschema.keyspace(keyspace).tables[cq.name].type != TableType.QUEUE:
        raise InvalidArgument(f"table {keyspace}.{cq.name} exists and is not a queue")
    if cq.segmented:
        _check_segmented_vindex(new_vschema, keyspace, cq, ks_topo.sharded)
    for shard in ks_topo.shards:
        client = gate.tablets[(keyspace, shard.name)]
        if cq.segmented:
            store = SegmentedStore(cq.name, client.dialect, client.placeholder,
                                   max_rows=cq.options.dataset_max_rows,
                                   max_bytes=cq.options.dataset_max_bytes,
                                   marker=cq.options.to_comment())
            await store.ensure_via(client.execute)
            continue
        for stmt in cq.table_ddl(client.dialect):
            await client.execute(stmt, [])
    await gate.change_vschema(keyspace, change)
    for shard in ks_topo.shards:
        await gate.tablets[(keyspace, shard.name)].queue_configure({cq.name: cq.options})


@dataclass(frozen=True)
class DropQueuePrimitive(Primitive):
    """``DROP QUEUE``: the VSchema entry, then the tablets stop serving it, then its tables."""

    statement: DropQueueStatement
    keyspace: str
    gate: QueueDDLGate

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        await drop_queue(self.gate, self.statement, self.keyspace)
        return Result()

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "DropQueue", "Keyspace": {"Name": self.keyspace},
                "Table": self.statement.name}


async def drop_queue(gate: QueueDDLGate, dq: DropQueueStatement, keyspace: str) -> None:
    """``DROP QUEUE``: refused for a table that is not a queue; segmented queues
    are not dropped yet (their dataset tables are many)."""
    table = gate.vschema.keyspace(keyspace).tables.get(dq.name)
    if table is None:
        if dq.if_exists:
            return
        raise NotFound(f"queue {keyspace}.{dq.name} is not in the VSchema")
    if table.type != TableType.QUEUE:
        raise InvalidArgument(f"{keyspace}.{dq.name} is not a queue: use DROP TABLE")
    if table.options.get("storage") == "segmented":
        raise Unsupported(
            f"DROP QUEUE {dq.name}: dropping a segmented queue is not implemented yet; "
            "stop its receivers and drop its tables by hand"
        )
    ks_topo = gate.topology.keyspace(keyspace)
    clients = [gate.tablets[(keyspace, s.name)] for s in ks_topo.shards]
    for client in clients:  # refuse, before any change, when a tablet cannot stop it
        if not client.forgets_queues:
            raise Unsupported(
                f"DROP QUEUE {dq.name}: the tablet of {keyspace}/{client.shard} cannot be "
                "told to stop serving a queue (it is not in this process); drop it through "
                "a gate with in-process tablets (shardgate up)"
            )
    name = table.name
    await gate.change_vschema(keyspace, lambda doc: drop_table(doc, keyspace, name))
    for client in clients:
        await client.queue_forget(name)
        await client.execute(f"DROP TABLE IF EXISTS {name}", [])


def _check_segmented_vindex(vschema: VSchema, keyspace: str, cq: CreateQueue,
                            sharded: bool) -> None:
    if not sharded:
        return
    table = vschema.keyspace(keyspace).tables[cq.name]
    vindex = table.primary.vindex if table.primary is not None else None
    if not isinstance(vindex, SingleColumn) or vindex.needs_cursor:
        raise InvalidArgument(
            f"CREATE QUEUE {cq.name} WITH (storage = segmented): SHARD BY ... USING {cq.vindex} "
            "must name a functional, single-column vindex (hash, xxhash, numeric, ...)")


async def receive(
    gate: QueueGate,
    keyspace: str,
    queue: str,
    *,
    shard: str | None = None,
    key_range: str | None = None,
    max_batch: int = 0,
) -> AsyncIterator[QueueBatch]:
    """Events of ``queue`` from the targeted shards (see the module docstring)."""
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    if table.type != TableType.QUEUE:
        raise InvalidArgument(f"{table.qualified} is not a queue table (type {table.type!r})")
    ks_name = table.keyspace
    if shard is not None:
        gate.topology.keyspace(ks_name).shard(shard)

    def serving() -> list[str]:
        """The shards to read now (they change with a reshard's write switch)."""
        ks = gate.topology.keyspace(ks_name)
        if shard is not None:
            return [shard]
        if key_range is not None:
            return ks.shard_map.shards_for_range(parse_shard_name(key_range))
        return [s.name for s in ks.shards]

    targets = serving()
    out: asyncio.Queue[QueueBatch | BaseException] = asyncio.Queue(maxsize=len(targets) * 2)

    async def pump(name: str) -> None:
        client = gate.tablets[(ks_name, name)]
        subscribed = False
        while True:
            stream = client.queue_receive(table.name, max_batch)
            try:
                async for batch in stream:
                    subscribed = True
                    await out.put(batch)
            except ShardgateError as exc:
                if not subscribed:
                    await out.put(exc)
                    return
                log.info("queue %s on %s/%s: %s; subscribing again", queue, ks_name, name, exc)
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]
            await asyncio.sleep(RESUBSCRIBE_PAUSE_S)
            if await dropped():  # a tablet ends its receivers when the queue is dropped
                return

    async def dropped() -> bool:
        try:
            gate.vschema.find_table(queue, keyspace, keyspace)
        except ShardgateError as exc:
            await out.put(NotFound(f"queue {table.qualified} was dropped: its receivers "
                                   f"end ({exc})"))
            return True
        return False

    pumps: dict[str, asyncio.Task[None]] = {}

    async def watch() -> None:
        # A tablet may be told of the drop before this gate's VSchema says so (or not at
        # all: another gate dropped it), and a resubscription in between would wait forever.
        checked = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(FOLLOW_S)
            if asyncio.get_running_loop().time() - checked >= DROP_CHECK_S:
                checked = asyncio.get_running_loop().time()
                if await dropped():
                    return
            with contextlib.suppress(ShardgateError):
                await follow(serving())

    async def follow(now: list[str]) -> None:
        """Read the shards serving now: subscribe to new ones, leave the others."""
        for name in now:
            if name not in pumps and (ks_name, name) in gate.tablets:
                log.info("queue %s: subscribing to shard %s/%s (it serves now)", queue,
                         ks_name, name)
                pumps[name] = asyncio.create_task(pump(name))
        gone = [n for n in pumps if n not in now]
        for name in gone:
            log.info("queue %s: leaving shard %s/%s (it no longer serves)", queue, ks_name,
                     name)
        await cancel_and_wait([pumps.pop(n) for n in gone], swallow=(Exception,))

    pumps.update((n, asyncio.create_task(pump(n))) for n in targets)
    watcher = asyncio.create_task(watch())
    sent_fields = False
    recent = _recent_acks(gate)
    try:
        while True:
            item = await out.get()
            if isinstance(item, BaseException):
                raise item
            if item.events:
                item = recent.live(ks_name, table.name.lower(), item)
                if not item.events:
                    continue
            if not item.events:
                if not sent_fields:
                    sent_fields = True
                    yield QueueBatch(ks_name, table.name, item.fields, [])
                continue
            yield item
    finally:
        await cancel_and_wait([watcher, *pumps.values()], swallow=(Exception,))


async def enqueue(
    gate: QueueGate, keyspace: str, queue: str, jobs: Sequence[tuple[Any, str | None]], *,
    join: JoinTransaction | None = None,
) -> list[tuple[str, int]]:
    """Store ``(key, payload)`` jobs of a segmented queue, each on the shard its key maps
    to through the queue's primary vindex; returns their ``(shard, job_id)`` in order.

    With ``join`` (a caller's open transaction), the jobs are written in that
    transaction on each shard and become visible when it commits (they vanish
    if it rolls back). Without it, they are committed when this returns: by
    the tablet's group-committing producer for an in-process tablet, in a
    tablet transaction of their own for a remote one.
    """
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    storage = str(table.options.get("storage", "")).lower()
    if table.type != TableType.QUEUE or storage != "segmented":
        raise InvalidArgument(f"{table.qualified} is not a segmented queue; a queue table "
                              "takes INSERT INTO")
    opts = QueueOptions.from_mapping(table.options, path=table.qualified)
    ks = gate.topology.keyspace(table.keyspace)
    shards = [s.name for s in ks.shards]
    by_shard: dict[str, list[int]] = {}
    if ks.sharded:
        vindex = table.primary.vindex if table.primary is not None else None
        if not isinstance(vindex, SingleColumn) or vindex.needs_cursor:
            raise InvalidArgument(f"{table.qualified}: needs a functional column vindex")
        for i, ksids in enumerate(vindex.map([k for k, _ in jobs])):
            if len(ksids) != 1:
                raise InvalidArgument(f"{table.qualified}: key {jobs[i][0]!r} maps to "
                                      f"{len(ksids)} keyspace ids; it needs exactly one")
            by_shard.setdefault(ks.shard_map.find(ksids[0]), []).append(i)
    elif jobs:
        by_shard[shards[0]] = list(range(len(jobs)))
    out: list[tuple[str, int]] = [("", 0)] * len(jobs)

    async def one(shard: str, idx: list[int]) -> None:
        client = gate.tablets[(ks.name, shard)]
        rows = [(str(jobs[i][0]), jobs[i][1]) for i in idx]
        if join is not None:
            store = SegmentedStore(table.name.lower(), client.dialect, client.placeholder,
                                   max_rows=opts.dataset_max_rows,
                                   max_bytes=opts.dataset_max_bytes)
            ids = await store.append_in_transaction(await join(ks.name, shard), rows)
        else:  # the tablet's group-committing producer (in-process or a tablet process)
            ids = await client.queue_enqueue(table.name, rows)
        for i, job_id in zip(idx, ids, strict=True):
            out[i] = (shard, int(job_id))

    await asyncio.gather(*(one(s, idx) for s, idx in by_shard.items()))
    return out


async def _append_own_transaction(
    client: QueueShard, store: SegmentedStore, rows: Sequence[tuple[str, str | None]]
) -> list[int]:
    """Jobs written in a tablet transaction of their own (a remote tablet)."""
    tid = await client.begin()
    try:
        ids = await store.append_in_transaction(
            lambda sql, params: client.execute(sql, params, tid), rows)
    except BaseException:
        with contextlib.suppress(ShardgateError):
            await client.rollback(tid)
        raise
    await client.commit(tid)
    return ids


async def nack(gate: QueueGate, keyspace: str, queue: str, shard: str, ids: Sequence[int],
               reason: str, retry_at: int | None = None) -> int:
    """Record a failed attempt of segmented-queue jobs of one shard (see
    :meth:`~shardgate.queues.segmented.consumer.ShardConsumer.fail`)."""
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    gate.topology.keyspace(table.keyspace).shard(shard)
    return await gate.tablets[(table.keyspace, shard)].queue_nack(
        table.name, list(ids), reason, retry_at)


async def ack(gate: QueueGate, keyspace: str, queue: str, shard: str, ids: Sequence[int]) -> int:
    """Ack events of one shard (the shard their receiver was told)."""
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    ks = gate.topology.keyspace(table.keyspace)
    if any(s.name == shard for s in ks.shards):
        owners = [shard]
    else:  # a reshard moved the shard's rows: to the serving shards of its key range
        try:
            kr = parse_shard_name(shard)
        except ShardgateError:
            ks.shard(shard)  # NotFound, naming the shards
            raise
        owners = ks.shard_map.shards_for_range(kr)
        if not owners:
            ks.shard(shard)
    done = await asyncio.gather(
        *(gate.tablets[(table.keyspace, s)].queue_ack(table.name, list(ids)) for s in owners))
    for s in {shard, *owners}:  # copies fired again by the new owners carry their name
        _recent_acks(gate).add(table.keyspace, table.name.lower(), s, ids)
    return max(done, default=0)  # a tablet's count is of ids known, per shard


async def admin(gate: QueueGate, keyspace: str, queue: str, action: str, *,
                shard: str | None, ids: Sequence[int]) -> int:
    """An operator's action on one queue, on ``shard`` or on every shard of it."""
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    ks = gate.topology.keyspace(table.keyspace)
    shards = [ks.shard(shard).name] if shard is not None else [s.name for s in ks.shards]
    done = await asyncio.gather(
        *(gate.tablets[(ks.name, s)].queue_admin(table.name, action, ids) for s in shards))
    return sum(done)


async def stats(gate: QueueGate, keyspace: str, queue: str) -> list[dict[str, Any]]:
    """Per-shard figures of one queue (see ``QueueService.stats``)."""
    table = gate.vschema.find_table(queue, keyspace, keyspace)
    ks = gate.topology.keyspace(table.keyspace)
    return list(await asyncio.gather(
        *(gate.tablets[(ks.name, s.name)].queue_stats(table.name) for s in ks.shards)))
