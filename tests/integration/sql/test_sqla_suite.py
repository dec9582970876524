"""SQLAlchemy's dialect compliance suite, a representative subset, in the normal test run.

The whole suite (``python scripts/sqla_suite/run.py [--sharded]``, about 1,400
tests) takes minutes; this runs the classes that exercise what the MySQL
listener had to learn for it, over an unsharded and over an auto-sharded
keyspace, each through ``scripts/sqla_suite/run.py`` in a subprocess
(``shardgate up`` over MariaDB databases, the stock ``mysql+pymysql``
dialect, shardgate's ``Requirements``), and asserts that nothing failed and
that the subset really ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.mysql

RUN = Path(__file__).resolve().parents[3] / "scripts" / "sqla_suite" / "run.py"

#: Unsharded: decimals and division, fractional types, odd names (quotes, %,
#: brackets), a derived table joining two keyspaces, duplicate result names,
#: FROM DUAL, RETURNING refused, views, and the reflection of foreign keys,
#: comments, check constraints and unique keys.
UNSHARDED = (
    "NumericTest or TrueDivTest or BizarroCharacterTest or QuotedNameArgumentTest "
    "or SameNamedSchemaTableTest "
    "or HasTableTest or ExistsTest or RowFetchTest or ReturningGuardsTest or TimeTest "
    "or (ComponentReflectionTest and (test_get_foreign_keys or test_get_table_comment "
    "or test_get_check_constraints or test_get_unique_constraints or test_get_view_names)) "
    "or TableViaSelectTest"
)
#: Sharded (auto_shard): tables created through the gate and added to the
#: VSchema, % in sharded inserts, FROM DUAL, reflection of each shard's keys,
#: joins at the gate (LEFT JOIN ON FALSE), a scalar subquery's DATETIME, CAST as
#: a sharding value, HasTableTest without views, CREATE TABLE ... AS SELECT run
#: by the gate, and AUTO_INCREMENT keys from the sequences auto_shard creates
#: (empty inserts, INSERT ... SELECT, lastrowid, a % in the sequence's name).
SHARDED = (
    "ExistsTest or DifficultParametersTest or DateTimeTest or JoinTest or RowFetchTest "
    "or CastTypeDecoratorTest or HasTableTest or TableViaSelectTest or InsertBehaviorTest "
    "or LastrowidTest or IdentityAutoincrementTest "
    "or (BizarroCharacterTest and test_fk_ref) "
    "or (ComponentReflectionTest and (test_get_foreign_keys or test_get_indexes))"
)


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_compliance_subset_passes(sharded: bool, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    prefix = f"sg_sqla_{os.getpid()}_{'sh' if sharded else 'un'}"
    subset = SHARDED if sharded else UNSHARDED
    args = [sys.executable, str(RUN), "--prefix", prefix, "-k", subset,
            f"--junitxml={junit}", "-x"]
    if sharded:
        args.insert(2, "--sharded")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert junit.exists(), tail
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    assert suite is not None, tail
    tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failures, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
    failed = [f"{case.get('name')}: {(bad.get('message') or '')[:300]}"
              for case in suite.iter("testcase")
              for bad in (case.find("failure"), case.find("error")) if bad is not None]
    assert (failures, errors) == (0, 0), "\n".join(failed)
    assert proc.returncode == 0, tail
    least = 60 if sharded else 120
    assert tests - skipped >= least, f"only {tests - skipped} tests ran\n{tail}"
