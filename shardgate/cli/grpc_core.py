"""Which of gRPC core's I/O paths a ``shardgate`` process uses (chosen before gRPC loads).

gRPC core (grpcio 1.85) runs client channels and server listeners on its
EventEngine by default, as "experiments" that can be turned off. On the
application's path (small unary calls, a gate both serving its clients and
calling its tablets) the older iomgr paths cost less CPU per call: a bare
unary call cost the server 245-257 us of CPU on iomgr against 277-343 us on
EventEngine, and the client 163-177 us against 199-215 us, on this
2-core machine (``docs/production.md``, "gRPC's I/O path").

:func:`prefer_iomgr` turns the two experiments off through
``GRPC_EXPERIMENTS``, which gRPC reads once, when it is first imported: so it
runs at the start of the ``shardgate`` command, before anything imports
``grpc``, and does nothing after that. It never overrides an operator:
``GRPC_EXPERIMENTS`` already set is left as it is, and
``SHARDGATE_GRPC_IO=event-engine`` keeps gRPC's default. Processes the
command starts (``gate --workers N``'s workers, ``up``'s tablets) inherit the
choice. A gRPC that no longer has these experiments ignores the setting.

This module must not import ``grpc`` (directly or through other modules).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: the gRPC core experiments turned off (client channels, server listeners)
IOMGR_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
#: the environment variable choosing the path: ``iomgr`` (default) or ``event-engine``
CHOICE_VAR = "SHARDGATE_GRPC_IO"
CHOICES = ("iomgr", "event-engine")


def prefer_iomgr(environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask gRPC for its iomgr I/O paths unless told otherwise; whether it was asked.

    No effect (False) when gRPC is already imported in this process, when
    ``GRPC_EXPERIMENTS`` is set, or when ``SHARDGATE_GRPC_IO`` is
    ``event-engine``; an unknown ``SHARDGATE_GRPC_IO`` is an error.
    """
    env = os.environ if environ is None else environ
    choice = env.get(CHOICE_VAR, "iomgr") or "iomgr"
    if choice not in CHOICES:
        raise SystemExit(f"{CHOICE_VAR}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice != "iomgr" or "GRPC_EXPERIMENTS" in env or "grpc" in sys.modules:
        return False
    env["GRPC_EXPERIMENTS"] = IOMGR_EXPERIMENTS
    return True
