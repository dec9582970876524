"""shardgate.aio: waits that never lose the caller's cancellation."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shardgate.aio import cancel_and_wait, wait_for


async def _cancel_as_it_completes(waiter: object) -> str:
    """Run a task whose wait completes in the same loop iteration as it is cancelled;
    return how the task ended."""
    event = asyncio.Event()

    async def body() -> None:
        while True:  # a stream loop: wait with a timeout, go round again
            await waiter(event.wait(), 10)  # type: ignore[operator]
            event.clear()

    task = asyncio.create_task(body())
    await asyncio.sleep(0)  # the task waits on the event
    event.set()  # its wait is done ...
    task.cancel()  # ... and the task is cancelled, in the same iteration
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:
        task.cancel()  # the loop went round again: cancel once more to end the test
        await asyncio.wait([task], timeout=1.0)
        return "still running"
    return "cancelled" if task.cancelled() else "ended otherwise"


async def test_wait_for_keeps_a_cancellation_that_meets_completion() -> None:
    assert await _cancel_as_it_completes(wait_for) == "cancelled"


async def test_asyncio_wait_for_of_311_loses_it() -> None:
    # Why the package bans asyncio.wait_for: on 3.11 the same scenario keeps the loop
    # running (3.12 rebuilt it on asyncio.timeout and keeps the cancellation).
    lost = sys.version_info < (3, 12)
    expected = "still running" if lost else "cancelled"
    assert await _cancel_as_it_completes(asyncio.wait_for) == expected


async def test_wait_for_times_out_and_returns_results() -> None:
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.sleep(10), 0.01)
    assert await wait_for(asyncio.sleep(0, "x"), 1) == "x"


async def test_cancel_and_wait_raises_a_tasks_failure_and_swallows_the_listed() -> None:
    async def fail(exc: BaseException) -> None:
        raise exc

    boom = asyncio.create_task(fail(RuntimeError("boom")))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await cancel_and_wait([boom, None])
    quiet = asyncio.create_task(fail(ValueError("quiet")))
    sleeper = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    await cancel_and_wait([quiet, sleeper], swallow=(ValueError,))
    assert sleeper.cancelled()


async def test_cancel_and_wait_does_not_swallow_the_callers_cancellation() -> None:
    stubborn_started = asyncio.Event()

    async def stubborn() -> None:
        stubborn_started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # takes a while to end
            raise

    inner = asyncio.create_task(stubborn())
    await stubborn_started.wait()
    closer = asyncio.create_task(cancel_and_wait([inner]))
    await asyncio.sleep(0.01)
    closer.cancel()  # the caller is cancelled while it waits
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert closer.cancelled()
    await asyncio.wait([inner])
