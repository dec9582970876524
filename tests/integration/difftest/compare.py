"""Comparing a gate result with the reference database's.

Only representation is normalised, never values:

* numbers of any type (int, Decimal, bool) compare as ``Decimal(str(x))``, so
  ``3``, ``3.0`` and ``Decimal("3.00")`` are equal but ``2.3333`` and
  ``2.333333`` are not (the gate must give the engine's precision);
* floats compare exactly, except in queries the generator marks ``approx``
  (SUM/AVG over the DOUBLE column ``f``: a sum of doubles depends on the order
  of addition, which differs between one database and a merge of shards):
  there relative tolerance 1e-9;
* on MariaDB, where the default collation ``utf8mb4_general_ci`` makes
  ``'ann'``, ``'Ann'`` and ``'ann '`` one value, a query that collapses equal
  values (DISTINCT, GROUP BY, MIN/MAX over text) may return any member of the
  class, so strings there compare by their collation key
  (:func:`.schema.collation_key`). Everywhere else strings compare exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from .schema import collation_key


def _norm(value: Any, kind: str, fold: bool) -> Any:
    if isinstance(value, bool):
        return Decimal(int(value))
    if isinstance(value, float):
        return value
    if isinstance(value, int | Decimal):
        return Decimal(str(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str) and fold:
        return collation_key(kind, value)
    return value


def normalised(rows: Sequence[Sequence[Any]], kind: str, fold: bool) -> list[tuple[Any, ...]]:
    return [tuple(_norm(v, kind, fold) for v in row) for row in rows]


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or isinstance(a, str) or isinstance(b, str):
            return False
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def _rows_close(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(_close(x, y) for x, y in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True))


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, type(v).__name__, v if v is not None else 0)
                 if not isinstance(v, float | Decimal) else (False, "num", float(v))
                 for v in row)


def difference(got_rows: Sequence[Sequence[Any]], want_rows: Sequence[Sequence[Any]], *,
               kind: str, ordered: bool, approx: bool, fold: bool) -> str | None:
    """None when the results agree, else a short description of how they differ."""
    got, want = normalised(got_rows, kind, fold), normalised(want_rows, kind, fold)
    if ordered:
        same = _rows_close(got, want) if approx else got == want
        return None if same else f"ordered rows differ:\n    gate {got}\n    db   {want}"
    if approx:
        same = _rows_close(sorted(got, key=_sort_key), sorted(want, key=_sort_key))
        return None if same else f"rows differ:\n    gate {got}\n    db   {want}"
    g, w = Counter(got), Counter(want)
    if g == w:
        return None
    return (f"rows differ (as multisets): only gate {sorted(map(repr, g - w))}, "
            f"only db {sorted(map(repr, w - g))}")
