"""Constructs switched off in the CI run because their issue-13 fix has not merged.

Each entry: construct name -> (the engines it is switched off on, the
FINDINGS.md entry with its minimal repro: /work/wt/FINDINGS.md, lines
starting ``[13.N difftest]`` or ``[new difftest]``). The CI test does not
generate these constructs on those engines: a generator switch, never a
filter on results (any mismatch in what is generated fails the test).
``SG_DIFF_ALL=1`` turns them all back on. Delete an entry when its fix
merges: the test then covers the construct again.

Measured on this branch (``SG_DIFF_ALL=1``, 6 rounds per engine, then 24
rounds with these switched off): with these switched off no mismatch
remained; each entry was needed by at least one mismatch on the engines
listed (the MariaDB order_alias_shadow one only showed after 20 rounds).
"""

from __future__ import annotations

ALL = frozenset({"sqlite", "postgres", "mysql"})

#: construct -> (engines, FINDINGS.md reference)
KNOWN_OPEN: dict[str, tuple[frozenset[str], str]] = {
    # item 1: vindex value from the literal's text, not the stored value
    "vindex_literal_type": (ALL, "13.1 difftest: WHERE id = 5.0 / '05' / 5e0 / TRUE"),
    "update_vindex_literal_type": (ALL, "13.1 difftest: UPDATE ... WHERE k = 4.0"),
    "insert_literal_type": (ALL, "13.1 difftest: INSERT ... k = '02' stored on the shard of '02'"),
    # item 3: INSERT IGNORE and unique lookups
    "insert_ignore": (ALL, "13.3 difftest: INSERT IGNORE keeps a duplicate unique lookup value"),
    # item 6: subquery in VALUES
    "insert_subquery": (ALL, "13.6 difftest: VALUES (i, (SELECT COUNT(*) FROM t2), ...)"),
    # item 4: IS NULL on a lookup column
    "lookup_is_null": (ALL, "13.4 difftest: SELECT ... WHERE tag IS NULL"),
    "update_lookup_is_null": (ALL, "13.4 difftest: UPDATE ... WHERE tag IS NULL"),
    "delete_lookup_is_null": (ALL, "13.4 difftest: DELETE ... WHERE tag IS NULL"),
    # item 7: NOT (x IN (SELECT ...)), x IN (SELECT ...) in the select list
    "subquery_not_wrapped": (ALL, "13.7 difftest: NOT (x IN (SELECT ...))"),
    "subquery_select_list": (ALL, "13.7 difftest: x IN (SELECT ...) in the select list"),
    # item 8: aggregates without GROUP BY on no shard
    "agg_no_shard": (ALL, "13.8 difftest: SELECT MAX(k) FROM t2 WHERE email = 'nope'"),
    # item 9: ORDER BY positions in joins, shadowing aliases
    "join_order_position": (ALL, "13.9 difftest: ORDER BY position over a gate-side join"),
    "order_alias_shadow": (ALL, "13.9 difftest: ORDER BY name that is also an alias"),
    # item 10: SQL expression semantics at the gate
    "aggregate_text": (ALL, "13.10 difftest: MIN(text) * 2 / HAVING MIN(text) < 3"),
    "sum_text": (ALL, "13.10 difftest: SUM(DISTINCT tag) concatenates strings"),
    "aggregate_arith": (ALL, "13.10 difftest: MIN(id) * 2 overflow, AVG(n) * 2 precision"),
    "expr_division": (frozenset({"sqlite", "postgres"}),
                      "13.10 difftest: SELECT id / 2 evaluated at the gate"),
    "aggregate_huge": (frozenset({"sqlite", "mysql"}),
                       "13.10 difftest: SUM/AVG of huge BIGINTs, AVG(x) * 2 precision"),
    "having_3vl": (frozenset({"postgres"}), "13.10 difftest: HAVING MAX(n) OR COUNT(*) > 1"),
    "nonbool_where": (frozenset({"postgres"}),
                      "13.10 difftest: WHERE tag = 'nope' AND id - 3 answered on no shard"),
    "expr_mixed_compare": (frozenset({"postgres"}),
                           "13.10 difftest: b.id > '1e1' answered, PostgreSQL: invalid bigint"),
    # item 11: MariaDB collation at the gate (DISTINCT / GROUP BY / ORDER BY merge)
    "distinct_text": (frozenset({"mysql"}), "13.11 difftest: GROUP BY tag splits 'red'/'Red '"),
    "order_text": (frozenset({"mysql"}), "13.11 difftest: ORDER BY tag merge is binary"),
    # item 12: LIMIT overflow, constants in DISTINCT sent as GROUP BY positions
    "limit_huge": (frozenset({"sqlite", "postgres"}),
                   "13.12 difftest: LIMIT 9223372036854775807 OFFSET 1"),
    "bind_internal_name": (ALL, "13.12 difftest: user bind :__sg_sq0 beside IN (SELECT ...)"),
    "constant_column": (frozenset({"postgres", "mysql"}),
                        "13.12 difftest: SELECT DISTINCT n, 'x' FROM t1"),
    # new: lookup vindex rows matched by exact bytes under a case-insensitive collation
    # (fixed on branch writes, d08d9e5: delete these three when it merges)
    "lookup_eq": (frozenset({"mysql"}), "new difftest: lookup match drops 'Red' for tag = 'red'"),
    "update_by_lookup": (frozenset({"mysql"}), "new difftest: lookup match (UPDATE)"),
    "delete_by_lookup": (frozenset({"mysql"}), "new difftest: lookup match (DELETE)"),
}


def disabled_on(kind: str) -> frozenset[str]:
    """The constructs switched off on engine ``kind``."""
    return frozenset(c for c, (engines, _ref) in KNOWN_OPEN.items() if kind in engines)
