"""VSchema changes as pure functions on one keyspace's VSchema JSON.

Each function takes a keyspace's VSchema document (Vitess's JSON shape, as
stored in the topo store) and returns a **new** document with one change;
the input is never modified. They check the change's own preconditions
(the table exists, the vindex is not already there, ...) and raise coded
errors naming the table or vindex; whether the resulting VSchema as a whole
is valid (vindex types and params, primary vindex unique, owners, sequences)
is checked by :meth:`~shardgate.topo.model.Topology.build_vschema` when the
change is saved (the topo server validates before it writes).

:func:`alter` applies an ``ALTER VSCHEMA`` statement with Vitess's semantics
(``go/vt/topotools/vschema_ddl.go``):

* ``ADD TABLE t`` only in an unsharded keyspace (a sharded table needs a
  vindex: ``ON t ADD VINDEX`` creates the entry);
* ``ON t ADD VINDEX v(cols) USING type WITH ...`` creates ``v`` if missing
  (an existing ``v`` must have the same type and params), creates the table
  entry if missing, and appends the column vindex (the first one is the
  primary); the ``owner`` param names the owner table;
* ``ON t DROP VINDEX v`` removes the column vindex, then the table entry if
  it has none left, then the vindex itself if no table uses it any more;
* ``DROP VINDEX v`` is refused while a table uses it;
* ``ADD SEQUENCE s`` only in an unsharded keyspace; ``ON t ADD
  AUTO_INCREMENT col USING seq`` needs the table and no auto_increment yet.

:func:`dependents` says what depends on a table across all keyspaces (the
lookup vindexes it owns and their tables, vindexes backed by it, tables whose
auto_increment uses it), which ``DROP TABLE`` through the gate checks;
:func:`drop_table_cascade` is the VSchema half of a confirmed drop.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from shardgate.sql.statements import (
    AddAutoIncrement,
    AddColumnVindex,
    AddVSchemaSequence,
    AddVSchemaTable,
    AlterVSchema,
    CreateVSchemaVindex,
    DropAutoIncrement,
    DropColumnVindex,
    DropVSchemaTable,
    DropVSchemaVindex,
)
from shardgate.vschema import TableType

Doc = dict[str, Any]


def alter(doc: Mapping[str, Any], stmt: AlterVSchema, keyspace: str) -> Doc:
    """``doc`` (the VSchema of ``keyspace``) with the ``ALTER VSCHEMA`` change made."""
    match stmt:
        case AddVSchemaTable(table=table):
            if _sharded(doc):
                raise InvalidArgument(
                    f"ALTER VSCHEMA ADD TABLE {table}: keyspace {keyspace!r} is sharded; a "
                    f"sharded table needs a vindex: ALTER VSCHEMA ON {table} ADD VINDEX "
                    "name(column) USING type"
                )
            return add_table(doc, keyspace, table, {})
        case DropVSchemaTable(table=table):
            return drop_table(doc, keyspace, table)
        case AddVSchemaSequence(table=table):
            if _sharded(doc):
                raise InvalidArgument(
                    f"ALTER VSCHEMA ADD SEQUENCE {table}: sequence tables live in an unsharded "
                    f"keyspace; {keyspace!r} is sharded"
                )
            return add_table(doc, keyspace, table, {"type": TableType.SEQUENCE.value})
        case CreateVSchemaVindex(vindex=name, vindex_type=vtype, params=params):
            out = _copy(doc)
            _define_vindex(out, keyspace, name, vtype, dict(params), create_only=True)
            return out
        case DropVSchemaVindex(vindex=name):
            return drop_vindex(doc, keyspace, name)
        case AddColumnVindex():
            return add_column_vindex(doc, keyspace, stmt)
        case DropColumnVindex(table=table, vindex=name):
            return drop_column_vindex(doc, keyspace, table, name)
        case AddAutoIncrement(table=table, column=column, sequence=sequence):
            out = _copy(doc)
            spec = _table(out, keyspace, table)
            if spec.get("auto_increment") or spec.get("autoIncrement"):
                raise AlreadyExists(
                    f"table {keyspace}.{table} already has an auto_increment: drop it first "
                    f"(ALTER VSCHEMA ON {table} DROP AUTO_INCREMENT)"
                )
            spec["auto_increment"] = {"column": column, "sequence": sequence}
            return out
        case DropAutoIncrement(table=table):
            out = _copy(doc)
            spec = _table(out, keyspace, table)
            if spec.pop("auto_increment", None) is None and spec.pop("autoIncrement", None) is None:
                raise NotFound(f"table {keyspace}.{table} has no auto_increment")
            return out
    raise InvalidArgument(f"unknown ALTER VSCHEMA form {type(stmt).__name__}")


def add_table(doc: Mapping[str, Any], keyspace: str, table: str, spec: Mapping[str, Any],
              *, if_not_exists: bool = False) -> Doc:
    """``doc`` with table ``table`` given ``spec`` (AlreadyExists if it is there)."""
    out = _copy(doc)
    tables = out.setdefault("tables", {})
    if table in tables:
        if if_not_exists:
            return out
        raise AlreadyExists(f"table {keyspace}.{table} already exists in the VSchema")
    tables[table] = copy.deepcopy(dict(spec))
    return out


def drop_table(doc: Mapping[str, Any], keyspace: str, table: str, *,
               if_exists: bool = False) -> Doc:
    """``doc`` without table ``table`` (NotFound unless ``if_exists``).

    Refused while a vindex of the keyspace names ``table`` as its owner: drop
    the vindex first, or drop the table through the gate with confirmation.
    """
    out = _copy(doc)
    tables = out.get("tables", {})
    if table not in tables:
        if if_exists:
            return out
        raise NotFound(f"table {keyspace}.{table} is not in the VSchema")
    owned = [v for v, spec in out.get("vindexes", {}).items() if spec.get("owner") == table]
    if owned:
        raise FailedPrecondition(
            f"table {keyspace}.{table} owns vindex(es) {sorted(owned)}: drop them first "
            f"(ALTER VSCHEMA ON {table} DROP VINDEX name)"
        )
    del tables[table]
    return out


def add_column_vindex(doc: Mapping[str, Any], keyspace: str, stmt: AddColumnVindex) -> Doc:
    """``ALTER VSCHEMA ON t ADD VINDEX v(cols) [USING type] [WITH ...]`` on ``doc``."""
    out = _copy(doc)
    params = dict(stmt.params)
    owner = params.pop("owner", None)
    vindexes = out.setdefault("vindexes", {})
    if stmt.vindex_type is not None:
        _define_vindex(out, keyspace, stmt.vindex, stmt.vindex_type, params, create_only=False)
    elif stmt.vindex not in vindexes:
        raise NotFound(
            f"vindex {stmt.vindex!r} is not defined in keyspace {keyspace!r}: give its type "
            f"(ADD VINDEX {stmt.vindex}(...) USING type) or create it first"
        )
    elif params:
        raise InvalidArgument(f"ADD VINDEX {stmt.vindex}: WITH params need USING type")
    if owner is not None:
        current = vindexes[stmt.vindex].get("owner")
        if current not in (None, owner):
            raise AlreadyExists(f"vindex {stmt.vindex!r} is already owned by {current!r}")
        if owner != stmt.table:
            raise InvalidArgument(
                f"ADD VINDEX {stmt.vindex} WITH owner={owner}: the owner must be the table "
                f"the vindex is added to ({stmt.table})"
            )
        vindexes[stmt.vindex]["owner"] = owner
    tables = out.setdefault("tables", {})
    spec = tables.setdefault(stmt.table, {})
    cvs = spec.setdefault("column_vindexes", spec.pop("columnVindexes", []))
    if any(cv.get("name") == stmt.vindex for cv in cvs):
        raise AlreadyExists(f"table {keyspace}.{stmt.table} already has vindex {stmt.vindex!r}")
    if len(stmt.columns) == 1:
        cvs.append({"column": stmt.columns[0], "name": stmt.vindex})
    else:
        cvs.append({"columns": list(stmt.columns), "name": stmt.vindex})
    return out


def drop_column_vindex(doc: Mapping[str, Any], keyspace: str, table: str, vindex: str) -> Doc:
    """``ALTER VSCHEMA ON t DROP VINDEX v`` on ``doc`` (see the module docstring)."""
    out = _copy(doc)
    spec = _table(out, keyspace, table)
    cvs: list[dict[str, Any]] = spec.get("column_vindexes") or spec.get("columnVindexes") or []
    kept = [cv for cv in cvs if cv.get("name") != vindex]
    if len(kept) == len(cvs):
        raise NotFound(f"table {keyspace}.{table} has no vindex {vindex!r}")
    spec.pop("columnVindexes", None)
    spec["column_vindexes"] = kept
    if not kept and not spec.get("type") and not spec.get("pinned"):
        del out["tables"][table]
    vspec = out.get("vindexes", {}).get(vindex, {})
    if not _users(out, vindex):
        out.get("vindexes", {}).pop(vindex, None)
    elif vspec.get("owner") == table:
        del vspec["owner"]  # the owner no longer maintains it
    return out


def drop_vindex(doc: Mapping[str, Any], keyspace: str, vindex: str) -> Doc:
    """``ALTER VSCHEMA DROP VINDEX v``: refused while a table uses ``v``."""
    out = _copy(doc)
    if vindex not in out.get("vindexes", {}):
        raise NotFound(f"vindex {vindex!r} is not defined in keyspace {keyspace!r}")
    users = _users(out, vindex)
    if users:
        raise FailedPrecondition(
            f"vindex {keyspace}.{vindex} is used by table(s) {users}: drop it from each first "
            f"(ALTER VSCHEMA ON {users[0]} DROP VINDEX {vindex})"
        )
    del out["vindexes"][vindex]
    return out


def set_vindex_params(doc: Mapping[str, Any], keyspace: str, vindex: str,
                      changes: Mapping[str, str | None]) -> Doc:
    """``doc`` with params of ``vindex`` set (a None value removes the param)."""
    out = _copy(doc)
    spec = out.get("vindexes", {}).get(vindex)
    if spec is None:
        raise NotFound(f"vindex {vindex!r} is not defined in keyspace {keyspace!r}")
    params = spec.setdefault("params", {})
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    return out


@dataclass(frozen=True)
class Dependents:
    """What depends on one table (``keyspace.table``) across the VSchemas.

    ``owned``: ``(vindex, lookup table)`` of the lookup vindexes the table owns
    (their rows go with the owner's); ``backing``: ``(keyspace, vindex)`` of
    the lookup vindexes whose rows live in this table; ``sequence_users``:
    ``keyspace.table`` of tables whose auto_increment draws from it.
    """

    owned: tuple[tuple[str, str], ...] = ()
    backing: tuple[tuple[str, str], ...] = ()
    sequence_users: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.owned or self.backing or self.sequence_users)

    def describe(self) -> str:
        parts = []
        if self.owned:
            parts.append("owns lookup vindex(es) " + ", ".join(
                f"{v} (rows in {t})" for v, t in self.owned))
        if self.backing:
            parts.append("holds the rows of lookup vindex(es) " + ", ".join(
                f"{k}.{v}" for k, v in self.backing))
        if self.sequence_users:
            parts.append("is the sequence of " + ", ".join(self.sequence_users))
        return "; ".join(parts)


def dependents(docs: Mapping[str, Mapping[str, Any]], keyspace: str, table: str) -> Dependents:
    """What depends on ``keyspace.table`` in the VSchemas ``docs`` (``{keyspace: doc}``)."""
    owned: list[tuple[str, str]] = []
    backing: list[tuple[str, str]] = []
    users: list[str] = []
    qualified = f"{keyspace}.{table}".lower()
    for ks, doc in docs.items():
        for vname, spec in doc.get("vindexes", {}).items():
            params = spec.get("params", {})
            lookup_table = params.get("table")
            if ks == keyspace and spec.get("owner") == table and lookup_table:
                owned.append((vname, _qualify(lookup_table, ks)))
            if lookup_table and _qualify(lookup_table, ks).lower() == qualified:
                backing.append((ks, vname))
        for tname, tspec in doc.get("tables", {}).items():
            ai = tspec.get("auto_increment") or tspec.get("autoIncrement")
            if not ai:
                continue
            seq = str(ai.get("sequence", "")).lower()
            if seq == qualified or (seq == table.lower()
                                    and _is_sequence(docs.get(keyspace, {}), table)):
                users.append(f"{ks}.{tname}")
    return Dependents(tuple(owned), tuple(backing), tuple(users))


def drop_table_cascade(docs: Mapping[str, Mapping[str, Any]], keyspace: str,
                       table: str) -> dict[str, Doc]:
    """The VSchemas (only the changed keyspaces) after a confirmed ``DROP TABLE``.

    Removes the table, the lookup vindexes it owns (and their column vindexes
    on other tables), the vindexes whose rows it holds, the auto_increment of
    tables drawing from it, and the VSchema entries of the owned lookups'
    tables. Refused (FailedPrecondition) when another table would lose its
    primary vindex: that table must be changed first.
    """
    deps = dependents(docs, keyspace, table)
    out: dict[str, Doc] = {}

    def doc_of(ks: str) -> Doc:
        if ks not in out:
            out[ks] = _copy(docs[ks])
        return out[ks]

    gone: list[tuple[str, str]] = [(keyspace, v) for v, _ in deps.owned] + list(deps.backing)
    for ks, vname in gone:
        doc = doc_of(ks)
        for tname, tspec in doc.get("tables", {}).items():
            if ks == keyspace and tname == table:
                continue
            cvs = tspec.get("column_vindexes", tspec.get("columnVindexes", []))
            if cvs and cvs[0].get("name") == vname:
                raise FailedPrecondition(
                    f"DROP TABLE {keyspace}.{table}: vindex {ks}.{vname} is the primary vindex "
                    f"of table {ks}.{tname}; change that table first"
                )
            kept = [cv for cv in cvs if cv.get("name") != vname]
            if len(kept) != len(cvs):
                tspec.pop("columnVindexes", None)
                tspec["column_vindexes"] = kept
        doc.get("vindexes", {}).pop(vname, None)
    for user in deps.sequence_users:
        uks, utable = user.split(".", 1)
        tspec = doc_of(uks)["tables"][utable]
        tspec.pop("auto_increment", None)
        tspec.pop("autoIncrement", None)
    own = doc_of(keyspace)
    own.get("tables", {}).pop(table, None)
    for _, lookup_table in deps.owned:
        lks, _, lname = lookup_table.partition(".")
        if lks in docs and lname in docs[lks].get("tables", {}):
            doc_of(lks)["tables"].pop(lname, None)
    return out


def lookup_table_name(params: Mapping[str, str], keyspace: str) -> str:
    """The ``keyspace.table`` of a lookup vindex's ``table`` param."""
    table = params.get("table")
    if not table:
        raise InvalidArgument("lookup vindex has no 'table' param")
    return _qualify(table, keyspace)


# -- helpers ------------------------------------------------------------------------------------


def _copy(doc: Mapping[str, Any]) -> Doc:
    return copy.deepcopy(dict(doc))


def _sharded(doc: Mapping[str, Any]) -> bool:
    return bool(doc.get("sharded", False))


def _qualify(table: str, keyspace: str) -> str:
    return table if "." in table else f"{keyspace}.{table}"


def _is_sequence(doc: Mapping[str, Any], table: str) -> bool:
    return bool(doc.get("tables", {}).get(table, {}).get("type") == TableType.SEQUENCE)


def _table(doc: Doc, keyspace: str, table: str) -> Doc:
    found = doc.get("tables", {}).get(table)
    if found is None:
        raise NotFound(f"table {keyspace}.{table} is not in the VSchema")
    if not isinstance(found, dict):
        raise InvalidArgument(f"table {keyspace}.{table}: its VSchema entry is not an object")
    return found


def _users(doc: Mapping[str, Any], vindex: str) -> list[str]:
    return sorted(
        tname for tname, spec in doc.get("tables", {}).items()
        if any(cv.get("name") == vindex
               for cv in spec.get("column_vindexes", spec.get("columnVindexes", [])))
    )


def _define_vindex(doc: Doc, keyspace: str, name: str, vtype: str, params: dict[str, str],
                   *, create_only: bool) -> None:
    vindexes = doc.setdefault("vindexes", {})
    existing = vindexes.get(name)
    if existing is None:
        vindexes[name] = {"type": vtype, **({"params": params} if params else {})}
        return
    if create_only:
        raise AlreadyExists(f"vindex {name!r} already exists in keyspace {keyspace!r}")
    if existing.get("type") != vtype:
        raise InvalidArgument(
            f"vindex {name!r} is defined with type {existing.get('type')!r}, not {vtype!r}"
        )
    if params and existing.get("params", {}) != params:
        raise InvalidArgument(
            f"vindex {name!r} is defined with params {existing.get('params', {})}, "
            f"not {params}"
        )
