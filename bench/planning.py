"""Planning time: long IN lists and nested IN subqueries, with no plan cache.

Each statement is planned the way a cache miss in the gate plans it:
``parse`` (sqlglot), then ``build_plan`` (routing, normalization, rewrites).
The table is ``user`` of the routing golden VSchema (``hash`` primary
vindex), so ``id IN (...)`` becomes an IN route that sends each shard its own
values, and each nested level is an uncorrelated subquery pulled out.

    python bench/planning.py [--runs 5] [--smoke]

Prints, per statement, the fastest of ``--runs`` runs of parse, plan and both
(goal: a 10,000-value IN list planned in < 100 ms; 16 nested levels well
under a second). Planning blocks the event loop, so these figures are also
the longest stall a single statement can cause.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from shardgate.planner import build_plan
from shardgate.sql.parse import parse
from shardgate.vschema import VSchema

VSCHEMA_FILE = Path(__file__).resolve().parent.parent / "tests" / "unit" / "golden" / "vschema.json"


def in_list(n: int) -> str:
    """``SELECT ... WHERE id IN (0, 1, ..., n-1)``."""
    return "select id, name from user where id in (" + ", ".join(map(str, range(n))) + ")"


def nested(depth: int) -> str:
    """``depth`` levels of ``id IN (SELECT id FROM user WHERE ...)``."""
    sql = "select id from user where id = 1"
    for _ in range(depth):
        sql = f"select id from user where id in ({sql})"
    return sql


def fastest(fn: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(runs: int) -> None:
    vschema = VSchema.from_json(json.loads(VSCHEMA_FILE.read_text()))
    cases = [(f"IN list, {n:,} values", in_list(n)) for n in (100, 1_000, 10_000)]
    cases += [(f"nested IN subqueries, {d} levels", nested(d)) for d in (4, 8, 16)]
    print(f"{'statement':<34}{'parse ms':>10}{'plan ms':>10}{'total ms':>10}")
    for name, sql in cases:
        stmt = parse(sql)  # warm up (imports, dialect set-up)
        t_parse = fastest(lambda sql=sql: parse(sql), runs)
        t_plan = fastest(lambda sql=sql, stmt=stmt: build_plan(stmt, sql, vschema, "user"), runs)
        t_total = fastest(
            lambda sql=sql: build_plan(parse(sql), sql, vschema, "user"), runs
        )
        print(f"{name:<34}{t_parse * 1e3:>10.1f}{t_plan * 1e3:>10.1f}{t_total * 1e3:>10.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    main(1 if args.smoke else args.runs)
