"""COM_STMT_EXECUTE: a prepared statement's parameters, read and written into its text.

The listener prepares a statement by remembering its text (mysql-mimic's
``COM_STMT_PREPARE``); an execute puts each parameter's value into the text as
a MySQL literal, and the gate plans that text as any other (its values become
bind variables again, so one plan serves every execute). mysql-mimic reads
the parameters itself, but

* refuses an execute whose *new-params-bound* flag is 0 (error 1235). The
  flag says the types were sent with an earlier execute of the statement and
  are left out now: libmariadb (sysbench, mysqlclient's C API, PHP's mysqlnd)
  sends the types with the first execute of a binding only, so every later
  execute was refused;
* quotes a string parameter without escaping it (a quote in the value ended
  the literal: a wrong statement, or one the value wrote), through ``re.sub``,
  which also reads backslashes in the value as group references;
* refuses DECIMAL, date and time parameters.

:class:`StatementParams` reads an execute's parameters with the types of the
statement's last binding kept (per connection, by statement id), escapes
strings as MySQL does (``\\'``, ``\\\\``, ``\\0``, ``\\n``, ``\\r``, ``\\Z``), sends
bytes that are not text in the client's character set as ``X'..'``, and reads
DECIMAL (its text), DATE, DATETIME, TIMESTAMP and TIME values.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import sqlglot
from mysql_mimic.charset import CharacterSet
from mysql_mimic.errors import ErrorCode, MysqlError
from mysql_mimic.prepared import REGEX_PARAM, PreparedStatement
from mysql_mimic.types import Capabilities, ColumnType, ComStmtExecuteFlags
from sqlglot import exp

from shardgate.api.mysql.errors import WRONG_ARGUMENTS

#: a parameter's type as the client bound it: the MySQL type and whether it is unsigned
ParamType = tuple[int, bool]

_ESCAPES = str.maketrans({"\\": "\\\\", "'": "\\'", "\0": "\\0", "\n": "\\n", "\r": "\\r",
                          "\x1a": "\\Z"})
_TEXT_TYPES = frozenset({ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING,
                         ColumnType.BLOB, ColumnType.TINY_BLOB, ColumnType.MEDIUM_BLOB,
                         ColumnType.LONG_BLOB, ColumnType.JSON, ColumnType.ENUM,
                         ColumnType.SET, ColumnType.BIT, ColumnType.GEOMETRY})
_DECIMAL_TYPES = frozenset({ColumnType.DECIMAL, ColumnType.NEWDECIMAL})
_DATE_TYPES = frozenset({ColumnType.DATE, ColumnType.DATETIME, ColumnType.TIMESTAMP,
                         ColumnType.NEWDATE})
#: fixed-size integers and floats: (struct format signed, unsigned)
_FIXED: dict[int, tuple[str, str]] = {
    ColumnType.TINY: ("<b", "<B"), ColumnType.SHORT: ("<h", "<H"),
    ColumnType.YEAR: ("<h", "<H"), ColumnType.LONG: ("<i", "<I"),
    ColumnType.INT24: ("<i", "<I"), ColumnType.LONGLONG: ("<q", "<Q"),
    ColumnType.FLOAT: ("<f", "<f"), ColumnType.DOUBLE: ("<d", "<d"),
}


def quote(text: str) -> str:
    """``text`` as a MySQL string literal."""
    return "'" + text.translate(_ESCAPES) + "'"


@dataclass(slots=True)
class Execute:
    """One COM_STMT_EXECUTE: the statement's text with its values in, the query
    attributes the client sent, the statement and whether the client asked for a cursor."""

    sql: str
    query_attrs: dict[str, str]
    stmt: PreparedStatement
    use_cursor: bool


class _Reader:
    """Reads a packet from the front."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MysqlError("COM_STMT_EXECUTE packet cut short", ErrorCode.MALFORMED_PACKET)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> int | float:
        value: int | float = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def lenenc(self) -> int:
        first = self.take(1)[0]
        if first < 0xFB:
            return first
        size = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
        if size is None:
            raise MysqlError("bad length in COM_STMT_EXECUTE", ErrorCode.MALFORMED_PACKET)
        return int.from_bytes(self.take(size), "little")

    def lenenc_bytes(self) -> bytes:
        return self.take(self.lenenc())


class StatementParams:
    """The parameters of one connection's prepared statements.

    For each statement: its text cut at the ``?`` markers (once) and the types
    its client bound last (new-params-bound-flag 0 reuses them). :meth:`forget`
    drops a closed statement's entry.
    """

    def __init__(self) -> None:
        self._types: dict[int, list[tuple[str | None, ParamType]]] = {}
        self._pieces: dict[int, list[str]] = {}

    def forget(self, stmt_id: int) -> None:
        self._types.pop(stmt_id, None)
        self._pieces.pop(stmt_id, None)

    def read_execute(self, capabilities: Capabilities, charset: CharacterSet, data: bytes,
                     get_stmt: Callable[[int], PreparedStatement]) -> Execute:
        """The execute in ``data``: its statement and values (see the module's comment)."""
        r = _Reader(data)
        stmt = get_stmt(int(r.unpack("<I")))
        flags = ComStmtExecuteFlags(r.take(1)[0])
        if flags & (ComStmtExecuteFlags.CURSOR_TYPE_FOR_UPDATE
                    | ComStmtExecuteFlags.CURSOR_TYPE_SCROLLABLE):
            raise MysqlError(f"Unsupported cursor flags: {flags}", ErrorCode.NOT_SUPPORTED_YET)
        use_cursor = bool(flags & ComStmtExecuteFlags.CURSOR_TYPE_READ_ONLY)
        r.take(4)  # iteration count, always 1
        count = stmt.num_params
        attributes = Capabilities.CLIENT_QUERY_ATTRIBUTES in capabilities
        if attributes and (count > 0 or ComStmtExecuteFlags.PARAMETER_COUNT_AVAILABLE in flags):
            count = r.lenenc()
        values: list[str] = []
        query_attrs: dict[str, str] = {}
        if count:
            nulls = r.take((count + 7) // 8)
            if r.take(1)[0]:  # new-params-bound-flag: the types follow
                types: list[tuple[str | None, ParamType]] = []
                for i in range(count):
                    kind, unsigned = r.take(2)
                    name = charset.decode(r.lenenc_bytes()) if attributes else None
                    types.append((name if i >= stmt.num_params else None,
                                  (kind, bool(unsigned & 0x80))))
                self._types[stmt.stmt_id] = types
            else:
                known = self._types.get(stmt.stmt_id)
                if known is None or len(known) != count:
                    raise MysqlError("COM_STMT_EXECUTE sent no parameter types and none were "
                                     "bound before: bind the parameters first",
                                     WRONG_ARGUMENTS.errno)
                types = known
            buffers = stmt.param_buffers or {}
            for i, (name, (kind, unsigned)) in enumerate(types):
                if nulls[i >> 3] & (1 << (i & 7)):
                    literal = "NULL"
                elif i in buffers:  # sent with COM_STMT_SEND_LONG_DATA
                    literal = _text_literal(bytes(buffers[i]), charset)
                else:
                    literal = _read_literal(r, kind, unsigned, charset)
                if i < stmt.num_params:
                    values.append(literal)
                elif name is not None:
                    query_attrs[name] = _unquote(literal)
        return Execute(self._text(stmt, values), query_attrs, stmt, use_cursor)

    def _text(self, stmt: PreparedStatement, values: list[str]) -> str:
        sql: str = stmt.sql
        if not values:
            return sql
        pieces = self._pieces.get(stmt.stmt_id)
        if pieces is None:
            pieces = self._pieces[stmt.stmt_id] = REGEX_PARAM.split(sql)
        out = [pieces[0]]
        for value, piece in zip(values, pieces[1:], strict=True):
            out += (value, piece)
        return "".join(out)


def _unquote(literal: str) -> str:
    """A query attribute's value as text (attributes are strings)."""
    if literal.startswith("'"):
        return re.sub(r"\\(.)", lambda m: {"0": "\0", "n": "\n", "r": "\r", "Z": "\x1a"}
                      .get(m.group(1), m.group(1)), literal[1:-1])
    return literal


def _text_literal(raw: bytes, charset: CharacterSet) -> str:
    """Bytes as a string literal, or as ``X'..'`` when they are not text in ``charset``."""
    if charset is CharacterSet.binary:
        return f"X'{raw.hex()}'"
    try:
        return quote(charset.decode(raw))
    except UnicodeDecodeError:
        return f"X'{raw.hex()}'"


def _read_literal(r: _Reader, kind: int, unsigned: bool, charset: CharacterSet) -> str:
    """One parameter value from the packet, as a MySQL literal."""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        value = r.unpack(fixed[1] if unsigned else fixed[0])
        if isinstance(value, float):
            if not math.isfinite(value):
                raise MysqlError(f"parameter value {value} is not a number MySQL stores",
                                 WRONG_ARGUMENTS.errno)
            return repr(value)
        return str(value)
    if kind in _TEXT_TYPES:
        return _text_literal(r.lenenc_bytes(), charset)
    if kind in _DECIMAL_TYPES:
        text = r.lenenc_bytes().decode("ascii", "replace")
        try:
            Decimal(text)
        except InvalidOperation:
            return quote(text)
        return text
    if kind in _DATE_TYPES:
        return quote(_datetime_text(r.take(r.take(1)[0]), date_only=kind in (
            ColumnType.DATE, ColumnType.NEWDATE)))
    if kind == ColumnType.TIME:
        return quote(_time_text(r.take(r.take(1)[0])))
    if kind == ColumnType.NULL:
        return "NULL"
    raise MysqlError(f"Unsupported parameter type: {kind}", ErrorCode.NOT_SUPPORTED_YET)


def _datetime_text(b: bytes, date_only: bool) -> str:
    """MySQL's binary DATE/DATETIME (length 0, 4, 7 or 11) as text."""
    year, month, day = (struct.unpack("<HBB", b[:4]) if len(b) >= 4 else (0, 0, 0))
    date = f"{year:04d}-{month:02d}-{day:02d}"
    if date_only:
        return date
    hour, minute, second = tuple(b[4:7]) if len(b) >= 7 else (0, 0, 0)
    text = f"{date} {hour:02d}:{minute:02d}:{second:02d}"
    if len(b) >= 11:
        text += f".{struct.unpack('<I', b[7:11])[0]:06d}"
    return text


def _time_text(b: bytes) -> str:
    """MySQL's binary TIME (length 0, 8 or 12) as text: ``[-]H:MM:SS[.ffffff]``."""
    if len(b) < 8:
        return "00:00:00"
    negative, days = b[0], struct.unpack("<I", b[1:5])[0]
    hour, minute, second = b[5], b[6], b[7]
    text = f"{'-' if negative else ''}{days * 24 + hour:02d}:{minute:02d}:{second:02d}"
    if len(b) >= 12:
        text += f".{struct.unpack('<I', b[8:12])[0]:06d}"
    return text


def columns_probe(sql: str) -> str | None:
    """A statement that answers ``sql``'s result columns over no rows, or None when
    ``sql`` returns no rows (or the listener cannot tell).

    A ``COM_STMT_PREPARE`` answer names the columns the statement will return,
    and clients rely on it: libmariadb (sysbench) reads an execute's rows only
    when the prepare announced columns, so without them the rows stayed unread
    and the next command failed with "Commands out of sync" (2014). As
    Vitess's prepare does, the listener runs the SELECT over no rows, its
    parameters NULL: ``WHERE 1 != 1 AND (...)``, without LIMIT or OFFSET (a
    select without FROM runs as it is).
    """
    pieces = REGEX_PARAM.split(sql)
    text = "NULL".join(pieces)
    try:
        tree = sqlglot.parse_one(text, read="mysql")
    except sqlglot.errors.SqlglotError:
        return None
    if not isinstance(tree, exp.Select):
        return None
    if tree.args.get("from_") is None and tree.args.get("from") is None:
        return text
    never: exp.Expr = exp.NEQ(this=exp.Literal.number(1), expression=exp.Literal.number(1))
    where = tree.args.get("where")
    if where is not None:
        never = exp.and_(never, exp.Paren(this=where.this))
    tree.set("where", exp.Where(this=never))
    tree.set("limit", None)
    tree.set("offset", None)
    return tree.sql(dialect="mysql")
