"""Safe SQL: which statement kinds may pass the gate, which role each needs on
which tables, and the deny-list of server-side features that reach files, the
network or programs.

:func:`analyze` reads one statement (text in, :class:`Access` out; pure, so
the guard caches it per text). Three rules, applied to every statement,
shard-targeted ones (``USE `ks:-80```) included:

* **Deny-list** (:data:`DENIED_FUNCTIONS`, :data:`DENIED_PREFIXES`, and the
  clauses and statements in :func:`_denied_node` and :data:`_DENIED_HEADS` /
  :data:`_DENIED_WORDS`): looked for in the parsed tree, and in the
  statement's tokens before parsing, so a feature sqlglot cannot parse
  (``INTO OUTFILE``, ``LOAD DATA``, ``ATTACH``) is refused by rule with
  ``PERMISSION_DENIED``, not by a parse failure.
* **Kinds** (:data:`KIND_ROLES`): the statement's class must be listed; its
  role is what it needs on the tables it changes (SELECT/EXPLAIN/SHOW:
  reader; INSERT/UPDATE/DELETE: writer on the written table, reader on the
  tables only read; DDL, ``CREATE QUEUE``, ``ALTER VSCHEMA``: admin).
  Anything else (``SET``, ``COPY``, ``PRAGMA``, ``KILL``, ``ANALYZE``...) is
  refused for everyone. Session control the gate answers itself (``USE``,
  ``BEGIN``, savepoints, ``SET transaction_mode``, ``SHOW VITESS_*``) needs
  nothing.
* **Tables**: every table named, with the role it needs (CTE names are not
  tables; a keyspace-qualified name keeps its keyspace).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from shardgate.auth.acl import Role
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
#: (which would escape these rules and the ACLs).
DENIED_FUNCTIONS = frozenset({
    # PostgreSQL: files, large objects from files, server control
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_file_write",
    "pg_file_rename", "pg_file_unlink", "pg_file_sync", "pg_logdir_ls", "pg_current_logfile",
    "lo_import", "lo_export", "pg_reload_conf", "pg_rotate_logfile", "pg_promote",
    "pg_terminate_backend", "pg_cancel_backend", "pg_read_server_files",
    "pg_execute_server_program", "pg_write_server_files",
    # PostgreSQL: SQL in a string
    "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "cursor_to_xml",
    "cursor_to_xmlschema", "table_to_xml", "table_to_xmlschema", "table_to_xml_and_xmlschema",
    "schema_to_xml", "database_to_xml",
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
#: What CREATE may make on a shard through the gate.
_CREATE_KINDS = frozenset({"TABLE", "INDEX", "VIEW"})

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
    """What one statement is and needs: its kind and each table with its role."""

    kind: str
    tables: tuple[TableUse, ...] = ()


def deny(reason: str) -> PermissionDenied:
    """The error for a statement on the deny-list."""
    return PermissionDenied(f"statement refused by the gate's deny-list: {reason}")


def analyze(sql: str) -> Access:
    """The kind and table roles of ``sql``; PermissionDenied for denied or unlisted kinds.

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
    return Access(kind, _tables(stmt, role))


def _screen_tokens(sql: str) -> None:
    """The deny-list's words and heads, before parsing (what sqlglot cannot parse)."""
    head = head_words(sql, 2)
    if head and head[0] in _DENIED_HEADS:
        raise deny(_DENIED_HEADS[head[0]])
    pair = _DENIED_HEAD_PAIRS.get((head[0], head[1])) if len(head) == 2 else None
    if pair is not None:
        raise deny(pair)
    try:
        tokens = sqlglot.tokenize(sql, read=GATE_DIALECT)
    except SqlglotError:
        return  # the parser reports it
    for i, tok in enumerate(tokens):
        word = tok.text.lower()
        # a call, however its name is written ("pg_ls_dir"(...) is one in PostgreSQL)
        if (i + 1 < len(tokens) and tokens[i + 1].token_type.name == "L_PAREN"
                and _denied_function(word)):
            raise deny(f"{word}() reaches files, the network or programs on the server")
        if tok.token_type.name in _LITERAL_TOKENS:  # strings and quoted names: not keywords
            continue
        if word in _DENIED_WORDS:
            raise deny(_DENIED_WORDS[word])


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
    elif isinstance(node, exp.Create):
        kind = str(node.args.get("kind") or "").upper()
        if kind not in _CREATE_KINDS:
            return f"CREATE {kind} is not allowed through the gate (TABLE, INDEX, VIEW are)"
    return None


def _tables(stmt: exp.Expression, role: Role) -> tuple[TableUse, ...]:
    """Every table ``stmt`` names, with the role it needs."""
    ctes = {c.alias_or_name.lower() for c in stmt.find_all(exp.CTE)}
    uses: dict[tuple[str, str], Role] = {}
    for table in stmt.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # a table function (denied above if it must be) or a variable
        name, ks = table.name, table.db
        if not ks and name.lower() in ctes:
            continue
        need = role
        if role is Role.WRITER and _read_only_part(table, stmt):
            need = Role.READER
        key = (ks, name)
        uses[key] = max(uses.get(key, need), need)
    if isinstance(stmt, exp.Show) and isinstance(stmt.args.get("target"), exp.Identifier):
        uses[("", stmt.args["target"].name)] = Role.READER
    return tuple(TableUse(ks, name, r) for (ks, name), r in uses.items())


def _read_only_part(node: exp.Expression, root: exp.Expression) -> bool:
    """True when ``node`` sits in a SELECT (a subquery or INSERT's source) inside ``root``."""
    parent = node.parent
    while parent is not None and parent is not root:
        if isinstance(parent, exp.Select | exp.Union | exp.Subquery):
            return True
        parent = parent.parent
    return False
