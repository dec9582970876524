"""Change streams above the tablets: event tokens, the gate's shard merge, cache helpers.

``token`` (event tokens and their comparison) has no dependencies; the others
are imported where used: ``merge`` (the gate's UpdateStream), ``cache``
(Redis invalidation helpers, needs ``redis``).
"""

from shardgate.event_token import EventToken, Freshness, compare, is_fresher

__all__ = ["EventToken", "Freshness", "compare", "is_fresher"]
