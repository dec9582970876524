"""Sorting by keys computed once per value orders rows exactly as comparing them pairwise
by the database's rules does (engine/sortkeys.py against order_compare)."""

from __future__ import annotations

from decimal import Decimal
from functools import cmp_to_key
from operator import itemgetter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardgate.engine.primitive import order_compare
from shardgate.engine.sortkeys import column_keys, sort_rows
from shardgate.evalengine.sqlsem import semantics

#: characters where the collations differ: case, accents, ß, spaces and tabs around
#: them (PAD SPACE), a character above U+FFFF
TEXT = st.text(alphabet="aAbBéEßs \t\U0001f600\ufffd", max_size=5)
SEMANTICS = [semantics("mysql", "utf8mb4_general_ci"), semantics("mysql", "utf8mb4_bin"),
             semantics("sqlite"), semantics("postgres")]


def _pairwise(rows: list[tuple[Any, ...]], terms: list[tuple[int, bool, bool]],
              sem: Any) -> list[tuple[Any, ...]]:
    def cmp(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
        for i, desc, nulls_first in terms:
            c = order_compare(a[i], b[i], desc, nulls_first, sem)
            if c:
                return c
        return 0

    return sorted(rows, key=cmp_to_key(cmp))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.none() | TEXT, st.none() | st.integers(-3, 3)
                               | st.decimals(-3, 3, places=1), st.integers(0, 3)),
                     max_size=30),
       terms=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.booleans()),
                      min_size=1, max_size=3),
       which=st.integers(0, len(SEMANTICS) - 1))
def test_keys_order_as_pairwise_comparison(rows: list[tuple[Any, ...]],
                                           terms: list[tuple[int, bool, bool]],
                                           which: int) -> None:
    sem = SEMANTICS[which]
    got = sort_rows(rows, [(itemgetter(i), d, n) for i, d, n in terms], sem)
    assert got == _pairwise(rows, terms, sem)


def test_mixed_kinds_are_left_to_pairwise_comparison() -> None:
    sem = semantics("mysql")
    assert column_keys(["a", 1], sem) is None
    assert column_keys([b"a", "a"], sem) is None
    assert column_keys([True, 2, Decimal("1.5"), 0.5], sem) == [1, 2, Decimal("1.5"), 0.5]
    assert sort_rows([("a",), (1,)], [(itemgetter(0), False, True)], sem) is None
