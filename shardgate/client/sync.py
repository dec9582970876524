"""Run shardgate's asyncio code from synchronous code: a private event loop thread.

shardgate's core is asyncio; the synchronous clients (the DB-API driver) are a
thin layer on top. A :class:`LoopThread` owns one event loop running forever in
a daemon thread; :meth:`LoopRunner.run` submits a coroutine to it with
:func:`asyncio.run_coroutine_threadsafe` and blocks for the result. Objects
bound to a loop (gRPC channels, a Gate's connection pools) must be created by
a coroutine running on that loop, so create them through :meth:`run` too.

:class:`LoopRunner` does the same for a loop someone else runs (e.g. the
loop an in-process Gate lives on); it refuses to block that loop's own thread,
which would deadlock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds :meth:`LoopThread.close` waits for the loop's thread to finish.
JOIN_TIMEOUT_S = 10.0


class LoopRunner:
    """Runs coroutines on ``loop``, which another thread runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and return its result (or raise its exception).

        ``timeout`` (seconds) cancels it when it takes longer and raises
        :class:`TimeoutError`.
        """
        if _running_loop() is self.loop:
            coro.close()
            raise RuntimeError(
                "cannot block on the event loop from its own thread: "
                "call the synchronous client from another thread, or use the async API"
            )
        if self.loop.is_closed() or not self.loop.is_running():
            coro.close()
            raise RuntimeError("the event loop is not running (closed?)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise


class LoopThread(LoopRunner):
    """A private event loop running in a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "shardgate-loop") -> None:
        super().__init__(asyncio.new_event_loop())
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it, join the thread, close the loop.

        Idempotent. Close what lives on the loop (channels, gates) first, through
        :meth:`run`, so it can shut down cleanly.
        """
        if self.loop.is_closed():
            return
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result(JOIN_TIMEOUT_S)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(JOIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _cancel_others() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    loop = asyncio.get_running_loop()
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
