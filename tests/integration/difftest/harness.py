"""The databases, the gate, and the checks of the differential tester.

One gate serves keyspace ``sk`` (4 shards) and ``lk`` (the lookup tables);
the reference is one plain database of the same engine, reached directly.
Rows are loaded directly into every database (shard placement and lookup
rows computed by :mod:`.schema`, independently of the gate), so a state that
diverged after a wrong write can be reset to the reference's.

Outcomes are tallied in :class:`Tally`: agreements, refusals (a coded
``ShardgateError`` of the gate itself where the database answers) per class,
and mismatches (wrong rows, a statement the database rejects but the gate
answers or applies, a shard error on SQL the gate generated for a statement
the database answers, an exception that is not a ``ShardgateError``, a
misplaced row, an inexact lookup table) with the constructs of the statement
that showed them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardgate.auth.identity import TRUSTED
from shardgate.backends import Backend, Connection, open_backend
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.keys import KeyRange
from shardgate.topo import Topology

from ..tablet_procs import TabletProcesses, serve_with_processes
from .compare import difference
from .dml import Write
from .queries import Query
from .schema import (
    COLUMNS,
    SHARDS,
    VSCHEMA,
    hash_ksid,
    lookup_ddl,
    row_ksid,
    shard_of,
    table_ddl,
)

#: in the message of an error a shard database raised: when one database answers the
#: same statement, the gate sent SQL (or values) the shard cannot take, which is a
#: bug, not a refusal
SHARD_ERROR = "shard database"

#: constructs whose text results collapse equal values (MariaDB: compare by collation key)
COLLAPSING = {"distinct", "distinct_text", "aggregate_text", "distinct_aggregate", "aggregate",
              "gate_expr_group"}


@dataclass
class Mismatch:
    """One disagreement, with the constructs of the statement that showed it."""

    what: str  # select | write | placement | lookup | crash
    sql: str
    detail: str
    constructs: frozenset[str]


@dataclass
class Tally:
    """What a run saw."""

    agreed: int = 0
    both_rejected: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    #: refusal class -> the first statement refused that way
    refusal_examples: dict[str, str] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    constructs: Counter[str] = field(default_factory=Counter)

    def refused(self, exc: ShardgateError, sql: str) -> None:
        msg = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`|-?\d+(\.\d+)?", "…", exc.message)
        key = f"{exc.code.value}: {msg[:90]}"
        self.refusals[key] += 1
        self.refusal_examples.setdefault(key, sql)


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def same_labels(kind: str, got: list[str], want: list[str]) -> bool:
    """Whether the result columns are named alike (case-insensitively).

    The gate labels an unaliased expression by its text, as MySQL and SQLite do;
    PostgreSQL labels it by function name (``count``, ``?column?``), so there
    only column names and aliases (labels that are plain identifiers at the
    gate) are compared.
    """
    if len(got) != len(want):
        return False
    return all(g.lower() == w.lower() for g, w in zip(got, want, strict=True)
               if kind != "postgres" or _IDENTIFIER.match(g))


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


class Harness:
    """The gate over the sharded keyspace, the shard and lookup databases, and the
    reference database, for one engine ``kind``."""

    def __init__(self, kind: str, make_database: Callable[..., str]) -> None:
        self.kind = kind
        ranges = KeyRange(b"", b"").split(SHARDS)
        self.shard_urls = [make_database(kind, f"dt{i}") for i in range(SHARDS)]
        self.lookup_url = make_database(kind, "dtlk")
        self.plain_url = make_database(kind, "dtone")
        topo = Topology.from_dict({"default_keyspace": "sk", "keyspaces": {
            "sk": {"shards": {kr.name: u for kr, u in zip(ranges, self.shard_urls, strict=True)},
                   "vschema": VSCHEMA},
            "lk": {"shards": {"0": self.lookup_url}, "vschema": {"sharded": False}},
        }})
        self.topology = topo
        self.gate = Gate.open(topo)
        #: the tablet processes the gate reaches (see :meth:`use_processes`)
        self.processes: TabletProcesses | None = None
        self.session = self.gate.session("sk", identity=TRUSTED)
        self.shards: list[Backend] = [open_backend(u, pool_size=1) for u in self.shard_urls]
        self.lookup: Backend = open_backend(self.lookup_url, pool_size=1)
        self.plain: Backend = open_backend(self.plain_url, pool_size=1)
        self.tally = Tally()
        #: id -> k of the reference's t2 rows (shared with the write generator)
        self.t2_keys: dict[int, int] = {}
        #: string -> its collation key on the reference MariaDB (see collation_keys)
        self._weights: dict[str, str] = {}

    @property
    def mark(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"

    def raw(self, sql: str) -> str:
        """``sql`` for the reference driver: psycopg and PyMySQL format ``%`` even
        without parameters, so a literal ``%`` is doubled there."""
        return sql if self.kind == "sqlite" else sql.replace("%", "%%")

    async def use_processes(self, directory: Path) -> None:
        """Reach the shards through tablet processes (their topo store and logs in
        ``directory``) instead of this process's tablets."""
        await self.gate.close()
        self.processes = await serve_with_processes(self.topology, directory)
        self.gate = self.processes.gate
        self.session = self.gate.session("sk", identity=TRUSTED)

    async def close(self) -> None:
        await (self.processes.close() if self.processes is not None else self.gate.close())
        for b in (*self.shards, self.lookup, self.plain):
            await b.close()

    async def create(self) -> None:
        for b in self.shards:
            for ddl in table_ddl(self.kind, plain=False):
                await b.execute(ddl)
        for ddl in table_ddl(self.kind, plain=True):
            await self.plain.execute(ddl)
        for ddl in lookup_ddl(self.kind):
            await self.lookup.execute(ddl)

    # ----------------------------------------------------------------- rows --

    async def _insert(self, backend: Backend, table: str, cols: Iterable[str],
                      rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        cols = list(cols)
        marks = ", ".join([self.mark] * len(cols))
        conn = await backend.acquire()
        try:
            await conn.executemany(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)
        finally:
            await backend.release(conn)

    async def load(self, data: dict[str, list[dict[str, Any]]]) -> None:
        """Make every database hold ``data`` (placed and looked up as the vschema says)."""
        for b in (*self.shards, self.plain):
            for t in ("t1", "t2", "t3"):
                await b.execute(f"DELETE FROM {t}")
        for t in ("tag_idx", "email_idx"):
            await self.lookup.execute(f"DELETE FROM {t}")
        self.t2_keys.clear()
        self.t2_keys.update((r["id"], r["k"]) for r in data["t2"])
        for t in ("t1", "t2", "t3"):
            rows = [tuple(r[c] for c in COLUMNS[t]) for r in data[t]]
            await self._insert(self.plain, t, COLUMNS[t], rows)
            for i, b in enumerate(self.shards):
                mine = rows if t == "t3" else [
                    row for row, r in zip(rows, data[t], strict=True)
                    if shard_of(row_ksid(t, r)) == i]
                await self._insert(b, t, COLUMNS[t], mine)
        await self._insert(self.lookup, "tag_idx", ("tag", "ksid"), [
            (r["tag"], hash_ksid(r["id"])) for r in data["t1"] if r["tag"] is not None])
        await self._insert(self.lookup, "email_idx", ("email", "ksid"), [
            (r["email"], row_ksid("t2", r)) for r in data["t2"] if r["email"] is not None])

    async def reference_rows(self) -> dict[str, list[dict[str, Any]]]:
        """The reference database's rows (to reset the sharded side after a divergence)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for t in ("t1", "t2", "t3"):
            res = await self.plain.execute(f"SELECT {', '.join(COLUMNS[t])} FROM {t}")
            out[t] = [dict(zip(COLUMNS[t], r, strict=True)) for r in res.rows]
        return out

    # --------------------------------------------------------------- checks --

    async def check_query(self, q: Query) -> None:
        """Run ``q`` on both sides and tally the outcome."""
        self.tally.constructs.update(q.constructs)
        try:
            want = await self.plain.execute(self.raw(q.plain_sql))
            db_error = ""
        except Exception as exc:  # the engine rejects it: the gate must not answer
            want, db_error = None, str(exc)[:160]
        try:
            got = await self.gate.execute(self.session, q.sql, q.binds or None)
        except ShardgateError as exc:
            if want is None:
                self.tally.both_rejected += 1
            elif SHARD_ERROR in exc.message:
                self.tally.mismatches.append(Mismatch("shard-error", q.sql, str(exc)[:300],
                                                      q.constructs))
            else:
                self.tally.refused(exc, q.sql)
            return
        except Exception as exc:  # not a coded error: a crash (item 13)
            self.tally.mismatches.append(Mismatch(
                "crash", q.sql, f"{type(exc).__name__}: {exc}", q.constructs))
            return
        if want is None:
            self.tally.mismatches.append(Mismatch(
                "select", q.sql, f"the database rejects it ({db_error}), the gate answered "
                f"{got.rows[:5]}", q.constructs))
            return
        if not same_labels(self.kind, got.fields, want.fields):
            self.tally.mismatches.append(Mismatch(
                "fields", q.sql, f"columns: gate {got.fields}, db {want.fields}", q.constructs))
            return
        text_key = None
        if self.kind == "mysql" and q.constructs & COLLAPSING:
            text_key = await self.collation_keys([*got.rows, *want.rows])
        diff = difference(got.rows, want.rows, ordered=q.ordered, approx=q.approx,
                          text_key=text_key)
        if diff is None:
            self.tally.agreed += 1
        else:
            self.tally.mismatches.append(Mismatch("select", q.sql, diff, q.constructs))

    async def collation_keys(self, rows: Iterable[Iterable[Any]]) -> Callable[[str], str]:
        """The reference MariaDB's collation key of every string in ``rows``:
        ``WEIGHT_STRING`` under ``utf8mb4_general_ci`` without its trailing space
        weights (PAD SPACE: ``'abc'`` = ``'abc '``), asked of the server itself
        so the tester does not share the gate's weight table."""
        todo = sorted({v for row in rows for v in row
                       if isinstance(v, str) and v not in self._weights})
        for i in range(0, len(todo), 200):
            chunk = todo[i:i + 200]
            items = ", ".join(["HEX(WEIGHT_STRING(CONVERT(%s USING utf8mb4) "
                               "COLLATE utf8mb4_general_ci))"] * len(chunk))
            res = await self.plain.execute(f"SELECT {items}", chunk)
            for text, weight in zip(chunk, res.rows[0], strict=True):
                while weight.endswith("0020") and len(weight) % 4 == 0:
                    weight = weight[:-4]
                self._weights[text] = weight
        return self._weights.__getitem__

    async def check_write(self, w: Write) -> None:
        """Run ``w`` on both sides, then check contents, placement and lookups
        (also after a refusal: a refused write must change nothing)."""
        if w.rollback:
            await self.check_rolled_back(w)
            return
        await self.check_transaction([w], explicit=False)

    async def check_transaction(self, writes: list[Write], *, explicit: bool = True) -> None:
        """Run ``writes`` in one transaction on each side (``explicit``: BEGIN ...
        COMMIT through the gate; else the one write autocommits there). The first
        write either side does not apply, or (explicit) that shows a mismatch, ends
        it: both sides roll back."""
        conn = await self.plain.acquire()
        applied = True
        try:
            await conn.begin()
            if explicit:
                self.tally.constructs["transaction"] += 1
                await self.gate.execute(self.session, "BEGIN")
            for w in writes:
                seen = len(self.tally.mismatches)
                # in a transaction the later writes would only repeat a first mismatch
                if not await self._write_pair(conn, w) or (
                        explicit and len(self.tally.mismatches) > seen):
                    applied = False
                    break
            if applied:
                await conn.commit()
                if explicit:
                    await self._gate_end("COMMIT", writes)
            else:
                await conn.rollback()
        finally:
            if conn.in_transaction:
                await conn.rollback()
            await self.plain.release(conn)
            if self.session.in_transaction:
                await self._gate_end("ROLLBACK", writes)
        constructs = frozenset().union(*(w.constructs for w in writes))
        if explicit:
            constructs |= {"transaction"}
        await self.check_state(Write("; ".join(w.sql for w in writes), "", constructs))

    async def _gate_end(self, verb: str, writes: list[Write]) -> None:
        try:
            await self.gate.execute(self.session, verb)
        except Exception as exc:
            self.tally.mismatches.append(Mismatch(
                "write", "; ".join(w.sql for w in writes) + f"; {verb}",
                f"{verb} failed: {type(exc).__name__}: {exc}",
                frozenset().union(*(w.constructs for w in writes))))

    async def _write_pair(self, conn: Connection, w: Write) -> bool:
        """``w`` on the reference connection and through the gate, tallied; True
        when both applied it."""
        self.tally.constructs.update(w.constructs)
        try:
            want = await conn.execute(self.raw(w.plain_sql))
            db_error = ""
        except Exception as exc:
            want, db_error = None, str(exc)[:160]
        try:
            got = await self.gate.execute(self.session, w.sql)
        except ShardgateError as exc:
            if want is None:
                self.tally.both_rejected += 1
            elif SHARD_ERROR in exc.message:
                self.tally.mismatches.append(Mismatch(
                    "shard-error", w.sql, str(exc)[:300], w.constructs))
            else:
                self.tally.refused(exc, w.sql)
            return False
        except Exception as exc:
            self.tally.mismatches.append(Mismatch(
                "crash", w.sql, f"{type(exc).__name__}: {exc}", w.constructs))
            return False
        if want is None:
            self.tally.mismatches.append(Mismatch(
                "write", w.sql, f"the database rejects it ({db_error}), "
                f"the gate applied it ({got.rows_affected} rows)", w.constructs))
            return False
        if got.rows_affected != want.rows_affected:
            self.tally.mismatches.append(Mismatch(
                "write", w.sql, f"rows affected: gate {got.rows_affected}, "
                f"db {want.rows_affected}", w.constructs))
        else:
            self.tally.agreed += 1
        return True

    async def check_rolled_back(self, w: Write) -> None:
        """``w`` inside BEGIN ... ROLLBACK through the gate: the shards and lookup
        tables must be as before (the reference is left alone)."""
        self.tally.constructs.update(w.constructs)
        await self.gate.execute(self.session, "BEGIN")
        try:
            await self.gate.execute(self.session, w.sql)
        except ShardgateError:
            pass
        except Exception as exc:
            self.tally.mismatches.append(Mismatch(
                "crash", w.sql, f"{type(exc).__name__}: {exc}", w.constructs))
        finally:
            if self.session.in_transaction:
                await self.gate.execute(self.session, "ROLLBACK")
        self.tally.agreed += 1
        await self.check_state(w)

    async def check_state(self, w: Write) -> None:
        """Shard contents equal the reference, every row on its shard, lookups exact.

        A divergence is recorded (against ``w``) and the sharded side is reset
        to the reference's rows, so later statements are checked from an
        agreed state.
        """
        problems: list[tuple[str, str]] = []
        owners: dict[str, list[dict[str, Any]]] = {"t1": [], "t2": []}
        for t in ("t1", "t2"):
            cols = COLUMNS[t]
            for i, b in enumerate(self.shards):
                for r in (await b.execute(f"SELECT {', '.join(cols)} FROM {t}")).rows:
                    row = dict(zip(cols, r, strict=True))
                    owners[t].append(row)
                    if shard_of(row_ksid(t, row)) != i:
                        problems.append(("placement", f"{t} {row} is on shard {i}, "
                                         f"its keyspace id says {shard_of(row_ksid(t, row))}"))
            ref = (await self.plain.execute(f"SELECT {', '.join(cols)} FROM {t}")).rows
            if t == "t2":
                self.t2_keys.clear()
                self.t2_keys.update((r[0], r[1]) for r in ref)
            got = Counter(tuple(r[c] for c in cols) for r in owners[t])
            want = Counter(tuple(r) for r in ref)
            if got != want:
                problems.append(("write", f"{t} differs: only shards "
                                 f"{sorted(map(repr, got - want))}, only db "
                                 f"{sorted(map(repr, want - got))}"))
        want_tags = Counter((r["tag"], hash_ksid(r["id"])) for r in owners["t1"]
                            if r["tag"] is not None)
        want_emails = Counter((r["email"], row_ksid("t2", r)) for r in owners["t2"]
                              if r["email"] is not None)
        for table, col, want_lk in (("tag_idx", "tag", want_tags),
                                    ("email_idx", "email", want_emails)):
            rows = (await self.lookup.execute(f"SELECT {col}, ksid FROM {table}")).rows
            have = Counter((r[0], _plain(r[1])) for r in rows)
            if have != want_lk:
                problems.append(("lookup", f"{table} is not what the owner rows imply: "
                                 f"extra {sorted(map(repr, have - want_lk))}, missing "
                                 f"{sorted(map(repr, want_lk - have))}"))
        if any(sum(1 for r in owners["t2"] if r["email"] is not None and
                   r["email"] == e) > 1 for e in {r["email"] for r in owners["t2"]}):
            problems.append(("lookup", "two t2 rows hold one value of the unique lookup email"))
        for what, detail in problems:
            self.tally.mismatches.append(Mismatch(what, w.sql, detail, w.constructs))
        if problems:
            await self.load(await self.reference_rows())
