"""Schema, VSchema and rows of the differential tester.

Keyspace ``sk`` (4 shards) holds::

    t1(id BIGINT PK, n INT, s VARCHAR(24), f DOUBLE PRECISION, tag VARCHAR(24))
        primary vindex hash(id); tag: non-unique lookup tag_idx (ignore_nulls)
    t2(id BIGINT PK, k BIGINT NOT NULL, email VARCHAR(32), n INT)
        primary vindex xxhash(k); email: unique lookup email_idx (ignore_nulls)
    t3(id INT PK, label VARCHAR(24), w INT)   reference table

Keyspace ``lk`` (unsharded) holds the lookup tables. The reference database is
one plain database of the same engine with the same three tables (``t2.email``
UNIQUE there, as the unique lookup promises, and on each shard). DDL is written here per engine
and run directly on every database, not through the gate.

Keyspace ids are computed here independently of shardgate: ``hash`` is DES of
the 8-byte big-endian two's complement (Vitess's ``hash``), ``xxhash`` is
xxHash64 of the value's decimal text, little-endian (Vitess's ``xxhash``).
"""

from __future__ import annotations

import random
from typing import Any

import xxhash
from Crypto.Cipher import DES

_DES = DES.new(bytes(8), DES.MODE_ECB)
SHARDS = 4

VSCHEMA: dict[str, Any] = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "xx": {"type": "xxhash"},
        "tag_idx": {"type": "lookup", "owner": "t1",
                    "params": {"table": "lk.tag_idx", "from": "tag", "to": "ksid",
                               "ignore_nulls": "true"}},
        "email_idx": {"type": "lookup_unique", "owner": "t2",
                      "params": {"table": "lk.email_idx", "from": "email", "to": "ksid",
                                 "ignore_nulls": "true"}},
    },
    "tables": {
        "t1": {"column_vindexes": [{"column": "id", "name": "hash"},
                                   {"column": "tag", "name": "tag_idx"}]},
        "t2": {"column_vindexes": [{"column": "k", "name": "xx"},
                                   {"column": "email", "name": "email_idx"}]},
        "t3": {"type": "reference"},
    },
}

COLUMNS: dict[str, tuple[str, ...]] = {
    "t1": ("id", "n", "s", "f", "tag"),
    "t2": ("id", "k", "email", "n"),
    "t3": ("id", "label", "w"),
}
#: the columns holding text (for collation-aware comparison)
TEXT_COLUMNS = {"s", "tag", "email", "label"}


def table_ddl(kind: str, plain: bool) -> list[str]:
    """CREATE TABLEs of t1..t3 for one engine (``plain``: the reference database).

    ``t2.email`` is UNIQUE on the reference and on every shard (what is unique
    in the keyspace is unique on each shard): MariaDB answers some statements
    by that index (``WHERE NOT (email)`` with ``COUNT(DISTINCT email)`` is
    ``(0, NULL)`` there while a scan finds rows), so shards and reference
    must have the same indexes to be compared.
    """
    unique = ", UNIQUE (email)"
    return [
        "CREATE TABLE t1 (id BIGINT PRIMARY KEY, n INT, s VARCHAR(24), "
        "f DOUBLE PRECISION, tag VARCHAR(24))",
        f"CREATE TABLE t2 (id BIGINT PRIMARY KEY, k BIGINT NOT NULL, email VARCHAR(32), "
        f"n INT{unique})",
        "CREATE TABLE t3 (id INT PRIMARY KEY, label VARCHAR(24), w INT)",
    ]


def lookup_ddl(kind: str) -> list[str]:
    """CREATE TABLEs of the lookup tables for one engine."""
    binary = "BYTEA" if kind == "postgres" else "VARBINARY(8)"
    return [
        f"CREATE TABLE tag_idx (tag VARCHAR(24) NOT NULL, ksid {binary} NOT NULL, "
        "PRIMARY KEY (tag, ksid))",
        f"CREATE TABLE email_idx (email VARCHAR(32) PRIMARY KEY, ksid {binary} NOT NULL)",
    ]


def hash_ksid(value: int) -> bytes:
    """Vitess ``hash``: DES (zero key) of the uint64, big-endian."""
    return _DES.encrypt((int(value) & (2**64 - 1)).to_bytes(8, "big"))


def xxhash_ksid(value: int | str) -> bytes:
    """Vitess ``xxhash``: xxHash64 of the value's bytes (an integer's decimal text),
    little-endian."""
    text = value if isinstance(value, str) else str(int(value))
    return xxhash.xxh64_intdigest(text.encode()).to_bytes(8, "little")


def row_ksid(table: str, row: dict[str, Any]) -> bytes:
    """The keyspace id a stored row of ``t1``/``t2`` must live under."""
    return hash_ksid(row["id"]) if table == "t1" else xxhash_ksid(row["k"])


def shard_of(ksid: bytes, shards: int = SHARDS) -> int:
    """Index of the shard (of ``shards`` equal ranges) holding ``ksid``."""
    return ksid[0] * shards // 256


# ------------------------------------------------------------ value domains --

HUGE = (9223372036854775807, -9223372036854775808, 4611686018427387904, -4611686018427387905)
INT32 = (2147483647, -2147483648)
#: equal under MariaDB's utf8mb4_general_ci in classes (case, accents, trailing
#: spaces: 'abc' = 'Ábc ' = 'ABC', 'ß' = 's'), ordered by its weights there
WORDS = ("ann", "Ann", "ANN", "ann ", "bob", "Bob ", "", "cy", "dee", "abc", "abc ", "Ábc",
         "Zeta", "zeta", "ß", "s", "Ørn", "orn", "éa", "Ea")
TAGS = ("red", "Red", "red ", "blue", "BLUE", "green")
FLOATS = (0.1, -2.5, 1e10, 3.0, 0.2, 1.5, -7.25)
EMAILS = ("a@x", "A@x", "b@x", "b@x ", "c@x", "d@x", "e@x", "f@x")


def small_id(rng: random.Random) -> int:
    return rng.randrange(-5, 60)


def any_id(rng: random.Random) -> int:
    return rng.choice(HUGE) if rng.random() < 0.08 else small_id(rng)


def any_n(rng: random.Random) -> int | None:
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.2:
        return rng.choice(INT32)
    return rng.randrange(-3, 11)


def maybe(rng: random.Random, values: tuple[Any, ...], nulls: float = 0.15) -> Any:
    return None if rng.random() < nulls else rng.choice(values)


def any_k(rng: random.Random) -> int:
    return rng.choice(HUGE) if rng.random() < 0.05 else rng.randrange(-3, 20)


def collation_key(kind: str, value: str) -> str:
    """How the engine's default collation compares the ASCII emails (MariaDB
    utf8mb4_general_ci: case-insensitive, trailing spaces ignored; others:
    binary). Results are compared by the server's own weights
    (:meth:`.harness.Harness.collation_keys`)."""
    return value.rstrip(" ").lower() if kind == "mysql" else value


def random_rows(rng: random.Random, kind: str) -> dict[str, list[dict[str, Any]]]:
    """Initial rows: NULLs, duplicates, mixed case, trailing spaces, huge numbers, floats.

    Emails are unique under the engine's collation (the reference database's
    UNIQUE and the unique lookup would refuse a duplicate).
    """
    t1: dict[int, dict[str, Any]] = {}
    for _ in range(rng.randrange(25, 45)):
        i = any_id(rng)
        t1[i] = {"id": i, "n": any_n(rng), "s": maybe(rng, WORDS),
                 "f": maybe(rng, FLOATS), "tag": maybe(rng, TAGS, 0.25)}
    t2: dict[int, dict[str, Any]] = {}
    seen: set[str] = set()
    for _ in range(rng.randrange(20, 35)):
        i = rng.randrange(1, 300)
        email = maybe(rng, EMAILS, 0.3)
        if email is not None:
            if collation_key(kind, email) in seen:
                email = None
            else:
                seen.add(collation_key(kind, email))
        t2[i] = {"id": i, "k": any_k(rng), "email": email, "n": any_n(rng)}
    t3 = [{"id": i, "label": maybe(rng, ("east", "West", "west ", "north")),
           "w": any_n(rng)} for i in range(-1, 6)]
    return {"t1": list(t1.values()), "t2": list(t2.values()), "t3": t3}


def literal(value: Any) -> str:
    """SQL text of a Python value (the same in every engine)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return repr(value)
    return str(int(value))
