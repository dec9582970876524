"""The ports a serving command will listen on, checked before it starts anything.

``shardgate up`` beside a running one used to fail on its MySQL port, then (run
again with another) on its console port, then on its gRPC port, each time after
setting up the cluster and printing that it was ready. :func:`check_free` tries
every port first and names every taken one with the flag that moves it, in one
``UNAVAILABLE`` error, before anything is opened or printed.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from shardgate.errors import Unavailable

#: (flag, host, port) of one listener; port 0 (a free port) or a disabled listener is left out
Listener = tuple[str, str, int]
#: flags whose listener 0 turns off
_OFF_BY_ZERO = frozenset({"--mysql-port", "--http-port"})


def taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (``address already in use``), or None.

    Bound the way the servers bind (``SO_REUSEADDR``: a closed connection's
    ``TIME_WAIT`` is no obstacle), closed at once.
    """
    try:
        family, kind, proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        return str(exc.strerror or exc).lower()
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return str(exc.strerror or exc).lower()
    return None


def check_free(listeners: Sequence[Listener]) -> None:
    """Raise ``UNAVAILABLE`` naming every listener whose port is taken, with its flag."""
    busy = [(flag, host, port, why) for flag, host, port in listeners
            if port and (why := taken(host, port)) is not None]
    if not busy:
        return
    reasons = sorted({why for *_, why in busy})
    if len(busy) == 1:
        _flag, host, port, _why = busy[0]
        where, held = f"{host}:{port}", "holds it"
    else:
        where = ", ".join(f"{host}:{port} ({flag})" for flag, host, port, _ in busy)
        held = "holds them"
    flags = " ".join(f"{flag} N" for flag, *_ in busy)
    off = [flag for flag, *_ in busy if flag in _OFF_BY_ZERO]
    note = f" ({' or '.join(off)} 0: off)" if off and len(busy) > 1 else ""
    raise Unavailable(f"cannot listen on {where}: {'; '.join(reasons)}; another process "
                      f"(a running `shardgate up`?) {held}: stop that one or pass "
                      f"{flags}{note}")
