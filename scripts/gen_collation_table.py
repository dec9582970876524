"""Write shardgate/vindexes/data/cldr23_root.bin from Go's x/text collation tables.

Vitess's ``unicode_loose_md5``/``unicode_loose_xxhash`` hash the primary weights of
``golang.org/x/text/collate`` (root/English, CLDR 23, UCA 6.2.0; Vitess keeps a frozen
copy in ``go/mysql/collations/vindex/collate``). Those weights exist only in x/text's
generated ``collate/tables.go``, which Debian ships in ``golang-golang-x-text-dev``::

    apt-get install golang-golang-x-text-dev
    python scripts/gen_collation_table.py [path/to/collate/tables.go]

The output (see :mod:`shardgate.vindexes.collation` for the format) keeps, per code
point, the collation element of the root table, plus the expansion, contraction and
contraction-trie arrays, zlib-compressed. The tables are (c) The Go Authors, under
the BSD-3-Clause license of golang.org/x/text.
"""

from __future__ import annotations

import re
import struct
import sys
import zlib
from pathlib import Path

DEFAULT = Path("/usr/share/gocode/src/golang.org/x/text/collate/tables.go")
OUT = Path(__file__).resolve().parent.parent / "shardgate" / "vindexes" / "data" / "cldr23_root.bin"
NUMBER = r"0x[0-9a-fA-F]+|\d+"


def go_array(src: str, name: str) -> list[int]:
    """The values of ``var name = [N]T{...}`` (keyed ``i: v`` or positional)."""
    m = re.search(r"var " + name + r" = \[(\d+)\]\w+\{(.*?)\n\}", src, re.S)
    if m is None:
        raise SystemExit(f"{name} not found")
    size, body = int(m.group(1)), re.sub(r"//[^\n]*", "", m.group(2))
    if ":" in body:
        out = [0] * size
        for k, v in re.findall(rf"({NUMBER})\s*:\s*({NUMBER})", body):
            out[int(k, 0)] = int(v, 0)
        return out
    values = [int(x, 0) for x in re.findall(NUMBER, body)]
    if len(values) != size:
        raise SystemExit(f"{name}: {len(values)} values, expected {size}")
    return values


def main() -> None:
    src = (Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT).read_text()
    if 'const CLDRVersion = "23"' not in src:
        raise SystemExit("expected x/text's CLDR 23 tables")
    values, lookup = go_array(src, "mainValues"), go_array(src, "mainLookup")
    expand, contract = go_array(src, "mainExpandElem"), go_array(src, "mainContractElem")
    m = re.search(r"var mainCTEntries = \[(\d+)\]struct\{ L, H, N, I uint8 \}\{(.*?)\n\}",
                  src, re.S)
    assert m is not None
    entries = [tuple(int(x, 0) for x in re.findall(NUMBER, t))
               for t in re.findall(r"\{([^{}]*)\}", re.sub(r"//[^\n]*", "", m.group(2)))]
    assert len(entries) == int(m.group(1)) and all(len(e) == 4 for e in entries)
    # The root ("und", also "en") table: lookupOffset 0x15, valuesOffset 0 (blocks of 64).
    index0, values0 = 0x15 * 64, 0

    def element(cp: int) -> int:
        data = chr(cp).encode("utf-8")
        if len(data) == 1:
            return values[values0 + data[0]]
        i = lookup[index0 + data[0]]
        for c in data[1:-1]:
            i = lookup[(i << 6) + c]
        return values[(i << 6) + data[-1]]

    pairs = [(cp, e) for cp in range(0x110000)
             if not 0xD800 <= cp <= 0xDFFF and (e := element(cp)) != 0]
    blob = b"".join([
        struct.pack("<4I", len(pairs), len(expand), len(contract), len(entries)),
        struct.pack(f"<{2 * len(pairs)}I", *(x for p in pairs for x in p)),
        struct.pack(f"<{len(expand)}I", *expand),
        struct.pack(f"<{len(contract)}I", *contract),
        bytes(x for e in entries for x in e),
    ])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(zlib.compress(blob, 9))
    print(f"{OUT}: {len(pairs)} code points, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
