"""One MySQL connection as one gate session.

:class:`GateSession` is mysql-mimic's ``Session`` over a
:class:`~shardgate.gate.Session`. What a statement does:

* **The gate's own statements** (``BEGIN``/``START TRANSACTION``, ``COMMIT``,
  ``ROLLBACK``, savepoints, ``USE ks`` / ``USE `ks:-80``` / ``USE `ks[ksid]```,
  ``SET transaction_mode``, ``SHOW VITESS_*``) go to the gate, which answers them.
* **Plain DML and queries** (``SELECT ... FROM``, ``INSERT``, ``UPDATE``,
  ``DELETE``, ``REPLACE``) that name no system variable, information function
  or system schema go, their comparison literals made bind variables
  (:mod:`shardgate.sql.literals`), straight to :meth:`Gate.execute` (writes) or
  :meth:`Gate.stream_execute` (reads: scatter results stream shard by shard,
  the rows written to the socket as they come, bounded memory).
* **DDL** (``CREATE``, ``ALTER``, ``DROP``, ``TRUNCATE``, ``RENAME``) goes to the
  gate as written, after committing an open transaction (MySQL's implicit
  commit; MariaDB/MySQL shards would commit it anyway).
* **Constant selects** (no FROM) go to the gate too, which runs them on a shard
  (exact MySQL functions and types), except ``SELECT <digits>`` pings and those
  naming variables or information functions.
* ``INSERT/UPDATE/DELETE ... RETURNING`` is refused with 1064, as MySQL 8 (the
  version reported) does.
* **The rest** is parsed by mysql-mimic (sqlglot, MySQL dialect): ``SET`` of
  session variables, ``SELECT @@version``, ``SELECT DATABASE()``, constant
  selects, ``SHOW VARIABLES``; ``SHOW DATABASES/TABLES/COLUMNS/INDEX/CREATE
  TABLE``, ``DESCRIBE`` and ``information_schema`` queries are answered from
  the gate's catalog (:mod:`shardgate.api.mysql.catalog`; ``SHOW CREATE TABLE``
  and ``DESCRIBE`` from a MariaDB/MySQL shard's own answer); anything else is
  re-rendered (information functions replaced by their values) and sent to
  the gate.

Autocommit: on by default, as MySQL. ``SET autocommit = 0`` makes every
statement open a transaction if none is open (closed by ``COMMIT`` or
``ROLLBACK``); ``SET autocommit = 1`` commits an open transaction, as MySQL does.

Invariants: statements of one connection run one at a time (the protocol is
request/response); ``last`` is the result of the last statement that ran
(``affected_rows`` and ``insert_id`` of the OK packet); on close an open
transaction is rolled back.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from mysql_mimic import Session
from mysql_mimic.errors import MysqlError
from mysql_mimic.functions import Functions
from mysql_mimic.results import AllowedResult, ResultColumn, ResultSet
from mysql_mimic.schema import BaseInfoSchema
from mysql_mimic.session import Query, mysql_function_mapping
from mysql_mimic.types import ColumnType
from mysql_mimic.variable_processor import VariableProcessor
from mysql_mimic.variables import SYSTEM_VARIABLES, GlobalVariables, SessionVariables
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.executor import execute

from shardgate.api.mysql import catalog, errors
from shardgate.api.mysql.errors import BAD_DB, NO_SUCH_TABLE, PARSE, mysql_code, mysql_message
from shardgate.api.mysql.shapes import SHAPES
from shardgate.auth.acl import Role
from shardgate.auth.identity import Identity
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.gate import Session as GateSessionState
from shardgate.gate.catalog import TableInfo, vschema_tables, vschema_vindexes
from shardgate.gate.planning import point_read
from shardgate.result import Result, WireResult
from shardgate.sql.parse import syntax_error
from shardgate.sql.statements import like_match

#: What the listener reports as the server version (clients read "8.0" features from it).
SERVER_VERSION = "8.0.31-shardgate"

#: System variables: mysql-mimic's, with the values a MySQL 8 server would give
#: where clients act on them, and shardgate's ``transaction_mode``.
VARIABLES: dict[str, Any] = {
    **SYSTEM_VARIABLES,
    "version": (str, SERVER_VERSION, False),
    "version_comment": (str, "shardgate", False),
    "sql_mode": (str, "STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION", True),
    "transaction_isolation": (str, "READ-COMMITTED", True),
    "tx_isolation": (str, "READ-COMMITTED", True),
    "tx_read_only": (bool, False, True),
    "default_storage_engine": (str, "InnoDB", True),
    "default_tmp_storage_engine": (str, "InnoDB", True),
    "transaction_mode": (str, "best_effort", True),
    "sql_quote_show_create": (bool, True, True),
    "character_set_filesystem": (str, "binary", True),
    "max_connections": (int, 10000, False),
    "have_ssl": (str, "DISABLED", False),
    "sql_safe_updates": (bool, False, True),
    "foreign_key_checks": (bool, True, True),
    "unique_checks": (bool, True, True),
    "names": (str, "utf8mb4", True),
    "query_cache_size": (int, 0, True),
    "query_cache_type": (str, "OFF", True),
    "innodb_lock_wait_timeout": (int, 50, True),
    "lock_wait_timeout": (int, 31536000, True),
    "group_concat_max_len": (int, 1024, True),
    "div_precision_increment": (int, 4, True),
    "default_week_format": (int, 0, True),
    "session_track_schema": (bool, True, True),
    "session_track_system_variables": (str, "", True),
    "session_track_state_change": (bool, False, True),
    "session_track_transaction_info": (str, "OFF", True),
    "explicit_defaults_for_timestamp": (bool, True, True),
}

_COMMENTS = re.compile(r"^\s*(?:(?:/\*(?!!).*?\*/|--[^\n]*\n|#[^\n]*\n)\s*)*", re.S)
_FIRST_WORD = re.compile(r"[A-Za-z_]+")
#: Text that sends a statement through mysql-mimic's parse (needs an answer of its own).
_NOT_DIRECT = re.compile(
    r"@@|information_schema|performance_schema|\bmysql\s*\.|\bsys\s*\.|"
    r"\b(?:database|schema|version|user|current_user|session_user|system_user|"
    r"connection_id|last_insert_id|found_rows|row_count)\s*\(",
    re.I,
)
_RETURNING = re.compile(r"\breturning\b", re.I)
#: String literals and quoted names (left out when looking for a keyword).
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`", re.S)
#: Constant selects mysql-mimic answers itself (connection checks): the rest run on a shard,
#: which evaluates every MySQL function and type exactly (as Vitess routes them).
_OWN_CONSTANT = re.compile(r"^select\s+\d+\s*;?\s*$", re.I)
#: A select from one table (``FROM t`` / ``FROM ks.t``, no join), for a schema probe's types.
_ONE_TABLE = re.compile(
    r"^\s*select\b(?:(?!\bfrom\b).)*\bfrom\s+`?(\w+)`?(?:\s*\.\s*`?(\w+)`?)?"
    r"(?:\s+(?:as\s+)?\w+)?\s*(?:$|where\b|limit\b|order\b|;)", re.I | re.S)
_DDL = frozenset({"create", "alter", "drop", "truncate", "rename"})
_GATE_CONTROL = frozenset({"begin", "commit", "rollback", "savepoint", "release", "start"})
_SHOW_VSCHEMA = re.compile(
    r"^show\s+vschema\s+(tables|vindexes)(?:\s+(?:on|from)\s+`?([\w.]+)`?)?\s*;?\s*$", re.I)
_SHOW_GATE = re.compile(r"^show\s+(?:vitess_\w+|keyspaces|shardgate_worker)\b", re.I)
_SET_TX_MODE = re.compile(
    r"^set\s+(?:(?:session|local)\s+|@@(?:session\.|local\.)?)?transaction_mode\s*(?:=|:=)",
    re.I)
_SHOW_KEYS = re.compile(
    r"^show\s+(?:index|indexes|keys)\s+(?:from|in)\s+((?:`(?:[^`]|``)+`|[\w$]+))"
    r"(?:\s+(?:from|in)\s+((?:`(?:[^`]|``)+`|[\w$]+)))?\s*;?\s*$", re.I)
_TRUE = frozenset({"1", "on", "true", "'on'", "'1'", "'true'"})
_FALSE = frozenset({"0", "off", "false", "'off'", "'0'", "'false'"})


class GateSession(Session):
    """A MySQL connection's session: a gate session plus MySQL's session variables."""

    #: the current database as the client sees it (a keyspace, or ``ks:shard``)
    database: str | None
    #: the authenticated user name (None until the handshake succeeded)
    username: str | None

    #: the statement came as COM_QUERY, whose rows are text (a MariaDB shard's own
    #: packets may answer it: :class:`WireRows`); COM_STMT_EXECUTE's rows are binary
    text_protocol = False

    def __init__(self, gate: Gate, identity: Callable[[str], Identity | None]) -> None:
        super().__init__(SessionVariables(GlobalVariables(VARIABLES)))
        self.gate = gate
        self._identity = identity
        #: the gate session, opened once the handshake named the caller (:meth:`init`)
        self._state: GateSessionState | None = None
        self.autocommit = True
        #: the last statement's result (its counts go in the OK packet)
        self.last = Result()
        #: the authenticated caller, set once the handshake is done
        self.identity: Identity | None = None

    @property
    def state(self) -> GateSessionState:
        """The gate session of the authenticated caller (none before the handshake)."""
        if self._state is None:
            raise MysqlError("not authenticated", code=errors.ACCESS_DENIED.errno)
        return self._state

    # -- connection life ---------------------------------------------------------

    def _open(self) -> GateSessionState:
        """A gate session for the authenticated user: every statement of this connection
        is authorized for that user (ANONYMOUS without a users file, as on gRPC)."""
        identity = self._identity(self.username or "")
        if identity is None:
            raise MysqlError(f"Access denied for user '{self.username}'",
                             code=errors.ACCESS_DENIED.errno)
        self.identity = identity
        keyspace = self._state.keyspace if self._state is not None else None
        return self.gate.session(keyspace, identity=identity)

    async def init(self, connection: Any) -> None:
        await super().init(connection)
        self._state = self._open()
        database: str | None = self.database
        if database:
            await self.use(database)
        else:
            self.database = self.state.keyspace

    async def close(self) -> None:
        if self._state is not None and self._state.in_transaction:
            await self.gate.rollback(self._state)
        await super().close()

    async def reset(self) -> None:
        """COM_RESET_CONNECTION / COM_CHANGE_USER: a fresh session, its transaction rolled
        back, for the user now authenticated (COM_CHANGE_USER's new user), in the
        connection's database (COM_CHANGE_USER's, if it named one)."""
        if self._state is not None and self._state.in_transaction:
            await self.gate.rollback(self._state)
        self._state = self._open()
        self.autocommit = True
        self.variables.set("autocommit", True)
        database: str | None = self.database
        if database:
            await self.use(database)
        else:
            self.database = self.state.keyspace

    async def use(self, database: str) -> None:
        """``USE ks`` / COM_INIT_DB, including Vitess's ``ks:-80`` and ``ks[ksid]`` targets.

        COM_INIT_DB (the ``mariadb`` client's own ``USE``) does not pass through
        :meth:`handle_query`: its errors are answered in MySQL's terms here (1049 for
        an unknown keyspace), not as an unexpected exception (1105 and a traceback)."""
        try:
            await self._gate(f"USE `{database.replace('`', '``')}`")
        except ShardgateError as exc:
            raise MysqlError(mysql_message(exc), code=mysql_code(exc).errno) from exc

    @property
    def in_transaction(self) -> bool:
        return self._state is not None and self._state.in_transaction

    # -- statements --------------------------------------------------------------

    async def handle_query(self, sql: str, attrs: dict[str, str]) -> AllowedResult:
        """Run one statement (see the module docstring for the paths)."""
        self.last = Result()
        try:
            return await self._dispatch(sql, attrs)
        except ShardgateError as exc:
            raise MysqlError(mysql_message(exc), code=mysql_code(exc).errno) from exc
        except SqlglotError as exc:  # mysql-mimic parsed it (a statement the gate passes on)
            error = syntax_error(sql, exc)
            raise MysqlError(mysql_message(error), code=PARSE.errno) from None

    async def _dispatch(self, sql: str, attrs: dict[str, str]) -> AllowedResult:
        body = sql[_COMMENTS.match(sql).end():]  # type: ignore[union-attr]
        m = _FIRST_WORD.match(body)
        word = m.group(0).lower() if m else ""
        if word in _GATE_CONTROL:
            if word == "savepoint" and not self.autocommit and not self.state.in_transaction:
                await self.gate.begin(self.state)  # as MySQL: it opens the transaction
            return await self._gate(sql)
        if word == "use":
            await self._gate(sql)
            return None
        if word in _DDL:
            # as MySQL: DDL commits the open transaction first and is never part of one
            # (MariaDB/MySQL shards would commit it behind the gate's back)
            if self.state.in_transaction:
                await self.gate.commit(self.state)
            self.last = await self.gate.execute(self.state, sql)
            return None
        if word in ("insert", "update", "delete", "replace") and \
                _RETURNING.search(_QUOTED.sub("", body)):
            # the listener is a MySQL 8 server to its clients (SERVER_VERSION), and MySQL 8
            # has no RETURNING: clients (SQLAlchemy's dialect) rely on it failing
            raise MysqlError("You have an error in your SQL syntax: RETURNING is not MySQL 8 "
                             "syntax", code=PARSE.errno)
        if word in ("select", "insert", "update", "delete", "replace", "with") \
                and not _not_direct(body) and not _OWN_CONSTANT.match(body):
            return await self._run(sql, word in ("select", "with"))
        if word == "set":
            return await self._set(sql, body, attrs)
        if word == "show":
            found = await self._show_gate(body)
            if found is not None:
                return found
        if word in ("describe", "desc", "explain") and not re.match(
                r"^\w+\s+(select|with|insert|update|delete|format|\()", body, re.I):
            return await self._describe(body)
        return await super().handle_query(sql, attrs)

    async def _gate(self, sql: str) -> AllowedResult:
        """A statement the gate answers (session control, SHOW VITESS_*)."""
        result = await self.gate.execute(self.state, sql)
        self.database = self.state.keyspace if self.state.target is None else \
            f"{self.state.keyspace}:{self.state.target}"
        self.variables.set("transaction_mode", self.state.transaction_mode)
        if result.fields:
            return result.rows, result.fields
        return None

    async def _run(self, sql: str, read: bool) -> AllowedResult:
        """A routed statement: streamed when it reads, counted when it writes.

        Comparison literals become bind variables first
        (:func:`~shardgate.sql.literals.bind_literals`, learned per statement shape:
        :mod:`shardgate.api.mysql.shapes`), so statements that differ only in their
        values share one cached plan.
        """
        bound = SHAPES.bind(sql)
        binds: dict[str, Any] | None = None
        if bound is not None:
            sql, binds = bound
        # the caller's rights first: a refused statement is PERMISSION_DENIED, never a
        # planner's error about a table it may not know of (cached per text, as execute's)
        self.gate.authorize(self.state, sql)
        if not self.autocommit and not self.state.in_transaction:
            await self.gate.begin(self.state)
        planned = await self.gate.plan_async(sql, self.state.plan_key) if read else None
        point = point_read(planned)
        if point and self.text_protocol and not self.state.in_transaction:
            # authorized and planned above: execute_wire does neither again
            wire = await self.gate.execute_wire(self.state, sql, binds, planned=planned)
            if wire is not None:
                return ResultSet(rows=WireRows(wire, self.state.keyspace or ""),
                                 columns=_WIRE_COLUMNS)
        if not read or point:
            self.last = await self.gate.execute(self.state, sql, binds)
            if self.last.insert_id is not None:
                self._last_insert_id = self.last.insert_id
            if self.last.fields:
                return self.last.rows, await self._columns(self.last, sql)
            return None
        chunks = self.gate.stream_execute(self.state, sql, binds)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            return None
        if not first.fields:
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()
            self.last = first
            return None
        return _rows(first, chunks), await self._columns(first, sql)

    async def _columns(self, first: Result, sql: str) -> list[Any]:
        """The result's columns: names (types inferred from the values), or, when the
        first chunk has no rows (a schema probe such as ``WHERE 1=0``), the declared
        types of a single-table select's table, so the client learns real types."""
        if first.rows:
            return catalog.value_columns(first.fields, first.rows)
        m = _ONE_TABLE.match(sql)
        if m is None or self.state.keyspace is None:
            return catalog.value_columns(first.fields, first.rows)
        db, name = (m.group(1), m.group(2)) if m.group(2) else (None, m.group(1))
        ks = db or self.state.keyspace
        if ks not in self.gate.topology.keyspaces:
            return catalog.value_columns(first.fields, first.rows)
        found = await self.gate.catalog(ks, name)
        return catalog.result_columns(first.fields, found[0]) if found else \
            catalog.value_columns(first.fields, first.rows)

    async def query(self, expression: exp.Expression, sql: str, attrs: dict[str, str]) -> \
            AllowedResult:
        """What mysql-mimic's middlewares passed on: re-rendered and sent to the gate."""
        text = expression.sql(dialect="mysql")
        return await self._run(text, isinstance(expression, exp.Query))

    async def _set(self, sql: str, body: str, attrs: dict[str, str]) -> AllowedResult:
        """``SET``: ``transaction_mode`` goes to the gate, the rest to the session variables
        (``autocommit`` among them, applied here: turning it on commits, as MySQL does)."""
        if _SET_TX_MODE.match(body):
            return await self._gate(re.sub(r"@@(?:session\.|local\.)?|\b(?:session|local)\s+",
                                           "", sql, count=1, flags=re.I))
        result = await super().handle_query(sql, attrs)
        on = bool(self.variables.get("autocommit"))
        if on and not self.autocommit and self.state.in_transaction:
            await self.gate.commit(self.state)
        self.autocommit = on
        return result

    def _set_variable(self, setitem: exp.SetItem) -> None:
        """One ``name = value`` of a SET: ``autocommit`` read as MySQL reads it (ON/OFF/1/0),
        expressions such as ``CONCAT(@@sql_mode, ',X')`` evaluated."""
        assignment = setitem.this
        name, right = assignment.left.name.lower(), assignment.right
        if name == "autocommit":
            text = (right.name if isinstance(right, exp.Column | exp.Var | exp.Identifier)
                    else right.sql()).lower().strip("'\"")
            if text not in _TRUE | _FALSE:
                raise MysqlError(f"Variable 'autocommit' can't be set to the value of '{text}'",
                                 code=1231)
            self.variables.set("autocommit", text in _TRUE)
            return
        try:
            super()._set_variable(setitem)
        except MysqlError:
            if isinstance(right, exp.Literal | exp.Column | exp.Var | exp.Identifier):
                raise
            value = self._evaluate(right)
            setitem.this.set("expression", exp.Literal.string(str(value)))
            super()._set_variable(setitem)

    def _evaluate(self, expression: exp.Expression) -> Any:
        """A constant expression's value, ``@@variables`` replaced by their values."""
        def value_of(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.SessionParameter):
                return exp.Literal.string(str(self.variables.get(node.name) or ""))
            return node

        constant = expression.copy().transform(value_of)
        try:
            return execute(exp.select(constant)).rows[0][0]
        except Exception as exc:
            raise MysqlError(f"cannot evaluate {expression.sql(dialect='mysql')}: {exc}",
                             code=1231) from exc

    async def _set_var_middleware(self, q: Query) -> AllowedResult:
        """Information functions replaced by their values (LAST_INSERT_ID too)."""
        with VariableProcessor(self._functions(), self.variables, q.expression).set_variables():
            return await q.next()

    def _functions(self) -> Functions:
        functions = mysql_function_mapping(self)
        functions["LAST_INSERT_ID"] = lambda: self._last_insert_id
        return functions

    _last_insert_id = 0

    # -- SHOW, DESCRIBE, information_schema -----------------------------------------

    async def _show_gate(self, body: str) -> AllowedResult | None:
        """SHOW statements answered here before mysql-mimic's parser sees them."""
        if _SHOW_GATE.match(body):
            return await self._gate(body)
        m = _SHOW_VSCHEMA.match(body)
        if m is not None:
            return self._show_vschema(m.group(1).lower(), m.group(2))
        m = _SHOW_KEYS.match(body)
        if m is not None:
            fields, rows = catalog.show_index(await self._table(
                _unquote(m.group(1)), m.group(2) and _unquote(m.group(2))))
            return rows, fields
        return None

    def _show_vschema(self, kind: str, on: str | None) -> AllowedResult:
        if kind == "tables":
            ks = self._keyspace(None)
            return [(t,) for t in vschema_tables(self.gate.vschema, ks)
                    if self._readable(ks, t)], ["Tables"]
        keyspace, table = self.state.keyspace, on
        if on is not None and "." in on:
            keyspace, table = on.split(".", 1)
        if table is not None:
            self._require_read(keyspace or "", table)
        fields, rows = vschema_vindexes(self.gate.vschema, keyspace if on else None, table)
        return rows, fields

    async def _show(self, expression: exp.Show) -> AllowedResult:
        kind = expression.name.upper()
        db = expression.text("db") or None
        like = expression.text("like") or None
        match kind:
            case "DATABASES" | "SCHEMAS":
                names = ["information_schema", *sorted(self.gate.topology.keyspaces)]
                return [(n,) for n in names if like is None or like_match(n, like)], \
                    ["Database"]
            case "TABLES":
                ks = self._keyspace(db)
                tables = [(t.name, "BASE TABLE") for t in await self.gate.catalog(ks)]
                tables += [(v, "VIEW") for v in await self.gate.views(ks)]
                rows = [t for t in sorted(tables) if (like is None or like_match(t[0], like))
                        and self._readable(ks, t[0])]
                fields = [f"Tables_in_{ks}"]
                if expression.args.get("full"):
                    return rows, [*fields, "Table_type"]
                return [r[:1] for r in rows], fields
            case "COLUMNS":
                table = await self._table(expression.text("target"), db)
                fields, rows = catalog.show_columns(table, bool(expression.args.get("full")),
                                                    like)
                return rows, fields
            case "INDEX" | "INDEXES" | "KEYS":
                fields, rows = catalog.show_index(await self._table(expression.text("target"),
                                                                    db))
                return rows, fields
            case "CREATE TABLE" | "CREATE VIEW":
                name = expression.text("target")
                self._require_read(self._keyspace(db), name)
                native = await self.gate.native_create(self._keyspace(db), name)
                if native is not None:
                    if re.match(r"^CREATE\b.*?\bVIEW\b", native, re.S):
                        return [(name, native, "utf8mb4", "utf8mb4_general_ci")], \
                            ["View", "Create View", "character_set_client",
                             "collation_connection"]
                    return [(name, native)], ["Table", "Create Table"]
                table = await self._table(name, db)
                return [(table.name, catalog.show_create_table(table))], \
                    ["Table", "Create Table"]
            case "CREATE DATABASE" | "CREATE SCHEMA":
                ks = self._keyspace(expression.text("target") or db)
                text = f"CREATE DATABASE `{ks}` /*!40100 DEFAULT CHARACTER SET utf8mb4 */"
                return [(ks, text)], ["Database", "Create Database"]
            case "ENGINES":
                return [("InnoDB", "DEFAULT", "shardgate's shards", "YES", "YES", "YES")], \
                    ["Engine", "Support", "Comment", "Transactions", "XA", "Savepoints"]
            case "COLLATION":
                return [("utf8mb4_general_ci", "utf8mb4", 45, "Yes", "Yes", 1),
                        ("utf8mb4_bin", "utf8mb4", 46, "", "Yes", 1)], \
                    ["Collation", "Charset", "Id", "Default", "Compiled", "Sortlen"]
            case "CHARACTER SET" | "CHARSET":
                return [("utf8mb4", "UTF-8 Unicode", "utf8mb4_general_ci", 4)], \
                    ["Charset", "Description", "Default collation", "Maxlen"]
            case "TABLE STATUS":
                ks = self._keyspace(db)
                return [(t.name, "InnoDB", 10, "Dynamic") for t in await self.gate.catalog(ks)
                        if (like is None or like_match(t.name, like))
                        and self._readable(ks, t.name)], \
                    ["Name", "Engine", "Version", "Row_format"]
        return await super()._show(expression)

    async def _describe(self, body: str) -> AllowedResult:
        m = re.match(rf"^\w+\s+({_IDENT})(?:\s*\.\s*({_IDENT}))?\s*;?\s*$", body, re.S)
        if m is None:
            raise MysqlError("DESCRIBE takes a table name", code=PARSE.errno)
        first, second = _unquote(m.group(1)), m.group(2) and _unquote(m.group(2))
        db, name = (first, second) if second is not None else (None, first)
        self._require_read(self._keyspace(db), name)
        native = await self.gate.native_describe(self._keyspace(db), name)
        if native is not None:
            return native, ["Field", "Type", "Null", "Key", "Default", "Extra"]
        fields, rows = catalog.show_columns(await self._table(name, db))
        return rows, fields

    async def schema(self) -> BaseInfoSchema:
        """``information_schema`` over every keyspace (read from the shards' catalogs),
        with only the tables the caller may read (as SHOW TABLES)."""
        catalogs = {ks: [t for t in await self.gate.catalog(ks) if self._readable(ks, t.name)]
                    for ks in self.gate.topology.keyspaces}
        return catalog.info_schema(catalogs)

    def _readable(self, keyspace: str, table: str) -> bool:
        """Whether the caller may read ``keyspace.table`` (what lists of tables show)."""
        return self.gate.guard.allows(self.state.identity, keyspace, table, Role.READER)

    def _require_read(self, keyspace: str, table: str) -> None:
        """PERMISSION_DENIED unless the caller may read ``keyspace.table``: the listener
        answers DESCRIBE, SHOW COLUMNS/INDEX/CREATE TABLE itself, from the catalog, and
        shows a table's columns only to whom the table ACL lets read its rows."""
        self.gate.guard.require(self.state.identity, keyspace, [table], Role.READER)

    def _keyspace(self, db: str | None) -> str:
        name = db or self.state.keyspace
        if not name:
            raise MysqlError("No database selected", code=1046)
        if name not in self.gate.topology.keyspaces:
            raise MysqlError(f"Unknown database '{name}'", code=BAD_DB.errno)
        return name

    async def _table(self, name: str, db: str | None) -> TableInfo:
        ks = self._keyspace(db)
        self._require_read(ks, name)
        found = await self.gate.catalog(ks, name)
        if not found:
            raise MysqlError(f"Table '{ks}.{name}' doesn't exist",
                             code=NO_SUCH_TABLE.errno)
        return found[0]


class WireRows:
    """A point read's answer as its MariaDB shard sent it (:meth:`Gate.execute_wire`),
    in a result set's ``rows``: the connection writes its packets as they are, the
    column definitions' schema made the keyspace (``schema``)."""

    __slots__ = ("schema", "wire")

    def __init__(self, wire: WireResult, schema: str) -> None:
        self.wire = wire
        self.schema = schema

    def __iter__(self) -> Any:  # (never iterated: GateConnection writes the packets)
        raise TypeError("WireRows are written as packets")


#: the columns of a result set holding WireRows (its column definitions are the shard's)
_WIRE_COLUMNS = [ResultColumn(name="", type=ColumnType.NULL)]


def _not_direct(body: str) -> bool:
    """Whether ``_NOT_DIRECT`` finds something in ``body``. Each of its forms holds
    ``@``, ``(``, ``.`` or ``schema``: a text with none of them (most point reads) is
    answered by three scans in C rather than the regex's walk over every position."""
    if "(" not in body and "." not in body and "@" not in body and \
            "schema" not in body.lower():
        return False
    return _NOT_DIRECT.search(body) is not None


#: One MySQL identifier: plain, or in backquotes (a doubled backquote is one backquote).
_IDENT = r"(?:`(?:[^`]|``)+`|[\w$]+)"


def _unquote(ident: str) -> str:
    """An identifier matched by ``_IDENT`` without its quotes."""
    if ident.startswith("`"):
        return ident[1:-1].replace("``", "`")
    return ident


async def _rows(first: Result, rest: AsyncIterator[Result]) -> AsyncIterator[Sequence[Any]]:
    """The rows of a streamed result, chunk by chunk (the stream is closed at the end)."""
    try:
        for row in first.rows:
            yield row
        async for chunk in rest:
            for row in chunk.rows:
                yield row
    finally:
        if isinstance(rest, AsyncGenerator):
            await rest.aclose()

