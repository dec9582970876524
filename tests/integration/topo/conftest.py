"""A private etcd for the topo tests: one per test process, a fresh key prefix per test.

``etcd`` is Debian's ``etcd-server`` (scripts/install-system-deps.sh). Missing, it is
a skip on a laptop and a failure in CI (``CI=true``), like an unreachable server.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardgate.errors import FailedPrecondition
from shardgate.topo.etcd_local import LocalEtcd
from tests.conftest import in_ci


@pytest.fixture(scope="session")
def local_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    try:
        etcd = LocalEtcd.start(Path(tmp_path_factory.mktemp("etcd")))
    except FailedPrecondition as exc:
        if in_ci():
            pytest.fail(f"CI=true and {exc.message}", pytrace=False)
        pytest.skip(exc.message)
    yield etcd
    etcd.stop()


@pytest.fixture
def etcd_url(local_etcd: LocalEtcd) -> str:
    """``etcd://127.0.0.1:PORT/t<random>``: an empty store of this test's own."""
    return f"{local_etcd.url}/t{secrets.token_hex(4)}"
