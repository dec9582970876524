"""Free TCP ports for servers a test starts in another process (``shardgate up``, ``gate``,
``tablet``, etcd), which must be told their port on the command line.

The usual helper binds port 0, reads the port the kernel chose and closes the socket
before the server binds it. Between the two, the port is free for anyone: the kernel
hands the same range (``net.ipv4.ip_local_port_range``, 32768-60999 here) to every
``connect()`` for its local port and to every ``bind(0)``, and a suite's three workers
open thousands of connections (PostgreSQL, MariaDB, gRPC) a minute. Two such helpers in
a row may even return the same port.

:func:`free_port` instead takes ports *below* the ephemeral range, where the kernel never
puts a connection or a ``bind(0)``, from a block of its own for each xdist worker (so two
workers of one run never pick the same port), moving through the block in order (so one
process does not return a port twice until the block wraps), and checks each port with a
bind before returning it (a port a server still listens on, or another program holds, is
skipped). What is left is a program outside the suite binding the same port in the
window: nothing in the suite does.

Servers a test starts in its own process still bind port 0 and read the port back; use
this only where a port must be named before the server starts.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

#: the ports handed out: below Linux's default ephemeral range (32768-60999)
FIRST_PORT = 20000
LAST_PORT = 32767
#: ports per xdist worker (gw0, gw1, ...; the controller or a run without xdist is last)
BLOCK = 1000


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(p) for p in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _block() -> range:
    """This process's ports: worker N of xdist gets block N, anything else the last one."""
    low, high = _ephemeral_range()
    first = FIRST_PORT
    last = min(LAST_PORT, low - 1) if high > LAST_PORT else LAST_PORT
    blocks = (last - first + 1) // BLOCK
    assert blocks >= 2, f"no room for test ports below the ephemeral range {low}-{high}"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    index = index % (blocks - 1) if index >= 0 else blocks - 1
    start = first + index * BLOCK
    return range(start, start + BLOCK)


_lock = threading.Lock()
_ports: itertools.cycle[int] | None = None


def bindable(port: int) -> bool:
    """Whether a server could bind ``port`` on 127.0.0.1 now (nothing listens on it)."""
    with socket.socket() as s:
        # as the servers bind (SO_REUSEADDR): a port in TIME_WAIT is free for them, but
        # Linux refuses the bind while anything listens on the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port no listener holds now and no other worker of this run will be given."""
    global _ports
    with _lock:
        if _ports is None:
            block = _block()
            # several runs at once (other checkouts) start at different places
            offset = os.getpid() % len(block)
            _ports = itertools.cycle([*block[offset:], *block[:offset]])
        for _ in range(BLOCK):
            port = next(_ports)
            if bindable(port):
                return port
    raise AssertionError(f"no free port in {_block()}")
