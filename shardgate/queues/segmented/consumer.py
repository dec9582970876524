"""The consumer of one segmented queue on one shard: ordering, retries, compaction.

One :class:`ShardConsumer` runs per shard and queue, only while it holds the
queue's lease on the shard (``shardgate/<ks>/<shard>/segmented/<queue>``,
the same kind of database lock as the tablet's lease); all its writes
(status rows, compaction) go through the lease's own connection, so if the
lease is lost the next write fails. Any database error in a read or write
makes it drop the lease and all its memory and start over from the tables
(:attr:`ShardConsumer.restarts`); only a bug stops it for good
(:attr:`ShardConsumer.failure`).

Parts
-----
* **The read cursor** (``_read_n``, ``_last_id``): jobs are read in
  ``(dataset, job_id)`` order, ``read_batch`` at a time, while fewer than
  ``cache_size`` are pending in memory. Job ids increase per shard in commit
  order (see :mod:`~shardgate.queues.segmented.store`), so ``job_id > last``
  misses nothing. The cursor leaves a dataset only after a read that started
  after the catalog showed the dataset ``closed`` returned its end: from then
  on the dataset is *fully read*. Jobs stored before this consumer started
  are matched with their dataset's latest status rows (one scan of the
  status table per dataset): terminal ones are skipped; ``executing`` (a
  crash mid-flight), ``failed`` and ``pending`` ones are pending again,
  keeping their attempt count. Later jobs can only have rows this consumer
  writes, so they are read from the jobs table alone.
* **Pending jobs** (``_jobs``), per key in id order (``_keys``), and a heap of
  job ids that may be runnable (``_runnable``, checked when popped). A job is
  handed out when it is ``ready``, due, and either first of its key or its key
  is *hot*. A failed job waits ``clamp(min_backoff * 2^attempt, min, max)``,
  still first of its key, so later jobs of that key wait while other keys go
  on. After ``max_attempts`` it is ``aborted`` and its key moves on.
* **The circuit breaker**: a key with more than ``hot_key_threshold`` pending
  jobs is hot for ``hot_key_cooldown`` seconds: its jobs are handed out
  without waiting for each other.
* **Status rows**: every change (``executing``, ``succeeded``, ``failed``,
  ``aborted``, ``pending``) is appended to the job's dataset. Rows are
  gathered while one write runs and written together (one INSERT per dataset
  touched), on PostgreSQL with ``synchronous_commit = off`` (a status row lost
  in a server crash means the job runs again: at least once). Whoever asked
  for a row returns once it is committed.
* **Compaction** (every ``compaction_interval``): datasets that are closed,
  fully read and have no pending job are dropped whole (``DROP TABLE``);
  the leading run of closed, fully read datasets is merged into one when it
  has two or more datasets and at most ``merge_max_rows`` pending jobs (so
  the count of datasets goes down). A merge holds the status writer, so it
  pauses handing out and acking for at most the time to copy
  ``merge_max_rows`` jobs and their status rows; producers never wait for it
  (they only write the open dataset).
* **Operator actions** (``<queue>_actions``): ``retry`` makes a waiting job
  due now, or re-queues an ``aborted`` job still in a live dataset; ``abort``
  aborts a pending job (also one not read yet). Applied in order at start and
  every compaction interval, then deleted.

Invariants
----------
1. A job is handed out only if it is pending in memory; it leaves memory only
   after its ``succeeded`` / ``aborted`` row committed, and a job whose
   terminal row committed is never read back as pending. So no job is handed
   out after its success committed (acks of other copies are ignored).
2. Per key, a job is handed out only when every earlier job of the key is
   done (succeeded or aborted), unless the key is hot.
3. A dataset is dropped only when it is closed, fully read and none of its
   jobs is pending: every job in it has a terminal status.
4. A merge copies exactly the pending jobs of its sources with their status
   history, switches the catalog in the same transaction, and only then
   drops the sources; pending jobs point at the new dataset afterwards.
5. ``in_flight <= max_in_flight`` (when set); memory holds at most
   ``cache_size`` pending jobs plus one read batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardgate.aio import cancel_and_wait, wait_for
from shardgate.backends import Backend, Connection
from shardgate.backends.base import LeaseHandle, transaction
from shardgate.errors import FailedPrecondition, NotFound, ShardgateError, Unavailable
from shardgate.queues import metrics
from shardgate.queues.options import QueueOptions
from shardgate.queues.segmented.ddl import (
    ABORTED,
    CLOSED,
    DATASET_STEP,
    DROPPING,
    EXECUTING,
    FAILED,
    MERGING,
    OPEN,
    PENDING,
    READY,
    SUCCEEDED,
    TERMINAL,
)
from shardgate.queues.segmented.store import Dataset, SegmentedStore, StoredJob

log = logging.getLogger(__name__)

DEFAULT_READ_BATCH = 2000
DEFAULT_POLL_INTERVAL_S = 0.05
DEFAULT_COMPACTION_INTERVAL_S = 1.0
DEFAULT_LEASE_RETRY_S = 0.5
_NS = 1_000_000_000

# in-memory job states
_READY = 0
_EXECUTING = 1
_WAITING = 2  # failed, waiting for its retry time
_FINISHING = 3  # terminal status row being written


@dataclass(slots=True)
class SegmentedJob:
    """A job handed to a worker. Ack or fail it by ``(shard, job_id)``."""

    shard: str
    job_id: int
    key: str
    payload: str | None
    attempt: int
    created: int


@dataclass(slots=True, eq=False)
class _Job:
    job_id: int
    n: int
    key: str
    payload: str | None
    created: int
    attempt: int
    state: int = _READY
    due: int = 0
    queued: bool = False


class ShardConsumer:
    """Hands out, retries and compacts one segmented queue on one shard (see the module
    docstring for its parts and invariants)."""

    def __init__(
        self,
        *,
        keyspace: str,
        shard: str,
        store: SegmentedStore,
        backend: Backend,
        options: QueueOptions,
        read_batch: int = DEFAULT_READ_BATCH,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        compaction_interval: float = DEFAULT_COMPACTION_INTERVAL_S,
        lease_retry: float = DEFAULT_LEASE_RETRY_S,
        on_runnable: Callable[[], None] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.keyspace = keyspace
        self.shard = shard
        self.store = store
        self.backend = backend
        self.options = options
        self.read_batch = read_batch
        self.poll_interval = poll_interval
        self.compaction_interval = compaction_interval
        self.lease_retry = lease_retry
        self.on_runnable = on_runnable
        self._clock = clock
        #: set when the consumer stopped for good (a bug, not a database error)
        self.failure: ShardgateError | None = None
        #: the database error that made it drop its state and start over, if any
        self.last_error: ShardgateError | None = None
        self.restarts = 0
        self.leader = False
        self._lease: LeaseHandle | None = None
        self._writer: Connection | None = None
        self._write_lock = asyncio.Lock()
        self._broken: ShardgateError | None = None
        self._reset_state()
        self._status_buf: list[tuple[_Job, int, str, str | None, int]] = []
        self._status_waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.max_pause = 0.0
        self.counts = collections.Counter[str]()
        self._labels = (keyspace, shard, store.names.queue)

    def _reset_state(self) -> None:
        """Forget everything held in memory (it is all re-read from the tables)."""
        self._jobs: dict[int, _Job] = {}
        self._keys: dict[str, collections.deque[int]] = {}
        self._runnable: list[int] = []
        self._retries: list[tuple[int, int]] = []
        self._deadlines: collections.deque[tuple[int, list[_Job], list[int]]] = (
            collections.deque())
        self._hot: dict[str, int] = {}
        self._outstanding: dict[int, int] = {}
        self._fully_read: set[int] = set()
        self._datasets: list[Dataset] = []
        self._catalog: list[Dataset] = []
        self._view: list[int] = []
        self._read_n = 0
        self._last_id = 0
        self._recovering = 0
        self._recover_states: dict[int, dict[int, tuple[int, str]]] = {}
        #: jobs not read yet that an operator aborted (skipped when read)
        self._skip: set[int] = set()
        self._in_flight = 0

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Compete for the lease and run once it is held (idempotent; needs a loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._main())

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until this consumer holds the lease and has recovered its state."""
        await wait_for(self._ready.wait(), timeout)

    async def close(self) -> None:
        """Stop; write the status rows already asked for; release the lease."""
        task, self._task = self._task, None
        await cancel_and_wait([task], swallow=(ShardgateError,))
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(ShardgateError, asyncio.CancelledError):
                await self._flusher
        self.leader = False
        if self._lease is not None:
            await self._lease.release()
            self._lease = None
        self._writer = None
        self._fail_waiters(Unavailable(f"segmented queue {self.store.names.queue} on "
                                       f"{self.keyspace}/{self.shard}: consumer closed"))

    @property
    def lease_name(self) -> str:
        return f"shardgate/{self.keyspace}/{self.shard}/segmented/{self.store.names.queue}"

    async def _main(self) -> None:
        while True:
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except ShardgateError as exc:  # lost lease or database: start over from the tables
                await self._lose(exc)
            except Exception as exc:  # a bug: stop loudly rather than loop or hang the workers
                log.exception("segmented consumer %s/%s crashed", self.keyspace, self.shard)
                self._stop(FailedPrecondition(f"segmented consumer crashed: {exc!r}"))
                return
            await asyncio.sleep(self.lease_retry)

    async def _serve(self) -> None:
        while self._lease is None:
            self._lease = await self.backend.try_lease(self.lease_name)
            if self._lease is None:
                await asyncio.sleep(self.lease_retry)
        self._writer = self._lease.conn
        relaxed = self.store.sql.relaxed_durability_sql
        if relaxed is not None:  # PostgreSQL: no WAL flush wait per status batch
            await self._writer.execute(relaxed)
        async with self._write_lock:
            live = await self.store.recover(self._writer)
            await self.store.add_spare(self._writer)
        self._set_datasets(live)
        self._read_n = min((d.n for d in self._datasets), default=0)
        # jobs stored before now may have status rows (an earlier consumer's); later
        # ones get theirs only from this consumer, so they are read without a lookup
        self._recovering = max((d.next_id for d in self._datasets), default=0)
        self._broken = None
        self.leader = True
        await self._apply_actions()  # operators' requests made while no consumer ran
        await self._read()
        self._ready.set()
        next_compaction = time.monotonic() + self.compaction_interval
        while True:
            if self._broken is not None:
                raise self._broken
            self._wake.clear()
            self._timers()
            got = await self._read()
            if time.monotonic() >= next_compaction:
                await self._apply_actions()
                await self.compact()
                self._refresh_metrics()
                next_compaction = time.monotonic() + self.compaction_interval
            if got:
                continue
            with contextlib.suppress(TimeoutError):
                await wait_for(self._wake.wait(), self._sleep_for())

    async def _lose(self, exc: ShardgateError) -> None:
        """A write or read failed: drop the lease and all state; :meth:`_main` starts over
        (jobs handed out meanwhile are handed out again: at least once)."""
        log.warning("segmented queue %s on %s/%s: %s; starting over from the tables",
                    self.store.names.queue, self.keyspace, self.shard, exc)
        self.leader = False
        self.last_error = exc
        self.restarts += 1
        self._ready.clear()
        async with self._write_lock:
            self._fail_waiters(exc)
            self._reset_state()
            lease, self._lease, self._writer = self._lease, None, None
        if lease is not None:
            await lease.release()

    def _stop(self, exc: ShardgateError) -> None:
        log.warning("segmented queue %s on %s/%s stopped: %s", self.store.names.queue,
                    self.keyspace, self.shard, exc)
        self.failure = exc
        self.leader = False
        self._fail_waiters(exc)
        if self.on_runnable is not None:
            self.on_runnable()

    def _fail_waiters(self, exc: ShardgateError) -> None:
        waiters, self._status_waiters = self._status_waiters, []
        self._status_buf = []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    def wake(self) -> None:
        """New jobs were stored on this shard (in-process producers call this)."""
        self._wake.set()

    def _sleep_for(self) -> float:
        now = self._clock()
        until = self.poll_interval
        if self._retries:
            until = min(until, max(0.0, (self._retries[0][0] - now) / _NS))
        if self._deadlines:
            until = min(until, max(0.0, (self._deadlines[0][0] - now) / _NS))
        return max(until, 0.001)

    # -- reading ----------------------------------------------------------------------

    def _set_datasets(self, live: Sequence[Dataset]) -> None:
        self._catalog = list(live)
        self._datasets = [d for d in live if d.state in (OPEN, CLOSED)]

    async def _refresh(self, conn: Connection) -> None:
        self._set_datasets(await self.store.datasets(conn))

    def _current(self) -> Dataset | None:
        for d in self._datasets:
            if d.n >= self._read_n and d.n not in self._fully_read:
                return d
        return None

    async def _read(self) -> int:
        """Read new jobs up to the free room; return how many were read."""
        room = self.options.cache_size - len(self._jobs)
        if room <= 0:
            return 0
        total = 0
        conn = await self.backend.acquire()
        try:
            refreshed = False
            while room > 0:
                d = self._current()
                if d is None:
                    if refreshed:
                        break
                    await self._refresh(conn)
                    refreshed = True
                    continue
                self._read_n = d.n
                closed_before = d.state == CLOSED
                limit = min(room, self.read_batch)
                rows = await self.store.read_jobs(conn, d.n, self._last_id, limit)
                if self._last_id < self._recovering:
                    # stored before this consumer started: an earlier one may have written
                    # status rows; later jobs get theirs only from this consumer
                    states = self._recover_states.get(d.n)
                    if states is None:
                        states = await self.store.latest_states(conn, d.n)
                        self._recover_states = {d.n: states}
                    rows = [StoredJob(r.job_id, r.key, r.payload, r.created, *states[r.job_id])
                            if r.job_id in states else r for r in rows]
                elif self._recover_states:
                    self._recover_states = {}
                for row in rows:
                    self._add(d.n, row)
                if rows:
                    self._last_id = rows[-1].job_id
                    if self.on_runnable is not None:
                        self.on_runnable()
                total += len(rows)
                room -= len(rows)
                if len(rows) == limit:
                    continue
                if closed_before:
                    self._fully_read.add(d.n)
                    continue
                if refreshed:
                    break
                await self._refresh(conn)
                refreshed = True
        finally:
            await self.backend.release(conn)
        return total

    def _add(self, n: int, row: StoredJob) -> None:
        if row.state in TERMINAL or (self._skip and row.job_id in self._skip):
            self._skip.discard(row.job_id)
            return
        job = _Job(row.job_id, n, row.key, row.payload, row.created, row.attempt)
        self._jobs[job.job_id] = job
        self._outstanding[n] = self._outstanding.get(n, 0) + 1
        keyq = self._keys.get(job.key)
        if keyq is None:  # the common case: a key with no pending job
            self._keys[job.key] = collections.deque((job.job_id,))
            job.queued = True
            heapq.heappush(self._runnable, job.job_id)
            return
        if keyq and keyq[-1] > job.job_id:  # re-queued by an operator: keep id order
            items = sorted([*keyq, job.job_id])
            keyq.clear()
            keyq.extend(items)
        else:
            keyq.append(job.job_id)
        if len(keyq) > self.options.hot_key_threshold and job.key not in self._hot:
            self._hot[job.key] = self._clock() + int(self.options.hot_key_cooldown * _NS)
            for jid in keyq:
                self._push(self._jobs[jid])
        elif keyq[0] == job.job_id or job.key in self._hot:
            self._push(job)

    def _push(self, job: _Job) -> None:
        if not job.queued and job.state == _READY:
            job.queued = True
            heapq.heappush(self._runnable, job.job_id)
            if self.on_runnable is not None:
                self.on_runnable()

    def _is_hot(self, key: str, now: int) -> bool:
        until = self._hot.get(key)
        if until is None:
            return False
        if until > now:
            return True
        del self._hot[key]
        return False

    # -- handing out ------------------------------------------------------------------

    def holds(self, job_id: int) -> bool:
        """Whether job ``job_id`` is pending in memory (not finished)."""
        return int(job_id) in self._jobs

    def has_runnable(self) -> bool:
        """Whether :meth:`pick` may return jobs now (or raise this consumer's failure)."""
        if self.failure is not None:
            return True
        limit = self.options.max_in_flight
        return bool(self._runnable) and self.leader and (not limit or self._in_flight < limit)

    def _signal(self) -> None:
        if self.on_runnable is not None and self._runnable:
            self.on_runnable()

    def pick(self, max_n: int) -> list[_Job]:
        """Take up to ``max_n`` runnable jobs (marked executing in memory; the caller
        writes their status with :meth:`started`)."""
        if self.failure is not None:
            raise self.failure
        if not self.leader:
            return []
        out: list[_Job] = []
        now = self._clock()
        limit = self.options.max_in_flight
        heap = self._runnable
        while heap and len(out) < max_n and (not limit or self._in_flight < limit):
            job = self._jobs.get(heapq.heappop(heap))
            if job is None or not job.queued:
                continue
            job.queued = False
            if job.state != _READY:
                continue
            keyq = self._keys[job.key]
            if keyq[0] != job.job_id and not self._is_hot(job.key, now):
                continue
            job.state = _EXECUTING
            job.attempt += 1
            self._in_flight += 1
            out.append(job)
        if out:
            self._deadlines.append((now + int(self.options.ack_wait * _NS), out,
                                    [j.attempt for j in out]))
        return out

    async def started(self, jobs: Sequence[_Job]) -> list[SegmentedJob]:
        """Append the ``executing`` rows of picked jobs; return them once committed."""
        now = self._clock()
        try:
            await self._write([(j, j.attempt, EXECUTING, None, now) for j in jobs])
        except asyncio.CancelledError:
            # The caller went away before getting them: they are ready again at once
            # (their executing rows may still commit; the next attempt writes its own).
            for j in jobs:
                if j.state == _EXECUTING:
                    j.state = _READY  # keeps its attempt number: the next one is new
                    self._in_flight -= 1
                    self._push(j)
            raise
        self.counts["executing"] += len(jobs)
        metrics.SEG_EXECUTING.labels(*self._labels).inc(len(jobs))
        return [SegmentedJob(self.shard, j.job_id, j.key, j.payload, j.attempt, j.created)
                for j in jobs]

    def release(self, jobs: Sequence[tuple[int, int]]) -> int:
        """Give back ``(job_id, attempt)`` pairs handed out and not finished (their
        receiver went away): each still executing in that attempt is ready again at once,
        first of its key, without a status row (the next attempt writes its own
        ``executing`` row). Returns how many were released."""
        n = 0
        for job_id, attempt in jobs:
            j = self._jobs.get(int(job_id))
            if j is None or j.state != _EXECUTING or j.attempt != attempt:
                continue
            j.state = _READY
            self._in_flight -= 1
            self._push(j)
            n += 1
        if n:
            self._wake.set()
            self._signal()
        return n

    async def ack(self, job_ids: Sequence[int]) -> int:
        """Record success of ``job_ids``; return how many were pending (the others were
        done already). Returns once the ``succeeded`` rows committed."""
        jobs = self._finishing(job_ids)
        if not jobs:
            return 0
        now = self._clock()
        await self._write([(j, j.attempt, SUCCEEDED, None, now) for j in jobs])
        for j in jobs:
            self._done(j)
        self._signal()  # room under max_in_flight again
        self.counts["succeeded"] += len(jobs)
        metrics.SEG_SUCCEEDED.labels(*self._labels).inc(len(jobs))
        return len(jobs)

    async def fail(self, job_ids: Sequence[int], reason: str, *,
                   retry_at: int | None = None) -> int:
        """Record a failed attempt of ``job_ids`` (executing ones): each is retried after
        its backoff (or at ``retry_at``, ns since the epoch, if later than now),
        blocking the later jobs of its key, or aborted once out of attempts.
        Returns how many were executing."""
        jobs = [j for j in (self._jobs.get(int(i)) for i in job_ids)
                if j is not None and j.state == _EXECUTING]
        return await self._fail(jobs, reason, retry_at=retry_at)

    async def _fail(self, jobs: Sequence[_Job], reason: str, *,
                    retry_at: int | None = None) -> int:
        if not jobs:
            return 0
        now = self._clock()
        rows = []
        aborted: list[_Job] = []
        retried: list[_Job] = []
        for j in jobs:
            if j.state == _EXECUTING:
                self._in_flight -= 1
            if self.options.max_attempts and j.attempt >= self.options.max_attempts:
                j.state = _FINISHING
                rows.append((j, j.attempt, ABORTED,
                             f"{reason} (attempt {j.attempt} of {self.options.max_attempts})",
                             now))
                aborted.append(j)
            else:
                j.state = _WAITING
                j.due = (now + self._backoff(j.attempt) if retry_at is None
                         else max(now, int(retry_at)))
                rows.append((j, j.attempt, FAILED, reason, now))
                retried.append(j)
        await self._write(rows)
        for j in aborted:
            self._done(j, was_executing=False)
        for j in retried:
            heapq.heappush(self._retries, (j.due, j.job_id))
        self._wake.set()
        self._signal()
        self.counts["failed"] += len(retried)
        self.counts["aborted"] += len(aborted)
        metrics.SEG_FAILED.labels(*self._labels).inc(len(retried))
        metrics.SEG_ABORTED.labels(*self._labels).inc(len(aborted))
        return len(jobs)

    def _backoff(self, attempt: int) -> int:
        o = self.options
        delay = o.min_backoff * (2 ** min(attempt - 1, 30)) * random.uniform(0.67, 1.33)
        delay = max(o.min_backoff, delay)
        if o.max_backoff:
            delay = min(o.max_backoff, delay)
        return int(delay * _NS)

    def _finishing(self, job_ids: Sequence[int]) -> list[_Job]:
        out = []
        for i in job_ids:
            j = self._jobs.get(int(i))
            if j is None or j.state == _FINISHING:
                continue
            if j.state == _EXECUTING:
                self._in_flight -= 1
            j.state = _FINISHING
            out.append(j)
        return out

    def _done(self, job: _Job, *, was_executing: bool = False) -> None:
        """Forget a job whose terminal row committed; let its key's next job run."""
        if was_executing:
            self._in_flight -= 1
        del self._jobs[job.job_id]
        left = self._outstanding.get(job.n, 1) - 1
        self._outstanding[job.n] = left
        keyq = self._keys[job.key]
        if keyq[0] == job.job_id:
            keyq.popleft()
        else:
            keyq.remove(job.job_id)
        if not keyq:
            del self._keys[job.key]
        else:
            nxt = self._jobs[keyq[0]]
            self._push(nxt)

    def _timers(self) -> None:
        """Retries that are due become ready; executing jobs past ack_wait fail."""
        now = self._clock()
        while self._retries and self._retries[0][0] <= now:
            _, jid = heapq.heappop(self._retries)
            job = self._jobs.get(jid)
            if job is not None and job.state == _WAITING and job.due <= now:
                job.state = _READY
                self._push(job)
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, jobs, attempts = self._deadlines.popleft()
            for job, attempt in zip(jobs, attempts, strict=True):
                if job.state == _EXECUTING and job.attempt == attempt and (
                        self._jobs.get(job.job_id) is job):
                    expired.append(job)
        if expired:
            asyncio.get_running_loop().create_task(self._expire(expired))

    async def _expire(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if j.state == _EXECUTING]
        with contextlib.suppress(ShardgateError):
            await self._fail(live, f"no ack within ack_wait ({self.options.ack_wait:g} s)")

    # -- status writes ----------------------------------------------------------------

    async def _write(self, rows: Sequence[tuple[_Job, int, str, str | None, int]]) -> None:
        if self.failure is not None:
            raise self.failure
        if not self.leader:
            raise self._not_leader()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._status_buf.extend(rows)
        self._status_waiters.append(fut)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        await fut

    async def _flush(self) -> None:
        while self._status_buf:
            async with self._write_lock:
                rows, self._status_buf = self._status_buf, []
                waiters, self._status_waiters = self._status_waiters, []
                by_n: dict[int, list[tuple[int, int, str, str | None, int]]] = {}
                for job, attempt, state, reason, at in rows:
                    by_n.setdefault(job.n, []).append((job.job_id, attempt, state, reason, at))
                try:
                    conn = self._conn()
                    if len(by_n) == 1:
                        for n, part in by_n.items():
                            await self.store.append_status(conn, n, part)
                    else:
                        async with transaction(conn):
                            for n, part in by_n.items():
                                await self.store.append_status(conn, n, part)
                except ShardgateError as exc:
                    for fut in waiters:
                        if not fut.done():
                            fut.set_exception(exc)
                    self._broken = exc  # the main task starts over
                    self._wake.set()
                    return
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)

    def _conn(self) -> Connection:
        if self._writer is None:
            raise self._not_leader()
        return self._writer

    def _not_leader(self) -> ShardgateError:
        return Unavailable(f"segmented queue {self.store.names.queue} on "
                           f"{self.keyspace}/{self.shard}: this consumer does not hold the "
                           "lease now (starting over, or another process consumes the shard)")

    # -- operator actions -------------------------------------------------------------

    async def _apply_actions(self) -> None:
        conn = await self.backend.acquire()
        try:
            actions = await self.store.actions_after(conn, 0)
        finally:
            await self.backend.release(conn)
        for action_id, job_id, action, reason in actions:
            try:
                await self._apply(job_id, action, reason or f"{action} by operator")
            except NotFound as exc:
                log.warning("segmented queue %s: action %s on job %s ignored: %s",
                            self.store.names.queue, action, job_id, exc.message)
            async with self._write_lock:
                await self._conn().execute(
                    f"DELETE FROM {self.store.names.actions} WHERE id = {self.store.ph}",
                    [action_id])

    async def _apply(self, job_id: int, action: str, reason: str) -> None:
        job = self._jobs.get(job_id)
        now = self._clock()
        if job is not None:
            if action == "abort":
                if job.state == _FINISHING:
                    return
                was = job.state == _EXECUTING
                job.state = _FINISHING
                await self._write([(job, job.attempt, ABORTED, reason, now)])
                self._done(job, was_executing=was)
                self.counts["aborted"] += 1
            elif job.state == _WAITING:
                job.state = _READY
                job.due = now
                self._push(job)
            return
        async with self._write_lock:
            found = await self.store.find_job(self._conn(), job_id)
        if found is None:
            raise NotFound(f"job {job_id} is in no live dataset (done and dropped, or never "
                           "stored on this shard)")
        d, stored = found
        if stored.state in TERMINAL and action == "abort":
            return
        if action == "abort":
            async with self._write_lock:
                await self.store.append_status(self._conn(), d.n, [
                    (job_id, stored.attempt, ABORTED, reason, now)])
            if job_id > self._last_id:
                self._skip.add(job_id)
            return
        if stored.state != ABORTED:
            return  # not read yet (it will be) or already succeeded: nothing to retry
        async with self._write_lock:
            await self.store.append_status(self._conn(), d.n, [
                (job_id, stored.attempt, PENDING, reason, now)])
        if job_id <= self._last_id:
            self._add(d.n, StoredJob(job_id, stored.key, stored.payload, stored.created,
                                     stored.attempt, PENDING))

    # -- compaction -------------------------------------------------------------------

    async def compact(self) -> tuple[list[int], list[int]]:
        """One compaction step: drop done datasets, merge the leading ones if that lowers
        their count. Returns ``(dropped, merged)`` dataset numbers."""
        if self._writer is None or self.failure is not None:
            return [], []
        dropped: list[int] = []
        merged: list[int] = []
        async with self._write_lock:
            t0 = time.monotonic()
            conn = self._conn()
            await self._refresh(conn)
            done = [d.n for d in self._datasets if d.state == CLOSED and d.n in self._fully_read
                    and self._outstanding.get(d.n, 0) == 0]
            if done:
                keep = [d.n for d in self._datasets if d.n not in done]
                await self.store.drop_datasets(conn, done, keep)
                for n in done:
                    self._outstanding.pop(n, None)
                    self._fully_read.discard(n)
                dropped = done
                metrics.SEG_DROPPED.labels(*self._labels).inc(len(done))
                await self._refresh(conn)
            prefix: list[Dataset] = []
            total = 0
            cap = min(self.options.merge_max_rows, self.options.dataset_max_rows)
            for d in self._datasets:
                if d.state != CLOSED or d.n not in self._fully_read:
                    break
                c = self._outstanding.get(d.n, 0)
                if total + c > cap:
                    break
                prefix.append(d)
                total += c
            if len(prefix) >= 2 and (prefix[-1].n + 1) % DATASET_STEP != 0:
                sources = {d.n for d in prefix}
                moving = [j for j in self._jobs.values() if j.n in sources]
                keep = [d.n for d in self._datasets if d.n not in sources]
                target = await self.store.merge(conn, prefix, [j.job_id for j in moving], keep)
                for j in moving:
                    j.n = target.n
                for n in sources:
                    self._outstanding.pop(n, None)
                    self._fully_read.discard(n)
                self._outstanding[target.n] = len(moving)
                self._fully_read.add(target.n)
                merged = sorted(sources)
                metrics.SEG_MERGED.labels(*self._labels).inc(len(sources))
                await self._refresh(conn)
            shown = [d.n for d in self._catalog if d.state in (READY, OPEN, CLOSED)]
            if shown != self._view:
                await self.store.rebuild_view(conn, shown)
                self._view = shown
            if dropped or merged:
                pause = time.monotonic() - t0
                self.max_pause = max(self.max_pause, pause)
                metrics.SEG_PAUSE.labels(*self._labels).set(self.max_pause)
        return dropped, merged

    # -- inspection -------------------------------------------------------------------

    def blocked_keys(self) -> list[str]:
        """Keys whose first pending job failed and waits for its retry, holding back
        later jobs of the key."""
        out = []
        for key, keyq in self._keys.items():
            head = self._jobs[keyq[0]]
            if head.state == _WAITING and key not in self._hot:
                out.append(key)
        return out

    def stats(self) -> dict[str, Any]:
        """What this consumer knows: pending, in flight, keys, datasets, counters."""
        per_key = sorted(((k, len(q)) for k, q in self._keys.items()), key=lambda kv: -kv[1])
        return {
            "shard": self.shard,
            "leader": self.leader,
            "pending": len(self._jobs),
            "in_flight": self._in_flight,
            "blocked_keys": self.blocked_keys(),
            "hot_keys": sorted(self._hot),
            "pending_per_key": dict(per_key[:20]),
            "datasets": [{"n": d.n, "state": d.state, "rows": d.job_rows,
                          "pending": self._outstanding.get(d.n, 0),
                          "fully_read": d.n in self._fully_read} for d in self._datasets],
            "max_compaction_pause_s": round(self.max_pause, 4),
            **dict(self.counts),
        }

    def _refresh_metrics(self) -> None:
        labels = self._labels
        metrics.SEG_DATASETS.labels(*labels).set(len(self._datasets))
        metrics.SEG_PENDING.labels(*labels).set(len(self._jobs))
        metrics.SEG_IN_FLIGHT.labels(*labels).set(self._in_flight)
        metrics.SEG_BLOCKED_KEYS.labels(*labels).set(len(self.blocked_keys()))
        metrics.SEG_HOT_KEYS.labels(*labels).set(len(self._hot))


# Names re-exported for callers that branch on dataset states.
__all__ = ["DROPPING", "MERGING", "READY", "SegmentedJob", "ShardConsumer"]
