"""A SELECT planned twice: for reads outside transactions, and for the rest.

Between MoveTables' ``switch-traffic --reads`` and ``--writes`` the VSchema
carries read routing rules (:attr:`~shardgate.vschema.VSchema.read_routing_rules`):
a read outside a transaction goes to the target keyspace, one inside a
transaction still to the source (where that transaction's writes are). The
planner then plans such a SELECT both ways and wraps the two plans in
:class:`ReadSwitch`; the gate marks its cursor ``reads`` for a read outside a
transaction (as it does to pick a keyspace's read-serving shards), and the
switch runs the matching plan.

Invariant: ``reads`` and ``other`` are plans of the same statement; they
differ only in the keyspace each routed table reference resolves to.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.result import Result


class ReadSwitch(Primitive):
    """Runs ``reads`` for a read outside a transaction, ``other`` otherwise."""

    def __init__(self, reads: Primitive, other: Primitive) -> None:
        self.reads = reads
        self.other = other

    def pick(self, vc: ExecCursor) -> Primitive:
        """The plan for ``vc`` (its ``reads`` flag, when it has one)."""
        return self.reads if getattr(vc, "reads", False) else self.other

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        return await self.pick(vc).execute(vc, bind_vars)

    async def stream(self, vc: ExecCursor, bind_vars: Mapping[str, Any]
                     ) -> AsyncIterator[Result]:
        async for chunk in self.pick(vc).stream(vc, bind_vars):
            yield chunk

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "ReadSwitch", "Reads": self.reads.describe(),
                "Other": self.other.describe()}
