"""Arrow schemas of the bulk seam (:mod:`~shardgate.backends.bulk.copy`): the Arrow type of
each database's columns, driver-specific types made plain, and batches conformed to a schema.

``pyarrow`` is the ``spark`` extra: each function imports it when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardgate.errors import InvalidArgument, NotFound

if TYPE_CHECKING:
    import pyarrow as pa


def inferred(values: Sequence[Any]) -> pa.DataType:
    """The Arrow type of a column of SQLite values (mixed storage classes: string)."""
    import pyarrow as pa

    try:
        return pa.array(list(values)).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.string()


#: field metadata key naming a type decision left to :mod:`shardgate.spark.types`:
#: ``numeric`` (PostgreSQL NUMERIC without precision, given as text), ``bool``
#: (MariaDB TINYINT(1)/BOOLEAN, given as integers)
SG_TYPE = b"shardgate.type"


def sqlite_type(declared: str) -> pa.DataType:
    """The Arrow type of a SQLite declared column type (SQLite's affinity rules)."""
    import pyarrow as pa

    d = (declared or "").upper()
    if "INT" in d:
        return pa.int64()
    if "CHAR" in d or "CLOB" in d or "TEXT" in d:
        return pa.string()
    if "BLOB" in d or not d:
        return pa.binary()
    if "BOOL" in d:
        return pa.bool_()
    if "DATE" in d or "TIME" in d:
        return pa.string()
    return pa.float64()  # REAL, FLOAT, DOUBLE, NUMERIC, DECIMAL (as ADBC reads them)


def mysql_field(f: Any) -> pa.Field:
    import pyarrow as pa
    from pymysql.constants import FIELD_TYPE
    from pymysql.constants.FLAG import NOT_NULL

    t = f.type_code
    meta: dict[bytes, bytes] | None = None
    if t == FIELD_TYPE.TINY and int(f.length) == 1:
        meta = {SG_TYPE: b"bool"}
    if t in (FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.LONG, FIELD_TYPE.INT24,
             FIELD_TYPE.LONGLONG, FIELD_TYPE.YEAR):
        typ: pa.DataType = pa.int64()
    elif t in (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE):
        typ = pa.float64()
    elif t in (FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL):
        scale = int(f.scale)
        precision = max(1, min(38, int(f.length) - (1 if scale else 0) - 1))
        typ = pa.decimal128(max(precision, scale), scale)
    elif t in (FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE):
        typ = pa.date32()
    elif t == FIELD_TYPE.DATETIME:
        typ = pa.timestamp("us")
    elif t == FIELD_TYPE.TIMESTAMP:  # stored in UTC; sessions read it in UTC
        typ = pa.timestamp("us", tz="UTC")
    elif f.charsetnr == 63 and t not in (FIELD_TYPE.TIME,):
        typ = pa.binary()
    else:
        typ = pa.string()
    return pa.field(f.name, typ, nullable=not f.flags & NOT_NULL, metadata=meta)


def not_null(schema: pa.Schema, columns: set[str]) -> pa.Schema:
    """``schema`` with the fields named in ``columns`` made non-nullable."""
    for i, f in enumerate(schema):
        if f.name in columns:
            schema = schema.set(i, f.with_nullable(False))
    return schema


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """Replace driver-specific Arrow types with plain ones Spark knows.

    PostgreSQL NUMERIC arrives as an opaque extension of strings: with a
    typmod it becomes ``decimal128(p, s)``, without one a string tagged
    ``numeric`` (:data:`SG_TYPE`; :mod:`shardgate.spark.types` decides its type).
    """
    import pyarrow as pa

    fields = []
    for f in schema:
        typ = f.type
        tag: dict[bytes, bytes] | None = None
        if isinstance(typ, pa.ExtensionType) or str(typ).startswith("extension<"):
            meta = {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}
            typmod = int(meta.get("POSTGRESQL:typmod", "-1") or -1)
            if meta.get("POSTGRESQL:type") == "numeric" and typmod >= 4:
                precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
                typ = pa.decimal128(min(precision, 38), scale)
            else:
                typ = pa.string()
                if meta.get("POSTGRESQL:type") == "numeric":
                    tag = {SG_TYPE: b"numeric"}
        elif pa.types.is_null(typ):
            typ = pa.string()
        fields.append(pa.field(f.name, typ, nullable=f.nullable, metadata=tag))
    return pa.schema(fields)


def conform(batch: Any, schema: pa.Schema) -> Any:
    """``batch`` (a RecordBatch or Table) with the columns and types of ``schema``.

    Columns are matched by name, case-insensitively; extra columns are dropped.
    """
    import pyarrow as pa

    names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
    arrays = []
    for f in schema:
        i = names.get(f.name.lower())
        if i is None:
            raise NotFound(f"column {f.name!r} is not in the result ({batch.schema.names})")
        col = batch.column(i)
        if isinstance(col.type, pa.ExtensionType) or str(col.type).startswith("extension<"):
            col = col.storage if hasattr(col, "storage") else pa.chunked_array(
                [c.storage for c in col.chunks], col.type.storage_type)  # PostgreSQL NUMERIC
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidArgument(
                    f"column {f.name!r}: cannot convert {col.type} to {f.type}: {exc}"
                ) from exc
        arrays.append(col)
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(arrays, schema=schema)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
