"""A gate in a process of its own, for the two-phase commit crash tests.

Usage: ``python twopc_worker.py CLUSTER_JSON FIRST_ID COUNT``. Opens the cluster
(a ``Topology.from_dict`` document), and in ``transaction_mode = 'twopc'``
inserts customers ``FIRST_ID .. FIRST_ID+COUNT-1`` (rows on several commerce
shards plus their lookup rows in ``lookup/0``) in one transaction and commits.
Prints ``committed`` on success. With ``SHARDGATE_TWOPC_FAULT=<point>`` set
it dies at that point of the commit instead (exit code
``shardgate.gate.twopc.FAULT_EXIT_CODE``), leaving what a crash leaves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate
from shardgate.topo import Topology


async def run(cluster: Path, first_id: int, count: int) -> None:
    gate = Gate.open(Topology.from_dict(json.loads(cluster.read_text())))
    try:
        session = gate.session("commerce", identity=TRUSTED)
        await gate.execute(session, "SET transaction_mode = 'twopc'")
        await gate.execute(session, "BEGIN")
        for cid in range(first_id, first_id + count):
            await gate.execute(
                session,
                "INSERT INTO customer (customer_id, email, name) VALUES (:id, :email, 'w')",
                {"id": cid, "email": f"c{cid}@example.com"},
            )
        await gate.execute(session, "COMMIT")
        print("committed", flush=True)
    finally:
        await gate.close()


if __name__ == "__main__":
    asyncio.run(run(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
