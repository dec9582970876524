"""Security: who is calling (identities from users files or certificates),
what they may touch (table ACLs), which statements are allowed at all
(statement rules), checked at the gate for every front door.

``auth`` sits between ``gate`` and ``tablet``: the gate and the front doors
(``api``) ask it; it never imports them.
"""

from shardgate.auth.identity import ANONYMOUS, Identity
from shardgate.auth.users import StaticUsers

__all__ = ["ANONYMOUS", "Identity", "StaticUsers"]
