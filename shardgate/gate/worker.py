"""Which worker process of a gate this is (``shardgate gate --workers N``).

A gate started with ``--workers N`` is N processes sharing its ports
(``SO_REUSEPORT``; see :mod:`shardgate.cli.workers`). Each is a whole gate
with its own sessions, plans, pools, topo watcher and per-process views (the
console's query log, live queries, ``/metrics``), so whatever answers a
client names the worker it came from: ``SHOW SHARDGATE_WORKER`` over gRPC and
MySQL, the ``X-Shardgate-Worker`` header and ``/debug/health`` over HTTP.

Invariant: set once, at a worker's start, before any listener opens; a gate
not started as a worker is worker 1 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Worker:
    """Worker ``index`` (1-based) of ``count`` worker processes, in process ``pid``."""

    index: int
    count: int
    pid: int

    def label(self) -> str:
        """``"index/count pid P"``: what headers and logs show."""
        return f"{self.index}/{self.count} pid {self.pid}"


_index, _count = 1, 1


def set_worker(index: int, count: int) -> None:
    """Record that this process is worker ``index`` of ``count`` (1 <= index <= count)."""
    global _index, _count
    if not 1 <= index <= count:
        raise ValueError(f"worker {index} of {count}")
    _index, _count = index, count


def current() -> Worker:
    """This process's worker identity (1 of 1 unless :func:`set_worker` said otherwise)."""
    return Worker(_index, _count, os.getpid())
