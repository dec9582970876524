"""A tablet that refuses a change stream at once: the stream fails coded, it never hangs.

(The tablet-stream call used to be made outside the ``try`` of the merge's pump:
its exception killed the pump task and the consumer waited forever.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardgate.auth.identity import TRUSTED
from shardgate.backends.changes import LogItem
from shardgate.errors import Code, ShardgateError, Unavailable
from shardgate.gate import Gate
from shardgate.tablet import LocalTabletClient
from shardgate.topo import Topology


class _Refusing(LocalTabletClient):
    """A tablet client whose change-stream call raises before it returns a stream."""

    def update_stream(self, **kwargs: Any) -> AsyncIterator[LogItem]:  # type: ignore[override]
        raise Unavailable("tablet refused the stream")


async def test_a_refused_tablet_stream_fails_the_stream(make_database: Callable[..., str]) -> None:
    topo = Topology.from_dict({"keyspaces": {"ks": {
        "shards": {"-80": make_database("sqlite", "a"), "80-": make_database("sqlite", "b")},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}}, "tables": {}}}}})
    gate = Gate.open(topo)
    try:
        local = gate.tablets[("ks", "80-")]
        assert isinstance(local, LocalTabletClient)
        gate.tablets[("ks", "80-")] = _Refusing(local.tablet)

        async def first() -> object:
            async for event in gate.update_stream("ks", heartbeat_s=0.1, identity=TRUSTED):
                return event
            return None

        with pytest.raises(ShardgateError) as err:
            await asyncio.wait_for(first(), 10)
        assert err.value.code is Code.UNAVAILABLE and "refused" in err.value.message
    finally:
        await gate.close()
