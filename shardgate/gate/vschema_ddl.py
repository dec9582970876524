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

from sqlglot import exp

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.errors import Aborted, FailedPrecondition, ShardgateError
from shardgate.gate.sequences import Sequences
from shardgate.result import Result
from shardgate.sql.dialects import Dialect
from shardgate.sql.statements import AlterVSchema
from shardgate.topo.model import Topology
from shardgate.topo.vschema_edits import Dependents, alter, dependents, drop_table_cascade
from shardgate.vschema import TableType, VSchema

#: The values a gate reserves at a time from a sequence ``auto_shard`` creates.
SEQUENCE_CACHE = 1000

#: The query comment that confirms a DROP TABLE with dependents.
CONFIRM_DROP = "/*sg+ CONFIRM_DROP */"
_CONFIRM = re.compile(r"/\*\s*sg\+\s+CONFIRM_DROP\s*\*/", re.IGNORECASE)


class ShardSQL(Protocol):
    """A tablet client, as far as these primitives use it."""

    #: the shard's SQL dialect (``sqlite``, ``postgres``, ``mysql``) and bind placeholder
    dialect: Dialect
    placeholder: str

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

    @property
    def sequences(self) -> Sequences:
        """The gate's cached sequence blocks."""
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
        auto_seq = _auto_sequence_of(topology, self.keyspace, self.table)
        changed = drop_table_cascade(docs, self.keyspace, self.table)
        for ks in sorted(changed, key=lambda k: k != self.keyspace):  # the owner's first
            await self.gate.change_vschema(ks, _replace(ks, docs[ks], changed[ks]))
        drops = [(self.keyspace, self.table)] + [
            (lt.partition(".")[0], lt.partition(".")[2]) for _, lt in deps.owned]
        for ks, name in drops:
            try:
                for shard in topology.keyspace(ks).shards:
                    tablet = self.gate.tablets[(ks, shard.name)]
                    await tablet.execute(_drop_sql(name, tablet), [])
            except ShardgateError as exc:
                raise type(exc)(
                    f"DROP TABLE {self.keyspace}.{self.table}: its VSchema entries are removed "
                    f"but dropping {ks}.{name} failed: {exc.message}; run the statement "
                    f"again (or DROP TABLE IF EXISTS {ks}.{name}) to finish"
                ) from exc
        if auto_seq is not None:
            await self._drop_sequence(*auto_seq)
        return Result()

    async def _drop_sequence(self, keyspace: str, table: str) -> None:
        """Drop the sequence ``auto_shard`` created for the dropped table (nothing else
        draws from it): its VSchema entry, then its table."""
        docs = {ks.name: ks.vschema for ks in self.gate.topology.keyspaces.values()}
        if dependents(docs, keyspace, table).sequence_users:
            return  # another table took it up meanwhile (by hand): keep it
        changed = drop_table_cascade(docs, keyspace, table)
        await self.gate.change_vschema(keyspace, _replace(keyspace, docs[keyspace],
                                                          changed[keyspace]))
        shard = self.gate.topology.keyspace(keyspace).shards[0].name
        tablet = self.gate.tablets[(keyspace, shard)]
        await tablet.execute(_drop_sql(table, tablet), [])
        self.gate.sequences.forget(f"{keyspace}.{table}")

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "DropTable", "Keyspace": {"Name": self.keyspace},
                "Table": self.table}


def _auto_sequence_of(topology: Topology, keyspace: str, table: str) -> tuple[str, str] | None:
    """``(keyspace, table)`` of the sequence ``auto_shard`` created for ``keyspace.table``
    (named by :func:`sequence_name` in the keyspace's ``auto_shard.sequence_keyspace``
    and drawn on by that table alone), or None."""
    ks = topology.keyspaces.get(keyspace)
    if ks is None:
        return None
    auto = ks.vschema.get("auto_shard") or {}
    seq_ks = auto.get("sequence_keyspace") if isinstance(auto, dict) else None
    spec = ks.vschema.get("tables", {}).get(table) or {}
    ai = spec.get("auto_increment") or spec.get("autoIncrement") or {}
    if not seq_ks or str(ai.get("sequence", "")) != f"{seq_ks}.{sequence_name(table)}":
        return None
    users = table_dependents(topology, seq_ks, sequence_name(table)).sequence_users
    return (seq_ks, sequence_name(table)) if list(users) == [f"{keyspace}.{table}"] else None


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


def sequence_name(table: str) -> str:
    """The name of the sequence ``auto_shard`` creates for ``table``: ``<table>_seq``."""
    return f"{table}_seq"


@dataclass(frozen=True)
class AutoSequence:
    """The sequence an auto-sharded table's AUTO_INCREMENT key draws from.

    ``table`` (:func:`sequence_name`) in the unsharded ``keyspace`` (the
    keyspace's ``auto_shard.sequence_keyspace``) numbers ``column``.
    """

    keyspace: str
    table: str
    column: str

    @property
    def qualified(self) -> str:
        return f"{self.keyspace}.{self.table}"


@dataclass(frozen=True)
class AutoShardCreate(Primitive):
    """``CREATE TABLE t`` in a sharded keyspace with ``auto_shard``, ``t`` not in its VSchema.

    The table is created on every shard (the keyspace's DDL primitive), then
    added to the VSchema sharded by ``vindex`` on ``column`` (its first
    primary key column), so the next statement routes it. Both steps are
    idempotent: after a failure between them, the same statement run again
    (with ``IF NOT EXISTS``, or after ``DROP TABLE``) finishes the job.

    With ``sequence`` (the key is AUTO_INCREMENT, SERIAL or IDENTITY and the
    keyspace names a ``sequence_keyspace``), between the two steps the
    sequence table is created there if missing and started at 1 (a new table
    has no rows; a sequence another VSchema table draws from is refused,
    FailedPrecondition), added to that keyspace's VSchema as a ``sequence``,
    and the new table's entry gets ``auto_increment`` from it: an insert that
    leaves the key out (or NULL, or DEFAULT) takes the next value, reported as
    the insert id, as Vitess does.
    """

    keyspace: str
    table: str
    column: str
    vindex: str
    ddl: Primitive
    gate: VSchemaChanger
    sequence: AutoSequence | None = None

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        if self.sequence is not None:
            self._check_sequence_free(self.sequence)
        await self.ddl.execute(vc, bind_vars)
        entry: dict[str, Any] = {
            "column_vindexes": [{"column": self.column, "name": self.vindex}]}
        if self.sequence is not None:
            await self._create_sequence(self.sequence)
            entry["auto_increment"] = {"column": self.sequence.column,
                                       "sequence": self.sequence.qualified}

        def add(doc: dict[str, Any]) -> dict[str, Any]:
            tables = dict(doc.get("tables", {}))
            tables.setdefault(self.table, entry)
            return {**doc, "tables": tables}

        await self.gate.change_vschema(self.keyspace, add)
        return Result()

    def _check_sequence_free(self, seq: AutoSequence) -> None:
        users = table_dependents(self.gate.topology, seq.keyspace, seq.table).sequence_users
        if users:
            raise FailedPrecondition(
                f"CREATE TABLE {self.keyspace}.{self.table}: its AUTO_INCREMENT key would "
                f"draw from sequence {seq.qualified}, which {', '.join(users)} already "
                "draws from; drop or rename that table first"
            )

    async def _create_sequence(self, seq: AutoSequence) -> None:
        self._check_sequence_free(seq)
        shard = self.gate.topology.keyspace(seq.keyspace).shards[0].name
        tablet = self.gate.tablets[(seq.keyspace, shard)]
        name = exp.to_identifier(seq.table, quoted=True).sql(dialect=tablet.dialect)
        ph = tablet.placeholder
        if ph == "%s":  # a driver formatting its parameters: a % of the name is doubled
            name = name.replace("%", "%%")
        for sql, params in (
            (f"CREATE TABLE IF NOT EXISTS {name} (id INT PRIMARY KEY, next_id BIGINT, "
             "cache BIGINT)", []),
            (f"DELETE FROM {name}", []),
            (f"INSERT INTO {name} (id, next_id, cache) VALUES ({ph}, {ph}, {ph})",
             [0, 1, SEQUENCE_CACHE]),
        ):
            await tablet.execute(sql, params)
        self.gate.sequences.forget(seq.qualified)

        def add(doc: dict[str, Any]) -> dict[str, Any]:
            tables = dict(doc.get("tables", {}))
            tables[seq.table] = {"type": TableType.SEQUENCE.value}
            return {**doc, "tables": tables}

        await self.gate.change_vschema(seq.keyspace, add)

    def describe(self) -> dict[str, Any]:
        out = {"OperatorType": "AutoShardCreate", "Keyspace": {"Name": self.keyspace},
               "Table": self.table, "Column": self.column, "Vindex": self.vindex,
               "DDL": self.ddl.describe()}
        if self.sequence is not None:
            out["AutoIncrement"] = {"Column": self.sequence.column,
                                    "Sequence": self.sequence.qualified}
        return out


def _drop_sql(table: str, tablet: ShardSQL) -> str:
    """``DROP TABLE IF EXISTS`` of ``table``, its name quoted in the shard's dialect."""
    name = exp.to_identifier(table, quoted=True).sql(dialect=tablet.dialect)
    sql = f"DROP TABLE IF EXISTS {name}"
    return sql.replace("%", "%%") if tablet.placeholder == "%s" else sql
