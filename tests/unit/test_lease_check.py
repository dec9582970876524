"""ShardLease: a lease check that cannot answer in time loses the lease.

A host cut off from its database (packets dropped, no reset) leaves the holder's check
query waiting on TCP for minutes; the holder must stop firing well before, so a check
that has not answered within ``check_timeout`` counts as a lost lease, even when the
driver's own cancellation of the check waits on the network too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from shardgate.backends import Backend
from shardgate.backends.base import LeaseHandle
from shardgate.tablet.lease import ShardLease


class HangingHandle(LeaseHandle):
    """A lease whose checks never answer once ``cut`` is set, and whose check's
    cancellation takes ``cancel_s`` (a driver cancelling a query over a dead link)."""

    def __init__(self, cancel_s: float) -> None:
        self.conn = cast(Any, None)
        self.cut = False
        self.cancel_s = cancel_s
        self.checks = 0
        self.released = asyncio.Event()

    async def check(self) -> bool:
        self.checks += 1
        if not self.cut:
            return True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(self.cancel_s)
            raise
        return True

    async def release(self) -> None:
        self.released.set()


class OneLease:
    """A backend granting ``handle`` once, then nothing."""

    def __init__(self, handle: LeaseHandle) -> None:
        self.handle: LeaseHandle | None = handle

    async def try_lease(self, name: str) -> LeaseHandle | None:
        handle, self.handle = self.handle, None
        return handle


async def test_a_check_that_cannot_answer_loses_the_lease_in_time() -> None:
    handle = HangingHandle(cancel_s=30.0)
    acquired, lost = asyncio.Event(), asyncio.Event()

    async def on_acquired(h: LeaseHandle) -> None:
        acquired.set()

    async def on_lost() -> None:
        lost.set()

    lease = ShardLease(cast(Backend, OneLease(handle)), "ks/0", on_acquired=on_acquired,
                       on_lost=on_lost, retry_interval=0.05, check_interval=0.05,
                       check_timeout=0.3)
    lease.start()
    try:
        await asyncio.wait_for(acquired.wait(), 5)
        while handle.checks < 2:  # answered checks keep the lease
            await asyncio.sleep(0.01)
        assert lease.held and not lost.is_set()
        handle.cut = True
        cut = time.monotonic()
        await asyncio.wait_for(lost.wait(), 5)
        took = time.monotonic() - cut
        # one check interval, then the check's time limit; not the 30 s cancellation
        assert took < 0.05 + 0.3 + 0.5, took
        assert not lease.held
        await asyncio.wait_for(handle.released.wait(), 1)
    finally:
        await lease.close()


async def test_answered_checks_keep_the_lease() -> None:
    handle = HangingHandle(cancel_s=0.0)
    lost = asyncio.Event()

    async def on_acquired(h: LeaseHandle) -> None:
        pass

    async def on_lost() -> None:
        lost.set()

    lease = ShardLease(cast(Backend, OneLease(handle)), "ks/0", on_acquired=on_acquired,
                       on_lost=on_lost, check_interval=0.02, check_timeout=0.3)
    lease.start()
    try:
        while handle.checks < 10:
            await asyncio.sleep(0.01)
        assert lease.held and not lost.is_set()
    finally:
        await lease.close()
