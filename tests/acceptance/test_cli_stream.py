"""`shardgate stream`: JSON lines from a timestamp, resumed exactly from its state file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.cli import main
from shardgate.cli.serve import _open_embedded


async def _setup(data_dir: Path) -> None:
    gate = await _open_embedded(data_dir)
    try:
        for client in gate.tablets.values():  # capture on before the writes
            await client.tablet.change_stream()  # type: ignore[attr-defined]
        s = gate.session(identity=TRUSTED)
        for i in range(1, 7):
            await gate.execute(
                s, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:i, :i, 'x', 1)",
                {"i": i},
            )
    finally:
        await gate.close()


@pytest.mark.timeout(60)
def test_stream_prints_json_lines_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_setup(tmp_path))
    state = tmp_path / "stream.state"
    args = ["stream", "--data-dir", str(tmp_path), "--keyspace", "commerce",
            "--from-timestamp", "0", "--state-file", str(state), "--heartbeat", "0.2"]
    # One row first: the other shards have sent nothing yet, and the resumed run
    # must still start them from the requested timestamp, not from that row's time.
    assert main([*args, "--count", "1"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main([*args, "--count", "5"]) == 0
    second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ids = [int(r["pk"][0]) for r in first + second]
    assert sorted(ids) == [1, 2, 3, 4, 5, 6]
    assert all(r["op"] == "insert" and r["table"] == "corder" for r in first + second)
    assert state.read_text().startswith("sp1.")
