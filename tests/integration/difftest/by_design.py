"""Constructs the differential tester never generates on some engines, and why.

There is no list of tolerated mismatches (issue 32): every construct is
generated on every engine except those of :data:`BY_DESIGN`, where the
engine's own answer is not the reference because the gate's SQL dialect is
MySQL's on every backend (decided by the lead, docs/routing.md "Scatter
post-processing"). A mismatch the gate cannot fix yet is an open bug with a
failing test marked ``xfail(strict=True)`` (``tests/integration/sql/test_difftest.py``,
"known open bugs"), never a construct switched off here.
"""

from __future__ import annotations

#: construct -> (engines, why the engine's own answer is not the reference there)
BY_DESIGN: dict[str, tuple[frozenset[str], str]] = {
    # `/` is MySQL's division on every backend: sqlglot sends CAST(a AS REAL) / b
    # (SQLite) and CAST(a AS DOUBLE PRECISION) / NULLIF(b, 0) (PostgreSQL), so
    # 7 / 2 is 3.5 where the engine alone answers 3 (and names the column by
    # the transpiled text); shard-computed and gate-computed values agree
    "expr_division": (frozenset({"sqlite", "postgres"}),
                      "MySQL's `/` on every backend (docs/routing.md)"),
}


def by_design_on(kind: str) -> frozenset[str]:
    """The constructs never generated on engine ``kind``: its own answer is not the reference."""
    return frozenset(c for c, (engines, _why) in BY_DESIGN.items() if kind in engines)
