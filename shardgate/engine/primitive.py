"""The base of the primitives and what several of them share.

A plan is a small tree of frozen dataclasses (Vitess's engine primitives), one
kind a module: :mod:`~shardgate.engine.route` (``Route``, its opcodes here),
:mod:`~shardgate.engine.insert`, :mod:`~shardgate.engine.ddl`,
:mod:`~shardgate.engine.dml`, :mod:`~shardgate.engine.join`,
:mod:`~shardgate.engine.postprocess` and the others beside them.

Planning (``shardgate.planner``) is pure and builds these; execution is the
only place with I/O, and it goes through the :class:`~shardgate.engine.cursor.ExecCursor`
the gate implements (and unit tests fake). ``describe()`` gives the plan as
JSON in the shape of Vitess's planbuilder test data, used by EXPLAIN and the
golden files.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.errors import InvalidArgument
from shardgate.evalengine.sqlsem import Semantics, semantics
from shardgate.evalengine.values import Value, resolve
from shardgate.result import Result
from shardgate.sql.dialects import Dialect, sql_dialect
from shardgate.sql.dialects.base import SQLDialect
from shardgate.vindexes import KeyspaceId, Lookup, MultiColumn, SingleColumn, Vindex


class Opcode(enum.Enum):
    """How a Route picks its shards (Vitess's route opcodes)."""

    UNSHARDED = "Unsharded"
    EQUAL_UNIQUE = "EqualUnique"
    EQUAL = "Equal"
    IN = "IN"
    #: a tuple IN naming a vindex column: each tuple's value routes like an equality
    MULTI_EQUAL = "MultiEqual"
    SCATTER = "Scatter"
    NONE = "None"
    REFERENCE = "Reference"
    BY_DESTINATION = "ByDestination"

    @property
    def rank(self) -> int:
        """Lower is better: used to choose among candidate routes."""
        return _RANK[self]


_RANK = {
    Opcode.NONE: 0,
    Opcode.UNSHARDED: 1,
    Opcode.REFERENCE: 1,
    Opcode.BY_DESTINATION: 1,
    Opcode.EQUAL_UNIQUE: 2,
    Opcode.EQUAL: 3,
    Opcode.IN: 4,
    Opcode.MULTI_EQUAL: 4,
    Opcode.SCATTER: 5,
}



class Primitive:
    """Base of all primitives."""

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        raise NotImplementedError

    async def stream(
        self, vc: ExecCursor, bind_vars: Mapping[str, Any]
    ) -> AsyncIterator[Result]:
        """Stream results; by default, one chunk with everything."""
        yield await self.execute(vc, bind_vars)

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY term of a scatter merge: a result column by name."""

    column: str
    descending: bool = False
    #: NULLs first in the output (MySQL: first when ascending, last when descending)
    nulls_first: bool = True
    #: the result column's position, when the planner knows it (no SELECT *)
    index: int | None = None


async def vindex_map(
    vc: ExecCursor, vindex: Vindex, values: Sequence[Any]
) -> list[list[KeyspaceId]]:
    """The keyspace ids each value maps to under ``vindex`` (a lookup reads through the cursor)."""
    if isinstance(vindex, Lookup):
        return await vindex.map(vc.lookup_cursor(), values)
    if isinstance(vindex, SingleColumn):
        return vindex.map(values)
    if isinstance(vindex, MultiColumn):
        return vindex.map_multi([v if isinstance(v, tuple | list) else (v,) for v in values])
    raise InvalidArgument(f"vindex {vindex.name!r} cannot map values")


async def map_distinct(
    vc: ExecCursor, vindex: Vindex, values: Sequence[Any]
) -> list[list[KeyspaceId]]:
    """:func:`vindex_map` of ``values``, each distinct value mapped once (rows of one
    insert often share their sharding value). Values are told apart by type as well,
    so ``1`` and ``True`` or ``1.0`` are never taken for one another."""
    try:
        keys = [tuple((type(x), x) for x in v) if isinstance(v, tuple) else (type(v), v)
                for v in values]
        distinct: dict[Any, Any] = {}  # key -> its first value, as given
        for k, v in zip(keys, values, strict=True):
            distinct.setdefault(k, v)
    except TypeError:  # an unhashable value: map them as they are
        return await vindex_map(vc, vindex, values)
    if len(distinct) == len(values):
        return await vindex_map(vc, vindex, values)
    mapped = await vindex_map(vc, vindex, list(distinct.values()))
    of = dict(zip(distinct, mapped, strict=True))
    return [of[k] for k in keys]



def int_of(v: Value | None, bind_vars: Mapping[str, Any], what: str) -> int:
    """A LIMIT or OFFSET value (``what``) resolved: a non-negative integer, 0 when absent."""
    if v is None:
        return 0
    n = resolve(v, bind_vars)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgument(f"{what} must be a non-negative integer, got {n!r}")
    return n



def order_compare(a: Any, b: Any, descending: bool, nulls_first: bool, sem: Semantics) -> int:
    """Compare two sort-key values; ``nulls_first`` places NULLs first in the output."""
    if a is None or b is None:
        if a is None and b is None:
            return 0
        return (-1 if a is None else 1) * (1 if nulls_first else -1)
    c = sem.compare(a, b)
    return -c if descending else c


def dialect_of(vc: ExecCursor, keyspace: str) -> SQLDialect:
    """The object of the keyspace's SQL dialect (what its database does differently)."""
    return sql_dialect(Dialect(vc.dialect(keyspace)))


def semantics_of(vc: ExecCursor, keyspace: str) -> Semantics:
    """How the keyspace's database compares, sorts and computes values."""
    if not keyspace:
        return semantics("mysql")
    return semantics(vc.dialect(keyspace), vc.collation(keyspace))

