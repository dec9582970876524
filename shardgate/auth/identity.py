"""Who is calling: the identity every front door hands to the gate."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

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


class Trusted(enum.Enum):
    """The gate's own work and trusted in-process code, as a session's caller.

    Statement rules (the deny-list) apply to it; table ACLs do not. Every
    session says who it runs for (:meth:`shardgate.gate.Gate.session` has no
    default): a front door passes the :class:`Identity` its transport
    authenticated, and only in-process code (workflows, the CLI's embedded
    commands, queue and stream helpers, the embedded DB-API driver) passes
    :data:`TRUSTED`. No module under ``shardgate/api/`` names it
    (``tests/unit/test_architecture.py`` holds that), so no transport can reach
    the gate on the trusted path.
    """

    TRUSTED = "trusted"

    def __repr__(self) -> str:
        return "TRUSTED"


#: The trusted caller (see :class:`Trusted`).
TRUSTED: Final = Trusted.TRUSTED

#: Who a session runs for: an authenticated caller, or the trusted in-process path.
Caller = Identity | Trusted
