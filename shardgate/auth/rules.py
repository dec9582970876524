"""Safe SQL: which statement kinds may pass the gate, which role each needs on
which tables, which functions and catalogs it calls, and the deny-list of
server-side features that reach files, the network, programs, the server or
the pooled connection's session.

:func:`analyze` reads one statement (text in, :class:`Access` out; pure, so
the guard caches it per text). The rules, applied to every statement,
shard-targeted ones (``USE `ks:-80```) included:

* **Deny-list**, for everyone, admin and trusted code included
  (:data:`DENIED_FUNCTIONS`, :data:`DENIED_PREFIXES`,
  :func:`shardgate.auth.functions.never_called`, the clauses and statements in
  :func:`_denied_node`, :data:`_DENIED_HEADS` / :data:`_DENIED_WORDS`, and
  :data:`NEVER_SENT`: statements about the server rather than a keyspace,
  such as ``CREATE/DROP/ALTER DATABASE``, ``SCHEMA``, ``ROLE``, ``USER``,
  ``TABLESPACE``, ``SERVER``, ``ALTER SYSTEM``, ``GRANT``, ``REVOKE``,
  ``FLUSH``, ``SHUTDOWN``, ``PURGE``, ``CHANGE MASTER``, ``SET GLOBAL``...):
  looked for in the statement's head words and tokens before parsing, so a
  form sqlglot cannot parse is refused by rule with ``PERMISSION_DENIED``
  naming it, and in the parsed tree.
* **Kinds** (:data:`KIND_ROLES`): the statement's class must be listed; its
  role is what it needs on the tables it changes (SELECT/EXPLAIN/SHOW:
  reader; INSERT/UPDATE/DELETE: writer on the written table, reader on the
  tables only read; DDL, ``CREATE QUEUE``, ``ALTER VSCHEMA``: admin).
  Anything else (``SET``, ``COPY``, ``PRAGMA``, ``KILL``, ``ANALYZE``...) is
  refused for everyone. Session control the gate answers itself (``USE``,
  ``BEGIN``, savepoints, ``SET transaction_mode``, ``SHOW VITESS_*``) needs
  nothing.
* **Tables** (:class:`_Walk`): every table reference at every depth, with the
  role it needs. CTE names are resolved by scope: a CTE hides a table of its
  name in the main query, in the CTEs after it and (``WITH RECURSIVE``) in its
  own body, and only for reads; a table named like a CTE anywhere else is a
  table. Every INSERT/UPDATE/DELETE/MERGE at any depth (a data-changing CTE)
  needs the writer role on the tables it changes, and a ``SELECT ... FOR
  UPDATE / FOR SHARE / LOCK IN SHARE MODE`` the writer role on the tables it
  locks.
* **Functions and catalogs** (recorded here, checked per dialect by the guard
  for callers below admin): :mod:`shardgate.auth.functions`,
  :mod:`shardgate.auth.catalogs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from shardgate.auth.acl import Role
from shardgate.auth.catalogs import catalog_name
from shardgate.auth.functions import never_called
from shardgate.errors import PermissionDenied
from shardgate.sql.classify import classify, head_words
from shardgate.sql.parse import GATE_DIALECT
from shardgate.sql.statements import (
    AlterVSchema,
    CreateQueueStatement,
    DropQueueStatement,
    GateStatement,
)

#: Server-side functions that read or write files, reach the network or run
#: programs (PostgreSQL, MariaDB/MySQL, SQLite), or run SQL given as a string
#: (which would escape these rules and the ACLs; more in
#: :data:`shardgate.auth.functions.NEVER_CALLED`).
DENIED_FUNCTIONS = frozenset({
    # PostgreSQL: files, large objects from files, server control
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_file_write",
    "pg_file_rename", "pg_file_unlink", "pg_file_sync", "pg_logdir_ls", "pg_current_logfile",
    "lo_import", "lo_export", "pg_read_server_files",
    "pg_execute_server_program", "pg_write_server_files",
    # MariaDB / MySQL: files and UDFs that run programs
    "load_file", "sys_exec", "sys_eval", "sys_get", "sys_set",
    # SQLite: extensions and the shell's file functions
    "load_extension", "readfile", "writefile", "edit", "fts3_tokenizer",
})
#: Name prefixes of denied functions (``dblink_connect``, ``pg_ls_waldir``...).
DENIED_PREFIXES = ("dblink", "pg_ls_", "pg_file_", "pg_read_", "lo_import", "lo_export")

#: Statements refused by their first word, whatever follows (many do not parse).
_DENIED_HEADS = {
    "copy": "COPY reads and writes files and runs programs on the database server",
    "load": "LOAD DATA / LOAD XML read files on the database server or client",
    "attach": "ATTACH opens another database file",
    "detach": "DETACH changes the shard's attached database files",
    "vacuum": "VACUUM rewrites database files (VACUUM INTO writes a new one)",
    "pragma": "PRAGMA changes the SQLite shard's engine settings",
    "install": "INSTALL PLUGIN / SONAME loads a shared library into the server",
    "uninstall": "UNINSTALL changes the server's plugins",
    "import": "IMPORT FOREIGN SCHEMA reaches another server",
}
#: Words refused anywhere in a statement (outside strings and quoted names).
_DENIED_WORDS = {
    "outfile": "INTO OUTFILE writes a file on the database server",
    "dumpfile": "INTO DUMPFILE writes a file on the database server",
    "infile": "LOAD DATA INFILE reads a file",
    "soname": "SONAME loads a shared library into the server",
}
#: Statements refused by their first two words.
_DENIED_HEAD_PAIRS = {
    ("create", "extension"): "CREATE EXTENSION loads code into the server",
    ("create", "server"): "CREATE SERVER reaches other servers",
    ("create", "foreign"): "foreign tables and data wrappers reach other servers",
}
#: MariaDB storage engines that reach files or other servers.
_DENIED_ENGINES = frozenset({"connect", "federated", "federatedx", "spider", "oqgraph", "s3"})
#: What CREATE, ALTER and DROP may make or change on a shard through the gate.
_CREATE_KINDS = frozenset({"TABLE", "INDEX", "VIEW"})

_SERVER = "it changes the database server, not one keyspace"
_LOGS = "it reads the server's logs or replication state, which span every database"
_SESSION = ("it changes the database session, which the next user of the pooled "
            "connection would inherit")
#: What CREATE/ALTER/DROP may not name: the server's objects, never sent to a shard.
_SERVER_OBJECTS = {
    "database": "DATABASE", "schema": "SCHEMA", "role": "ROLE", "user": "USER",
    "tablespace": "TABLESPACE", "server": "SERVER", "system": "SYSTEM",
    "logfile": "LOGFILE GROUP", "resource": "RESOURCE GROUP", "group": "GROUP",
    "event": "EVENT", "instance": "INSTANCE", "publication": "PUBLICATION",
    "subscription": "SUBSCRIPTION", "default": "DEFAULT PRIVILEGES", "language": "LANGUAGE",
}
#: Statements never sent to a shard, by anyone (admins included), by their first
#: word: the server's accounts, privileges, replication, logs, configuration,
#: and the pooled connection's session.
NEVER_SENT = {
    "grant": _SERVER, "revoke": _SERVER, "flush": _SERVER, "shutdown": _SERVER,
    "restart": _SERVER, "purge": _SERVER, "change": _SERVER, "reset": _SERVER,
    "reassign": _SERVER, "security": _SERVER, "checkpoint": _SERVER, "binlog": _SERVER,
    "backup": _SERVER, "cache": _SERVER, "kill": _SERVER,
    "lock": _SESSION, "unlock": _SESSION, "handler": _SESSION, "prepare": _SESSION,
    "execute": "it runs SQL given as a string, outside the gate's rules",
    "deallocate": _SESSION, "listen": _SESSION, "unlisten": _SESSION, "notify": _SESSION,
    "discard": _SESSION, "xa": _SESSION, "call": "it runs a stored procedure's SQL",
    "do": "it runs code (PostgreSQL DO blocks run SQL given as a string)",
}
#: Two-word forms never sent (first word, second word).
_NEVER_SENT_PAIRS = {
    ("set", "global"): _SERVER, ("set", "persist"): _SERVER, ("set", "persist_only"): _SERVER,
    ("set", "password"): _SERVER, ("set", "role"): _SESSION,
    ("rename", "user"): _SERVER, ("start", "slave"): _SERVER, ("start", "replica"): _SERVER,
    ("stop", "slave"): _SERVER, ("stop", "replica"): _SERVER, ("show", "binlog"): _LOGS,
    ("show", "relaylog"): _LOGS, ("show", "binary"): _LOGS, ("show", "master"): _LOGS,
    ("show", "slave"): _LOGS, ("show", "replica"): _LOGS,
}
#: SHOW forms a caller below admin may send (the rest show the server, not a keyspace).
SHOW_BELOW_ADMIN = frozenset({
    "TABLES", "COLUMNS", "FIELDS", "INDEX", "INDEXES", "KEYS", "CREATE TABLE",
    "CREATE VIEW", "TABLE STATUS", "WARNINGS", "ERRORS", "COLLATION", "CHARACTER SET",
    "CHARSET",
})

#: The statement classes the gate lets through, with the role each needs on
#: the tables it changes (tables only read need READER).
KIND_ROLES: dict[type, tuple[str, Role]] = {
    exp.Select: ("SELECT", Role.READER),
    exp.Union: ("SELECT", Role.READER),
    exp.Intersect: ("SELECT", Role.READER),
    exp.Except: ("SELECT", Role.READER),
    exp.Subquery: ("SELECT", Role.READER),
    exp.Describe: ("EXPLAIN", Role.READER),
    exp.Show: ("SHOW", Role.READER),
    exp.Insert: ("INSERT", Role.WRITER),
    exp.Update: ("UPDATE", Role.WRITER),
    exp.Delete: ("DELETE", Role.WRITER),
    exp.Create: ("DDL", Role.ADMIN),
    exp.Alter: ("DDL", Role.ADMIN),
    exp.Drop: ("DDL", Role.ADMIN),
    exp.TruncateTable: ("DDL", Role.ADMIN),
    CreateQueueStatement: ("DDL", Role.ADMIN),
    DropQueueStatement: ("DDL", Role.ADMIN),
    AlterVSchema: ("ALTER_VSCHEMA", Role.ADMIN),
}


@dataclass(frozen=True)
class TableUse:
    """One table a statement touches: its keyspace as written ("" if not), name, role."""

    keyspace: str
    table: str
    role: Role


@dataclass(frozen=True)
class Access:
    """What one statement is and needs: its kind, each table with its role, and what
    the guard checks per dialect for callers below admin.

    ``functions`` maps each shard dialect to the names of the functions the statement
    calls as that dialect's shard sees them (the gate writes the statement in the
    shard's dialect); ``catalogs`` are the catalog references
    (:func:`~shardgate.auth.catalogs.catalog_name`); ``admin_only`` says why a caller
    below admin may not run it whatever the dialect (a schema-qualified function, a
    SHOW about the server), empty if nothing.
    """

    kind: str
    tables: tuple[TableUse, ...] = ()
    functions: dict[str, frozenset[str]] = field(default_factory=dict)
    catalogs: tuple[str, ...] = ()
    admin_only: tuple[str, ...] = ()


def deny(reason: str) -> PermissionDenied:
    """The error for a statement on the deny-list."""
    return PermissionDenied(f"statement refused by the gate's deny-list: {reason}")


def analyze(sql: str) -> Access:
    """The kind, table roles, functions and catalogs of ``sql``; PermissionDenied for
    denied or unlisted kinds.

    Raises the classifier's own errors (syntax) for a statement that does not
    parse and names nothing denied.
    """
    _screen_tokens(sql)
    stmt = classify(sql)
    if isinstance(stmt, GateStatement) and not isinstance(stmt, AlterVSchema):
        return Access("SESSION")  # answered by the gate itself: every caller, no table
    listed = KIND_ROLES.get(AlterVSchema if isinstance(stmt, AlterVSchema) else type(stmt))
    if listed is None:
        name = stmt.key.upper() if isinstance(stmt, exp.Expression) else type(stmt).__name__
        raise PermissionDenied(
            f"statement kind {name} is not allowed through the gate (allowed: SELECT, "
            "INSERT, UPDATE, DELETE, EXPLAIN, SHOW, DDL and session control)"
        )
    kind, role = listed
    if isinstance(stmt, CreateQueueStatement | DropQueueStatement):
        return Access(kind, (TableUse(stmt.keyspace or "", stmt.name, Role.ADMIN),))
    if isinstance(stmt, AlterVSchema):
        # the table the change is about; vindex and sequence forms name none, so they
        # need admin on the keyspace's unnamed entry (only a group for "%" grants it)
        table = getattr(stmt, "table", "") or getattr(stmt, "sequence", "") or ""
        return Access(kind, (TableUse(stmt.keyspace or "", str(table), Role.ADMIN),))
    assert isinstance(stmt, exp.Expression)
    for node in stmt.walk():
        reason = _denied_node(node)
        if reason is not None:
            raise deny(reason)
    walk = _Walk(stmt, role)
    admin_only = list(walk.admin_only)
    if isinstance(stmt, exp.Show):
        form = stmt.name.upper()
        if form not in SHOW_BELOW_ADMIN:
            admin_only.append(f"SHOW {form} shows the database server, not the keyspace")
        elif stmt.args.get("db"):
            admin_only.append(f"SHOW {form} FROM a database: databases are the server's")
        target = stmt.args.get("target")
        if isinstance(target, exp.Identifier):
            walk.use("", target.name, Role.READER)
    return Access(
        kind, tuple(TableUse(ks, name, r) for (ks, name), r in walk.uses.items()),
        walk.function_names(), tuple(sorted(walk.catalogs)), tuple(admin_only))


def _screen_tokens(sql: str) -> None:
    """The deny-list's words and heads, before parsing (what sqlglot cannot parse)."""
    head = head_words(sql, 4)
    if head and head[0] in _DENIED_HEADS:
        raise deny(_DENIED_HEADS[head[0]])
    pair = _DENIED_HEAD_PAIRS.get((head[0], head[1])) if len(head) >= 2 else None
    if pair is not None:
        raise deny(pair)
    _screen_never_sent(head)
    try:
        tokens = sqlglot.tokenize(sql, read=GATE_DIALECT)
    except SqlglotError:
        return  # the parser reports it
    for i, tok in enumerate(tokens):
        word = tok.text.lower()
        # a call, however its name is written ("pg_ls_dir"(...) is one in PostgreSQL)
        if i + 1 < len(tokens) and tokens[i + 1].token_type.name == "L_PAREN":
            if _denied_function(word):
                raise deny(f"{word}() reaches files, the network or programs on the server")
            why = never_called(word)
            if why is not None:
                raise deny(f"{word}() {why}")
        if tok.token_type.name in _LITERAL_TOKENS:  # strings and quoted names: not keywords
            continue
        if word in _DENIED_WORDS:
            raise deny(_DENIED_WORDS[word])


def _screen_never_sent(head: tuple[str, ...]) -> None:
    """PermissionDenied naming the form when ``head`` starts a statement never sent."""
    if not head:
        return
    first = head[0]
    if first in ("create", "drop", "alter"):
        rest = list(head[1:])
        if rest[:2] == ["or", "replace"]:
            rest = rest[2:]
        obj = _SERVER_OBJECTS.get(rest[0]) if rest else None
        if obj is not None:
            raise deny(f"{first.upper()} {obj} is never sent to a shard: {_SERVER}")
        return
    why = NEVER_SENT.get(first)
    if why is not None:
        raise deny(f"{first.upper()} is never sent to a shard: {why}")
    if len(head) >= 2:
        why = _NEVER_SENT_PAIRS.get((first, head[1]))
        if why is not None:
            raise deny(f"{first.upper()} {head[1].upper()} is never sent to a shard: {why}")


_LITERAL_TOKENS = frozenset({"STRING", "NATIONAL_STRING", "BIT_STRING", "HEX_STRING",
                             "BYTE_STRING", "RAW_STRING", "HEREDOC_STRING", "IDENTIFIER"})


def _denied_function(name: str) -> bool:
    return name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES)


def _denied_node(node: exp.Expr) -> str | None:
    """Why a node of a parsed statement is on the deny-list (None: it is not)."""
    if isinstance(node, exp.Anonymous | exp.Func):
        names = {node.name.lower()} if isinstance(node, exp.Anonymous) else {
            node.sql_name().lower(), type(node).__name__.lower()}
        for name in names:
            if _denied_function(name):
                return f"{name}() reaches files, the network or programs on the server"
            why = never_called(name)
            if why is not None:
                return f"{name}() {why}"
        if "last_insert_id" in names and node.expressions:
            return f"LAST_INSERT_ID(expr): {_SESSION}"
    elif isinstance(node, exp.Copy):
        return _DENIED_HEADS["copy"]
    elif isinstance(node, exp.Into):
        return "SELECT ... INTO writes tables, variables or files; use INSERT ... SELECT"
    elif isinstance(node, exp.Pragma):
        return _DENIED_HEADS["pragma"]
    elif isinstance(node, exp.Command):
        return f"{node.name.upper()} is not a statement the gate understands"
    elif isinstance(node, exp.EngineProperty) and node.name.lower() in _DENIED_ENGINES:
        return f"ENGINE={node.name.upper()} reaches files or other servers"
    elif isinstance(node, exp.Grant | exp.Revoke):
        return f"{node.key.upper()} is never sent to a shard: {_SERVER}"
    elif isinstance(node, exp.PropertyEQ) and isinstance(node.this, exp.Parameter):
        return f"assigning a user variable (@name := ...): {_SESSION}"
    elif isinstance(node, exp.Create | exp.Drop | exp.Alter):
        verb = node.key.upper()
        kind = str(node.args.get("kind") or "TABLE" if verb == "ALTER" else
                   node.args.get("kind") or "").upper()
        if kind in ("DATABASE", "SCHEMA"):
            return f"{verb} {kind} is never sent to a shard: {_SERVER}"
        if kind not in _CREATE_KINDS:
            return f"{verb} {kind} is not allowed through the gate (TABLE, INDEX, VIEW are)"
    return None


#: Statement nodes that change the table they name.
_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Merge)
#: Query nodes (what only reads, unless it locks).
_QUERIES = (exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Subquery)
#: Function nodes rendered as operators, not calls (no name to check).
_NOT_CALLS = (exp.Binary, exp.Connector, exp.Case, exp.Cast, exp.Paren)
_CALL_HEAD = re.compile(r'^\s*[`"]?([A-Za-z_][A-Za-z0-9_$]*)[`"]?\s*\(')
#: Dialects the guard checks functions for (the tablets' ``dialect`` values).
DIALECTS = ("postgres", "mysql", "sqlite")
#: Function forms that are SQL syntax in every dialect (a name any caller may call).
SYNTAX_CALLS = frozenset({
    "cast", "try_cast", "extract", "coalesce", "nullif", "greatest", "least", "position",
    "substring", "trim", "overlay", "convert", "interval", "row", "array", "exists",
    "values", "grouping", "count", "any", "some", "all", "in", "case", "if", "iif",
})

# a CTE name as written: (text, quoted)
_Name = tuple[str, bool]
# a node to walk: (node, CTE names in scope, role, in a read, in a locking read)
_Item = tuple[exp.Expression, frozenset[_Name], Role, bool, bool]


class _Walk:
    """Every table reference, function call and catalog of one statement (module docstring).

    ``uses`` maps ``(keyspace as written, table)`` to the highest role needed;
    ``calls`` are the function nodes; ``catalogs`` the catalog references;
    ``admin_only`` why a caller below admin may not run it (dialect-free reasons).
    """

    def __init__(self, stmt: exp.Expression, role: Role) -> None:
        self.root = stmt
        self.uses: dict[tuple[str, str], Role] = {}
        self.calls: list[exp.Func] = []
        self.catalogs: set[str] = set()
        self.admin_only: list[str] = []
        self._visit(stmt, frozenset(), role, reading=False, locked=False)

    def use(self, ks: str, name: str, role: Role) -> None:
        key = (ks, name)
        self.uses[key] = max(self.uses.get(key, role), role)

    def _visit(self, root: exp.Expression, visible: frozenset[_Name], role: Role, *,
               reading: bool, locked: bool) -> None:
        # an explicit stack: statements nest deeper than Python's recursion limit
        stack: list[_Item] = [(root, visible, role, reading, locked)]
        while stack:
            node, visible, role, reading, locked = stack.pop()
            if isinstance(node, _WRITES):
                role, reading, locked = max(role, Role.WRITER), False, False
            elif isinstance(node, _QUERIES):
                if node is not self.root and role is Role.WRITER and not locked:
                    role = Role.READER
                reading = True
            with_ = node.args.get("with_") or node.args.get("with")
            if isinstance(with_, exp.With):
                visible = self._with(with_, visible, role, reading, locked, stack,
                                     nested=node is not self.root)
            if isinstance(node, exp.Table):
                self._table(node, visible, role, reading=reading)
            elif isinstance(node, exp.Func) and not isinstance(node, _NOT_CALLS):
                self._call(node)
            lock_role = role
            if isinstance(node, exp.Select) and node.args.get("locks"):
                lock_role = max(role, Role.WRITER)  # FOR UPDATE / FOR SHARE: the locked tables
            for key, value in node.args.items():
                if key in ("with_", "with"):
                    continue
                locks_here = lock_role is not role and key in ("from_", "from", "joins")
                for child in value if isinstance(value, list) else (value,):
                    if isinstance(child, exp.Expression):
                        stack.append((child, visible, lock_role if locks_here else role,
                                      reading, locked or locks_here))

    @staticmethod
    def _with(with_: exp.With, visible: frozenset[_Name], role: Role, reading: bool,
              locked: bool, stack: list[_Item], *, nested: bool) -> frozenset[_Name]:
        """Queue the CTE bodies, each seeing the CTEs before it (and itself when RECURSIVE);
        return the names the rest of the statement sees.

        The bodies of a nested WITH (in a subquery or a CTE) see only their own WITH's
        CTEs: MariaDB 10.11 resolves a name there to the table, not to an outer CTE
        (PostgreSQL and SQLite to the CTE), so only the narrower scope is safe.
        """
        recursive = bool(with_.args.get("recursive"))
        names: list[_Name] = []
        outer = frozenset() if nested else visible
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            ident = alias.this if isinstance(alias, exp.TableAlias) else None
            name = (ident.this, bool(ident.quoted)) if isinstance(ident, exp.Identifier) else None
            body_sees = outer | frozenset(names) | (
                frozenset({name}) if recursive and name is not None else frozenset())
            if isinstance(cte.this, exp.Expression):
                stack.append((cte.this, body_sees, role, reading, locked))
            if name is not None:
                names.append(name)
        return visible | frozenset(names)

    def _table(self, table: exp.Table, visible: frozenset[_Name], role: Role, *,
               reading: bool) -> None:
        catalog = catalog_name(table)
        if catalog is not None:
            self.catalogs.add(catalog)
            return
        ident = table.this
        if not isinstance(ident, exp.Identifier):
            return  # a table function (its call is checked) or a variable
        ks = table.db
        if not ks and not table.catalog and reading and _hidden(ident, visible):
            return  # a CTE in scope, in a read
        if table.catalog:
            ks = f"{table.catalog}.{ks}"  # three-part name: a keyspace that cannot exist
        self.use(ks, ident.this, role)

    def _call(self, node: exp.Func) -> None:
        parent = node.parent
        if isinstance(parent, exp.Table) and catalog_name(parent) is not None:
            return  # SQLite's pragma_* table functions: catalogs, checked as such
        self.calls.append(node)
        if isinstance(parent, exp.Dot) and parent.expression is node:
            qualifier = parent.this.name.lower() if isinstance(parent.this, exp.Expression) \
                else ""
            if qualifier != "pg_catalog":
                self.admin_only.append(
                    f"{parent.sql(GATE_DIALECT)[:60]}: a function qualified by a schema "
                    "(a user-defined function) needs the admin role")

    def function_names(self) -> dict[str, frozenset[str]]:
        """Per dialect, the names of the functions called as that dialect's shard sees them."""
        out: dict[str, set[str]] = {d: set() for d in DIALECTS}
        for node in self.calls:
            if isinstance(node, exp.Anonymous):
                for names in out.values():
                    names.add(node.name.lower())
                continue
            shape = frozenset(k for k, v in node.args.items() if v not in (None, False, []))
            for dialect, names in out.items():
                key = (type(node), dialect, shape)
                name = _RENDERED.get(key, "")
                if name == "":
                    name = _rendered_name(node, dialect)
                    if len(_RENDERED) < 10_000:
                        _RENDERED[key] = name
                if name is not None:
                    names.add(name)
        return {d: frozenset(n - SYNTAX_CALLS) for d, n in out.items()}


#: the name a function class with given arguments is written as in a dialect (None: as
#: an operator or keyword, no call): sqlglot's generator picks it by class and arguments
_RENDERED: dict[tuple[type, str, frozenset[str]], str | None] = {}


def _rendered_name(node: exp.Func, dialect: str) -> str | None:
    try:
        text = node.sql(dialect)
    except (SqlglotError, RecursionError):
        text = f"{node.sql_name()}("
    match = _CALL_HEAD.match(text)
    return match.group(1).lower() if match is not None else None


def _hidden(ident: exp.Identifier, visible: frozenset[_Name]) -> bool:
    """True when a table reference named ``ident`` means a CTE in scope in every dialect:
    the same text, and the same case folding (an unquoted name is folded by PostgreSQL)."""
    text, quoted = ident.this, bool(ident.quoted)
    return (text, quoted) in visible or (text == text.lower() and (text, not quoted) in visible)
