"""Which known-open entries a mismatch dump still needs.

Usage (after a run with ``SG_DIFF_ALL=1 SG_DIFF_DUMP=dump.jsonl``)::

    python -m tests.integration.difftest.triage dump.jsonl

For each engine: per entry of :data:`.known_open.KNOWN_OPEN` on it, how many
mismatches contain it and how many contain no other known-open construct (an
entry at 0/0 after a fix merged can go); then every mismatch no entry
covers (a new class: write its repro into FINDINGS.md).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from .known_open import KNOWN_OPEN, disabled_on

ENGINES = ("sqlite", "postgres", "mysql")


def main(path: str) -> None:
    with open(path) as f:
        dump = [json.loads(line) for line in f if line.strip()]
    for kind in ENGINES:
        known = disabled_on(kind)
        sole: Counter[str] = Counter()
        anywhere: Counter[str] = Counter()
        uncovered = []
        for m in (m for m in dump if m["kind"] == kind):
            hit = set(m["constructs"]) & known
            anywhere.update(hit)
            if len(hit) == 1:
                sole.update(hit)
            if not hit:
                uncovered.append(m)
        print(f"{kind}: {sum(1 for m in dump if m['kind'] == kind)} mismatches")
        for construct in sorted(known):
            print(f"  {construct:28s} only one {sole[construct]:4d}  in {anywhere[construct]:4d}"
                  f"  ({KNOWN_OPEN[construct][1]})")
        for m in uncovered:
            print(f"  NOT COVERED [{m['what']}] {m['sql']}\n    {m['detail'][:300]}")


if __name__ == "__main__":
    main(sys.argv[1])
