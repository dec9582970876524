"""The cost of security on point selects over gRPC: authentication, table ACL
checks and TLS, on vs off, in one run.

One PostgreSQL database holds table ``t`` (a sharded keyspace with one shard
and a ``hash`` vindex, as in ``gate_point_select.py``). One gate serves it
over gRPC on 127.0.0.1 in several configurations; one client runs point
selects by primary vindex with bind variables, sequentially:

* ``off``: no authentication, no ACL, plaintext (the reference);
* ``auth``: a users file, the password checked on every call;
* ``auth+acl``: the same and a table ACL checked on every statement;
* ``auth+acl+tls``: the same over TLS (a local CA from scripts/make-test-ca.sh).

The configurations take turns for several rounds (the machine is shared) and
each keeps its median. Also in-process, without gRPC: the gate's ACL check
alone (identity + ACL vs none), where the goal is < 2 % (issue 30).

    python bench/auth_overhead.py [--seconds 6] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from shardgate.api.grpc.client import GateClient
from shardgate.api.grpc.security import ClientSecurity, ServerSecurity, TLSFiles
from shardgate.api.grpc.server import serve
from shardgate.auth import Identity, StaticUsers
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate

try:
    from bench._pg import drop_database, fresh_database, point_table
except ImportError:  # run as a script
    from _pg import (  # type: ignore[no-redef]
        drop_database,
        fresh_database,
        point_table,
    )

DB = "sec_bench_auth"
ROWS = 10_000
REPO = Path(__file__).resolve().parents[1]
USERS = {"app": [{"Password": "app-pw"}]}
ACL = {"table_groups": [
    {"name": "t", "table_names_or_prefixes": ["t"], "readers": ["app"], "writers": ["app"],
     "admins": []},
    {"name": "rest", "table_names_or_prefixes": ["%"], "readers": [], "writers": [],
     "admins": []},
]}
SELECT = "SELECT id, v FROM t WHERE id = :id"


def _per_call(fn: Callable[[], object], n: int) -> float:
    """Microseconds per call of ``fn`` (the best of three runs of ``n``)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


async def measure(seconds: float, op: Callable[[int], Awaitable[None]]) -> tuple[float, float]:
    """Run ``op(i)`` for ``seconds``: (operations per second, CPU microseconds per operation
    of this process, which runs both the client and the gate)."""
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            await op(n)
            n += 1
    return n / (time.perf_counter() - wall), (time.process_time() - cpu) / n * 1e6


async def main(seconds: float, rounds: int) -> None:
    url = fresh_database(DB)
    topo = point_table(url, ROWS)
    ca = Path(tempfile.mkdtemp(prefix="sec-bench-ca-"))
    subprocess.run([str(REPO / "scripts" / "make-test-ca.sh"), str(ca)], check=True,
                   capture_output=True)
    users = StaticUsers.from_mapping(USERS)
    acl = TableACL.from_mapping(ACL)
    tls = TLSFiles(ca / "server.pem", ca / "server.key")
    plain_gate = Gate.open(topo, pool_size=1)
    acl_gate = Gate.open(topo, pool_size=1, guard=Guard(acl))
    keys = [random.randrange(ROWS) for _ in range(4096)]
    configs: dict[str, tuple[Gate, ServerSecurity | None, ClientSecurity | None]] = {
        "off": (plain_gate, None, None),
        "auth": (plain_gate, ServerSecurity(users=users),
                 ClientSecurity(user="app", password="app-pw")),
        "auth+acl": (acl_gate, ServerSecurity(users=users),
                     ClientSecurity(user="app", password="app-pw")),
        "auth+acl+tls": (acl_gate, ServerSecurity(users=users, tls=tls),
                         ClientSecurity(user="app", password="app-pw", tls_ca=ca / "ca.pem")),
    }
    servers, clients = [], {}
    try:
        for name, (gate, sec, csec) in configs.items():
            server, port = await serve(gate, "127.0.0.1", 0, security=sec,
                                       no_auth=sec is None)
            servers.append(server)
            scheme = "grpcs" if sec is not None and sec.tls is not None else "grpc"
            clients[name] = GateClient(f"{scheme}://127.0.0.1:{port}", keyspace="bench",
                                       security=csec)

        def grpc_op(c: GateClient) -> Callable[[int], Awaitable[None]]:
            async def op(i: int) -> None:
                r = await c.execute(SELECT, {"id": keys[i & 4095]})
                assert len(r.rows) == 1
            return op

        plain_s = plain_gate.session("bench", identity=TRUSTED)
        acl_s = acl_gate.session("bench", identity=Identity("app"))

        def local_op(gate: Gate, s: object) -> Callable[[int], Awaitable[None]]:
            async def op(i: int) -> None:
                r = await gate.execute(s, SELECT, {"id": keys[i & 4095]})  # type: ignore[arg-type]
                assert len(r.rows) == 1
            return op

        ops = {name: grpc_op(c) for name, c in clients.items()}
        ops["in-process, no ACL"] = local_op(plain_gate, plain_s)
        ops["in-process, ACL"] = local_op(acl_gate, acl_s)
        for op in ops.values():  # warm up: plan caches, prepared statements, channels
            for i in range(100):
                await op(i)
        rates: dict[str, list[float]] = {name: [] for name in ops}
        cpus: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(rounds):
            for name, op in ops.items():
                rate, cpu = await measure(seconds / rounds, op)
                rates[name].append(rate)
                cpus[name].append(cpu)
        rate = {name: statistics.median(v) for name, v in rates.items()}
        cpu = {name: statistics.median(v) for name, v in cpus.items()}
        print(f"point selects, one client, {rounds} rounds of {seconds / rounds:.2f} s per "
              "configuration (medians). CPU = this process (client + gate) per select; it is "
              "the steadier figure on a shared machine.")
        print(f"{'configuration':<22}{'ops/s':>9}{'vs off':>8}{'CPU us':>9}{'vs off':>8}")
        for group in (list(configs), ["in-process, no ACL", "in-process, ACL"]):
            ref = group[0]
            for name in group:
                print(f"{name:<22}{rate[name]:>9.0f}{rate[name] / rate[ref]:>8.3f}"
                      f"{cpu[name]:>9.0f}{cpu[name] / cpu[ref]:>8.3f}")
        # The checks themselves, timed alone (steady even on a busy machine).
        ident = Identity("app")
        vschema = acl_gate.vschema
        n = 20_000 if seconds > 1 else 2_000
        t_acl = _per_call(lambda: acl_gate.guard.authorize(ident, SELECT, "bench", vschema), n)
        t_rules = _per_call(lambda: plain_gate.guard.authorize(None, SELECT, "bench", vschema), n)
        t_auth = _per_call(lambda: users.authenticate("app", "app-pw"), n)
        select_us = cpu["in-process, no ACL"]
        print(f"per statement: statement rules {t_rules:.2f} us, rules + ACL {t_acl:.2f} us, "
              f"password check {t_auth:.2f} us; an in-process point select costs "
              f"{select_us:.0f} us of CPU here")
        print(f"ACL check alone: {(t_acl - t_rules) / select_us * 100:.3f}% of a point select, "
              f"rules + ACL {t_acl / select_us * 100:.3f}% (goal < 2%)")
        over_grpc = cpu["auth+acl"] / cpu["auth"] - 1
        alone = cpu["in-process, ACL"] / cpu["in-process, no ACL"] - 1
        print(f"end to end (noisy on a shared machine): ACL {over_grpc * 100:+.1f}% CPU over "
              f"gRPC (auth+acl vs auth), {alone * 100:+.1f}% in-process")
    finally:
        for c in clients.values():
            await c.close()
        for server in servers:
            await server.stop(None)
        await plain_gate.close()
        await acl_gate.close()
        drop_database(DB)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=6.0, help="per configuration, all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    args = ap.parse_args()
    asyncio.run(main(0.3 if args.smoke else args.seconds, 2 if args.smoke else args.rounds))
