"""Who is calling: the identity every front door hands to the gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The trusted caller lives with the ports lower layers use (queues, streams pass it too);
# see :class:`shardgate.ports.Trusted`.
from shardgate.ports import TRUSTED, Trusted

__all__ = ["ANONYMOUS", "TRUSTED", "Caller", "Identity", "Trusted", "Via"]

#: How an identity was established.
Via = Literal["password", "mtls", "anonymous"]


@dataclass(frozen=True)
class Identity:
    """An authenticated caller.

    ``user`` is the name ACLs are checked against (the users file's key, or the
    client certificate's subject common name); ``user_data`` is the users
    file's ``UserData`` of the entry that matched (empty otherwise); ``via``
    says how the caller proved it: ``"password"``, ``"mtls"`` or
    ``"anonymous"`` (no authentication configured, loopback only).
    """

    user: str
    user_data: str = ""
    via: Via = "password"


#: The caller when authentication is off (``shardgate up``, ``--no-auth``).
ANONYMOUS = Identity("anonymous", via="anonymous")


#: Who a session runs for: an authenticated caller, or the trusted in-process path.
Caller = Identity | Trusted
