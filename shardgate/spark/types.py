"""The one type mapping: shard database types -> Arrow -> Spark, and values converted by it.

Every Spark path of shardgate goes through this module: the reader (both the
split reader and the gate path), the writer, the dump job's snapshot and its
change apply, and the change source. ``docs/types.md`` is the table a user
reads; this docstring is the contract the code keeps.

Schemas. The backends describe a column in Arrow terms
(:func:`shardgate.backends.bulk.copy.result_schema`), tagging the columns whose
Arrow form is a decision rather than a fact with the field metadata key
:data:`shardgate.backends.bulk.copy.SG_TYPE`:

* ``numeric``: a PostgreSQL ``NUMERIC`` without precision. It becomes
  ``decimal(38, 18)`` (:data:`UNBOUNDED_NUMERIC`) by default; a value that does
  not fit (more than 20 integer digits or 18 fractional ones, ``NaN``) is
  refused, never rounded. With ``numeric_as="string"`` the column is a string
  in the canonical form (:func:`decimal_text`): plain notation, no exponent,
  the database's scale kept (``0.000000000001``, never ``1E-12``); ``NaN``,
  ``Infinity`` and ``-Infinity`` as PostgreSQL spells them.
* ``bool``: a MariaDB ``TINYINT(1)``/``BOOLEAN``: Arrow ``bool``; a stored
  value other than 0 or 1 is refused.

Timestamps: without a zone (PostgreSQL ``timestamp``, MariaDB ``DATETIME``)
Arrow ``timestamp[us]`` and Spark ``TIMESTAMP_NTZ`` (wall-clock values, shown
the same in every session time zone); with a zone (PostgreSQL
``timestamptz``, MariaDB ``TIMESTAMP``) ``timestamp[us, UTC]`` and Spark
``TIMESTAMP``. PostgreSQL's ``infinity`` and ``-infinity`` (timestamps and
dates) map to the ends of Spark's range, :data:`TS_MAX`/:data:`TS_MIN` and
:data:`DATE_MAX`/:data:`DATE_MIN` (the gate's own PostgreSQL sessions read
them the same way); any other value outside that range is refused.
``time`` becomes a string (``HH:MM:SS[.ffffff]``), Spark having no time type.

Values. :func:`conform` converts a driver's Arrow batch (whole columns, no
Python objects); :func:`column` converts Python values (change images, the
gate's rows, MariaDB's tuples) and returns, instead of raising, the rows it
could not convert with the reason, so the dump job can quarantine exactly those.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from shardgate.backends.bulk.arrow import SG_TYPE
from shardgate.errors import InvalidArgument

#: the Arrow type of an unbounded PostgreSQL NUMERIC (``numeric_as="decimal"``)
UNBOUNDED_NUMERIC = pa.decimal128(38, 18)
#: how unbounded NUMERIC columns are typed: ``decimal`` (default) or ``string``
NUMERIC_AS = ("decimal", "string")
#: where PostgreSQL's infinities land: the ends of Spark's range, except that
#: -infinity is 0001-01-02 (PySpark cannot turn a zoned timestamp of 0001-01-01
#: into a Python datetime)
TS_MIN = datetime.datetime(1, 1, 2)
TS_MAX = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
DATE_MIN = datetime.date(1, 1, 1)
DATE_MAX = datetime.date(9999, 12, 31)
_EPOCH = datetime.datetime(1970, 1, 1)
_TS_MIN_US = -62135596800_000000
_TS_LOW_US = -62135510400_000000  # TS_MIN
_TS_MAX_US = 253402300799_999999
_DATE_MIN_D, _DATE_MAX_D = -719162, 2932896
# ADBC's PostgreSQL driver adds the 2000-01-01 epoch offset to PostgreSQL's
# infinity sentinels (INT64/INT32 max and min) and wraps around: these values.
_TS_INF = {-9222425352054775809: _TS_MAX_US, -9222425352054775808: _TS_LOW_US}
_DATE_INF = {-2147472692: _DATE_MAX_D, -2147472691: _DATE_MIN_D}
_TEXT_INF = {"infinity": 1, "+infinity": 1, "-infinity": -1}


# ---------------------------------------------------------------------- schemas --


def canonical_schema(raw: pa.Schema, *, numeric_as: str = "decimal") -> pa.Schema:
    """The Arrow schema every path uses for a table whose backends describe it as ``raw``."""
    if numeric_as not in NUMERIC_AS:
        raise InvalidArgument(f"numeric_as must be one of {NUMERIC_AS}, got {numeric_as!r}")
    return pa.schema([pa.field(f.name, _canonical_type(f, numeric_as), f.nullable,
                               f.metadata) for f in raw])


def _canonical_type(f: pa.Field, numeric_as: str) -> pa.DataType:
    tag = sg_type(f)
    if tag == "numeric":
        return UNBOUNDED_NUMERIC if numeric_as == "decimal" else pa.string()
    if tag == "bool":
        return pa.bool_()
    t = f.type
    if isinstance(t, pa.BaseExtensionType):
        return pa.string()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_time(t):
        return pa.string()
    if pa.types.is_date64(t):
        return pa.date32()
    return t


def sg_type(f: pa.Field) -> str:
    """The backend's tag of a field (``numeric``, ``bool``), or ``""``."""
    return str((f.metadata or {}).get(SG_TYPE, b"").decode())


def to_spark(schema: pa.Schema) -> StructType:
    """The Spark schema of a canonical Arrow schema (zone-less timestamps -> TIMESTAMP_NTZ)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def to_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema the reader's batches must have for ``schema``."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def drop_last(schema: pa.Schema, n: int) -> pa.Schema:
    """``schema`` without its last ``n`` fields (the gate's hidden columns)."""
    for _ in range(n):
        schema = schema.remove(len(schema) - 1)
    return schema


# ----------------------------------------------------------------- Arrow values --


def conform(batch: Any, schema: pa.Schema) -> Any:
    """``batch`` (RecordBatch or Table) with the columns, in order, and types of ``schema``.

    Columns are matched by name, case-insensitively. Raises ``INVALID_ARGUMENT``
    naming the column and value when a value cannot be converted exactly.
    """
    names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
    arrays = []
    for f in schema:
        i = names.get(f.name.lower())
        if i is None:
            raise InvalidArgument(f"column {f.name!r} is not in the result {batch.schema.names}")
        arrays.append(arrow_column(batch.column(i), f))
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(arrays, schema=schema)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def arrow_column(col: Any, f: pa.Field) -> Any:
    """One Arrow column converted to ``f``'s type by the mapping (see the module doc)."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([arrow_column(c, f) for c in col.chunks], f.type)
    opaque = isinstance(col.type, pa.BaseExtensionType)
    if opaque:
        col = col.storage  # PostgreSQL NUMERIC (and other opaque types) as text
    t = f.type
    try:
        if pa.types.is_timestamp(col.type) and pa.types.is_timestamp(t):
            return _timestamps(col, t)
        if pa.types.is_date32(col.type) and pa.types.is_date32(t):
            return _dates(col)
        if pa.types.is_time(col.type) and pa.types.is_string(t):
            return pa.array([None if v is None else v.isoformat() for v in col.to_pylist()],
                            pa.string())
        if pa.types.is_string(col.type) and pa.types.is_decimal(t):
            return _check_fits(col, f).cast(t)
        if pa.types.is_string(col.type) and pa.types.is_string(t):
            return _numeric_names(col) if opaque else col
        if pa.types.is_integer(col.type) and pa.types.is_boolean(t):
            return _ints_as_bools(col, f)
        if pa.types.is_decimal(col.type) and pa.types.is_string(t):
            return pa.array([decimal_text(v) for v in col.to_pylist()], pa.string())
        return col if col.type == t else col.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise InvalidArgument(f"column {f.name!r}: cannot convert {col.type} values to "
                              f"{t} exactly: {exc}") from exc


def _check_fits(col: pa.Array, f: pa.Field) -> pa.Array:
    """Refuse decimal text that does not fit ``f``'s type exactly.

    Checked on the text itself: Arrow's string -> decimal cast wraps around, with
    no error, values of more than 38 digits once scaled.
    """
    t = f.type
    whole = t.precision - t.scale
    pattern = (rf"^[+-]?[0-9]{{1,{max(1, whole)}}}(\.[0-9]{{0,{t.scale}}}0*)?$" if t.scale
               else rf"^[+-]?[0-9]{{1,{max(1, whole)}}}(\.0*)?$")
    ok = pc.match_substring_regex(col, pattern)
    if not pc.all(pc.or_kleene(ok, pc.is_null(col))).as_py():
        bad = col.filter(pc.invert(pc.fill_null(ok, True)))[0].as_py()
        raise InvalidArgument(
            f"column {f.name!r}: {bad!r} does not fit {t} (NaN, infinity and wider values "
            "have no such form): read unbounded NUMERIC columns with numeric_as='string'")
    return col


def _numeric_names(col: pa.Array) -> pa.Array:
    """ADBC's ``nan``/``inf`` spellings of NUMERIC specials as PostgreSQL's (canonical)."""
    names = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "infinity": "Infinity",
             "-infinity": "-Infinity"}
    if not pc.any(pc.is_in(pc.utf8_lower(col), pa.array(list(names)))).as_py():
        return col
    return pa.array([names.get(v.lower(), v) if v is not None else None
                     for v in col.to_pylist()], pa.string())


def _outside(raw: pa.Array, low: int, high: int) -> bool:
    """True when a non-null value of the integer array ``raw`` is outside [low, high]."""
    mm = pc.min_max(raw).as_py()
    return mm["min"] is not None and (mm["min"] < low or mm["max"] > high)


def _timestamps(col: pa.Array, t: pa.TimestampType) -> pa.Array:
    us = col.cast(pa.timestamp("us", tz=col.type.tz)) if col.type.unit != "us" else col
    raw = us.view(pa.int64()) if hasattr(us, "view") else us.cast(pa.int64())
    raw = _clamped(raw, _TS_MIN_US, _TS_MAX_US, _TS_INF, "timestamp", "µs")
    return raw.cast(pa.timestamp("us", tz=col.type.tz)).cast(t)


def _dates(col: pa.Array) -> pa.Array:
    raw = _clamped(col.cast(pa.int32()), _DATE_MIN_D, _DATE_MAX_D, _DATE_INF, "date", "days")
    return raw.cast(pa.date32())


def _clamped(raw: pa.Array, low: int, high: int, infinities: dict[int, int], what: str,
             unit: str) -> pa.Array:
    """``raw`` (epoch offsets) with PostgreSQL's infinity sentinels at the range's ends;
    refuses any other value outside [low, high]."""
    if not _outside(raw, low, high):
        return raw
    fixed = []
    for v in raw.to_pylist():
        if v is not None and not low <= v <= high:
            if v not in infinities:
                raise InvalidArgument(f"{what} {v} {unit} is outside Spark's range")
            v = infinities[v]
        fixed.append(v)
    return pa.array(fixed, raw.type)


def _ints_as_bools(col: pa.Array, f: pa.Field) -> pa.Array:
    if not pc.all(pc.is_in(col.drop_null(), pa.array([0, 1], col.type))).as_py() and len(col):
        raise InvalidArgument(f"column {f.name!r} is a BOOLEAN/TINYINT(1) holding a value "
                              "other than 0 and 1")
    return pc.not_equal(col, pa.scalar(0, col.type))


# ---------------------------------------------------------------- Python values --


def decimal_text(value: Any) -> str | None:
    """The canonical text of a decimal: plain notation, scale kept, PostgreSQL's NaN names."""
    if value is None:
        return None
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
    if d.is_nan():
        return "NaN"
    if d.is_infinite():
        return "Infinity" if d > 0 else "-Infinity"
    return format(d, "f")


def column(values: Sequence[Any], f: pa.Field) -> tuple[pa.Array, dict[int, str]]:
    """Python values (as drivers and change streams give them) as an Arrow array of ``f``.

    Returns the array and ``{row index: reason}`` for the values that could not
    be converted exactly; those rows hold NULL in the array and must not be
    stored (the caller refuses or quarantines them).
    """
    t = f.type
    try:
        return pa.array(values, t), {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    out: list[Any] = []
    bad: dict[int, str] = {}
    for i, v in enumerate(values):
        try:
            out.append(None if v is None else value(v, f))
        except (InvalidArgument, ValueError, TypeError, ArithmeticError,
                pa.ArrowInvalid) as exc:
            out.append(None)
            bad[i] = f"column {f.name!r}: {v!r} is not a {t}: {exc}"
    return pa.array(out, t), bad


def value(v: Any, f: pa.Field) -> Any:
    """One non-NULL Python value as the Python value Arrow takes for ``f`` (or raises)."""
    t = f.type
    if pa.types.is_string(t):
        if isinstance(v, decimal.Decimal):
            return decimal_text(v)
        if isinstance(v, datetime.time):
            return v.isoformat()
        if isinstance(v, datetime.timedelta):
            return time_text(v)
        if isinstance(v, bytes | memoryview):
            return bytes(v).decode()
        return str(v)
    if pa.types.is_decimal(t):
        d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))
        if not d.is_finite():
            raise InvalidArgument("NaN or infinity has no decimal form")
        q = d.quantize(decimal.Decimal(1).scaleb(-t.scale))
        if q != d or len(q.as_tuple().digits) > t.precision:
            raise InvalidArgument(f"does not fit decimal({t.precision},{t.scale})")
        return q
    if pa.types.is_boolean(t):
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        if isinstance(v, str) and v.lower() in ("t", "f", "true", "false", "0", "1"):
            return v.lower() in ("t", "true", "1")
        raise InvalidArgument("not a boolean (0 or 1)")
    if pa.types.is_timestamp(t):
        return _timestamp_value(v, t.tz is not None)
    if pa.types.is_date32(t):
        return _date_value(v)
    if pa.types.is_integer(t):
        if isinstance(v, bool | float):
            raise InvalidArgument("not an integer")
        return int(v)
    if pa.types.is_floating(t):
        return float(v)
    if pa.types.is_binary(t):
        if isinstance(v, str):
            return _pg_bytea(v)
        return bytes(v)
    return v


def time_text(td: datetime.timedelta) -> str:
    """A MariaDB ``TIME`` (a duration, up to ±838 h) as ``[-]HH:MM:SS[.ffffff]``."""
    sign = "-" if td < datetime.timedelta(0) else ""
    us = abs(td) // datetime.timedelta(microseconds=1)
    secs, frac = divmod(us, 1_000_000)
    text = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return text + (f".{frac:06d}" if frac else "")


def _timestamp_value(v: Any, zoned: bool) -> datetime.datetime:
    if isinstance(v, str):
        inf = _TEXT_INF.get(v.strip().lower())
        if inf is not None:
            ts = TS_MAX if inf > 0 else TS_MIN
            return ts.replace(tzinfo=datetime.UTC) if zoned else ts
        if v.endswith(" BC"):
            raise InvalidArgument("dates before the common era are outside Spark's range")
        v = datetime.datetime.fromisoformat(_iso(v))
    if isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
        v = datetime.datetime(v.year, v.month, v.day)
    if not isinstance(v, datetime.datetime):
        raise InvalidArgument("not a timestamp")
    if zoned:
        # A zone-less value for a zoned column is UTC (the sessions shardgate opens run in UTC).
        return v.astimezone(datetime.UTC) if v.tzinfo else v.replace(tzinfo=datetime.UTC)
    if v.tzinfo is not None:
        raise InvalidArgument("a time-zone-aware value for a timestamp without time zone")
    return v


def _iso(text: str) -> str:
    """PostgreSQL's timestamp text (``+05`` offsets, 2-digit) as ISO 8601 Python parses."""
    text = text.strip()
    if len(text) >= 3 and text[-3] in "+-" and text[-2:].isdigit() and ":" in text[-9:-3]:
        return text + ":00"
    return text


def _date_value(v: Any) -> datetime.date:
    if isinstance(v, datetime.datetime):
        raise InvalidArgument("a timestamp for a date column")
    if isinstance(v, datetime.date):
        return v
    text = str(v).strip()
    inf = _TEXT_INF.get(text.lower())
    if inf is not None:
        return DATE_MAX if inf > 0 else DATE_MIN
    if text.endswith(" BC"):
        raise InvalidArgument("dates before the common era are outside Spark's range")
    return datetime.date.fromisoformat(text)


def _pg_bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return text.encode()


def python_row_batch(
    fields: Sequence[str], rows: Sequence[Sequence[Any]], schema: pa.Schema
) -> pa.RecordBatch:
    """Rows of Python values (named by ``fields``) as a batch of ``schema``; refuses bad values."""
    lowered = [n.lower() for n in fields]
    arrays = []
    for f in schema:
        try:
            i = lowered.index(f.name.lower())
        except ValueError:
            raise InvalidArgument(
                f"the schema names column {f.name!r} but the query returns {list(fields)}"
            ) from None
        arr, bad = column([r[i] for r in rows], f)
        if bad:
            raise InvalidArgument(next(iter(bad.values())))
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
