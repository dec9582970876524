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
  ``'ann'``, ``'Ann'``, ``'ann '`` and ``'Ánn'`` one value, a query that
  collapses equal values (DISTINCT, GROUP BY, MIN/MAX over text) may return
  any member of the class (MariaDB shows a group's first row's value), so
  strings there compare by a ``text_key`` (the harness asks the reference
  server for ``WEIGHT_STRING``, PAD SPACE applied). Everywhere else strings
  compare exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from decimal import Decimal
from typing import Any

#: a string's collation key (equal exactly for the strings the collation holds equal)
TextKey = Callable[[str], Hashable]


def _norm(value: Any, text_key: TextKey | None) -> Any:
    if isinstance(value, bool):
        return Decimal(int(value))
    if isinstance(value, float):
        return value
    if isinstance(value, int | Decimal):
        return Decimal(str(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str) and text_key is not None:
        return ("collation key", text_key(value))
    return value


def normalised(rows: Sequence[Sequence[Any]],
               text_key: TextKey | None) -> list[tuple[Any, ...]]:
    return [tuple(_norm(v, text_key) for v in row) for row in rows]


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
               ordered: bool, approx: bool, text_key: TextKey | None = None) -> str | None:
    """None when the results agree, else a short description of how they differ
    (``text_key``: strings compare by it, see the module doc)."""
    got, want = normalised(got_rows, text_key), normalised(want_rows, text_key)
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
