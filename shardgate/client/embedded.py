"""An in-process gate for synchronous code: the gate on a private loop thread.

::

    gate, loop_thread = open_embedded(load_cluster_file("cluster.yaml"))
    try:
        conn = dbapi.connect(gate, loop=loop_thread.loop, identity=TRUSTED)
        ...
    finally:
        close_embedded(gate, loop_thread)
"""

from __future__ import annotations

from shardgate.client.sync import LoopThread
from shardgate.gate import Gate
from shardgate.topo import Topology


def open_embedded(topology: Topology) -> tuple[Gate, LoopThread]:
    """Open a :class:`Gate` over ``topology`` on a new :class:`LoopThread`."""
    loop_thread = LoopThread("shardgate-embedded")
    try:
        gate = loop_thread.run(_open(topology))
    except BaseException:
        loop_thread.close()
        raise
    return gate, loop_thread


def close_embedded(gate: Gate, loop_thread: LoopThread) -> None:
    """Close the gate, then stop its loop thread."""
    try:
        loop_thread.run(gate.close())
    finally:
        loop_thread.close()


async def _open(topology: Topology) -> Gate:
    # Opened on the loop so whatever the tablets bind to a loop binds to this one.
    return Gate.open(topology)
