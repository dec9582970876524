"""Differential tester (issue 13): a 4-shard keyspace answers like one database.

Random data (NULLs, duplicates, mixed case, trailing spaces, negative and huge
numbers, floats), random SELECTs covering the constructs listed in
:data:`tests.integration.difftest.queries.CONSTRUCTS` and random writes
(:data:`tests.integration.difftest.dml.DML_CONSTRUCTS`) run through the gate
and on one plain database of the same engine. After every write the shard
databases are read directly: their rows must equal the reference's, every row
must be on the shard its keyspace id names, and the lookup tables must be
exactly what the owner rows imply. See the package docstrings for the schema
and the comparison rules (floats: tolerance only for SUM/AVG over doubles;
MariaDB: collation keys only where the SQL collapses equal strings).

Seeds are fixed. ``SG_DIFF_ROUNDS`` (default 10) runs more rounds of fresh
data, queries and writes (round ``r`` uses seed ``1000 * r + engine``);
``SG_DIFF_ALL=1`` also generates the constructs of
:data:`tests.integration.difftest.known_open.KNOWN_OPEN` (never those of its
``BY_DESIGN``: the gate's dialect is MySQL's there). Any mismatch fails
the test; refusals (coded ``ShardgateError`` where the database answers) are
counted and printed per class.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from decimal import Decimal

import pytest

from .difftest.compare import difference
from .difftest.dml import DML_CONSTRUCTS, DmlGen, Write
from .difftest.harness import Harness, Tally
from .difftest.known_open import by_design_on, disabled_on
from .difftest.queries import CONSTRUCTS, Gen
from .difftest.schema import hash_ksid, random_rows, shard_of, xxhash_ksid

ROUNDS = int(os.environ.get("SG_DIFF_ROUNDS", "10"))
ALL = os.environ.get("SG_DIFF_ALL") == "1"
QUERIES_PER_ROUND = int(os.environ.get("SG_DIFF_QUERIES", "250"))
WRITES_PER_ROUND = int(os.environ.get("SG_DIFF_WRITES", "60"))
ENGINE_SEED = {"sqlite": 1, "postgres": 2, "mysql": 3}
#: file to append every mismatch to as JSON lines (for triage), if set
DUMP = os.environ.get("SG_DIFF_DUMP")


def report(kind: str, tally: Tally, seconds: float, disabled: frozenset[str]) -> str:
    lines = [f"difftest[{kind}]: {tally.agreed} agreed, {tally.both_rejected} rejected by both, "
             f"{sum(tally.refusals.values())} refused, {len(tally.mismatches)} mismatches "
             f"in {seconds:.1f}s"]
    if disabled:
        lines.append(f"  known-open constructs not generated: {sorted(disabled)}")
    for cls, n in tally.refusals.most_common():
        lines.append(f"  refused {n:4d}x {cls}\n      e.g. {tally.refusal_examples[cls][:150]}")
    impossible = {"replace"} if kind == "postgres" else set()  # no REPLACE there
    never = sorted((set(CONSTRUCTS) | set(DML_CONSTRUCTS)) - set(tally.constructs) - disabled
                   - impossible)
    if never:
        lines.append(f"  constructs never generated: {never}")
    for m in tally.mismatches[:40]:
        lines.append(f"  MISMATCH [{m.what}] {m.sql}\n    {m.detail}\n"
                     f"    constructs {sorted(m.constructs)}")
    return "\n".join(lines)


async def test_sharded_answers_like_one_database(
    backend_kind: str, make_database: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    disabled = by_design_on(backend_kind) | (frozenset() if ALL else disabled_on(backend_kind))
    h = Harness(backend_kind, make_database)
    start = time.monotonic()
    try:
        await h.create()
        for rnd in range(ROUNDS):
            rng = random.Random(1000 * rnd + ENGINE_SEED[backend_kind])
            await h.load(random_rows(rng, backend_kind))
            gen = Gen(rng, backend_kind, disabled)
            for _ in range(QUERIES_PER_ROUND // 2):
                await h.check_query(gen.generate())
            writes = DmlGen(rng, backend_kind, disabled, t2_keys=h.t2_keys)
            for _ in range(WRITES_PER_ROUND):
                if "transaction" not in disabled and rng.random() < 0.15:
                    await h.check_transaction(
                        [writes.generate(alone=False) for _ in range(rng.randrange(2, 4))])
                else:
                    await h.check_write(writes.generate())
            for _ in range(QUERIES_PER_ROUND - QUERIES_PER_ROUND // 2):
                await h.check_query(gen.generate())
    finally:
        await h.close()
    text = report(backend_kind, h.tally, time.monotonic() - start, disabled)
    if DUMP:
        with open(DUMP, "a") as f:
            for m in h.tally.mismatches:
                f.write(json.dumps({"kind": backend_kind, "what": m.what, "sql": m.sql,
                                    "detail": m.detail[:600],
                                    "constructs": sorted(m.constructs)}) + "\n")
    with capsys.disabled():
        print("\n" + text)
    if h.tally.mismatches:
        pytest.fail(text, pytrace=False)


# ------------------------------------------------- the tester checks itself --


def test_independent_keyspace_ids_match_vitess_vectors() -> None:
    # Vitess go/vt/vtgate/vindexes/hash_test.go and xxhash_test.go (TestXXHashMap),
    # the vectors tests/unit/test_vindexes.py cites
    assert hash_ksid(1) == b"\x16k@\xb4J\xbaK\xd6"
    assert hash_ksid(5) == b"p\xbb\x02<\x81\x0c\xa8z"
    assert xxhash_ksid("test1") == bytes([0xD0, 0x1A, 0xB7, 0xE4, 0xD6, 0x97, 0x8F, 0x0B])
    assert [shard_of(bytes([b])) for b in (0x00, 0x3F, 0x40, 0xBF, 0xC0, 0xFF)] == [
        0, 0, 1, 2, 3, 3]


def test_comparison_normalises_representation_only() -> None:
    same = {"kind": "sqlite", "ordered": False, "approx": False, "fold": False}
    assert difference([(3,)], [(Decimal("3.00"),)], **same) is None  # type: ignore[arg-type]
    assert difference([(Decimal("2.3333"),)], [(Decimal("2.333333"),)],
                      **same) is not None  # type: ignore[arg-type]
    assert difference([(1,), (2,)], [(2,), (1,)], **same) is None  # type: ignore[arg-type]
    assert difference([(1,), (2,)], [(2,), (1,)], kind="sqlite", ordered=True, approx=False,
                      fold=False) is not None
    assert difference([(0.1 + 0.2,)], [(0.3,)], **same) is not None  # type: ignore[arg-type]
    assert difference([(0.1 + 0.2,)], [(0.3,)], kind="sqlite", ordered=False, approx=True,
                      fold=False) is None
    assert difference([("Ann ",)], [("ann",)], kind="mysql", ordered=False, approx=False,
                      fold=True) is None
    assert difference([("Ann ",)], [("ann",)], kind="mysql", ordered=False, approx=False,
                      fold=False) is not None


async def test_state_check_catches_misplaced_rows_and_lookup_drift(
    make_database: Callable[..., str]
) -> None:
    h = Harness("sqlite", make_database)
    try:
        await h.create()
        await h.load({"t1": [{"id": 1, "n": 1, "s": "a", "f": None, "tag": "red"}],
                      "t2": [], "t3": []})
        wrong = (shard_of(hash_ksid(1)) + 1) % len(h.shards)
        await h.shards[wrong].execute("INSERT INTO t1 (id, n) VALUES (1, 1)")
        await h.lookup.execute("DELETE FROM tag_idx")
        await h.check_state(Write("-- planted", "-- planted", frozenset({"planted"})))
        kinds = sorted({m.what for m in h.tally.mismatches})
        assert kinds == ["lookup", "placement", "write"], h.tally.mismatches
        # and the shards were reset to the reference
        h.tally.mismatches.clear()
        await h.check_state(Write("-- again", "-- again", frozenset()))
        assert h.tally.mismatches == []
    finally:
        await h.close()
