"""The console of a real ``shardgate up`` (issue 34 item 12): the shard lease is held
and named with no queue, the charts' figures move with traffic, and every page and
asset comes from the gate itself (a console used offline loads nothing else)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_cli import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    cli_env,
    free_port,
    shardgate,
    wait_for_port,
)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    """``shardgate up`` on free ports: (cwd, gRPC port, HTTP port)."""
    cwd = tmp_path_factory.mktemp("up")
    grpc, http = free_port(), free_port()
    log = cwd / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardgate.cli", "up", "--data-dir", "data",
             "--port", str(grpc), "--mysql-port", "0", "--http-port", str(http)],
            cwd=cwd, env=cli_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(proc, grpc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "try: shardgate sql" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        yield cwd, grpc, http
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def _get(http: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=10) as r:
        return str(r.read().decode())


def _api(http: int, path: str) -> Any:
    return json.loads(_get(http, path))


def test_up_names_each_shards_lease_holder_without_a_queue(up: tuple[Path, int, int]) -> None:
    _, _, http = up
    assert _api(http, "/api/queues") == []
    deadline = time.monotonic() + 10
    while True:  # the leases are taken in the background as up starts serving
        holders = [s["lease_holder"] for ks in _api(http, "/api/cluster")["keyspaces"]
                   for s in ks["shards"]]
        if all(holders) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(holders) == 5 and all(h.startswith("in-process (") for h in holders), holders
    page = _get(http, "/")
    assert page.count('<span class="holder">in-process (') == 5
    assert "SQLite logs changes from the first change stream on" in page


def test_up_counts_statements_for_the_charts(up: tuple[Path, int, int]) -> None:
    cwd, grpc, http = up

    def commerce() -> int:
        stats = _api(http, "/api/stats?minutes=10")
        return sum(s["total"]["count"] for s in stats["keyspaces"] if s["keyspace"] == "commerce")

    before = commerce()
    for i in range(3):
        done = shardgate("sql", "--target", f"grpc://127.0.0.1:{grpc}",
                         f"select * from customer where customer_id = {i + 1}", cwd=cwd)
        assert done.returncode == 0, done.stderr
    assert commerce() - before == 3


def test_pages_and_assets_come_from_the_gate_alone(up: tuple[Path, int, int]) -> None:
    _, _, http = up
    for path in ("/", "/vschema", "/queues", "/streams", "/workflows",
                 "/static/console.js", "/static/console.css"):
        body = _get(http, path)
        # no script, style or font from elsewhere (the SVG namespace is a name, not a load)
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", body), path
        assert not re.search(r"(import|url)\(\s*[\"']?https?:", body), path
