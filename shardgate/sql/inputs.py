"""Checking what a caller sends before anything uses it: SQL text and bind variables.

Every front door calls these (:meth:`shardgate.gate.Gate.execute`, the gRPC
client, the DB-API driver), so bad input is refused with ``INVALID_ARGUMENT``
naming what is wrong, instead of surfacing as a ``TypeError`` or
``UnicodeEncodeError`` from deep inside the planner, a vindex or a driver, or
(worse) as a value that silently matches nothing.

Accepted bind values: ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes`` (``bytearray``, ``memoryview``), ``Decimal``, ``date``, ``time``,
``datetime``, ``timedelta`` and ``UUID``; a ``list`` or ``tuple`` of those
for an IN list (``col IN (:ids)``). Text must be encodable as UTF-8 (no lone
surrogates), as every backend stores it so.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

from shardgate.errors import InvalidArgument

_SCALARS: tuple[type, ...] = (
    type(None), bool, int, float, str, bytes, bytearray, memoryview, decimal.Decimal,
    datetime.date, datetime.time, datetime.timedelta, uuid.UUID,  # (datetime is a date)
)
#: the common exact types, checked first with one set lookup
_FAST: frozenset[type] = frozenset({type(None), bool, int, float, bytes})
_ACCEPTED = ("None, bool, int, float, str, bytes, Decimal, date, time, datetime, timedelta "
             "or UUID (a list or tuple of these only for an IN list)")


def check_sql(sql: object) -> str:
    """``sql`` if it is a ``str`` of valid Unicode text; else ``INVALID_ARGUMENT``."""
    if not isinstance(sql, str):
        raise InvalidArgument(
            f"the SQL statement must be a str, not {type(sql).__name__}"
            + (": decode it first" if isinstance(sql, bytes | bytearray) else "")
        )
    if not sql.isascii():
        check_text(sql, "the SQL statement")
    return sql


def check_bind_vars(bind_vars: object) -> Mapping[str, Any]:
    """``bind_vars`` (``{}`` for None) if every name and value is acceptable.

    Refuses, naming the bind variable: values of other types (dicts, sets,
    objects...), lists holding lists or other non-scalars, and text that is
    not valid Unicode.
    """
    if bind_vars is None:
        return {}
    if not isinstance(bind_vars, Mapping):
        raise InvalidArgument(
            f"bind variables must be a mapping of names to values, not {type(bind_vars).__name__}"
        )
    for name, value in bind_vars.items():
        if not isinstance(name, str):
            raise InvalidArgument(f"bind variable names must be str, not {name!r}")
        t = type(value)
        if t in _FAST:
            continue
        if t is str:
            if not value.isascii():
                check_text(value, f"bind variable :{name}")
        elif isinstance(value, list | tuple):
            for item in value:
                _check_scalar(name, item, "an element of list ")
        else:
            _check_scalar(name, value, "")
    return bind_vars


def _check_scalar(name: str, value: object, where: str) -> None:
    if isinstance(value, str):
        if not value.isascii():
            check_text(value, f"{where}bind variable :{name}")
        return
    if isinstance(value, list | tuple | dict | set | frozenset) or \
            not isinstance(value, _SCALARS):
        raise InvalidArgument(
            f"{where}bind variable :{name} has type {type(value).__name__}: "
            f"bind values are {_ACCEPTED}"
        )


def check_text(text: str, what: str) -> None:
    """Refuse ``text`` (``what`` names it) unless it encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{what} is not valid Unicode text: lone surrogate {text[exc.start]!r} at "
            f"position {exc.start} (decode bytes with errors='strict', or send bytes)"
        ) from None
