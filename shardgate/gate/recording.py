"""What the gate keeps of each statement it runs, and the bounds it runs it under.

:meth:`Recorder.run` runs a statement's work under the session's query
timeout (the shards' statements are cancelled with it: ``DEADLINE_EXCEEDED``,
and an open transaction is rolled back), lists it among the live queries while
it runs (an operator may kill it: ``ABORTED``), checks the merged result
against the result limits (``RESOURCE_EXHAUSTED``), and records it, failed or
not: query statistics, the console's timeline, the query log and the
Prometheus metrics.

The query timeout is watched by one timer per event loop (:class:`Deadlines`),
not one per statement: a statement only adds its deadline to the loop's set
and takes it out when it ends; the timer sleeps until the earliest deadline of
the set, cancels the statements past theirs and sleeps again until the next one
(with statements of one timeout, about once per timeout however many run).
An ``asyncio.timeout`` per statement cost 15-20 us of CPU per point select
(schedule and cancel a timer handle); the set costs about 1 us.

Invariants: every statement :meth:`Recorder.run` starts is recorded exactly
once and leaves the live list and its loop's deadline set, whatever happens to
it; a statement past its deadline is cancelled once, and only its own
``Recorder.run`` turns that cancellation into ``DEADLINE_EXCEEDED``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shardgate.engine.plan import Plan
from shardgate.errors import Aborted, DeadlineExceeded, ShardgateError
from shardgate.gate import metrics as gate_metrics
from shardgate.gate.limits import GateLimits
from shardgate.gate.querylog import LiveQueries, QueryLog
from shardgate.gate.session import Session
from shardgate.gate.stats import Stats, Timeline
from shardgate.result import Result, WireResult, rows_size

R = TypeVar("R")


class Recorder:
    """Runs statements under the gate's bounds and records them (see the module).

    It holds the gate's own limits, statistics, timeline, live list and query
    log (the same objects the gate exposes); ``rollback`` ends a session's
    transaction when its statement times out.
    """

    def __init__(self, limits: GateLimits, stats: Stats, timeline: Timeline,
                 live: LiveQueries, querylog: QueryLog,
                 rollback: Callable[[Session], Awaitable[None]]) -> None:
        self._limits = limits
        self._stats = stats
        self._timeline = timeline
        self._live = live
        self._querylog = querylog
        self._rollback = rollback
        #: each event loop's deadline set (the last one used kept at hand)
        self._deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = \
            weakref.WeakKeyDictionary()
        self._last: Deadlines | None = None

    async def run(self, session: Session, planned: Plan, run: Callable[[], Awaitable[R]],
                  check: Callable[[R], None]) -> R:
        """``run()`` as the statement ``planned``: under the session's query timeout (the
        shards' statements cancelled with it), listed among the live queries (an operator
        may kill it), its answer ``check``-ed, and recorded (statistics, query log,
        metrics), failed or not."""
        start, calls = time.perf_counter(), session.shard_calls
        timeout_ms = (session.query_timeout_ms if session.query_timeout_ms is not None
                      else self._limits.query_timeout_ms)
        live = self._live.start(session, planned.normalized)
        try:
            if timeout_ms and live.task is not None:
                result = await self._with_timeout(session, run, live.task, timeout_ms)
            else:
                result = await run()
            check(result)
        except ShardgateError as exc:
            self._finished(session, planned, start, calls, None, exc.code.value)
            raise
        except asyncio.CancelledError:
            if not live.killed:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._finished(session, planned, start, calls, None, "ABORTED")
            raise Aborted("the statement was killed by an operator") from None
        finally:
            self._live.finish(live)
        self._finished(session, planned, start, calls, result, None)  # type: ignore[arg-type]
        return result

    async def _with_timeout(self, session: Session, run: Callable[[], Awaitable[R]],
                            task: asyncio.Task[Any], timeout_ms: int) -> R:
        """``run()`` (on ``task``) cancelled after ``timeout_ms`` by its loop's
        :class:`Deadlines`: the shards' statements are cancelled with it (the backends
        cancel a statement whose caller is). The rules of ``asyncio.timeout``: the
        cancellation becomes ``DEADLINE_EXCEEDED`` unless the task was also cancelled
        by someone else, and it is taken back (``uncancel``) however ``run`` ended."""
        loop = task.get_loop()
        watch = self._last
        if watch is None or watch.loop is not loop:
            watch = self._deadlines.get(loop)
            if watch is None:
                watch = self._deadlines[loop] = Deadlines(loop)
            self._last = watch
        deadline = Deadline(task, loop.time() + timeout_ms / 1000)
        watch.add(deadline)
        try:
            return await run()
        except asyncio.CancelledError:
            if not deadline.expired or task.uncancel() > deadline.cancelling:
                raise
        except BaseException:
            if deadline.expired:
                task.uncancel()
            raise
        finally:
            watch.discard(deadline)
        note = ""
        if session.in_transaction:
            await self._rollback(session)
            note = "; the transaction was rolled back"
        raise DeadlineExceeded(
            f"the statement ran longer than query_timeout_ms = {timeout_ms} and was "
            f"cancelled on the shards{note}. Raise it with SET query_timeout_ms = N "
            "(0: no timeout), or narrow the statement"
        )

    def check_result(self, result: Result | WireResult) -> None:
        """The merged result against the result limits (each shard's part was checked
        while it arrived; this bounds what the shards add up to)."""
        limits = self._limits.result_limits
        n = len(result.rows)
        if n > 1000 or (limits.max_rows and n > limits.max_rows):
            size = (result.size if type(result) is WireResult
                    else rows_size(result.rows) if limits.max_bytes else 0)  # type: ignore[arg-type]
            limits.check(n, size, "the shards")

    def _finished(self, session: Session, planned: Plan, start: float, calls: int,
                  result: Result | WireResult | None, error: str | None) -> None:
        """Count a finished statement: statistics, query log, metrics."""
        seconds = time.perf_counter() - start
        shard_calls = session.shard_calls - calls
        rows = len(result.rows) if result is not None else 0
        affected = result.rows_affected if type(result) is Result else 0
        self._stats.record(planned.normalized, seconds, rows or affected, shard_calls,
                           error is not None)
        self._timeline.record((session.keyspace or "", ""), seconds, error is not None)
        self._querylog.record(time.time() - seconds, session.keyspace, planned.normalized,
                              seconds, rows or affected, shard_calls, error, session)
        gate_metrics.record(session.keyspace, planned.statement_type, seconds, rows, affected,
                            shard_calls, error)


class Deadline:
    """One statement's deadline (``at``, on its task's loop clock) in a :class:`Deadlines` set."""

    __slots__ = ("at", "cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], at: float) -> None:
        self.task = task
        self.at = at
        #: the task's cancellation requests when the statement started (asyncio.timeout's
        #: rule: the cancellation is the deadline's only if no other one came meanwhile)
        self.cancelling = task.cancelling()
        #: set (once) when the task was cancelled for being past ``at``
        self.expired = False


class Deadlines:
    """The deadlines of the statements running on one event loop, and one timer.

    Invariants: while the set is not empty a timer is scheduled, no later than
    its earliest deadline (``timer_at``); a deadline is expired (its task
    cancelled) at most once, by the timer, once the loop's clock reached it
    (within the loop's 1 ms resolution); the statement takes its deadline out
    when it ends, expired or not. Used from its loop's thread only.
    """

    #: a deadline this close to the clock counts as reached (the loop's timers
    #: themselves fire up to their clock resolution early)
    RESOLUTION_S = 0.001

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: set[Deadline] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    def add(self, deadline: Deadline) -> None:
        self.pending.add(deadline)
        if self.timer is None or deadline.at < self.timer_at:
            self._schedule(deadline.at)

    def discard(self, deadline: Deadline) -> None:
        self.pending.discard(deadline)

    def _schedule(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(at, self._fire)
        self.timer_at = at

    def _fire(self) -> None:
        """Cancel the statements past their deadline; sleep until the next deadline."""
        self.timer = None
        now = self.loop.time() + self.RESOLUTION_S
        later: float | None = None
        for deadline in list(self.pending):
            if deadline.expired:
                continue
            if deadline.at <= now:
                deadline.expired = True
                deadline.task.cancel()
            elif later is None or deadline.at < later:
                later = deadline.at
        if later is not None:
            self._schedule(later)
