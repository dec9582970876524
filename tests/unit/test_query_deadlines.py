"""The query timeout as the gate's recorder runs it: one timer per event loop, not one
per statement (:class:`shardgate.gate.recording.Deadlines`), with asyncio.timeout's rules."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.engine.cursor import ShardQuery
from shardgate.engine.plan import Plan
from shardgate.engine.primitive import Opcode
from shardgate.engine.route import Route
from shardgate.errors import Aborted, DeadlineExceeded
from shardgate.gate.limits import GateLimits
from shardgate.gate.querylog import LiveQueries, QueryLog
from shardgate.gate.recording import Recorder
from shardgate.gate.session import Session
from shardgate.gate.stats import Stats, Timeline
from shardgate.result import Result
from shardgate.sql.parse import parse
from shardgate.sql.statements import StatementType

PLAN = Plan(StatementType.SELECT, "SELECT 1",
            Route(Opcode.UNSHARDED, "ks", False, ShardQuery(parse("SELECT 1"))), "select :vtg1")


DONE = Result(["x"], [(1,)])


def recorder(rolled_back: list[Session] | None = None) -> tuple[Recorder, Stats, LiveQueries]:
    async def rollback(session: Session) -> None:
        session.in_transaction = False
        if rolled_back is not None:
            rolled_back.append(session)

    stats, live = Stats(), LiveQueries()
    return Recorder(GateLimits(), stats, Timeline(), live, QueryLog(), rollback), stats, live


def session(timeout_ms: int) -> Session:
    return Session(keyspace="ks", identity=TRUSTED, query_timeout_ms=timeout_ms)


def sleeping(seconds: float) -> object:
    async def run() -> Result:
        await asyncio.sleep(seconds)
        return DONE

    return run


async def test_a_statement_past_its_timeout_is_deadline_exceeded_and_counted() -> None:
    rec, stats, live = recorder()
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="query_timeout_ms = 50"):
        await rec.run(session(50), PLAN, sleeping(5), lambda r: None)  # type: ignore[arg-type]
    assert 0.04 < time.monotonic() - start < 2.0
    (st,) = stats.snapshot()
    assert (st.count, st.errors) == (1, 1)
    assert not live.snapshot()
    # the task is not left cancelled: it goes on awaiting
    await asyncio.sleep(0.01)


async def test_an_open_transaction_is_rolled_back_on_timeout() -> None:
    rolled: list[Session] = []
    rec, _, _ = recorder(rolled)
    s = session(30)
    s.in_transaction = True
    with pytest.raises(DeadlineExceeded, match="transaction was rolled back"):
        await rec.run(s, PLAN, sleeping(5), lambda r: None)  # type: ignore[arg-type]
    assert rolled == [s]


async def test_a_shorter_timeout_started_later_fires_first() -> None:
    """The loop's one timer sleeps until the earliest deadline, which a statement
    started later with a shorter timeout moves earlier."""
    rec, _, _ = recorder()
    long = asyncio.create_task(rec.run(session(5_000), PLAN, sleeping(0.4),  # type: ignore[arg-type]
                                       lambda r: None))
    await asyncio.sleep(0.02)
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await rec.run(session(50), PLAN, sleeping(5), lambda r: None)  # type: ignore[arg-type]
    assert time.monotonic() - start < 0.3  # not held until the long statement's deadline
    assert await long is DONE


async def test_statements_that_finish_in_time_are_never_cancelled_later() -> None:
    rec, stats, _ = recorder()
    for _ in range(200):
        assert await rec.run(session(30), PLAN, sleeping(0), lambda r: None) is DONE  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # past every deadline those statements had: no stray cancel
    (st,) = stats.snapshot()
    assert (st.count, st.errors) == (200, 0)


async def test_concurrent_statements_each_get_their_own_outcome() -> None:
    rec, _, _ = recorder()
    runs = [rec.run(session(t), PLAN, sleeping(d), lambda r: None)  # type: ignore[arg-type]
            for t, d in ((60, 1.0), (2_000, 0.15), (60, 0.0), (100, 1.0))]
    got = await asyncio.gather(*runs, return_exceptions=True)
    assert [type(g).__name__ for g in got] == ["DeadlineExceeded", "Result", "Result",
                                               "DeadlineExceeded"]


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    """As asyncio.timeout: the caller's own cancellation is not turned into a timeout."""
    rec, _, _ = recorder()
    task = asyncio.create_task(rec.run(session(5_000), PLAN, sleeping(5),  # type: ignore[arg-type]
                                       lambda r: None))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_kill_is_aborted_not_a_timeout() -> None:
    rec, _, live = recorder()
    task = asyncio.create_task(rec.run(session(5_000), PLAN, sleeping(5),  # type: ignore[arg-type]
                                       lambda r: None))
    await asyncio.sleep(0.02)
    (q,) = live.snapshot()
    assert live.kill(q.id)
    with pytest.raises(Aborted, match="killed"):
        await task


async def test_no_timer_per_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the deadline set: 300 statements under a timeout schedule one timer
    on their loop, where asyncio.timeout schedules (and cancels) one each."""
    loop = asyncio.get_running_loop()
    timers: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        timers.append(when)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    rec, _, _ = recorder()
    for _ in range(300):
        await rec.run(session(30_000), PLAN, sleeping(0), lambda r: None)  # type: ignore[arg-type]
    assert len(timers) == 1
