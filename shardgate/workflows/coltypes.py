"""Column types across backends: what a moving column is, how a target of another
kind declares it, and how its values are written and compared there.

Each column of a moving table gets a **kind** from its source declaration
(:func:`column_kinds`, read with sqlglot in the source's dialect):

==============  ==========================  ================  ==========  =============
kind            sources                     PostgreSQL        MariaDB     SQLite
==============  ==========================  ================  ==========  =============
``timestamptz`` ``timestamptz``, MariaDB    ``TIMESTAMPTZ``   DATETIME(6) TEXT
                ``TIMESTAMP``                                 (UTC)       (UTC, ISO)
``timestamp``   ``timestamp``, DATETIME     ``TIMESTAMP``     DATETIME(6) TEXT (ISO)
``date``        DATE                        ``DATE``          DATE        TEXT (ISO)
``time``        TIME                        ``TIME``          TIME(6)     TEXT (ISO)
``decimal``     NUMERIC / DECIMAL           ``NUMERIC(p,s)``  DECIMAL     TEXT
``bytes``       bytea, BLOB, VARBINARY ...  ``BYTEA``         LONGBLOB    BLOB
``json``        json, jsonb, MariaDB JSON   ``JSON``          JSON        TEXT
``uuid``        uuid, MariaDB UUID          ``UUID``          UUID        TEXT
``bool``        boolean                     (as sqlglot writes it: BOOLEAN / INTEGER)
``int``         integer types (signed)      (as sqlglot writes it, display width dropped)
``float``       real, double                (as sqlglot writes it)
``text``        char, varchar, text ...     (as sqlglot writes it)
==============  ==========================  ================  ==========  =============

A MariaDB ``TIMESTAMP`` (and a naive value of a ``timestamptz`` column) is
taken as UTC: shardgate's MariaDB connections use the server's zone, which must
be UTC for a cross-kind reshard of such a column. A target of another kind
refuses any other type (PostgreSQL ``interval``, arrays, ranges, network
types, MariaDB ``ENUM`` / ``SET``, unsigned ``BIGINT``, ...) with
:class:`~shardgate.errors.Unsupported` naming the table and the column.

:func:`writer` converts a value, in whatever form the copy (the source
driver's object) or the change log (pgoutput's text, the binlog's objects)
gives it, to what a target column of another kind takes (a target of the
source's kind gets values as they come, as before); :func:`normal` is the one form
VDiff compares: a ``timestamptz`` as a naive UTC datetime, ``timestamp``,
``date`` and ``time`` as Python objects (a MariaDB ``TIME`` timedelta as a
time of day), a decimal as :class:`~decimal.Decimal`, a boolean as ``bool``,
binary as ``bytes``, JSON as the parsed value (key order and spacing are not
kept by ``jsonb``), a UUID as :class:`uuid.UUID` (a value that is not of its
column's kind, which SQLite allows, is compared as it is).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

T = exp.DataType.Type

_KINDS: dict[Any, str] = {
    **{t: "int" for t in (T.TINYINT, T.SMALLINT, T.MEDIUMINT, T.INT, T.BIGINT,
                          T.UTINYINT, T.USMALLINT, T.UMEDIUMINT, T.UINT)},
    **{t: "float" for t in (T.FLOAT, T.DOUBLE)},
    T.DECIMAL: "decimal",
    T.BOOLEAN: "bool",
    **{t: "text" for t in (T.CHAR, T.VARCHAR, T.NCHAR, T.NVARCHAR, T.TEXT, T.TINYTEXT,
                           T.MEDIUMTEXT, T.LONGTEXT)},
    **{t: "bytes" for t in (T.BINARY, T.VARBINARY, T.BLOB, T.TINYBLOB, T.MEDIUMBLOB,
                            T.LONGBLOB)},
    **{t: "json" for t in (T.JSON, T.JSONB)},
    T.UUID: "uuid",
    T.TIMESTAMPTZ: "timestamptz",
    **{t: "timestamp" for t in (T.TIMESTAMP, T.DATETIME)},
    T.DATE: "date",
    T.TIME: "time",
}

#: the target type of a kind, where it is not what sqlglot writes (see the table above)
_TARGET_TYPES: dict[tuple[str, str], str] = {
    ("timestamptz", "mysql"): "DATETIME(6)", ("timestamptz", "sqlite"): "TEXT",
    ("timestamptz", "postgres"): "TIMESTAMPTZ",
    ("timestamp", "mysql"): "DATETIME(6)", ("timestamp", "sqlite"): "TEXT",
    ("timestamp", "postgres"): "TIMESTAMP",
    ("date", "sqlite"): "TEXT", ("time", "sqlite"): "TEXT", ("time", "mysql"): "TIME(6)",
    ("time", "postgres"): "TIME",
    ("decimal", "sqlite"): "TEXT",
    ("bytes", "mysql"): "LONGBLOB", ("bytes", "postgres"): "BYTEA", ("bytes", "sqlite"): "BLOB",
    ("json", "mysql"): "JSON", ("json", "postgres"): "JSON", ("json", "sqlite"): "TEXT",
    ("uuid", "mysql"): "UUID", ("uuid", "postgres"): "UUID", ("uuid", "sqlite"): "TEXT",
}


def kind_of(col: exp.ColumnDef) -> str | None:
    """A column definition's kind; None: no declared type (SQLite); ``"other"``: a type
    no target of another kind takes faithfully."""
    dtype = col.args.get("kind")
    if not isinstance(dtype, exp.DataType):
        return None
    kind = _KINDS.get(dtype.this, "other")
    if kind == "text" and _json_checked(col):
        return "json"  # MariaDB's JSON: LONGTEXT CHECK (json_valid(col))
    return kind


def _json_checked(col: exp.ColumnDef) -> bool:
    for c in col.args.get("constraints") or []:
        check = c.args.get("kind")
        if isinstance(check, exp.CheckColumnConstraint) and \
                "JSON_VALID" in check.sql(dialect="mysql").upper():
            return True
    return False


def is_json_check(check: exp.Expression) -> bool:
    """Whether a column's CHECK is MariaDB's ``json_valid(col)`` (a JSON column's mark)."""
    return "JSON_VALID" in check.sql(dialect="mysql").upper()


def target_type(kind: str | None, target: str) -> exp.DataType | None:
    """The type ``target`` gives a column of ``kind`` when it is not sqlglot's own
    (None: keep sqlglot's)."""
    name = _TARGET_TYPES.get((kind or "", target))
    return exp.DataType.build(name, dialect=target) if name else None


def column_kinds(create: str, dialect: str) -> dict[str, str | None]:
    """The kind of each column of a ``CREATE TABLE`` in ``dialect`` (empty when the
    statement cannot be read: values are then written as they come)."""
    try:
        tree = sqlglot.parse_one(create, read=dialect)
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return {}
    schema = tree.this if isinstance(tree, exp.Create) else None
    if not isinstance(schema, exp.Schema):
        return {}
    return {c.name: kind_of(c) for c in schema.expressions if isinstance(c, exp.ColumnDef)}


# -- values ----------------------------------------------------------------------

def _datetime(v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, bytes):
        v = v.decode()
    return dt.datetime.fromisoformat(str(v))


def _utc(v: Any) -> dt.datetime:
    """A naive UTC datetime (a naive value is UTC already)."""
    d = _datetime(v)
    return d.astimezone(dt.UTC).replace(tzinfo=None) if d.tzinfo is not None else d


def _time(v: Any) -> dt.time:
    if isinstance(v, dt.time):
        return v
    if isinstance(v, dt.timedelta):  # MariaDB's TIME (a duration)
        if not dt.timedelta(0) <= v < dt.timedelta(days=1):
            raise ValueError(f"TIME {v} is not a time of day")
        return (dt.datetime.min + v).time()
    if isinstance(v, bytes):
        v = v.decode()
    return dt.time.fromisoformat(str(v))


def _date(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        return v.date()
    if isinstance(v, dt.date):
        return v
    if isinstance(v, bytes):
        v = v.decode()
    return dt.date.fromisoformat(str(v))


def _json_text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False)


def _uuid(v: Any) -> uuid.UUID:
    if isinstance(v, uuid.UUID):
        return v
    if isinstance(v, bytes) and len(v) == 16:
        return uuid.UUID(bytes=v)
    if isinstance(v, bytes):
        v = v.decode()
    return uuid.UUID(str(v))


def _bytes(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _iso(d: dt.datetime) -> str:
    return d.isoformat(" ", "microseconds")


_WRITERS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("timestamptz", "postgres"): lambda v: _utc(v).replace(tzinfo=dt.UTC),
    ("timestamptz", "mysql"): _utc,
    ("timestamptz", "sqlite"): lambda v: _iso(_utc(v)),
    ("timestamp", "postgres"): _datetime,
    ("timestamp", "mysql"): _datetime,
    ("timestamp", "sqlite"): lambda v: _iso(_datetime(v)),
    ("date", "postgres"): _date,
    ("date", "mysql"): _date,
    ("date", "sqlite"): lambda v: _date(v).isoformat(),
    ("time", "postgres"): _time,
    ("time", "mysql"): _time,
    ("time", "sqlite"): lambda v: _time(v).isoformat("microseconds"),
    ("decimal", "postgres"): lambda v: Decimal(_text(v) if not isinstance(v, float) else str(v)),
    ("decimal", "mysql"): lambda v: Decimal(_text(v) if not isinstance(v, float) else str(v)),
    ("decimal", "sqlite"): lambda v: str(Decimal(_text(v) if not isinstance(v, float)
                                                 else str(v))),
    ("bytes", "postgres"): _bytes, ("bytes", "mysql"): _bytes, ("bytes", "sqlite"): _bytes,
    ("json", "postgres"): _json_text, ("json", "mysql"): _json_text,
    ("json", "sqlite"): _json_text,
    ("uuid", "postgres"): lambda v: str(_uuid(v)), ("uuid", "mysql"): lambda v: str(_uuid(v)),
    ("uuid", "sqlite"): lambda v: str(_uuid(v)),
    ("text", "postgres"): _text, ("text", "mysql"): _text, ("text", "sqlite"): _text,
}


def writer(kind: str | None, target: str) -> Callable[[Any], Any] | None:
    """The conversion of a non-NULL value of ``kind`` for a ``target`` column (None:
    written as it comes)."""
    return _WRITERS.get((kind or "", target))


def _normal_decimal(v: Any) -> Decimal:
    d = Decimal(_text(v) if not isinstance(v, float) else str(v))
    return d.normalize() if d == d else d  # 1.500 and 1.5 alike


_NORMAL: dict[str, Callable[[Any], Any]] = {
    "timestamptz": _utc, "timestamp": _datetime, "date": _date, "time": _time,
    "decimal": _normal_decimal, "bool": bool, "bytes": _bytes,
    "json": lambda v: json.loads(v) if isinstance(v, str | bytes) else v,
    "uuid": _uuid, "text": _text,
}


def normal(kind: str | None) -> Callable[[Any], Any] | None:
    """The normalisation VDiff applies to a non-NULL value of ``kind`` (None: none
    by kind; see the module docstring)."""
    return _NORMAL.get(kind or "")
