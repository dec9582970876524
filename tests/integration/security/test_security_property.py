"""Property: a reader never receives a row of a table denied to it (issue 30).

Hypothesis generates statements with nested CTEs (named like the denied and
the allowed table, shadowing at several depths, RECURSIVE or not),
subqueries (in FROM, WHERE, the select list, EXISTS and IN), joins, UNIONs and
function calls over allowed tables (``pub``, ``x``, ``y``) and a denied one
(``priv``, holding marker values no other table holds; all four ``(k, v)``,
so generated queries compose), and runs each
through the real gate as the reader ``bob`` (an :class:`Identity` under a
table ACL), in a plain session and in a shard-targeted one (``USE
`commerce:-80```), where the shard runs whatever the gate lets through.
Refused statements and errors are fine; a marker in any result is a leak.

On the embedded SQLite cluster the run is long; on MariaDB and PostgreSQL
shards (whose CTE scoping differs: MariaDB 10.11 resolves a name in a nested
WITH's CTE body to the table) it is shorter. A fixed sample of generated
statements also runs over gRPC and the MySQL listener (``test_sample_...``).
Runs are derandomized (the same statements every run).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED, Identity
from shardgate.gate import Gate

from ..conftest import open_cluster
from ..sql.module_databases import KINDS, kind_param, module_databases
from .test_security_rules import TARGET, Doors, Refused, served_doors

NAMES = ["priv", "priv", "pub", "x", "y"]  # CTE names: mostly the denied table's
#: what only the denied table holds (its v values; its k values are above SECRET_K)
SECRET = "zz-secret"
SECRET_K = 900_000_000
EXAMPLES = {"sqlite": 500, "postgres": 250, "mysql": 250}
DEPTH = 3
ACL_P = {"table_groups": [
    {"name": "private", "table_names_or_prefixes": ["priv"], "admins": ["dba"]},
    {"name": "the rest", "table_names_or_prefixes": ["%"], "readers": ["bob"],
     "admins": ["dba"]},
]}


def _statements() -> st.SearchStrategy[str]:
    """Queries of two columns ``k`` (a number) and ``v`` (text), composable everywhere."""
    name = st.sampled_from(NAMES)  # a CTE's name
    # a table reference: mostly the allowed table, the denied one and CTE names too
    ref = st.sampled_from(["pub", "pub", "pub", "pub", "x", "y", "priv"])
    col = st.sampled_from(["s.k", "s.v"])

    def pair(joined: bool, query: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        v = st.sampled_from(["s.v", "upper(s.v)", "coalesce(s.v, 'a')", "concat(s.v, 'x')",
                             "lower(s.v)"] + (["s2.v", "upper(s2.v)"] if joined else []))
        k = st.sampled_from(["s.k", "s.k + 1", "abs(s.k)"] + (["s2.k"] if joined else []))
        return st.one_of(
            st.tuples(k, v).map(lambda kv: f"{kv[0]} AS k, {kv[1]} AS v"),
            st.just("*") if not joined else st.just("s.*"),
            st.sampled_from(["count(*) AS k, max(s.v) AS v", "max(s.k) AS k, min(s.v) AS v",
                             "sum(s.k) AS k, group_concat(s.v) AS v"]),
            st.tuples(k, query).map(
                lambda kq: f"{kq[0]} AS k, (SELECT max(q.v) FROM ({kq[1]}) AS q) AS v"),
        )

    def cond(query: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.just("s.k > 0"),
            st.tuples(col, query).map(
                lambda cq: f"{cq[0]} IN (SELECT q.{cq[0][2:]} FROM ({cq[1]}) AS q)"),
            query.map(lambda q: f"EXISTS ({q})"), query.map(lambda q: f"NOT EXISTS ({q})"),
            st.tuples(col, query).map(
                lambda cq: f"{cq[0]} = (SELECT max(q.{cq[0][2:]}) FROM ({cq[1]}) AS q)"),
        )

    def extend(query: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        plain = st.tuples(ref | query.map(lambda q: f"({q})"), st.booleans()).flatmap(
            lambda src: st.tuples(pair(False, query), st.none() | cond(query)).map(
                lambda pc: f"SELECT {pc[0]} FROM {src[0]} AS s"
                           + (f" WHERE {pc[1]}" if pc[1] else "")))
        joined = st.tuples(ref, ref | query.map(lambda q: f"({q})"), pair(True, query)).map(
            lambda t: f"SELECT {t[2]} FROM {t[0]} AS s JOIN {t[1]} AS s2 ON s.k = s2.k")
        union = st.tuples(query, st.sampled_from(["UNION", "UNION ALL"]), query).map(
            lambda t: f"SELECT * FROM ({t[0]}) AS u1 {t[1]} SELECT * FROM ({t[2]}) AS u2")
        cte = st.tuples(name, query).map(lambda nq: f"{nq[0]} AS ({nq[1]})")
        ctes = st.lists(cte, min_size=1, max_size=3, unique_by=lambda c: c.split(" ", 1)[0])
        with_ = st.tuples(st.booleans(), ctes, query).map(
            lambda t: ("WITH RECURSIVE " if t[0] else "WITH ") + ", ".join(t[1]) + " " + t[2])
        return st.one_of(plain, joined, union, with_)

    leaf = ref.map(lambda n: f"SELECT k, v FROM {n}")
    query: st.SearchStrategy[str] = leaf
    for _ in range(DEPTH):  # bounded nesting: each level wraps the one below
        query = st.one_of(query, extend(query))
    return query


STATEMENTS = _statements()


def _leaks(rows: list[tuple[Any, ...]]) -> bool:
    for row in rows:
        for value in row:
            if SECRET in str(value) or (isinstance(value, int) and value >= SECRET_K):
                return True
    return False


async def _cluster(kind: str, make_database: Callable[..., str]) -> Gate:
    """Two shards; tables ``pub``, ``x``, ``y`` (allowed) and ``priv`` (denied), all
    ``(k, v)``, on each, their rows on the targeted one."""
    c = await open_cluster(kind, lambda k, hint="": make_database(k, "p" + hint), shards=2)
    gate = c.gate
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, f"USE `{TARGET}`")
    for table in ("pub", "priv", "x", "y"):
        await gate.execute(s, f"CREATE TABLE {table} (k BIGINT PRIMARY KEY, v VARCHAR(64))")
    for i in range(1, 7):
        for n, table in enumerate(("pub", "x", "y")):
            await gate.execute(s, f"INSERT INTO {table} (k, v) VALUES ({i + 10 * n}, "
                                  f"'{table}-{i}')")
        await gate.execute(s, f"INSERT INTO priv (k, v) VALUES ({SECRET_K + i}, '{SECRET}-{i}')")
    gate.guard = Guard(TableACL.from_mapping(ACL_P))
    return gate


async def _run_as_bob(gate: Gate, sql: str) -> list[list[Any]]:
    """Each session's rows (an empty list when refused or failed)."""
    out = []
    plain = gate.session("commerce", identity=Identity("bob"))
    targeted = gate.session("commerce", identity=Identity("bob"))
    await gate.execute(targeted, f"USE `{TARGET}`")
    for session in (plain, targeted):
        try:
            out.append([tuple(r) for r in (await gate.execute(session, sql)).rows])
        except Exception:
            out.append([])
    return out


@pytest.mark.asyncio(loop_scope="module")
async def test_no_generated_statement_returns_a_denied_row(doors: Doors) -> None:
    """Hypothesis draws in a thread of its own; each statement runs on the module's
    gate in the module's event loop (the gate behind the doors, the same cluster)."""
    loop = asyncio.get_running_loop()
    answered = [0]

    @settings(max_examples=EXAMPLES[doors.kind], deadline=None, derandomize=True,
              database=None, suppress_health_check=list(HealthCheck))
    @given(STATEMENTS)
    def check(sql: str) -> None:
        results = asyncio.run_coroutine_threadsafe(_run_as_bob(doors.gate, sql), loop).result()
        for rows in results:
            assert not _leaks(rows), (sql, rows[:3])
        answered[0] += sum(1 for rows in results if rows)

    await loop.run_in_executor(None, check)
    assert answered[0] > 0  # the statements are not all refused: the check is live


#: statements drawn once from the strategy (derandomized), for the doors
def _sample(n: int) -> list[str]:
    found: list[str] = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(STATEMENTS)
    def draw(sql: str) -> None:
        found.append(sql)

    draw()
    return found


@pytest.fixture(scope="module", params=KINDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Each database kind in turn, for the whole module (the doors' cluster is shared)."""
    return kind_param(request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def doors(
    backend_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Doors]:
    """One cluster behind both doors per backend kind (the sample only reads, as bob)."""
    with module_databases(tmp_path_factory.mktemp("doors"), __name__) as make:
        gate = await _cluster(backend_kind, make)
        try:
            async with served_doors(gate, backend_kind) as doors_:
                yield doors_
        finally:
            await gate.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("door", ["grpc", "mysql"])
async def test_sample_over_grpc_and_the_mysql_listener(doors: Doors, door: str) -> None:
    answered = 0
    for sql in _sample(40):
        for targeted in (True, False):
            try:
                rows = await doors.run(door, "bob", sql, targeted=targeted)
            except Refused:
                continue
            assert not _leaks(rows), (door, targeted, sql, rows[:3])
            answered += bool(rows)
    assert answered > 0
