"""Per-shard service: runs a shard's queries and transactions."""

from shardgate.tablet.client import LocalTabletClient, TabletClient
from shardgate.tablet.tablet import Tablet

__all__ = ["LocalTabletClient", "Tablet", "TabletClient"]
