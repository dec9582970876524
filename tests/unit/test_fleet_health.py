"""The gate's health loop survives a health call that ends in a stray CancelledError.

grpc.aio ends a call in flight with ``asyncio.CancelledError`` when its connection
is torn down under it (a tablet's host cut off from the network: seen in
tests/integration/production/test_hosts.py). That is no answer, like a timeout,
not a cancellation of the gate's health loop: the loop must keep checking, or the
gate never sees the standby take the shard lease and every call fails
``UNAVAILABLE`` after the failover. A real cancellation (the fleet closing) still
ends the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

from shardgate.errors import TabletUnreachable
from shardgate.gate.fleet import TabletFleet
from shardgate.sql.dialects import Dialect
from shardgate.tablet.client import TabletClient
from shardgate.tablet.registry import KIND, LEASE_HOLDER, SERVING, TabletRecord
from shardgate.topo.local import open_topo


class _Unused:
    """The tablet client the fleet keeps: closed, and a receive stream that never sends
    (as one from a host cut off from the network)."""

    closed = False

    async def close(self) -> None:
        self.closed = True

    async def queue_receive(self, queue: str, max_batch: int = 0) -> AsyncIterator[object]:
        await asyncio.Event().wait()
        yield None  # never reached


@dataclass
class _Health:
    serving: bool
    lease_holder: bool


def _record(alias: str) -> TabletRecord:
    return TabletRecord(
        alias=alias, keyspace="ks", shard="-", address="127.0.0.1:1", role=LEASE_HOLDER,
        health=SERVING, position="", started_at=time.time(), heartbeat_at=time.time(),
        heartbeat_s=60.0, beat=1, dialect="postgres", placeholder="%s",  # type: ignore[arg-type]
        supports_twopc=False, collation="")


async def test_a_stray_cancelled_error_is_no_answer_and_the_loop_goes_on(tmp_path: Path) -> None:
    topo = await open_topo(url=f"sqlite:///{tmp_path / 'topo.db'}")
    await topo.store.put(KIND, "t1", asdict(_record("t1")))
    answers: list[str] = ["ok", "cancelled", "ok"]  # then "ok" for ever
    asked = asyncio.Event()
    clients: list[_Unused] = []

    def connect(rec: TabletRecord, gate_id: str) -> tuple[TabletClient, object]:
        async def health(timeout: float) -> _Health:
            what = answers.pop(0) if answers else "ok"
            if what == "cancelled":
                asked.set()
                raise asyncio.CancelledError  # as grpc.aio raises it: nobody cancelled us
            return _Health(serving=True, lease_holder=True)
        client = _Unused()
        clients.append(client)
        return cast(TabletClient, client), health

    fleet = TabletFleet(topo.store, connect, health_interval=0.02)  # type: ignore[arg-type]
    await fleet.start()
    try:
        assert fleet.pick("ks", "-") is not None
        await asyncio.wait_for(asked.wait(), 5)
        await asyncio.sleep(0)  # the check that got the stray CancelledError has ended
        task = fleet._task
        assert task is not None and not task.done(), "the health loop stopped"
        deadline = time.monotonic() + 5
        while fleet.pick("ks", "-") is None:  # the next answer is seen: serving again
            assert time.monotonic() < deadline, fleet.describe()
            await asyncio.sleep(0.01)
    finally:
        await fleet.close()
        await topo.close()
    assert fleet._task is None and task.cancelled()  # a real cancellation ends the loop
    assert [c.closed for c in clients] == [True]


async def test_a_receive_stream_from_a_tablet_gone_silent_ends(tmp_path: Path) -> None:
    """A holder cut off sends neither batches nor an end: its failing health checks
    end the stream (the queue router then subscribes again, on the new holder)."""
    topo = await open_topo(url=f"sqlite:///{tmp_path / 'topo.db'}")
    await topo.store.put(KIND, "t1", asdict(_record("t1")))
    silent = asyncio.Event()

    def connect(rec: TabletRecord, gate_id: str) -> tuple[TabletClient, object]:
        async def health(timeout: float) -> _Health:
            if silent.is_set():
                raise TabletUnreachable("no answer", sent=False)
            return _Health(serving=True, lease_holder=True)
        return cast(TabletClient, _Unused()), health

    fleet = TabletFleet(topo.store, connect, health_interval=0.02)  # type: ignore[arg-type]
    await fleet.start()
    try:
        stream = fleet.shard("ks", "-", Dialect.POSTGRES, "%s").queue_receive("jobs")
        receiving = asyncio.ensure_future(anext(aiter(stream)))
        await asyncio.sleep(0.1)
        assert not receiving.done()
        silent.set()
        try:
            await asyncio.wait_for(receiving, 5)
        except TabletUnreachable as exc:
            assert exc.sent
        else:
            raise AssertionError("the stream gave a batch")
    finally:
        await fleet.close()
        await topo.close()
