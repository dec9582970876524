"""The leader's watch of the queue signal table (shardgate.queues.signals), on SQLite.

A signal written after the lease was taken but before the watcher's first read
(another gate's insert right after a new leader started: seen in CI) must wake
its queue, not be recorded as already seen; a consumed one must not.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from shardgate.backends import open_backend
from shardgate.queues import signals
from shardgate.tablet.queue_service import QueueService


async def test_first_read_wakes_pending_signals_only(tmp_path: Path) -> None:
    backend = open_backend(f"sqlite:///{tmp_path / 'shard.db'}")
    try:
        await backend.execute(signals.ddl())
        since = time.time_ns()
        await backend.execute(signals.signal_sql("sqlite", "jobs", since))  # pending
        await backend.execute(signals.signal_sql("sqlite", "mail", since))
        await backend.execute(signals.consumed_sql("?"), ["mail", 1])  # consumed earlier
        svc = QueueService("ks", "-", backend)
        woken: list[tuple[str, int]] = []
        svc._woken_by_signal = lambda q, s: woken.append((q, s))  # type: ignore[method-assign]
        watcher = asyncio.create_task(svc._watch_signals())
        try:
            for _ in range(200):
                if woken:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # further reads must not wake again
            assert woken == [("jobs", since)]
            res = await backend.execute(signals.read_sql())
            assert {q: s for q, _, s in res.rows} == {"jobs": signals.NONE_PENDING,
                                                       "mail": signals.NONE_PENDING}
            await backend.execute(signals.signal_sql("sqlite", "mail", since + 1))
            for _ in range(200):
                if len(woken) > 1:
                    break
                await asyncio.sleep(0.01)
            assert woken == [("jobs", since), ("mail", since + 1)]
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    finally:
        await backend.close()
