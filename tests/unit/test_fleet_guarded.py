"""The gate's guard on a tablet call: abandoned when the tablet fails its health checks.

The call runs in the caller's own task (no task or watcher of its own); these
check what that must keep: the tablet going down ends the call as
``TabletUnreachable`` (sent), any other cancellation stays a cancellation, a
tablet already down is not sent to, and the bookkeeping ends empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from shardgate.api.grpc.tablet_client import GrpcTabletClient
from shardgate.errors import TabletUnreachable
from shardgate.gate.fleet import _guarded, _Remote
from shardgate.tablet.registry import TabletRecord


@pytest.fixture
async def remote() -> AsyncIterator[_Remote]:
    record = TabletRecord(
        alias="t1", keyspace="ks", shard="-", address="127.0.0.1:1", role="lease_holder",
        health="serving", position="", started_at=time.time(), heartbeat_at=time.time(),
        heartbeat_s=1.0, beat=1, dialect="postgres", placeholder="%s", supports_twopc=False,
        collation="")
    client = GrpcTabletClient(record.address, "ks", "-", "postgres", "%s")  # never dialled
    yield _Remote(record, client, client.health, healthy=True, serving=True)
    await client.close()


async def _answer_after(seconds: float, started: asyncio.Event | None = None) -> str:
    if started is not None:
        started.set()
    await asyncio.sleep(seconds)
    return "answer"


async def test_an_answer_is_returned(remote: _Remote) -> None:
    assert await _guarded(remote, _answer_after(0)) == "answer"
    assert not remote.callers and not remote.abandoned


async def test_a_tablet_going_down_abandons_the_call_as_sent(remote: _Remote) -> None:
    started = asyncio.Event()
    call = asyncio.ensure_future(_guarded(remote, _answer_after(30, started)))
    await started.wait()
    remote.went_down()
    with pytest.raises(TabletUnreachable) as err:
        await asyncio.wait_for(call, 5)
    assert err.value.sent
    assert not remote.callers and not remote.abandoned
    assert call.cancelling() == 0  # the guard's own cancellation was taken back


async def test_other_cancellations_stay_cancellations(remote: _Remote) -> None:
    started = asyncio.Event()
    call = asyncio.ensure_future(_guarded(remote, _answer_after(30, started)))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not remote.callers and not remote.abandoned


async def test_cancelled_and_down_together_is_a_cancellation(remote: _Remote) -> None:
    started = asyncio.Event()
    call = asyncio.ensure_future(_guarded(remote, _answer_after(30, started)))
    await started.wait()
    call.cancel()
    remote.went_down()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not remote.callers and not remote.abandoned


async def test_a_timeout_around_the_call_still_times_out(remote: _Remote) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await _guarded(remote, _answer_after(30))
    assert not remote.callers


async def test_a_tablet_already_down_is_not_sent_to(remote: _Remote) -> None:
    remote.went_down()
    started = asyncio.Event()
    with pytest.raises(TabletUnreachable) as err:
        await _guarded(remote, _answer_after(0, started))
    assert not err.value.sent
    assert not started.is_set()
