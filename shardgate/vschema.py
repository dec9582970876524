"""The VSchema: per-keyspace JSON naming vindexes, tables and their column vindexes.

The JSON shape is Vitess's, unchanged::

    {"sharded": true,
     "vindexes": {"hash": {"type": "hash"},
                  "name_idx": {"type": "lookup", "owner": "user",
                               "params": {"table": "lookup.name_idx", "from": "name",
                                          "to": "keyspace_id"}}},
     "tables": {"user": {"column_vindexes": [{"column": "id", "name": "hash"},
                                             {"column": "name", "name": "name_idx"}],
                         "auto_increment": {"column": "id", "sequence": "lookup.user_seq"}},
                "user_seq": {"type": "sequence"},
                "countries": {"type": "reference"}}}

plus our own table type ``queue`` (with an optional ``queue`` object of options).

Rules enforced (the V3 design's), each failure a :class:`VSchemaError` naming
the JSON path:

* every vindex ``type`` is registered; ``params`` are strings; an ``owner``
  names a table of the same keyspace;
* in a sharded keyspace every table except ``reference`` and ``sequence`` has at
  least one column vindex; the first is the *primary* vindex and must be unique;
  a primary vindex may not be a lookup owned by the same table (its ksid would
  have to come from itself);
* ``sequence`` tables live in unsharded keyspaces; an ``auto_increment``
  names a sequence that exists;
* a column vindex gives ``column`` or ``columns`` (not both); multi-column
  vindexes get as many columns as they need;
* table names must be unique across keyspaces to be used unqualified: a name
  found in several keyspaces must be qualified (``keyspace.table``) unless the
  session's default keyspace has it.

Vitess's protobuf JSON spellings are accepted too (``columnVindexes``,
``autoIncrement``, ``columnListAuthoritative``, ``requireExplicitRouting``,
``foreignKeyMode``; ``fromTable``/``toTables`` in routing rules); giving both
spellings of one field is refused. As in Vitess (``go/vt/vtgate/vindexes/vschema.go``):

* ``pinned`` (hex keyspace id) places a table of a sharded keyspace on the one
  shard owning that keyspace id; it needs no column vindex, and routes like a
  ``binary`` vindex whose value is the pin (:attr:`Table.pinned`);
* ``columns`` (``[{"name": ..., "type": ...}]``, names unique) with
  ``column_list_authoritative: true`` is the table's full column list: an
  INSERT into it may leave out its column list (:attr:`Table.authoritative_columns`);
* ``require_explicit_routing: true`` leaves the keyspace's tables out of the
  global (unqualified) name space: they are found qualified, through the
  default keyspace, or through a routing rule;
* routing rules (:func:`parse_routing_rules`): ``{"rules": [{"from_table":
  "t" or "ks.t", "to_tables": ["ks2.t2"]}]}`` make a table name of a SQL
  statement resolve to another table (the planner rewrites the statement,
  :mod:`shardgate.planner.rules`; :meth:`VSchema.find_table` itself does not
  apply them); an empty ``to_tables`` disables the name (Vitess's
  "table ... has been disabled"), more than one target is refused, as are
  tablet-type rules (``ks@replica.t``: shardgate has no tablet types).
  A shardgate extension, ``"read_rules"`` (same shape as ``rules``), applies
  only to reads outside transactions, before ``rules`` (MoveTables'
  ``switch-traffic --reads``, :mod:`shardgate.workflows.movetables`).

Refused, naming the feature: ``sequence`` tables in a sharded keyspace (even
pinned: shardgate's sequence allocator reads them from an unsharded keyspace),
and the keyspace fields ``multi_tenant_spec`` and other unknown fields.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardgate.errors import (
    Code,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ShardgateError,
    VSchemaError,
)
from shardgate.sql.schema import EMPTY as EMPTY_SCHEMA
from shardgate.sql.schema import Schema
from shardgate.vindexes import Lookup, MultiColumn, SingleColumn, Vindex, create_vindex
from shardgate.vindexes.consistent_lookup import ConsistentLookupBase


class TableType(StrEnum):
    """A VSchema table's ``type``: the value is what the VSchema document says."""

    #: an ordinary table, placed by its column vindexes (the document leaves ``type`` out)
    NORMAL = ""
    #: a sequence table: one row handing out auto-increment values (unsharded keyspace)
    SEQUENCE = "sequence"
    #: a reference table: the same rows on every shard (reads go to any one)
    REFERENCE = "reference"
    #: a queue table (``CREATE QUEUE``): its events are fired to receivers
    QUEUE = "queue"


TABLE_TYPES = tuple(TableType)

#: Vitess's protobuf JSON (camelCase) names -> the snake_case ones used here.
CAMEL_CASE = {
    "columnVindexes": "column_vindexes",
    "autoIncrement": "auto_increment",
    "columnListAuthoritative": "column_list_authoritative",
    "requireExplicitRouting": "require_explicit_routing",
    "foreignKeyMode": "foreign_key_mode",
    "fromTable": "from_table",
    "toTables": "to_tables",
}


@dataclass(frozen=True)
class Column:
    """A column listed in a table's VSchema ``columns``."""

    name: str
    type: str = ""


@dataclass(frozen=True)
class ColumnVindex:
    """One column vindex of a table: the column(s) and the vindex that maps them."""

    columns: tuple[str, ...]
    name: str
    vindex: Vindex
    #: True when this table is the vindex's owner (it maintains the lookup rows).
    owned: bool = False


@dataclass(frozen=True)
class AutoIncrement:
    column: str
    sequence: str  # "keyspace.table" once resolved


@dataclass
class Table:
    """A table as the gate sees it."""

    name: str
    keyspace: str
    type: TableType = TableType.NORMAL
    column_vindexes: list[ColumnVindex] = field(default_factory=list)
    auto_increment: AutoIncrement | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: the keyspace id a pinned table lives at (VSchema ``pinned``, hex)
    pinned: bytes | None = None
    #: the VSchema ``columns`` (lower-cased names)
    columns: tuple[Column, ...] = ()
    column_list_authoritative: bool = False

    @property
    def authoritative_columns(self) -> tuple[str, ...] | None:
        """The full column list when ``column_list_authoritative`` gives one, else None."""
        if self.column_list_authoritative and self.columns:
            return tuple(c.name for c in self.columns)
        return None

    @property
    def primary(self) -> ColumnVindex | None:
        return self.column_vindexes[0] if self.column_vindexes else None

    @property
    def owned_vindexes(self) -> list[ColumnVindex]:
        return [cv for cv in self.column_vindexes[1:] if cv.owned]

    @property
    def qualified(self) -> str:
        return f"{self.keyspace}.{self.name}"


@dataclass
class Keyspace:
    """One keyspace of the VSchema."""

    name: str
    sharded: bool
    vindexes: dict[str, Vindex] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    #: tables are left out of the global (unqualified) name space
    require_explicit_routing: bool = False
    #: the vindex a CREATE TABLE through the gate shards a new table by (on its first
    #: primary key column), or None: new tables must be added to the VSchema by hand
    auto_shard: str | None = None
    #: ``auto_shard.sequence_keyspace``: the unsharded keyspace where the gate creates
    #: a sequence for each auto-sharded table with an AUTO_INCREMENT key (None: none)
    auto_shard_sequences: str | None = None


@dataclass(frozen=True)
class RoutingRule:
    """Where a table name routes: one ``(keyspace, table)``, or nowhere (disabled)."""

    from_table: str
    target: tuple[str, str] | None


class VSchema:
    """All keyspaces' VSchemas, resolved and validated together."""

    def __init__(
        self,
        keyspaces: Mapping[str, Keyspace],
        routing_rules: Mapping[str, RoutingRule] | None = None,
        read_routing_rules: Mapping[str, RoutingRule] | None = None,
    ) -> None:
        self.keyspaces = dict(keyspaces)
        #: the columns the gate tracked from the shards (the planning context's
        #: data about tables; empty outside a gate: see :meth:`with_schema`)
        self.schema: Schema = EMPTY_SCHEMA
        self.routing_rules = dict(routing_rules or {})
        #: rules for reads outside transactions, tried before :attr:`routing_rules`
        self.read_routing_rules = dict(read_routing_rules or {})
        self._global: dict[str, list[Table]] = {}
        for ks in self.keyspaces.values():
            if ks.require_explicit_routing:
                continue
            for t in ks.tables.values():
                self._global.setdefault(t.name.lower(), []).append(t)

    @classmethod
    def from_json(
        cls,
        docs: Mapping[str, Mapping[str, Any] | str],
        routing_rules: Mapping[str, Any] | None = None,
    ) -> VSchema:
        """Build from ``{keyspace: vschema JSON (dict or text)}``, validating everything.

        ``routing_rules`` is Vitess's ``RoutingRules`` JSON (see :func:`parse_routing_rules`).
        """
        parsed: dict[str, Mapping[str, Any]] = {}
        for name, doc in docs.items():
            if isinstance(doc, str):
                try:
                    doc = json.loads(doc)
                except json.JSONDecodeError as exc:
                    raise VSchemaError(name, f"not valid JSON: {exc}") from exc
            if not isinstance(doc, Mapping):
                raise VSchemaError(name, "must be a JSON object")
            parsed[name] = doc
        keyspaces = {name: _build_keyspace(name, doc) for name, doc in parsed.items()}
        _resolve_sequences(keyspaces)
        _check_auto_shard_sequences(keyspaces)
        rules = parse_routing_rules(routing_rules or {}, keyspaces)
        reads = parse_routing_rules(routing_rules or {}, keyspaces, key="read_rules")
        return cls(keyspaces, rules, reads)

    def with_schema(self, schema: Schema) -> VSchema:
        """This VSchema with ``schema`` as its tracked columns: a shallow copy that
        shares everything else (the planner reads both, and no database)."""
        if schema is self.schema:
            return self
        out = copy.copy(self)
        out.schema = schema
        return out

    def table_columns(self, table: Table) -> tuple[str, ...] | None:
        """The columns of ``table``: its VSchema's authoritative ``columns`` if it has
        them (as in Vitess, they win), else the tracked ones; None when the tracked
        keyspace has no such table. Raises
        :class:`~shardgate.sql.schema.ColumnsUnknown` (keyspace not read yet) or
        :class:`~shardgate.errors.Unsupported` (it could not be read)."""
        listed = table.authoritative_columns
        if listed is not None:
            return listed
        found = self.schema.table(table.keyspace, table.name)
        return found.names if found is not None else None

    def keyspace(self, name: str) -> Keyspace:
        try:
            return self.keyspaces[name]
        except KeyError:
            raise NotFound(
                f"keyspace {name!r} does not exist; known keyspaces: {sorted(self.keyspaces)}"
            ) from None

    def find_table(self, name: str, keyspace: str | None, default_keyspace: str | None) -> Table:
        """Resolve a table reference.

        ``keyspace`` is the qualifier written in the SQL (or None). Unqualified
        names look in the default keyspace first, then globally; a name found
        in several keyspaces must be qualified. Tables of an unsharded keyspace
        need not be listed in its VSchema. Routing rules are not applied here:
        the planner rewrites table names with :meth:`routing_target` first.
        """
        if keyspace is not None:
            ks = self.keyspace(keyspace)
            return _table_in(ks, name)
        if default_keyspace is not None and default_keyspace in self.keyspaces:
            ks = self.keyspaces[default_keyspace]
            found = ks.tables.get(name) or ks.tables.get(name.lower())
            if found is not None:
                return found
        candidates = self._global.get(name.lower(), [])
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            where = sorted(t.keyspace for t in candidates)
            raise InvalidArgument(
                f"table {name!r} exists in keyspaces {where}: qualify it as keyspace.{name}"
            )
        if default_keyspace is not None and default_keyspace in self.keyspaces:
            ks = self.keyspaces[default_keyspace]
            if not ks.sharded:
                return _table_in(ks, name)
        unsharded = [k for k in self.keyspaces.values() if not k.sharded]
        if (
            default_keyspace is None
            and len(unsharded) == 1
            and len(self.keyspaces) == 1
            and not unsharded[0].require_explicit_routing
        ):
            return _table_in(unsharded[0], name)
        raise NotFound(
            f"table {name!r} is not in any VSchema"
            + (f" (default keyspace {default_keyspace!r})" if default_keyspace else "")
            + ": add it to the keyspace's vschema or qualify it as keyspace.table"
        )

    def routing_target(
        self, name: str, keyspace: str | None, default_keyspace: str | None,
        *, reads: bool = False,
    ) -> tuple[str, str] | None:
        """Where a routing rule sends the table reference ``[keyspace.]name``, if one does.

        As Vitess's ``FindRoutedTable``: the rule for ``keyspace.name`` applies,
        ``keyspace`` being the written one, else the default one; only with
        neither does the rule for the bare ``name`` apply (so, as in Vitess, a
        rule meant for every session is written for ``t`` and ``ks.t``). One
        rule applies, once (no chains). A rule with no target raises
        :class:`FailedPrecondition` ("table ... has been disabled"). ``reads``:
        the reference is read outside a transaction, so a read rule
        (:attr:`read_routing_rules`) for it comes first.
        """
        if not self.routing_rules and not (reads and self.read_routing_rules):
            return None
        qualifier = keyspace if keyspace is not None else default_keyspace
        key = f"{qualifier}.{name}" if qualifier else name
        rule = None
        if reads:
            rule = self.read_routing_rules.get(key) or self.read_routing_rules.get(key.lower())
        if rule is None:
            rule = self.routing_rules.get(key) or self.routing_rules.get(key.lower())
        if rule is None:
            return None
        if rule.target is None:
            raise FailedPrecondition(
                f"table {name!r} has been disabled by routing rule {rule.from_table!r}"
            )
        return rule.target

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {name: ks.source for name, ks in self.keyspaces.items()}


def parse_routing_rules(
    doc: Mapping[str, Any], keyspaces: Mapping[str, Keyspace], *, key: str = "rules"
) -> dict[str, RoutingRule]:
    """Read Vitess's ``RoutingRules`` JSON: ``{"rules": [{"from_table", "to_tables"}]}``.

    ``from_table`` is ``table`` or ``keyspace.table``; ``to_tables`` lists at
    most one ``keyspace.table`` (empty: the name is disabled). Errors are
    :class:`VSchemaError` naming ``routing_rules.rules[i]``. ``key``:
    ``"read_rules"`` reads shardgate's rules for reads outside transactions
    (same shape) instead.
    """
    path = "routing_rules"
    _expect(doc, Mapping, path, "an object")
    doc = _canonical(doc, path)
    _check_keys(doc, ("rules", "read_rules"), path)
    rules = _expect(doc.get(key, []), list, f"{path}.{key}", "a list")
    out: dict[str, RoutingRule] = {}
    for i, raw in enumerate(rules):
        rpath = f"{path}.{key}[{i}]"
        _expect(raw, Mapping, rpath, "an object")
        rule = _canonical(raw, rpath)
        _check_keys(rule, ("from_table", "to_tables"), rpath)
        src = _expect(rule.get("from_table"), str, f"{rpath}.from_table", "a table name")
        targets = _expect(rule.get("to_tables", []), list, f"{rpath}.to_tables",
                          "a list of keyspace.table names")
        if "@" in src or any(isinstance(t, str) and "@" in t for t in targets):
            raise VSchemaError(rpath, "tablet-type routing rules (keyspace@type.table) are "
                               "not supported: shardgate has no tablet types")
        if not src or src.count(".") > 1:
            raise VSchemaError(f"{rpath}.from_table", f"must be 'table' or 'keyspace.table', "
                               f"got {src!r}")
        if src in out:
            raise VSchemaError(f"{rpath}.from_table", f"duplicate rule for {src!r}")
        if len(targets) > 1:
            raise VSchemaError(f"{rpath}.to_tables", f"table {src!r} has more than one target: "
                               "give exactly one keyspace.table (or none to disable it)")
        target: tuple[str, str] | None = None
        if targets:
            t = targets[0]
            if not isinstance(t, str) or t.count(".") != 1 or "" in t.split("."):
                raise VSchemaError(f"{rpath}.to_tables[0]",
                                   f"must be a qualified 'keyspace.table', got {t!r}")
            tks, tname = t.split(".")
            if tks not in keyspaces:
                raise VSchemaError(f"{rpath}.to_tables[0]",
                                   f"keyspace {tks!r} of {t!r} does not exist")
            target = (tks, tname)
        out[src] = RoutingRule(src, target)
    return out


def _canonical(doc: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``doc`` with Vitess's camelCase field names turned snake_case (both at once refused)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = CAMEL_CASE.get(key, key)
        if name in out:
            raise VSchemaError(path, f"field {name!r} is given twice (as {name!r} and its "
                               "camelCase spelling)")
        out[name] = value
    return out

def _table_in(ks: Keyspace, name: str) -> Table:
    found = ks.tables.get(name) or ks.tables.get(name.lower())
    if found is not None:
        return found
    if not ks.sharded:
        # Unsharded keyspaces route any table to their one shard.
        return Table(name=name, keyspace=ks.name)
    raise NotFound(
        f"table {name!r} is not in the vschema of sharded keyspace {ks.name!r}: "
        f"add it with its column vindexes"
    )


def _expect(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise VSchemaError(path, f"must be {what}, got {type(value).__name__}")
    return value


def _check_keys(doc: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise VSchemaError(path, f"unknown field(s) {extra}; allowed: {sorted(allowed)}")


def _build_keyspace(name: str, source: Mapping[str, Any]) -> Keyspace:
    doc = _canonical(source, name)
    if "multi_tenant_spec" in doc or "multiTenantSpec" in doc:
        raise VSchemaError(name, "multi_tenant_spec (Vitess's multi-tenant migrations) is "
                           "not supported")
    _check_keys(
        doc,
        ("sharded", "vindexes", "tables", "require_explicit_routing", "foreign_key_mode",
         "auto_shard"),
        name,
    )
    sharded = bool(_expect(doc.get("sharded", False), bool, f"{name}.sharded", "true or false"))
    explicit = _expect(doc.get("require_explicit_routing", False), bool,
                       f"{name}.require_explicit_routing", "true or false")
    _check_foreign_key_mode(doc.get("foreign_key_mode", "unspecified"), name)
    ks = Keyspace(name=name, sharded=sharded, source=dict(source),
                  require_explicit_routing=explicit)

    owners: dict[str, str] = {}
    vdoc = _expect(doc.get("vindexes", {}), dict, f"{name}.vindexes", "an object")
    for vname, spec in vdoc.items():
        path = f"{name}.vindexes.{vname}"
        _expect(spec, dict, path, "an object")
        _check_keys(spec, ("type", "params", "owner"), path)
        vtype = _expect(spec.get("type"), str, f"{path}.type", "a string naming a vindex type")
        params = _expect(spec.get("params", {}), dict, f"{path}.params", "an object")
        for k, v in params.items():
            _expect(v, str, f"{path}.params.{k}", "a string (Vitess params are strings)")
        try:
            ks.vindexes[vname] = create_vindex(vtype, vname, params)
        except ShardgateError as exc:
            field_ = "type" if exc.code is Code.NOT_FOUND else "params"
            raise VSchemaError(f"{path}.{field_}", exc.message) from exc
        if "owner" in spec:
            owners[vname] = _expect(spec["owner"], str, f"{path}.owner", "a table name")

    tdoc = _expect(doc.get("tables", {}), dict, f"{name}.tables", "an object")
    for tname, spec in tdoc.items():
        path = f"{name}.tables.{tname}"
        _expect(spec, dict, path, "an object")
        ks.tables[tname] = _build_table(ks, tname, _canonical(spec, path), owners, path)

    if "auto_shard" in doc:
        ks.auto_shard, ks.auto_shard_sequences = _auto_shard(ks, doc["auto_shard"],
                                                             f"{name}.auto_shard")
    for vname, owner in owners.items():
        if owner not in ks.tables:
            raise VSchemaError(
                f"{name}.vindexes.{vname}.owner",
                f"owner table {owner!r} is not a table of keyspace {name!r}",
            )
    return ks


def _build_table(
    ks: Keyspace, tname: str, spec: Mapping[str, Any], owners: Mapping[str, str], path: str
) -> Table:
    _check_keys(
        spec,
        ("type", "column_vindexes", "auto_increment", "columns", "pinned", "queue",
         "column_list_authoritative", "source"),
        path,
    )
    ttype = _expect(spec.get("type", ""), str, f"{path}.type", "a string")
    if ttype not in TABLE_TYPES:
        raise VSchemaError(f"{path}.type", f"unknown table type {ttype!r}; use one of "
                           f"{[t.value for t in TableType if t]} or leave it out")
    ttype = TableType(ttype)
    if ttype == TableType.SEQUENCE and ks.sharded:
        raise VSchemaError(f"{path}.type", "sequence tables must be in an unsharded keyspace "
                           "(pinned sequence tables in a sharded keyspace are not supported)")
    table = Table(name=tname, keyspace=ks.name, type=ttype)
    _table_extras(table, spec, path)
    if ttype == TableType.QUEUE:
        table.options = dict(_expect(spec.get("queue", {}), dict, f"{path}.queue", "an object"))

    cvs = _expect(spec.get("column_vindexes", []), list, f"{path}.column_vindexes", "a list")
    for i, cv in enumerate(cvs):
        cpath = f"{path}.column_vindexes[{i}]"
        _expect(cv, dict, cpath, "an object")
        _check_keys(cv, ("column", "columns", "name"), cpath)
        vname = _expect(cv.get("name"), str, f"{cpath}.name", "the name of a vindex")
        if vname not in ks.vindexes:
            raise VSchemaError(
                f"{cpath}.name",
                f"vindex {vname!r} is not defined in {ks.name}.vindexes; "
                f"defined: {sorted(ks.vindexes)}",
            )
        vindex = ks.vindexes[vname]
        if ("column" in cv) == ("columns" in cv):
            raise VSchemaError(cpath, "give exactly one of 'column' or 'columns'")
        if "column" in cv:
            columns: tuple[str, ...] = (_expect(cv["column"], str, f"{cpath}.column", "a string"),)
        else:
            cols = _expect(cv["columns"], list, f"{cpath}.columns", "a list of column names")
            if not cols or not all(isinstance(c, str) for c in cols):
                raise VSchemaError(f"{cpath}.columns", "must be a non-empty list of names")
            columns = tuple(cols)
        if len(columns) > 1 and not isinstance(vindex, MultiColumn | Lookup):
            raise VSchemaError(
                f"{cpath}.columns",
                f"vindex {vname!r} ({vindex.type_name}) takes one column, got {len(columns)}",
            )
        owned = owners.get(vname) == tname
        if owned and isinstance(vindex, ConsistentLookupBase):
            try:
                vindex.set_owner(f"{ks.name}.{tname}", list(columns))
            except ShardgateError as exc:
                raise VSchemaError(cpath, exc.message) from exc
        table.column_vindexes.append(
            ColumnVindex(columns=tuple(c.lower() for c in columns), name=vname,
                         vindex=vindex, owned=owned)
        )

    if (ks.sharded and ttype not in (TableType.REFERENCE, TableType.SEQUENCE)
            and not table.column_vindexes and table.pinned is None):
        raise VSchemaError(
            f"{path}.column_vindexes",
            "a table of a sharded keyspace needs at least one column vindex "
            "(the first one is its primary vindex) or a 'pinned' keyspace id",
        )
    if table.column_vindexes and ks.sharded:
        primary = table.column_vindexes[0]
        if not primary.vindex.unique:
            raise VSchemaError(
                f"{path}.column_vindexes[0]",
                f"the primary vindex {primary.name!r} must be unique "
                f"({primary.vindex.type_name} is not)",
            )
        if primary.owned and isinstance(primary.vindex, Lookup):
            raise VSchemaError(
                f"{path}.column_vindexes[0]",
                f"the primary vindex {primary.name!r} is a lookup owned by {tname!r}: "
                "an owner's primary vindex must be functional (its keyspace id cannot "
                "come from a lookup the row itself creates)",
            )

    if "auto_increment" in spec:
        apath = f"{path}.auto_increment"
        ai = _expect(spec["auto_increment"], dict, apath, "an object")
        _check_keys(ai, ("column", "sequence"), apath)
        col = _expect(ai.get("column"), str, f"{apath}.column", "a column name")
        seq = _expect(ai.get("sequence"), str, f"{apath}.sequence", "a sequence table name")
        table.auto_increment = AutoIncrement(column=col.lower(), sequence=seq)
    return table


#: Vitess's ``ForeignKeyMode`` names and numbers; ``managed`` (3) is refused
_FK_MODES = {"unspecified": 0, "disallow": 1, "unmanaged": 2, "managed": 3}
#: the fields of Vitess's ``vschema.Column`` (only ``name`` and ``type`` are used)
_COLUMN_FIELDS = ("name", "type", "invisible", "default", "collation_name", "collationName",
                  "size", "scale", "nullable", "values")


def _auto_shard(ks: Keyspace, spec: Any, path: str) -> tuple[str, str | None]:
    """``auto_shard: {"vindex": NAME, "sequence_keyspace": KS}``: a unique vindex of
    this sharded keyspace, and optionally where sequences of new tables go (checked
    to be an unsharded keyspace by :func:`_check_auto_shard_sequences`)."""
    _expect(spec, dict, path, "an object")
    _check_keys(spec, ("vindex", "sequence_keyspace"), path)
    name = _expect(spec.get("vindex"), str, f"{path}.vindex", "a vindex name")
    seq_ks = spec.get("sequence_keyspace")
    if seq_ks is not None:
        _expect(seq_ks, str, f"{path}.sequence_keyspace", "an unsharded keyspace's name")
    if not ks.sharded:
        raise VSchemaError(path, "auto_shard is for sharded keyspaces (an unsharded keyspace "
                                 "takes any table already)")
    vindex = ks.vindexes.get(name)
    if vindex is None:
        raise VSchemaError(f"{path}.vindex", f"vindex {name!r} is not a vindex of keyspace "
                                             f"{ks.name!r}")
    if not vindex.unique or vindex.needs_cursor or not isinstance(vindex, SingleColumn):
        raise VSchemaError(f"{path}.vindex", f"vindex {name!r} cannot be a primary vindex "
                                             "(it must be unique and compute the keyspace id "
                                             "from the value, like hash or xxhash)")
    return str(name), seq_ks


def _check_auto_shard_sequences(keyspaces: Mapping[str, Keyspace]) -> None:
    """Every ``auto_shard.sequence_keyspace`` names an unsharded keyspace."""
    for ks in keyspaces.values():
        seq = ks.auto_shard_sequences
        if seq is None:
            continue
        target = keyspaces.get(seq)
        if target is None or target.sharded:
            raise VSchemaError(
                f"{ks.name}.auto_shard.sequence_keyspace",
                f"{seq!r} is not an unsharded keyspace (sequences live in one)")


def _check_foreign_key_mode(mode: Any, keyspace: str) -> None:
    path = f"{keyspace}.foreign_key_mode"
    if isinstance(mode, bool) or mode not in (*_FK_MODES, *_FK_MODES.values()):
        raise VSchemaError(path, f"must be one of {list(_FK_MODES)}, got {mode!r}")
    if mode in ("managed", _FK_MODES["managed"]):
        raise VSchemaError(path, "foreign_key_mode 'managed' (foreign keys whose cascades "
                           "the gate carries out) is not supported; use 'unmanaged' to let "
                           "each shard's database enforce them, or 'disallow'")


def _table_extras(table: Table, spec: Mapping[str, Any], path: str) -> None:
    """``pinned``, ``columns`` and ``column_list_authoritative`` of a table."""
    if "pinned" in spec:
        pin = _expect(spec["pinned"], str, f"{path}.pinned", "a hex keyspace id")
        try:
            table.pinned = bytes.fromhex(pin)
        except ValueError:
            raise VSchemaError(f"{path}.pinned", f"could not decode the keyspace id for pin: "
                               f"{pin!r} is not hex") from None
    cols = _expect(spec.get("columns", []), list, f"{path}.columns", "a list of columns")
    seen: set[str] = set()
    out: list[Column] = []
    for i, col in enumerate(cols):
        cpath = f"{path}.columns[{i}]"
        _expect(col, dict, cpath, "an object with 'name' (and 'type')")
        _check_keys(col, _COLUMN_FIELDS, cpath)
        cname = _expect(col.get("name"), str, f"{cpath}.name", "a column name")
        ctype = _expect(col.get("type", ""), (str, int), f"{cpath}.type",
                        "a type name (or its query.Type number)")
        if not cname or cname.lower() in seen:
            raise VSchemaError(f"{cpath}.name", f"duplicate column name {cname!r}")
        seen.add(cname.lower())
        out.append(Column(cname.lower(), str(ctype)))
    table.columns = tuple(out)
    table.column_list_authoritative = _expect(
        spec.get("column_list_authoritative", False), bool,
        f"{path}.column_list_authoritative", "true or false")


def _resolve_sequences(keyspaces: Mapping[str, Keyspace]) -> None:
    """Qualify every auto_increment sequence and check it names a sequence table."""
    sequences: dict[str, list[str]] = {}
    for ks in keyspaces.values():
        for t in ks.tables.values():
            if t.type == TableType.SEQUENCE:
                sequences.setdefault(t.name, []).append(ks.name)
    for ks in keyspaces.values():
        for t in ks.tables.values():
            ai = t.auto_increment
            if ai is None:
                continue
            path = f"{ks.name}.tables.{t.name}.auto_increment.sequence"
            if "." in ai.sequence:
                sks, sname = ai.sequence.split(".", 1)
                seq_table = keyspaces.get(sks, Keyspace(sks, False)).tables.get(sname)
                if seq_table is None or seq_table.type != TableType.SEQUENCE:
                    raise VSchemaError(path, f"{ai.sequence!r} is not a table of type sequence")
                continue
            where = sequences.get(ai.sequence, [])
            if len(where) != 1:
                problem = "is not defined as a table of type sequence in any keyspace"
                if where:
                    problem = f"is defined in several keyspaces {where}: qualify it"
                raise VSchemaError(path, f"sequence {ai.sequence!r} {problem}")
            t.auto_increment = AutoIncrement(ai.column, f"{where[0]}.{ai.sequence}")
