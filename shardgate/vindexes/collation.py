"""Vitess's Unicode collation keys: the primary weights ``unicode_loose_*`` hash.

Vitess (``go/vt/vtgate/vindexes/unicode.go``) trims trailing U+0020 spaces and
hashes the collation key of ``golang.org/x/text/collate`` for
``language.English`` with ``collate.Loose``: the root collation of CLDR 23 (UCA
6.2.0), primary level only, variable characters not ignorable. The key is each
collation element's non-zero primary weight, in order, two bytes big-endian (three,
``0x80 | w >> 16`` first, above ``0x7FFF``).

The elements come from x/text's root table, stored in ``data/cldr23_root.bin``
(made by ``scripts/gen_collation_table.py``; the tables are (c) The Go Authors,
BSD-3-Clause). How a string becomes elements follows x/text's ``colltab`` design:

* each code point has a 32-bit element: a plain element (primary, secondary,
  tertiary and canonical combining class packed in one of three layouts), or an
  index into the *expansion* array (several elements), or the start of a
  *contraction* (a small trie over the following UTF-8 bytes, discontiguous
  matches allowed across combining marks), or "decompose" (the elements of its
  NFKD decomposition);
* a code point without an element is a Hangul syllable (its NFD jamo) or gets an
  implicit primary: ``cp + 0x10000`` for common CJK ideographs (and the
  compatibility block), ``cp + 0x20000`` for other ideographs, ``cp + 0x50000``
  otherwise;
* runs of elements with a non-zero combining class are put in canonical order.

Invalid UTF-8 has no key (Vitess refuses it). The Unicode data for
decompositions is Python's :mod:`unicodedata`, Go's ``norm`` package in Vitess.
"""

from __future__ import annotations

import struct
import unicodedata
import zlib
from array import array
from functools import cache
from importlib import resources

_MAX_CE, _MAX_CONTRACT, _MAX_EXPAND = 0xAFFFFFFF, 0xDFFFFFFF, 0xEFFFFFFF
_NORMAL, _CONTRACTION, _EXPANSION, _DECOMPOSE = range(4)
_MAX_COMBINING = 30
_NO_INDEX = 0xFF

#: Unicode's Ideographic property (Go's ``unicode.Ideographic``, Unicode 15)
_IDEOGRAPHIC = (
    (0x3006, 0x3007), (0x3021, 0x3029), (0x3038, 0x303A), (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF), (0xF900, 0xFA6D), (0xFA70, 0xFAD9), (0x16FE4, 0x16FE4),
    (0x17000, 0x187F7), (0x18800, 0x18CD5), (0x18D00, 0x18D08), (0x1B170, 0x1B2FB),
    (0x20000, 0x2A6DF), (0x2A700, 0x2B739), (0x2B740, 0x2B81D), (0x2B820, 0x2CEA1),
    (0x2CEB0, 0x2EBE0), (0x2F800, 0x2FA1D), (0x30000, 0x3134A), (0x31350, 0x323AF),
)


class _Table:
    """The root table: element per code point, expansions, contractions."""

    def __init__(self, blob: bytes) -> None:
        n_pairs, n_expand, n_contract, n_entries = struct.unpack_from("<4I", blob)
        pos = 16
        pairs = array("I")
        pairs.frombytes(blob[pos : pos + 8 * n_pairs])
        pos += 8 * n_pairs
        self.elements = dict(zip(pairs[0::2], pairs[1::2], strict=True))
        self.expand = array("I")
        self.expand.frombytes(blob[pos : pos + 4 * n_expand])
        pos += 4 * n_expand
        self.contract = array("I")
        self.contract.frombytes(blob[pos : pos + 4 * n_contract])
        pos += 4 * n_contract
        raw = blob[pos : pos + 4 * n_entries]
        self.entries = [tuple(raw[i : i + 4]) for i in range(0, len(raw), 4)]


@cache
def _table() -> _Table:
    data = resources.files("shardgate.vindexes").joinpath("data/cldr23_root.bin").read_bytes()
    return _Table(zlib.decompress(data))


def _ctype(ce: int) -> int:
    if ce <= _MAX_CE:
        return _NORMAL
    if ce <= _MAX_CONTRACT:
        return _CONTRACTION
    return _EXPANSION if ce <= _MAX_EXPAND else _DECOMPOSE


def _primary(ce: int) -> int:
    if ce >= 0x80000000:
        return 0 if ce > 0xA0000000 else ce & 0xFFFF
    return (ce & 0x3FFFFE00) >> 9


def _ccc(ce: int) -> int:
    if ce & 0x80000000:
        return (ce >> 16) & 0xFF if ce & 0xA0000000 == 0x80000000 else (ce >> 20) & 0xFF
    return 0


def _implicit(cp: int) -> int:
    if any(lo <= cp <= hi for lo, hi in _IDEOGRAPHIC):
        common = 0x4E00 <= cp <= 0x9FFF or 0xF900 <= cp <= 0xFAFF
        primary = cp + (0x10000 if common else 0x20000)
    else:
        primary = cp + 0x50000
    return 0x40000000 | (primary << 9) | 0x20


def _rune(s: bytes, p: int) -> tuple[int, int]:
    c = s[p]
    size = 1 if c < 0x80 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4
    return ord(s[p : p + size].decode("utf-8")), size


def _combining(s: bytes, p: int) -> tuple[int, int, int]:
    """Leading and trailing combining class of the code point at ``p`` (NFD), its size."""
    cp, size = _rune(s, p)
    nfd = unicodedata.normalize("NFD", chr(cp))
    return unicodedata.combining(nfd[0]), unicodedata.combining(nfd[-1]), size


class _Scanner:
    """Walks the contraction trie over UTF-8 bytes (x/text's ``ctScanner``)."""

    def __init__(self, entries: list[tuple[int, ...]], index: int, n: int, s: bytes) -> None:
        self.entries, self.offset, self.n, self.s = entries, index, n, s
        self.index = self.pindex = 0
        self.done = False

    def scan(self, p: int) -> int:
        start, s, offset, n, i = p, self.s, self.offset, self.n, 0
        while i < n and p < len(s):
            low, high, nxt, idx = self.entries[offset + i]
            c = s[p]
            if c >= low:
                if c == low:
                    p += 1
                    if idx != _NO_INDEX:
                        self.index, self.pindex = idx, p
                    if nxt == 0:
                        self.done = True
                        return p
                    i, offset, n = 0, offset + high + n, nxt
                    if p >= len(s) or s[p] & 0xC0 != 0x80:  # at a code point start
                        self.offset, self.n, start = offset, n, p
                    continue
                if nxt == 0 and c <= high:
                    self.done = True
                    self.index, self.pindex = c - low + idx, p + 1
                    return p + 1
            i += 1
        return start


class _Elements:
    """Collation elements of one UTF-8 string."""

    def __init__(self, table: _Table) -> None:
        self.t = table

    def lookup(self, s: bytes, p: int) -> tuple[int, int]:
        cp, size = _rune(s, p)
        return self.t.elements.get(cp, 0), size

    def expansion(self, out: list[int], ce: int) -> None:
        i = ce & 0xFFFF
        out.extend(self.t.expand[i + 1 : i + 1 + self.t.expand[i]])

    def append_next(self, out: list[int], s: bytes, p: int) -> int:
        """Append the elements starting at ``s[p]``; return how many bytes they used."""
        ce, size = self.lookup(s, p)
        kind = _ctype(ce)
        if kind == _NORMAL:
            if ce == 0:
                cp, _ = _rune(s, p)
                if 0xAC00 <= cp <= 0xD7A3:  # Hangul syllable: its jamo
                    for jamo in unicodedata.normalize("NFD", chr(cp)):
                        out.append(self.t.elements.get(ord(jamo), 0))
                    return size
                ce = _implicit(cp)
            out.append(ce)
        elif kind == _EXPANSION:
            self.expansion(out, ce)
        elif kind == _CONTRACTION:
            size += self.contraction(out, ce, s[p + size :])
        else:
            cp, _ = _rune(s, p)
            self.append_all(out, unicodedata.normalize("NFKD", chr(cp)).encode("utf-8"))
        return size

    def append_all(self, out: list[int], s: bytes) -> None:
        q = 0
        while q < len(s):
            q += self.append_next(out, s, q)

    def contraction(self, out: list[int], ce: int, suffix: bytes) -> int:
        n, index, offset = ce & 0xF, (ce >> 4) & 0xFFF, (ce >> 16) & 0x1FFF
        scan = _Scanner(self.t.entries, index, n, suffix)
        skipped, keep = b"", 0
        p = scan.scan(0)
        if not scan.done and p < len(suffix) and suffix[p] >= 0x80:
            p0 = p
            lead, trail, size = _combining(suffix, p)
            p += size
            if lead != 0:  # a discontiguous match across combining marks
                prev = trail
                end = p
                while end < len(suffix):
                    mark_lead, _, mark_size = _combining(suffix, end)
                    if mark_lead == 0:
                        break
                    end += mark_size
                scan.s = suffix[:end]
                while p < len(suffix) and not scan.done and suffix[p] >= 0x80:
                    lead, trail, size = _combining(suffix, p)
                    if lead == 0 or prev >= lead:
                        break
                    prev = trail
                    pp = scan.scan(p)
                    if pp != p:
                        skipped += suffix[p0:p]
                        if scan.pindex == pp:
                            keep = len(skipped)
                        p = p0 = pp
                    else:
                        p += size
        found = self.t.contract[scan.index + offset]
        if _ctype(found) == _NORMAL:
            out.append(found)
        else:
            self.expansion(out, found)
        self.append_all(out, skipped[:keep])
        return scan.pindex

    def all(self, s: bytes) -> list[int]:
        """Every element of ``s``, non-starters in canonical order (x/text's ``Iter``)."""
        out: list[int] = []
        done = 0  # elements before this index are final
        pos = 0

        def more() -> bool:
            nonlocal pos
            if pos >= len(s):
                return False
            pos += self.append_next(out, s, pos) or 1
            return True

        while True:
            if done == len(out) and not more():
                return out
            prev = _ccc(out[-1])
            if prev == 0:
                done = len(out)
                continue
            if _ccc(out[done]) == 0:
                done += 1
                while done < len(out) and _ccc(out[done]) == 0:
                    done += 1
                continue
            while True:
                start = len(out)
                if not more():
                    done = len(out)
                    break
                ccc = _ccc(out[start])
                if ccc == 0 or len(out) - done > _MAX_COMBINING:
                    done = start
                    break
                if ccc < prev:  # move the new elements before the marks they follow
                    k = start - 1
                    while k > done and ccc < _ccc(out[k - 1]):
                        k -= 1
                    out[k:] = out[start:] + out[k:start]
                else:
                    prev = ccc


def collation_key(data: bytes) -> bytes | None:
    """Vitess's loose collation key of UTF-8 ``data`` (None if it is not UTF-8)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    key = bytearray()
    for ce in _Elements(_table()).all(data.rstrip(b" ")):
        w = _primary(ce)
        if w > 0x7FFF:
            key += bytes(((w >> 16) | 0x80, (w >> 8) & 0xFF, w & 0xFF))
        elif w > 0:
            key += bytes((w >> 8, w & 0xFF))
    return bytes(key)
