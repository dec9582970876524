"""Hostile input gets coded errors, never raw exceptions (issue 13, item 13).

The gate runs over the embedded default (four SQLite shards plus the
unsharded lookup keyspace, files under ``tmp_path``). Named cases first, each
of which escaped as ``TypeError``, ``AttributeError``, ``RecursionError`` or
``UnicodeEncodeError``, or was silently matched against nothing, before the
fix; then a hypothesis battery of garbage SQL and bind values asserting that
only :class:`ShardgateError` escapes ``Gate.execute``, and never the INTERNAL
"shardgate bug" safety net. The batteries are derandomized (the same examples
on every run), so CI does not flake; a longer random run is a matter of
raising ``max_examples`` and dropping ``derandomize``.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardgate.api.grpc.client import GateClient
from shardgate.auth.identity import TRUSTED
from shardgate.client import dbapi
from shardgate.engine.route import Route
from shardgate.errors import Code, InvalidArgument, ShardgateError
from shardgate.evalengine.coerce import column_types_sql
from shardgate.gate import Gate, Session
from shardgate.gate import planning as planning_module
from shardgate.result import Result
from shardgate.topo import Topology
from shardgate.topo.embedded import (
    COMMERCE_DDL,
    LOOKUP_DDL,
    SEQUENCE_ROWS,
    embedded_topology,
)


class Harness:
    """A gate on its own event loop, driven synchronously (hypothesis calls us sync)."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.gate = Gate.open(embedded_topology(data_dir))
        self.session = self.gate.session(identity=TRUSTED)
        lookup = self.gate.session("lookup", identity=TRUSTED)
        for ddl in COMMERCE_DDL:
            self.run(ddl)
        for ddl in LOOKUP_DDL:
            self.run(ddl, session=lookup)
        for seq in SEQUENCE_ROWS:
            self.run(f"INSERT INTO {seq} (id, next_id, cache) VALUES (0, 1, 50)", session=lookup)
        self.run("INSERT INTO customer (customer_id, email, name) VALUES (1, 'a@x', 'a'), "
                 "(2, 'b@x', 'b'), (3, 'c@x', NULL)")

    def run(self, sql: Any, bind_vars: Any = None, session: Session | None = None) -> Result:
        return self.loop.run_until_complete(
            asyncio.wait_for(self.gate.execute(session or self.session, sql, bind_vars), 60)
        )

    def error(self, sql: Any, bind_vars: Any = None) -> ShardgateError:
        with pytest.raises(ShardgateError) as err:
            self.run(sql, bind_vars)
        return err.value

    def close(self) -> None:
        self.loop.run_until_complete(self.gate.close())
        self.loop.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


BY_ID = "SELECT customer_id FROM customer WHERE customer_id = :id"
BY_EMAIL = "SELECT customer_id FROM customer WHERE email = :e"  # a lookup vindex column
BY_NAME = "SELECT customer_id FROM customer WHERE name = :n"  # scatter


@pytest.mark.parametrize(("sql", "words"), [
    (b"SELECT 1", "must be a str, not bytes"),
    (None, "must be a str, not NoneType"),
    (5, "must be a str, not int"),
    (["SELECT 1"], "must be a str, not list"),
])
def test_sql_that_is_not_text_is_refused(h: Harness, sql: Any, words: str) -> None:
    err = h.error(sql)
    assert err.code is Code.INVALID_ARGUMENT and words in err.message


@pytest.mark.parametrize(("sql", "bind_vars", "words"), [
    (BY_ID, [1], "must be a mapping"),
    (BY_ID, {"id": {"a": 1}}, ":id has type dict"),
    (BY_ID, {"id": object()}, ":id has type object"),
    (BY_ID, {"id": {1, 2}}, ":id has type set"),
    (BY_EMAIL, {"e": {"x": 1}}, ":e has type dict"),
    ("SELECT customer_id FROM customer WHERE customer_id IN (:id)", {"id": [[1], 2]},
     "element of list bind variable :id has type list"),
    (BY_ID, {1: 2}, "names must be str"),
    # A list where one value is compared: it routed to no shard and matched nothing.
    (BY_ID, {"id": [1, 2]}, ":id is a list, but it is compared with '='"),
    (BY_NAME, {"n": ["a", "b"]}, ":n is a list, but it is not an IN list"),
])
def test_bind_values_of_the_wrong_shape_are_refused_by_name(
    h: Harness, sql: str, bind_vars: Any, words: str
) -> None:
    err = h.error(sql, bind_vars)
    assert err.code is Code.INVALID_ARGUMENT and words in err.message, err.message


def test_a_list_bind_still_works_as_an_in_list(h: Harness) -> None:
    sql = "SELECT customer_id FROM customer WHERE customer_id IN (:ids) ORDER BY customer_id"
    assert h.run(sql, {"ids": [1, 3, 99]}).rows == [(1,), (3,)]
    assert h.run(sql, {"ids": (2,)}).rows == [(2,)]


@pytest.mark.parametrize(("sql", "bind_vars", "words"), [
    (BY_EMAIL, {"e": "a\udc80b"}, "bind variable :e is not valid Unicode"),
    ("SELECT customer_id FROM customer WHERE email = 'a\udc80b'", None,
     "the SQL statement is not valid Unicode"),
    ("INSERT INTO customer (customer_id, email, name) VALUES (9, :e, 'x')", {"e": "\ud800"},
     "bind variable :e is not valid Unicode"),
    (BY_NAME, {"n": "\ud800"}, "bind variable :n is not valid Unicode"),
    ("SELECT customer_id FROM customer WHERE customer_id IN (:ids)", {"ids": [1, "\udfff"]},
     "list bind variable :ids is not valid Unicode"),
])
def test_lone_surrogates_are_refused(h: Harness, sql: str, bind_vars: Any, words: str) -> None:
    err = h.error(sql, bind_vars)
    assert err.code is Code.INVALID_ARGUMENT and words in err.message, err.message
    # Nothing was written, and the lookup vindex is intact.
    assert h.run("SELECT COUNT(*) FROM customer").rows == [(3,)]


def test_forty_nested_parentheses_work(h: Harness) -> None:
    assert h.run("SELECT " + "(" * 40 + "1" + ")" * 40).rows == [(1,)]
    sql = "SELECT name FROM customer WHERE " + "(" * 40 + "customer_id = 2" + ")" * 40
    assert h.run(sql).rows == [("b",)]


def test_a_thousand_or_terms_work(h: Harness) -> None:
    ors = " OR ".join(f"customer_id = {i}" for i in range(2, 1002))
    r = h.run(f"SELECT customer_id FROM customer WHERE {ors} ORDER BY customer_id")
    assert r.rows == [(2,), (3,)]
    ands = " AND ".join(f"customer_id <> {i}" for i in range(2, 500))
    assert h.run(f"SELECT customer_id FROM customer WHERE {ands}").rows == [(1,)]


def test_too_deep_nesting_is_refused_with_a_code(h: Harness) -> None:
    err = h.error("SELECT " + "(" * 3000 + "1" + ")" * 3000)
    assert err.code is Code.INVALID_ARGUMENT and "nested too deeply" in err.message


def test_a_thousand_or_terms_evaluated_at_the_gate_work(h: Harness) -> None:
    # HAVING runs at the gate after merging: compiled flat, in linear time.
    having = " OR ".join(f"COUNT(*) = {i}" for i in range(1000))
    assert h.run(f"SELECT COUNT(*) FROM customer HAVING {having}").rows == [(3,)]
    having = " OR ".join(f"COUNT(*) = {i}" for i in range(4, 1000))
    assert h.run(f"SELECT COUNT(*) FROM customer HAVING {having}").rows == []


def _drop_behind_the_vschema(h: Harness, table: str) -> None:
    """Drop ``table`` of keyspace lookup on its shard only (a shard-targeted session
    sends DDL as is), leaving the VSchema that uses it as it is."""
    s = h.gate.session("lookup", identity=TRUSTED)
    h.run("USE `lookup:0`", session=s)
    h.run(f"DROP TABLE {table}", session=s)


def test_a_plain_drop_of_a_lookup_table_needs_confirmation(h: Harness) -> None:
    err = h.error("DROP TABLE lookup.customer_email_idx")
    assert err.code is Code.FAILED_PRECONDITION
    assert "CONFIRM_DROP" in err.message


def test_errors_in_the_gates_own_lookup_query_say_so(h: Harness) -> None:
    _drop_behind_the_vschema(h, "customer_email_idx")
    err = h.error(BY_EMAIL, {"e": "a@x"})
    assert err.code is Code.NOT_FOUND
    assert err.message.startswith("internal query for shard lookup/0 failed (the lookup "
                                  "vindex query 'select"), err.message


def test_errors_in_sequence_allocation_say_so(h: Harness) -> None:
    _drop_behind_the_vschema(h, "customer_seq")
    err = h.error("INSERT INTO customer (email, name) VALUES ('n@x', 'n')")
    assert err.message.startswith("internal query for shard lookup/0 failed (allocating "
                                  "values of sequence lookup.customer_seq)"), err.message


def test_dbapi_refuses_bad_sql_and_binds_as_programming_errors(h: Harness) -> None:
    class Runner:  # runs the driver's coroutines on the harness loop
        def run(self, coro: Any) -> Any:
            return h.loop.run_until_complete(coro)

    session = dbapi._LocalSession(h.gate, None, TRUSTED)
    conn = dbapi.Connection(session, Runner(), autocommit=True)  # type: ignore[arg-type]
    cur = conn.cursor()
    for sql, params in ((b"SELECT 1", None), (None, None), (BY_ID, {"id": {"a": 1}}),
                        (BY_EMAIL, {"e": "\ud800"})):
        with pytest.raises(dbapi.ProgrammingError) as err:
            cur.execute(sql, params)  # type: ignore[arg-type]
        assert err.value.code is Code.INVALID_ARGUMENT
    assert cur.execute(BY_ID, {"id": 1}).fetchall() == [(1,)]


# -- the battery ----------------------------------------------------------------------------

_WORDS = [
    "SELECT", "INSERT", "UPDATE", "DELETE", "FROM", "WHERE", "INTO", "VALUES", "SET", "AND",
    "OR", "NOT", "IN", "IS", "NULL", "LIKE", "BETWEEN", "GROUP BY", "ORDER BY", "HAVING",
    "LIMIT", "OFFSET", "DISTINCT", "JOIN", "ON", "UNION", "AS", "COUNT(*)", "SUM", "MAX",
    "customer", "corder", "lookup.customer_email_idx", "customer_id", "email", "name",
    "order_id", "price", "sku", "*", ",", "(", ")", "=", "<>", "<", "+", "-", "/", ";",
    ":a", ":b", ":__sg_vals", "?", "1", "-1", "0.5", "1e308", "9223372036854775808", "'x'",
    "'a@x'", "''", "x'00'", "TRUE", "`select`", "\"q\"", "@v", "BEGIN", "COMMIT", "ROLLBACK",
    "USE", "SAVEPOINT s", "keyrange('-80')", "CASE WHEN", "THEN", "END", "EXISTS",
]
_TEMPLATES = [
    "SELECT {e} FROM customer WHERE {c} {op} {v}",
    "SELECT {e}, COUNT(*) FROM customer GROUP BY {e} ORDER BY {e} LIMIT {v}",
    "SELECT c.{c} FROM customer c JOIN corder o ON c.customer_id = o.customer_id WHERE o.{c} "
    "{op} {v}",
    "SELECT {e} FROM customer WHERE {c} IN ({v}, {v}) OR {c} IN (SELECT {c} FROM corder "
    "WHERE {c} {op} {v})",
    "UPDATE customer SET name = {v} WHERE {c} {op} {v}",
    "DELETE FROM corder WHERE {c} {op} {v}",
    "INSERT INTO corder (order_id, customer_id, price) VALUES ({v}, {v}, {v})",
    "INSERT INTO customer (customer_id, email, name) VALUES ({v}, {v}, {v})",
]
_VALUES = ["1", "NULL", "'a@x'", ":a", ":b", "-5", "1.5", "'\\''", "(1)", "x'ff'", "TRUE",
           "9999999999999999999999", ":a + 1", "customer_id", "(SELECT 1)"]
_COLS = ["customer_id", "email", "name", "price", "order_id", "nope"]
_OPS = ["=", "<>", "<", ">=", "IS", "LIKE", "IN", "<=>"]

_sql = st.one_of(
    st.text(max_size=60),
    st.lists(st.sampled_from(_WORDS), max_size=14).map(" ".join),
    st.builds(
        lambda t, e, c, op, vs: t.format(e=e, c=c, op=op, v=vs),
        st.sampled_from(_TEMPLATES), st.sampled_from(["*", *_COLS, "COUNT(*)", "1"]),
        st.sampled_from(_COLS), st.sampled_from(_OPS), st.sampled_from(_VALUES),
    ),
)
_text = st.one_of(
    st.text(alphabet=st.characters(codec=None, categories=("L", "N", "P", "Zs", "Cs")),
            max_size=8),
    st.builds(lambda a, n: a + chr(n), st.text(max_size=3),
              st.integers(min_value=0xD800, max_value=0xDFFF)),  # a lone surrogate
)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), _text, st.binary(max_size=8),
    st.decimals(allow_nan=False, places=3, min_value=-1000, max_value=1000),
    st.dates(), st.uuids(),
)
_value = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=4), st.tuples(_scalar, _scalar),
    st.dictionaries(st.text(max_size=3), _scalar, max_size=2),
    st.sets(st.integers(), max_size=2), st.builds(object),
    st.lists(st.lists(st.integers(), max_size=2), min_size=1, max_size=2),
)
_binds = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["a", "b", "__sg_vals", "id"]), _value, max_size=3),
    st.lists(st.integers(), max_size=2),
)


def _is_bug(exc: ShardgateError) -> bool:
    return exc.code is Code.INTERNAL and "shardgate bug" in exc.message


def test_only_coded_errors_escape_for_garbage(h: Harness) -> None:
    seen = {"ok": 0, "refused": 0}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(sql=_sql, bind_vars=_binds)
    def one(sql: str, bind_vars: Any) -> None:
        try:
            h.run(sql, bind_vars)
            seen["ok"] += 1
        except ShardgateError as exc:
            assert not _is_bug(exc), f"{sql!r} {bind_vars!r}: {exc}"
            seen["refused"] += 1
        finally:
            if h.session.in_transaction:
                h.loop.run_until_complete(h.gate.rollback(h.session))

    one()
    assert seen["ok"] and seen["refused"]  # the battery reaches both outcomes


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(value=_value)
def test_only_coded_errors_escape_for_any_bind_value_on_a_lookup_column(
    tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    # (one gate per module run: see the cached harness below)
    h = _shared(tmp_path_factory)
    for sql in (BY_EMAIL, BY_ID, BY_NAME,
                "SELECT customer_id FROM customer WHERE email IN (:e)",
                "UPDATE customer SET name = :n WHERE customer_id = :id"):
        try:
            h.run(sql, {"e": value, "id": value, "n": value})
        except ShardgateError as exc:
            assert not _is_bug(exc), f"{sql!r} {value!r}: {exc}"
        else:
            # Never matched against nothing: such values must be refused.
            assert _acceptable(value), f"{sql!r} accepted {value!r}"


def _acceptable(value: Any) -> bool:
    """A value the docs allow (a list only of scalars), as text that is valid UTF-8."""
    scalars = (type(None), bool, int, float, str, bytes, bytearray, decimal.Decimal,
               datetime.date, datetime.time, datetime.timedelta, uuid.UUID)
    items = value if isinstance(value, list | tuple) else [value]
    for v in items:
        if not isinstance(v, scalars):
            return False
        if isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            return False
    return True


_HARNESS: list[Harness] = []


def _shared(factory: pytest.TempPathFactory) -> Harness:
    if not _HARNESS:
        _HARNESS.append(Harness(factory.mktemp("hostile")))
    return _HARNESS[0]


@pytest.fixture(scope="module", autouse=True)
def _close_shared() -> Iterator[None]:
    yield
    while _HARNESS:
        _HARNESS.pop().close()


def test_accepted_scalar_types_pass_the_check(h: Harness) -> None:
    for value in (None, True, 7, 1.5, "t", b"b", bytearray(b"b"), decimal.Decimal("1.5"),
                  datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4),
                  uuid.UUID(int=5)):
        try:
            h.run(BY_NAME, {"n": value})
        except ShardgateError as exc:  # the shard's own refusal is fine, never the gate's
            assert "bind variable :n has type" not in exc.message


async def test_grpc_client_refuses_bad_sql_and_binds_before_sending() -> None:
    # Nothing listens on the port: a refusal must come from the checks, not the network.
    client = GateClient("grpc://127.0.0.1:9", timeout=5)
    try:
        for sql, bind_vars in ((b"SELECT 1", None), (None, None), (7, None),
                               ("SELECT '\ud800'", None), ("SELECT :a", {"a": "\udc00"}),
                               ("SELECT :a", {"a": {"k": 1}}), ("SELECT :a", [1])):
            with pytest.raises(ShardgateError) as err:
                await client.execute(sql, bind_vars)  # type: ignore[arg-type]
            assert err.value.code is Code.INVALID_ARGUMENT, err.value
        with pytest.raises(ShardgateError) as err:
            await client.execute_batch([(b"SELECT 1", None)])  # type: ignore[list-item]
        assert err.value.code is Code.INVALID_ARGUMENT
    finally:
        await client.close()


class _NoSavepoints:
    """A fake shard whose database refuses SAVEPOINT (as a broken or foreign backend would)."""

    dialect, placeholder, keyspace, shard = "postgres", "%s", "bench", "-"

    async def execute(self, sql: str, args: Any, tid: int | None = None,
                      options: Any = None, target: Any = None) -> Result:
        if sql.startswith("SAVEPOINT"):
            raise InvalidArgument("bad statement for shard database fake: syntax error")
        if sql == column_types_sql(self.dialect, self.placeholder):
            return Result(["column_name", "data_type"], [])  # a schema the gate learns nothing from
        return Result(["id"], [(1,)])

    async def begin(self, caller: str | None = None) -> int:
        return 1

    async def rollback(self, tid: int) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_errors_in_the_gates_own_savepoints_say_so() -> None:
    topo = Topology.from_dict({"keyspaces": {"bench": {
        "shards": {"-": "postgresql://nobody@127.0.0.1/none"},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"t": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }}})
    gate = Gate(topo, {("bench", "-"): _NoSavepoints()})  # type: ignore[dict-item]
    s = gate.session("bench", identity=TRUSTED)
    await gate.execute(s, "BEGIN")
    await gate.execute(s, "SELECT id FROM t WHERE id = 1")  # the shard joins the transaction
    with pytest.raises(ShardgateError) as err:
        await gate.execute(s, "UPDATE t SET v = 2 WHERE id = 1")
    assert err.value.code is Code.INVALID_ARGUMENT
    assert err.value.message.startswith(
        "internal query for shard bench/- failed (SAVEPOINT sg_stmt)"), err.value.message


def test_stream_execute_lets_only_coded_errors_escape(h: Harness) -> None:
    # A blob beside text in one column: the gate's merge sort once raised TypeError here
    # (item 10 fixes the sort; whatever the answer, it is rows or a coded error).
    h.run("INSERT INTO customer (customer_id, email, name) VALUES (10, 'z@x', x'ff')")

    async def stream() -> list[Any]:
        return [c async for c in h.gate.stream_execute(
            h.session, "SELECT name FROM customer ORDER BY name")]

    try:
        chunks = h.loop.run_until_complete(stream())
    except ShardgateError:
        return
    assert sum(len(c.rows) for c in chunks) == 4


def test_a_bug_in_planning_or_execution_is_still_a_coded_error(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_plan(*args: Any) -> Any:
        raise AttributeError("'NoneType' object has no attribute 'name'")

    monkeypatch.setattr(planning_module, "build_plan", broken_plan)
    err = h.error("SELECT name FROM customer WHERE customer_id = 99")
    assert err.code is Code.INTERNAL
    assert err.message.startswith("planning failed with AttributeError"), err.message
    monkeypatch.undo()

    async def broken_execute(self: Any, vc: Any, bind_vars: Any) -> Result:
        raise TypeError("'<' not supported")

    monkeypatch.setattr(Route, "execute", broken_execute)
    monkeypatch.setattr(Route, "point_shard", broken_execute)  # the gate's point path
    err = h.error("SELECT name FROM customer WHERE customer_id = 98")
    assert err.code is Code.INTERNAL and "running the statement failed with TypeError" in \
        err.message
    # Inside a transaction: the same coded error, and the transaction handling goes on.
    h.run("BEGIN")
    with pytest.raises(ShardgateError):
        h.run("UPDATE customer SET name = 'zz' WHERE customer_id = 1")
    monkeypatch.undo()
    h.run("COMMIT")
    assert h.run("SELECT name FROM customer WHERE customer_id = 1").rows == [("a",)]
