"""VSchema DDL through the gate: ``ALTER VSCHEMA`` and ``DROP TABLE`` of VSchema tables.

Both are primitives the gate plans but never caches (they change the
VSchema). Each change goes through ``gate.change_vschema``: written to the
topo store (checked first: an invalid change is refused with its JSON path
and nothing is saved), then served by this gate at once and by every other
gate watching the store within its poll interval.

``DROP TABLE t`` where ``t`` is in a VSchema, owns lookup vindexes, holds a
lookup vindex's rows or is a sequence another table draws from:

* with dependents (anything but its own VSchema entry), the statement must
  carry the directive ``/*sg+ CONFIRM_DROP */`` (Vitess-style query
  comment); without it the gate refuses with FailedPrecondition naming them;
* the VSchema goes first (:func:`~shardgate.topo.vschema_edits.drop_table_cascade`:
  the table, the lookup vindexes it owns and their uses, vindexes backed by
  it, auto_increments drawing from it), so no gate routes to or maintains
  what is about to disappear; then ``DROP TABLE IF EXISTS`` on every shard of
  the table, then of each owned lookup table. A failure on a shard after the
  VSchema change names what is left, and the same statement run again
  finishes it (every step is idempotent).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardgate.engine.primitives import ExecCursor, Primitive
from shardgate.errors import Aborted, FailedPrecondition, ShardgateError
from shardgate.result import Result
from shardgate.sql.statements import AlterVSchema
from shardgate.topo.model import Topology
from shardgate.topo.vschema_edits import Dependents, alter, dependents, drop_table_cascade
from shardgate.vschema import VSchema

#: The query comment that confirms a DROP TABLE with dependents.
CONFIRM_DROP = "/*sg+ CONFIRM_DROP */"
_CONFIRM = re.compile(r"/\*\s*sg\+\s+CONFIRM_DROP\s*\*/", re.IGNORECASE)


class ShardSQL(Protocol):
    """A tablet client, as far as these primitives use it."""

    async def execute(self, sql: str, params: Sequence[Any]) -> Result:
        """Run ``sql`` on the shard."""
        ...


class VSchemaChanger(Protocol):
    """What these primitives need of the gate."""

    @property
    def topology(self) -> Topology:
        """The topology served now."""
        ...

    @property
    def vschema(self) -> VSchema:
        """The VSchema served now."""
        ...

    @property
    def tablets(self) -> Mapping[tuple[str, str], ShardSQL]:
        """The tablet client of every shard."""
        ...

    async def change_vschema(
        self, keyspace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Save a change of the keyspace's VSchema and serve it."""
        ...


def confirmed(sql: str) -> bool:
    """Whether ``sql`` carries the :data:`CONFIRM_DROP` directive."""
    return _CONFIRM.search(sql) is not None


@dataclass(frozen=True)
class AlterVSchemaPrimitive(Primitive):
    """``ALTER VSCHEMA ...`` on ``keyspace``."""

    statement: AlterVSchema
    keyspace: str
    gate: VSchemaChanger

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        stmt, ks = self.statement, self.keyspace
        await self.gate.change_vschema(ks, lambda doc: alter(doc, stmt, ks))
        return Result()

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "AlterVSchema", "Keyspace": {"Name": self.keyspace},
                "Statement": type(self.statement).__name__}


def table_dependents(topology: Topology, keyspace: str, table: str) -> Dependents:
    """What depends on ``keyspace.table`` in ``topology``'s VSchemas."""
    docs = {ks.name: ks.vschema for ks in topology.keyspaces.values()}
    return dependents(docs, keyspace, table)


def needs_cascade(topology: Topology, keyspace: str, table: str) -> bool:
    """Whether dropping ``keyspace.table`` changes a VSchema."""
    ks = topology.keyspaces.get(keyspace)
    if ks is None:
        return False
    return table in ks.vschema.get("tables", {}) or bool(
        table_dependents(topology, keyspace, table))


@dataclass(frozen=True)
class DropTableCascade(Primitive):
    """``DROP TABLE`` of a table the VSchema knows (see the module docstring)."""

    keyspace: str
    table: str
    gate: VSchemaChanger
    confirmed: bool

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        topology = self.gate.topology
        deps = table_dependents(topology, self.keyspace, self.table)
        if deps and not self.confirmed:
            raise FailedPrecondition(
                f"DROP TABLE {self.keyspace}.{self.table}: the table {deps.describe()}; "
                f"dropping it removes those too. Confirm with {CONFIRM_DROP} in the statement"
            )
        docs = {ks.name: ks.vschema for ks in topology.keyspaces.values()}
        changed = drop_table_cascade(docs, self.keyspace, self.table)
        for ks in sorted(changed, key=lambda k: k != self.keyspace):  # the owner's first
            await self.gate.change_vschema(ks, _replace(ks, docs[ks], changed[ks]))
        drops = [(self.keyspace, self.table)] + [
            (lt.partition(".")[0], lt.partition(".")[2]) for _, lt in deps.owned]
        for ks, name in drops:
            try:
                for shard in topology.keyspace(ks).shards:
                    await self.gate.tablets[(ks, shard.name)].execute(
                        f"DROP TABLE IF EXISTS {name}", [])
            except ShardgateError as exc:
                raise type(exc)(
                    f"DROP TABLE {self.keyspace}.{self.table}: its VSchema entries are removed "
                    f"but dropping {ks}.{name} failed: {exc.message}; run the statement "
                    f"again (or DROP TABLE IF EXISTS {ks}.{name}) to finish"
                ) from exc
        return Result()

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "DropTable", "Keyspace": {"Name": self.keyspace},
                "Table": self.table}


def _replace(keyspace: str, before: Mapping[str, Any], after: dict[str, Any]
             ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        if doc != before:
            raise Aborted(
                f"the VSchema of keyspace {keyspace!r} changed while the table was being "
                "dropped; run the statement again"
            )
        return after
    return change
