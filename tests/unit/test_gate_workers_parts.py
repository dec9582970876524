"""The parts of ``gate --workers N`` and ``--event-loop`` that need no process of their own."""

from __future__ import annotations

import asyncio
import importlib.util
import socket

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.cli.app import build_parser
from shardgate.cli.serve import run_loop
from shardgate.cli.workers import check_count, parse_slot, reserve_port
from shardgate.errors import FailedPrecondition, InvalidArgument, Unavailable
from shardgate.gate import worker
from shardgate.gate.gate import Gate
from shardgate.sql.classify import classify
from shardgate.sql.statements import ShowShardgateWorker
from shardgate.topo import Topology


def test_worker_slots_are_checked() -> None:
    assert parse_slot("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "x/2", "2", "1/0"):
        with pytest.raises(InvalidArgument):
            parse_slot(bad)
    check_count(1)
    for bad in (0, -1, 65):
        with pytest.raises(InvalidArgument):
            check_count(bad)


def test_up_has_no_workers_flag() -> None:
    """``up`` runs tablets in its process: N copies would run N lease holders."""
    parser = build_parser()
    assert parser.parse_args(["gate", "--topo", "x", "--workers", "3"]).workers == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--workers", "2"])


def test_a_reserved_port_is_shared_only_by_reuse_port_sockets() -> None:
    held = reserve_port("127.0.0.1", 0, "--port")
    try:
        port = held.getsockname()[1]
        assert port != 0
        with socket.socket() as worker_sock:  # a worker binds it too, and listens
            worker_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker_sock.bind(("127.0.0.1", port))
            worker_sock.listen()
            with pytest.raises(Unavailable, match="--port N"):  # taken: refused, not shared
                reserve_port("127.0.0.1", port, "--port")
            with socket.socket() as plain, pytest.raises(OSError):
                plain.bind(("127.0.0.1", port))  # a program without SO_REUSEPORT cannot
    finally:
        held.close()


async def test_show_shardgate_worker_names_this_process(tmp_path: object) -> None:
    assert classify("show shardgate_worker;") == ShowShardgateWorker()
    gate = Gate.open(Topology.from_dict({"keyspaces": {"ks": {
        "shards": {"-": f"sqlite:///{tmp_path}/w.db"}}}}))
    try:
        r = await gate.execute(gate.session("ks", identity=TRUSTED), "SHOW SHARDGATE_WORKER")
        me = worker.current()
        assert r.fields == ["Worker", "Workers", "Pid"]
        assert r.rows == [(me.index, me.count, me.pid)]
    finally:
        await gate.close()
    worker.set_worker(2, 3)
    try:
        assert worker.current().label().startswith("2/3 pid ")
    finally:
        worker.set_worker(1, 1)
    with pytest.raises(ValueError):
        worker.set_worker(4, 3)


def test_event_loop_choice() -> None:
    async def kind() -> int:
        return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0

    assert run_loop(kind(), "asyncio") == 0
    if importlib.util.find_spec("uvloop") is None:
        assert run_loop(kind(), "auto") == 0
        with pytest.raises(FailedPrecondition, match="uvloop is not installed"):
            run_loop(kind(), "uvloop")
    else:
        assert run_loop(kind(), "auto") == 1
        assert run_loop(kind(), "uvloop") == 1
