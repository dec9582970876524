"""Finding a cluster's topo store: by URL, or beside its cluster file.

A cluster file ``DIR/NAME.yaml`` keeps its topo store in the SQLite file
``DIR/NAME.topo.db`` (``shardgate up``'s data directory: ``cluster.yaml`` and
``cluster.topo.db``). The first process to open it imports the file; from
then on the store is the truth: VSchema changes made at run time (``CREATE
QUEUE``, ``ALTER VSCHEMA``, ``shardgate vschema apply``) live there and
survive restarts, and every process that names the same cluster file (gate,
CLI, Spark executors) reads the same topology. ``shardgate topo import
--replace`` re-imports an edited file. A production cluster names its store
with ``--topo postgresql://…`` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from shardgate.errors import Aborted, AlreadyExists
from shardgate.topo.file import load_cluster_file
from shardgate.topo.model import Topology
from shardgate.topo.server import TopoServer
from shardgate.topo.store import open_topo_store

STORE_SUFFIX = ".topo.db"

T = TypeVar("T")

#: attempts of a topology read that a locked store aborts
READ_ATTEMPTS = 5


def store_path_for(cluster_file: str | Path) -> Path:
    """The topo store file of a cluster file (``cluster.yaml`` -> ``cluster.topo.db``)."""
    p = Path(cluster_file).resolve()
    return p.with_name(p.stem + STORE_SUFFIX)


def store_url_for(cluster_file: str | Path) -> str:
    return f"sqlite:///{store_path_for(cluster_file)}"


async def open_topo(
    cluster_file: str | Path | None = None, *, url: str | None = None
) -> TopoServer:
    """The topo store at ``url``, or the one of ``cluster_file`` (seeded from it).

    With both, the file seeds the store at ``url`` if that store is empty.
    """
    if url is None and cluster_file is None:
        raise ValueError("open_topo needs a cluster file or a store URL")
    server = TopoServer(open_topo_store(url or store_url_for(str(cluster_file))))
    try:
        if cluster_file is not None and await server.is_empty():
            with contextlib.suppress(AlreadyExists):  # another process seeded it first
                await server.import_topology(load_cluster_file(cluster_file))
    except BaseException:
        await server.close()
        raise
    return server


def read_topology(cluster_file: str | Path | None, *, url: str | None = None) -> Topology:
    """The current topology of a cluster file (its store's, once it has one), or with
    no file, of the topo store at ``url``. Sync.

    For code outside an event loop or inside one that must not wait on it
    (CLI set-up, Spark executors): the read runs on a private loop in a thread.
    """
    if cluster_file is not None and url is None and not store_path_for(cluster_file).exists():
        return load_cluster_file(cluster_file)

    async def read_once() -> Topology:
        server = await open_topo(cluster_file, url=url)
        try:
            return await server.load_topology()
        finally:
            await server.close()

    async def read() -> Topology:
        # ABORTED (a SQLite store locked by a writer: tablets' heartbeats) says "retry".
        for attempt in range(READ_ATTEMPTS):
            try:
                return await read_once()
            except Aborted:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    return run_sync(read())


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop in a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
