"""Vindexes: functions from column values to keyspace ids.

The families are registered here, explicitly and once, in the registry of
:mod:`shardgate.vindexes.registry`; :func:`create_vindex` builds one from a
VSchema entry. To add a family: write its module (a subclass of one of the
protocols in :mod:`shardgate.vindexes.base`) and add one ``register`` line below.
"""

from __future__ import annotations

from shardgate.vindexes.base import (
    KeyspaceId,
    Lookup,
    MultiColumn,
    Reversible,
    SingleColumn,
    VCursor,
    Vindex,
)
from shardgate.vindexes.binary import Binary, BinaryMD5
from shardgate.vindexes.cfc import CFC
from shardgate.vindexes.consistent_lookup import ConsistentLookup, ConsistentLookupUnique
from shardgate.vindexes.functional import Hashing
from shardgate.vindexes.hash import Hash
from shardgate.vindexes.lookup import LookupNonUnique, LookupUnique
from shardgate.vindexes.lookup_hash import (
    LookupHash,
    LookupHashUnique,
    LookupUnicodeLooseMD5Hash,
    LookupUnicodeLooseMD5HashUnique,
)
from shardgate.vindexes.multicol import MultiCol
from shardgate.vindexes.null import Null
from shardgate.vindexes.numeric import Numeric
from shardgate.vindexes.region_json import RegionJSON
from shardgate.vindexes.registry import create_vindex, known_types, register
from shardgate.vindexes.reverse_bits import ReverseBits
from shardgate.vindexes.unicode import UnicodeLooseMD5, UnicodeLooseXXHash
from shardgate.vindexes.xxhash64 import XXHash

__all__ = [
    "Hashing",
    "KeyspaceId",
    "Lookup",
    "MultiColumn",
    "Reversible",
    "SingleColumn",
    "VCursor",
    "Vindex",
    "create_vindex",
    "known_types",
    "register",
]

register("hash", Hash)
register("xxhash", XXHash)
register("numeric", Numeric)
register("binary", Binary)
register("binary_md5", BinaryMD5)
register("unicode_loose_md5", UnicodeLooseMD5)
register("reverse_bits", ReverseBits)
register("null", Null)
register("multicol", MultiCol)
register("lookup", LookupNonUnique)
register("lookup_unique", LookupUnique)
register("consistent_lookup", ConsistentLookup)
register("consistent_lookup_unique", ConsistentLookupUnique)
register("unicode_loose_xxhash", UnicodeLooseXXHash)
register("lookup_hash", LookupHash)
register("lookup_hash_unique", LookupHashUnique)
register("lookup_unicodeloosemd5_hash", LookupUnicodeLooseMD5Hash)
register("lookup_unicodeloosemd5_hash_unique", LookupUnicodeLooseMD5HashUnique)
register("region_json", RegionJSON)
register("cfc", CFC)
