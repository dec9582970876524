"""``shardgate sql``, ``schema apply`` and ``twopc resolve``.

::

    shardgate sql [--target grpc://H:P | --cluster FILE | --data-dir DIR]
                  [--keyspace KS] [--explain] "SQL"
    shardgate schema apply --keyspace KS (--file F.sql | --sql "DDL")
                  [--vindex COLUMN:VINDEX[:TYPE] ... | --register]
                  [--target ... | --cluster FILE | --data-dir DIR]
    shardgate twopc resolve [--cluster FILE | --data-dir DIR | --topo URL] [--grace SECONDS]
                  [--tablet-user U] [--tablet-tls-ca CA --tablet-tls-cert F --tablet-tls-key F]

``twopc resolve --topo URL`` resolves through the tablet processes registered in
that topo store (production mode, ``docs/production.md``); with ``--cluster`` /
``--data-dir`` it opens in-process tablets on the shard databases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from shardgate.cli.common import (
    DEFAULT_TARGET,
    add_tablet_client_args,
    add_target_args,
    client_security,
    format_result,
    local_gate,
    tablet_credentials,
)
from shardgate.cli.defaults import RESOLVE_GRACE_S
from shardgate.errors import InvalidArgument, NotFound

# What a command needs is imported in the function that runs it: ``sql --target``
# loads the gRPC client only, not the gate, planner, sqlglot or the database drivers
# (tests/unit/test_cli_dispatch.py holds that).


def add_parsers(commands: Any) -> None:
    """Add the ``sql``, ``schema`` and ``twopc`` subcommands."""
    sql = commands.add_parser("sql", help="run one SQL statement and print its result")
    add_target_args(sql, remote=True)
    sql.add_argument("--keyspace", help="default keyspace of the session")
    sql.add_argument("--explain", action="store_true", help="print the plan instead (JSON)")
    sql.add_argument("sql", metavar="SQL", help="one statement; bind variables are not taken")

    schema = commands.add_parser("schema", help="schema changes")
    schema_cmds = schema.add_subparsers(dest="schema_command", required=True, metavar="COMMAND")
    apply = schema_cmds.add_parser("apply", help="run DDL on every shard of a keyspace")
    apply.add_argument("--keyspace", required=True, help="keyspace to change")
    source = apply.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="a .sql file of ;-separated DDL statements")
    source.add_argument("--sql", help="DDL statement(s)")
    register = apply.add_mutually_exclusive_group()
    register.add_argument(
        "--vindex", action="append", default=[], metavar="COLUMN:VINDEX[:TYPE]",
        help="add each table the DDL creates to the VSchema with this column vindex "
        "(repeat for more; the first is the primary; TYPE defaults to VINDEX, e.g. "
        "customer_id:hash)")
    register.add_argument(
        "--register", action="store_true",
        help="add each table the DDL creates to the VSchema (unsharded keyspaces)")
    add_target_args(apply, remote=True)

    tpc = commands.add_parser("twopc", help="two-phase commit maintenance")
    tpc_cmds = tpc.add_subparsers(dest="twopc_command", required=True, metavar="COMMAND")
    resolve = tpc_cmds.add_parser(
        "resolve", help="commit or roll back the two-phase commits a dead gate left prepared"
    )
    add_target_args(resolve, remote=False)
    resolve.add_argument(
        "--topo", help="topo store URL: resolve through the tablet processes registered there "
        "(production mode) instead of opening the shard databases in this process")
    add_tablet_client_args(resolve)
    resolve.add_argument(
        "--grace",
        type=float,
        default=RESOLVE_GRACE_S,
        help="leave transactions younger than this many seconds to their gate "
        f"(default {RESOLVE_GRACE_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``sql``, ``schema`` or ``twopc``."""
    match args.command:
        case "sql":
            return asyncio.run(_sql(args))
        case "schema":
            return asyncio.run(_schema_apply(args))
    return asyncio.run(_twopc_resolve(args))


async def _sql(args: argparse.Namespace) -> int:
    if args.cluster or args.data_dir:
        from shardgate.auth.identity import TRUSTED

        gate = await local_gate(args)
        try:
            session = gate.session(args.keyspace, identity=TRUSTED)
            if args.explain:
                plan = await gate.explain_shards(args.sql, session.keyspace, identity=TRUSTED)
                print(json.dumps(plan, indent=2))
            else:
                print(format_result(await gate.execute(session, args.sql)))
        finally:
            await gate.close()
        return 0
    from shardgate.api.grpc.client import GateClient

    async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace,
                          security=client_security(args)) as client:
        if args.explain:
            print(json.dumps(await client.explain(args.sql), indent=2))
        else:
            print(format_result(await client.execute(args.sql)))
    return 0


async def _schema_apply(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            text = args.file.read_text()
        except OSError as exc:
            raise NotFound(f"cannot read {args.file}: {exc.strerror}") from exc
    else:
        text = args.sql
    statements = split_statements(text)
    if not statements:
        raise InvalidArgument("no SQL statements to apply")
    statements = [part for stmt in statements
                  for part in [stmt, *register_statements(stmt, args.vindex, args.register)]]
    if args.cluster or args.data_dir:
        from shardgate.auth.identity import TRUSTED

        gate = await local_gate(args)
        try:
            session = gate.session(args.keyspace, identity=TRUSTED)
            for stmt in statements:
                await gate.execute(session, stmt)
                print(f"OK  {_first_line(stmt)}")
        finally:
            await gate.close()
    else:
        from shardgate.api.grpc.client import GateClient

        async with GateClient(args.target or DEFAULT_TARGET, keyspace=args.keyspace,
                              security=client_security(args)) as client:
            for stmt in statements:
                await client.execute(stmt)
                print(f"OK  {_first_line(stmt)}")
    print(f"applied {len(statements)} statement(s) to keyspace {args.keyspace}")
    return 0


async def _twopc_resolve(args: argparse.Namespace) -> int:
    if args.topo:
        if args.cluster or args.data_dir:
            raise InvalidArgument("twopc resolve: give --topo URL or --cluster / --data-dir, "
                                  "not both")
        return await _twopc_resolve_remote(args)
    gate = await local_gate(args, default_data_dir=True)
    try:
        report = await gate.resolve_transactions(grace_s=args.grace)
    finally:
        await gate.close()
    print(report)
    return 1 if report.errors else 0


async def _twopc_resolve_remote(args: argparse.Namespace) -> int:
    """Resolve through the tablet processes of the topo store at ``--topo``: a gate of
    this process with no tablet of its own (each shard's lease holder answers)."""
    from shardgate.api.grpc.remote_gate import open_remote_gate
    from shardgate.topo.local import open_topo

    topo = await open_topo(url=args.topo)
    try:
        gate, fleet = await open_remote_gate(topo, owns_topo=False,
                                             tablet_security=tablet_credentials(args))
        try:
            report = await gate.resolve_transactions(grace_s=args.grace)
        finally:
            await gate.close()
            await fleet.close()
    finally:
        await topo.close()
    print(report)
    return 1 if report.errors else 0


def register_statements(stmt: str, vindexes: list[str], register: bool) -> list[str]:
    """The ``ALTER VSCHEMA`` statements adding the table ``stmt`` creates (if it is a
    ``CREATE TABLE``) to the VSchema: one ``ADD VINDEX`` per ``COLUMN:VINDEX[:TYPE]``,
    or ``ADD TABLE`` with ``register``; none otherwise."""
    if not vindexes and not register:
        return []
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    from shardgate.sql.parse import GATE_DIALECT

    try:
        tree = sqlglot.parse_one(stmt, read=GATE_DIALECT)
    except SqlglotError:
        return []
    if not isinstance(tree, exp.Create) or str(tree.args.get("kind", "")).upper() != "TABLE":
        return []
    table = tree.find(exp.Table)
    if table is None:
        return []
    name = f"{table.db}.{table.name}" if table.db else table.name
    if register:
        return [f"ALTER VSCHEMA ADD TABLE {name}"]
    out = []
    for spec in vindexes:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not all(parts):
            raise InvalidArgument(f"--vindex {spec!r}: give COLUMN:VINDEX or COLUMN:VINDEX:TYPE")
        column, vindex, vtype = parts[0], parts[1], parts[-1]
        out.append(f"ALTER VSCHEMA ON {name} ADD VINDEX {vindex}({column}) USING {vtype}")
    return out


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` split on ``;`` (not inside strings or comments).

    Each statement is the original text from its first to its last token.
    """
    import sqlglot
    from sqlglot import TokenType
    from sqlglot.errors import SqlglotError

    from shardgate.sql.parse import GATE_DIALECT

    try:
        tokens = sqlglot.Dialect.get_or_raise(GATE_DIALECT).tokenize(text)
    except SqlglotError as exc:
        raise InvalidArgument(f"cannot split the SQL into statements: {exc}") from exc
    statements: list[str] = []
    start: int | None = None
    end = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if start is not None:
                statements.append(text[start : end + 1])
            start = None
            continue
        if start is None:
            start = tok.start
        end = tok.end
    if start is not None:
        statements.append(text[start : end + 1])
    return statements


def _first_line(stmt: str) -> str:
    line = stmt.strip().splitlines()[0]
    return line if len(line) <= 80 else line[:77] + "..."
