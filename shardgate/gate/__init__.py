"""The gate: the stateless front door that plans, routes, merges and streams."""

from shardgate.gate.gate import Gate
from shardgate.gate.session import Session

__all__ = ["Gate", "Session"]
