"""Two-phase commit coordinator logic against a recording fake tablet (no database)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.base import MAX_XID_LENGTH, check_xid
from shardgate.errors import Aborted, AlreadyExists, InvalidArgument
from shardgate.gate import twopc
from shardgate.gate.session import Session
from shardgate.result import ExecuteOptions, Result, Row
from shardgate.sql.classify import WriteTarget
from shardgate.sql.parse import parse
from shardgate.tablet import TabletClient


class FakeTablet(TabletClient):
    """Logs every call as ``shard: call``; holds a tiny decision table."""

    dialect = "postgres"
    placeholder = "%s"
    supports_twopc = True

    def __init__(self, shard: str, log: list[str], *, fail_prepare: bool = False) -> None:
        self.keyspace, self.shard, self.log = "ks", shard, log
        self.fail_prepare = fail_prepare
        self.records: dict[str, str] = {}
        self.steal_decision = False  # a resolver sets ROLLBACK just before our COMMIT

    async def execute(
        self, sql: str, params: Sequence[Any], transaction_id: int | None = None,
        options: ExecuteOptions | None = None, *, target: WriteTarget | None = None,
    ) -> Result:
        verb = sql.split()[0]
        self.log.append(f"{self.shard}: {verb} {params[0] if params else ''}".rstrip())
        if verb == "INSERT":
            self.records[params[0]] = params[1]
        elif verb == "UPDATE":
            state, dtid, expect = params
            if self.steal_decision and state == twopc.COMMIT:
                self.records[dtid] = twopc.ROLLBACK
            result = Result()
            if self.records.get(dtid) == expect:
                self.records[dtid] = state
                result.rows_affected = 1
            return result
        elif verb == "DELETE":
            self.records.pop(params[0], None)
        return Result()

    def stream_execute(
        self, sql: str, params: Sequence[Any]
    ) -> AsyncIterator[tuple[list[str], list[Row]]]:
        raise NotImplementedError

    async def begin(self, caller: str | None = None) -> int:
        return 1

    async def commit(self, transaction_id: int) -> None:
        self.log.append(f"{self.shard}: commit")

    async def rollback(self, transaction_id: int) -> None:
        self.log.append(f"{self.shard}: rollback")

    async def close(self) -> None:
        pass

    async def begin_twopc(self, xid: str, caller: str | None = None) -> int:
        self.log.append(f"{self.shard}: begin {xid[-2:]}")
        return 1

    async def prepare(self, transaction_id: int, xid: str) -> None:
        self.log.append(f"{self.shard}: prepare {xid[-2:]}")
        if self.fail_prepare:
            raise AlreadyExists("duplicate")

    async def commit_prepared(self, xid: str) -> None:
        self.log.append(f"{self.shard}: commit_prepared {xid[-2:]}")

    async def rollback_prepared(self, xid: str) -> None:
        self.log.append(f"{self.shard}: rollback_prepared {xid[-2:]}")


async def _joined(tablets: dict[tuple[str, str], FakeTablet]) -> Session:
    s = Session(keyspace="ks", in_transaction=True, transaction_mode=twopc.TWOPC,
                identity=TRUSTED)
    for key, t in tablets.items():
        s.shard_txs[key] = await twopc.begin_participant(s, key[0], key[1], t)
    return s


async def _commit(tablets: dict[tuple[str, str], FakeTablet], s: Session) -> None:
    txs = list(s.shard_txs.items())
    xids, dtid = twopc.take(s)
    await twopc.commit(tablets, txs, xids, dtid)


async def test_happy_path_order() -> None:
    log: list[str] = []
    tablets = {("ks", n): FakeTablet(n, log) for n in ("-80", "80-")}
    s = await _joined(tablets)
    assert s.dtid is not None and s.dtid.startswith("sg2pc:ks/-80:")
    dtid = s.dtid
    await _commit(tablets, s)
    assert [line.replace(dtid, "D") for line in log] == [
        "-80: begin :0",
        "80-: begin :1",
        "-80: INSERT D",
        "-80: prepare :0",
        "80-: prepare :1",
        "-80: UPDATE COMMIT",
        "-80: commit_prepared :0",
        "80-: commit_prepared :1",
        "-80: DELETE D",
    ]


async def test_prepare_failure_rolls_back_everything_and_keeps_the_code() -> None:
    log: list[str] = []
    tablets = {
        ("ks", "-40"): FakeTablet("-40", log),
        ("ks", "40-80"): FakeTablet("40-80", log, fail_prepare=True),
        ("ks", "80-"): FakeTablet("80-", log),
    }
    s = await _joined(tablets)
    dtid = s.dtid
    assert dtid is not None
    with pytest.raises(AlreadyExists, match="prepare failed on ks/40-80"):
        await _commit(tablets, s)
    tail = log[log.index("40-80: prepare :1") + 1 :]
    assert tail == [
        "-40: UPDATE ROLLBACK",
        "-40: rollback_prepared :0",
        "80-: rollback",
        f"-40: DELETE {dtid}",
    ]


async def test_resolver_winning_the_decision_aborts_the_commit() -> None:
    log: list[str] = []
    tablets = {("ks", n): FakeTablet(n, log) for n in ("-80", "80-")}
    tablets[("ks", "-80")].steal_decision = True
    s = await _joined(tablets)
    with pytest.raises(Aborted, match="rolled back by `shardgate twopc resolve`"):
        await _commit(tablets, s)
    assert "-80: rollback_prepared :0" in log and "80-: rollback_prepared :1" in log
    assert not any("commit_prepared" in line for line in log)


def test_set_transaction_mode_parsing() -> None:
    def mode(sql: str) -> str | None:
        stmt = parse(sql)
        assert isinstance(stmt, twopc.exp.Set)
        return twopc.mode_from_set(stmt)

    assert mode("SET transaction_mode = 'twopc'") == "twopc"
    assert mode("SET SESSION transaction_mode = 'Best_Effort'") == "best_effort"
    assert mode("SET @@transaction_mode = 'twopc'") == "twopc"
    assert mode("SET autocommit = 1") is None
    with pytest.raises(InvalidArgument, match="unknown transaction_mode"):
        mode("SET transaction_mode = 'multi'")
    with pytest.raises(InvalidArgument, match="statement of its own"):
        mode("SET transaction_mode = 'twopc', autocommit = 1")


def test_names_fit_an_xid() -> None:
    readable = twopc.new_dtid("commerce", "80-c0")
    assert readable.startswith("sg2pc:commerce/80-c0:")
    long = twopc.new_dtid("a_keyspace_with_a_really_long_name_indeed", "80-c0")
    assert long.startswith("sg2pc:#")
    for dtid in (readable, long):
        assert check_xid(f"{dtid}:9999") and len(f"{dtid}:9999") <= MAX_XID_LENGTH
        assert twopc.dtid_of(f"{dtid}:3") == dtid
    assert twopc.coordinator_name("ks", "-80") == "ks/-80"
    with pytest.raises(InvalidArgument):
        check_xid("x" * (MAX_XID_LENGTH + 1))
    with pytest.raises(InvalidArgument):
        check_xid("has space")
