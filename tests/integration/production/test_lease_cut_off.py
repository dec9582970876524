"""A shard lease holder cut off from its PostgreSQL database loses the lease in time.

The holder reaches the database through a TCP relay the test controls. Cutting the
relay drops every byte both ways and keeps the sockets open (no FIN, no reset: a
partitioned host), so the holder's lease check waits on TCP, and so does psycopg's
cancellation of it (a cancel request over the same dead path, then a wait for the
query's end). The holder must count the lease as lost within the check's time limit
and stop firing, not minutes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from shardgate.backends import open_backend
from shardgate.backends.base import LeaseHandle
from shardgate.tablet.lease import ShardLease

pytestmark = pytest.mark.postgres


class Relay:
    """A TCP relay to ``host:port`` that :meth:`cut` turns into a black hole."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.cut = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None
        self.closed = False

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self.cut.is_set():
            data = await reader.read(65536)
            if not data or self.cut.is_set():
                break
            writer.write(data)
            await writer.drain()
        await asyncio.Event().wait()  # dropped: nothing is sent, nothing is closed

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        task = asyncio.current_task()
        if self.closed or task is None:  # accepted as the relay closed
            writer.close()
            return
        self.tasks.add(task)
        if self.cut.is_set():  # a new connection (psycopg's cancel request) hangs too
            await asyncio.Event().wait()
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.writers.append(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def close(self) -> None:
        self.closed = True
        if self.server is not None:
            self.server.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for w in self.writers:
            w.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


async def test_cut_off_holder_loses_the_lease_within_the_check_limit(
    make_database: Callable[..., str],
) -> None:
    url = urlsplit(make_database("postgres", "lease_cut"))
    relay = Relay(url.hostname or "127.0.0.1", url.port or 5432)
    port = await relay.start()
    netloc = f"{url.username}@127.0.0.1:{port}" if url.username else f"127.0.0.1:{port}"
    backend = open_backend(urlunsplit(url._replace(netloc=netloc)))
    acquired, lost = asyncio.Event(), asyncio.Event()
    check_interval, check_timeout = 0.2, 1.0

    async def on_acquired(handle: LeaseHandle) -> None:
        acquired.set()

    async def on_lost() -> None:
        lost.set()

    lease = ShardLease(backend, "commerce/-80", on_acquired=on_acquired, on_lost=on_lost,
                       check_interval=check_interval, check_timeout=check_timeout)
    lease.start()
    try:
        await asyncio.wait_for(acquired.wait(), 30)
        await asyncio.sleep(3 * check_interval)  # checks answered through the relay
        assert lease.held and not lost.is_set()
        relay.cut.set()
        cut = time.monotonic()
        await asyncio.wait_for(lost.wait(), 60)
        took = time.monotonic() - cut
        # a check interval, then the check's limit (psycopg's cancellation alone would
        # take 10 s: a 5 s cancel request, then 5 s waiting for the query's end)
        assert took < check_interval + check_timeout + 1.5, took
        assert not lease.held
        print(f"\nlease lost {took:.2f} s after the cut (check every {check_interval} s, "
              f"limit {check_timeout} s)")
    finally:
        await lease.close()
        await relay.close()  # the late check's connection ends: so does its task
        deadline = time.monotonic() + 15
        while lease._stragglers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await backend.close()
