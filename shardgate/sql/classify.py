"""One entry from SQL text to a typed statement.

:func:`classify` reads the first words of a statement (comments and case
ignored) and takes the statements sqlglot does not model itself (``USE``
targets, savepoints, ``CREATE QUEUE``, ``DROP QUEUE``, ``SHOW VITESS_*``,
``ALTER VSCHEMA``);
everything else is parsed by sqlglot, and transaction control and
``SET transaction_mode`` become the dataclasses of
:mod:`shardgate.sql.statements`. Malformed statements raise coded
``InvalidArgument`` / ``SyntaxError_`` errors naming the position.

:func:`write_target` is the tablet's cheap look at a shard statement's head
(which table an INSERT/UPDATE/DELETE writes), on the same reader.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp
from sqlglot.errors import SqlglotError

from shardgate.errors import InvalidArgument, SyntaxError_
from shardgate.sql.parse import describe_error, line_col, parse
from shardgate.sql.statements import (
    AddAutoIncrement,
    AddColumnVindex,
    AddVSchemaSequence,
    AddVSchemaTable,
    AlterVSchema,
    Begin,
    Commit,
    CreateQueueStatement,
    CreateVSchemaVindex,
    DropAutoIncrement,
    DropColumnVindex,
    DropQueueStatement,
    DropVSchemaTable,
    DropVSchemaVindex,
    ReleaseSavepoint,
    Rollback,
    RollbackToSavepoint,
    Savepoint,
    SetQueryTimeout,
    SetTransactionMode,
    ShowShardgateWorker,
    ShowVitessKeyspaces,
    ShowVitessShards,
    ShowVitessTablets,
    Statement,
    TabletType,
    Use,
)

#: Vitess tablet types a ``USE ks@type`` may name (shardgate serves primaries only).
TABLET_TYPES = {"primary": TabletType.PRIMARY, "master": TabletType.PRIMARY,
                "replica": TabletType.REPLICA, "rdonly": TabletType.RDONLY}

_USE_FORMS = "USE ks, USE `ks:-80` or USE `ks[<hex keyspace id>]`"
_CREATE_QUEUE_FORM = (
    "CREATE QUEUE syntax: CREATE QUEUE [IF NOT EXISTS] [keyspace.]name "
    "(column type, ...) [SHARD BY column [USING vindex]] [WITH (option = value, ...)]"
)


class _Head:
    """A reader over the head of a statement: words, identifiers, strings.

    Whitespace and comments (``/* */``, ``-- ``, ``#``) between tokens are skipped.
    """

    __slots__ = ("pos", "sql")

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.pos = 0

    def skip(self) -> None:
        s, n = self.sql, len(self.sql)
        while self.pos < n:
            c = s[self.pos]
            if c.isspace():
                self.pos += 1
            elif s.startswith("/*", self.pos):
                end = s.find("*/", self.pos + 2)
                if end < 0:
                    raise self.error("unterminated comment")
                self.pos = end + 2
            elif c == "#" or (s.startswith("--", self.pos)
                              and (self.pos + 2 == n or s[self.pos + 2].isspace())):
                end = s.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                return

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.sql)

    def char(self) -> str:
        """The next character after whitespace and comments ('' at the end)."""
        self.skip()
        return self.sql[self.pos : self.pos + 1]

    def word(self) -> str | None:
        """The next bare word (letters, digits, ``_``, ``$``) lower-cased, or None."""
        self.skip()
        start = self.pos
        s = self.sql
        while self.pos < len(s) and (s[self.pos].isalnum() or s[self.pos] in "_$"):
            self.pos += 1
        return s[start : self.pos].lower() or None

    def accept(self, word: str) -> bool:
        """Consume ``word`` if it comes next."""
        start = self.pos
        if self.word() == word:
            return True
        self.pos = start
        return False

    def expect(self, word: str, usage: str) -> None:
        if not self.accept(word):
            raise self.error(f"expected {word.upper()}; {usage}")

    def quoted(self) -> str:
        """The quoted text starting here (``'``, ``"`` or backtick; doubling escapes)."""
        quote, start = self.sql[self.pos], self.pos
        out: list[str] = []
        i = self.pos + 1
        while i < len(self.sql):
            c = self.sql[i]
            if c == "\\" and quote != "`" and i + 1 < len(self.sql):
                out.append(self.sql[i + 1])
                i += 2
            elif c == quote:
                if self.sql[i + 1 : i + 2] == quote:
                    out.append(quote)
                    i += 2
                else:
                    self.pos = i + 1
                    return "".join(out)
            else:
                out.append(c)
                i += 1
        self.pos = start
        kind = "quoted identifier" if quote == "`" else "string"
        raise self.error(f"unterminated {kind}")

    def ident(self, quotes: str = "`") -> str | None:
        """The next identifier as written (bare, or quoted with one of ``quotes``)."""
        if self.char() and self.char() in quotes:
            return self.quoted()
        start = self.pos
        found = self.word()
        return self.sql[start:self.pos].strip() if found else None

    def rest(self) -> str:
        """What is left of the statement, without a final ``;``."""
        self.skip()
        text = self.sql[self.pos :].rstrip()
        return text[:-1].rstrip() if text.endswith(";") else text

    def end(self, what: str = "statement") -> None:
        """Require the end of the statement (a final ``;`` allowed)."""
        if self.char() == ";":
            self.pos += 1
        if not self.at_end():
            raise self.error(f"unexpected text after the {what}")

    def error(self, detail: str, at: int | None = None) -> SyntaxError_:
        pos = self.pos if at is None else at
        line, col = line_col(self.sql, pos)
        near = self.sql[pos : pos + 20].split("\n", 1)[0].strip()
        near_text = f" near {near!r}" if near else " at the end of the statement"
        return SyntaxError_(f"syntax error at line {line}, column {col}{near_text}: {detail}",
                            line=line, near=self.sql[pos:])


def classify(sql: str) -> Statement:
    """``sql`` as a typed statement: a sqlglot expression or a :mod:`statements` dataclass."""
    head = _Head(sql)
    reader = _OWN.get(head.word() or "")
    if reader is not None:
        own = reader(head)
        if own is not None:
            return own
    return _standard(parse(sql))


def head_words(sql: str, n: int) -> tuple[str, ...]:
    """The first ``n`` bare words of ``sql``, lower-cased (fewer if something else comes)."""
    head, words = _Head(sql), list[str]()
    try:
        while len(words) < n and (word := head.word()) is not None:
            words.append(word)
    except SyntaxError_:
        pass
    return tuple(words)


def create_queue_statement(sql: str) -> CreateQueueStatement:
    """``sql`` read as ``CREATE QUEUE``; InvalidArgument if it is not one or is malformed."""
    stmt = classify(sql)
    if not isinstance(stmt, CreateQueueStatement):
        raise InvalidArgument(_CREATE_QUEUE_FORM)
    return stmt


#: what a gate tells a tablet of a statement it sends (issue 33): ``(verb, table)``
#: of an INSERT/REPLACE/UPDATE/DELETE (verb lower-cased, the first table written),
#: or :data:`NOT_A_WRITE`; None where the sender did not classify it (the tablet
#: then reads the statement's head with :func:`write_target`)
WriteTarget = tuple[str, str]
#: a statement that writes no table (a read, DDL, a savepoint...)
NOT_A_WRITE: WriteTarget = ("", "")


def tree_write_target(tree: exp.Expr) -> WriteTarget | None:
    """The :data:`WriteTarget` of a statement the gate parsed; None when a write's
    table cannot be named (the tablet reads the statement then)."""
    if isinstance(tree, exp.Insert):
        verb = "insert"
    elif isinstance(tree, exp.Update):
        verb = "update"
    elif isinstance(tree, exp.Delete):
        verb = "delete"
    else:
        return NOT_A_WRITE
    table = tree.this
    if isinstance(table, exp.Schema):
        table = table.this
    if not isinstance(table, exp.Table) or not table.name:
        return None
    return verb, table.name


def write_target(sql: str) -> tuple[str, str] | None:
    """``(verb, table)`` of an INSERT/REPLACE/UPDATE/DELETE statement, else None.

    ``verb`` is lower-cased; ``table`` is the first table named, as written.
    Only the statement's head is read, so this is cheap on large statements.
    """
    head = _Head(sql)
    try:
        verb = head.word()
        if verb not in ("insert", "replace", "update", "delete"):
            return None
        if head.accept("or"):  # SQLite's INSERT OR IGNORE / OR REPLACE
            head.word()
        head.accept("ignore")
        if not head.accept("into"):
            head.accept("from")
        table = head.ident(quotes="`\"")
    except SyntaxError_:
        return None
    return (verb, table) if table else None


def _setting(stmt: exp.Set, name: str) -> exp.Expression | None:
    """The value of ``SET [SESSION] <name> = value``; None for any other SET."""
    items = stmt.expressions
    named = [
        item
        for item in items
        if isinstance(item, exp.SetItem)
        and isinstance(item.this, exp.EQ)
        and isinstance(item.this.this, exp.Column | exp.SessionParameter)
        and item.this.this.name.lower() == name
    ]
    if not named:
        return None
    if len(items) != 1:
        raise InvalidArgument(f"SET {name} must be a statement of its own")
    value: exp.Expression = named[0].this.expression
    return value


def transaction_mode_of(stmt: exp.Set) -> str | None:
    """The mode of ``SET [SESSION] transaction_mode = 'm'`` as written; None for any other SET."""
    value = _setting(stmt, "transaction_mode")
    if value is None:
        return None
    if not isinstance(value, exp.Literal | exp.Var):
        raise InvalidArgument("SET transaction_mode takes a string: 'best_effort' or 'twopc'")
    return str(value.name)


def query_timeout_of(stmt: exp.Set) -> int | None:
    """The milliseconds of ``SET [SESSION] query_timeout_ms = N``; None for any other SET."""
    value = _setting(stmt, "query_timeout_ms")
    if value is None:
        return None
    if not (isinstance(value, exp.Literal) and not value.is_string and value.name.isdigit()):
        raise InvalidArgument(
            "SET query_timeout_ms takes a whole number of milliseconds (0: no timeout)")
    return int(value.name)


def _standard(stmt: exp.Expression) -> Statement:
    """Transaction control and ``SET transaction_mode`` as dataclasses; other SQL as is."""
    if isinstance(stmt, exp.Transaction):
        return Begin()
    if isinstance(stmt, exp.Commit):
        return Commit()
    if isinstance(stmt, exp.Rollback):
        savepoint = stmt.args.get("savepoint")
        if savepoint is not None:
            return RollbackToSavepoint(_savepoint_name(savepoint.name))
        return Rollback()
    if isinstance(stmt, exp.Set) and (mode := transaction_mode_of(stmt)) is not None:
        return SetTransactionMode(mode)
    if isinstance(stmt, exp.Set) and (ms := query_timeout_of(stmt)) is not None:
        return SetQueryTimeout(ms)
    return stmt


# -- USE ----------------------------------------------------------------------------------------


def _use(head: _Head) -> Use:
    if head.at_end() or head.char() == ";":
        raise head.error(f"USE needs a keyspace: {_USE_FORMS}")
    at = head.pos
    if head.char() == "`":
        target = head.quoted()
    else:  # unquoted: up to the next space, comment or ';'
        end = at
        while end < len(head.sql) and not head.sql[end].isspace() and head.sql[end] != ";" \
                and not head.sql.startswith("/*", end):
            end += 1
        target, head.pos = head.sql[at:end], end
    head.end("USE target")
    return _use_target(target, head, at)


def _use_target(target: str, head: _Head, at: int) -> Use:
    """``ks``, ``ks:shard``, ``ks/shard`` or ``ks[<hex>]``, each with an optional ``@type``."""
    body, sep, tablet = target.partition("@")
    tablet_type: TabletType | None = None
    if sep:
        tablet_type = TABLET_TYPES.get(tablet.strip().lower())
        if tablet_type is None:
            raise head.error(
                f"'@{tablet}' is not a tablet type: '@' names one (primary, replica, "
                f"rdonly), a shard is named with ':' as in USE `ks:-80`", at)
    keyspace_id: bytes | None = None
    shard: str | None = None
    if body.endswith("]") and "[" in body:
        ks, _, inner = body[:-1].partition("[")
        if "-" in inner:
            raise head.error(
                f"USE {ks}[{inner}]: key range targets are not supported; "
                f"name the shard (USE `{ks}:{inner}`) or a keyspace id in hex", at)
        try:
            keyspace_id = bytes.fromhex(inner)
        except ValueError:
            raise InvalidArgument(f"bad keyspace id {inner!r}: give it in hex") from None
        if not keyspace_id:
            raise InvalidArgument("empty keyspace id in USE ks[]: give it in hex")
    else:
        ks, sep, shard_name = _split_shard(body)
        if sep:
            if not shard_name or not all(c.isalnum() or c in "-_" for c in shard_name):
                raise head.error(f"bad shard name {shard_name!r}; {_USE_FORMS}", at)
            shard = shard_name
    if not _is_name(ks):
        raise head.error(f"bad keyspace name {ks!r}; {_USE_FORMS}", at)
    return Use(ks, shard=shard, keyspace_id=keyspace_id, tablet_type=tablet_type)


def _split_shard(body: str) -> tuple[str, str, str]:
    for sep in (":", "/"):
        if sep in body:
            return body.partition(sep)
    return body, "", ""


def _is_name(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and all(
        c.isalnum() or c == "_" for c in text)


# -- savepoints ---------------------------------------------------------------------------------


def _savepoint_name(name: str) -> str:
    """Savepoint names are spliced into shard SQL: plain identifiers only, lower-cased."""
    if not _is_name(name) or not name.isascii():
        raise InvalidArgument(
            f"bad savepoint name {name!r}: use letters, digits and '_' (not starting with a digit)")
    return name.lower()


def _named(head: _Head, verb: str) -> str:
    at = head.pos
    name = head.ident()
    if name is None:
        raise head.error(f"{verb} needs a savepoint name")
    head.end(f"{verb} statement")
    try:
        return _savepoint_name(name)
    except InvalidArgument as exc:
        raise head.error(exc.message, at) from None


def _savepoint(head: _Head) -> Savepoint:
    return Savepoint(_named(head, "SAVEPOINT"))


def _release(head: _Head) -> ReleaseSavepoint | None:
    if not head.accept("savepoint"):
        return None
    return ReleaseSavepoint(_named(head, "RELEASE SAVEPOINT"))


def _rollback(head: _Head) -> RollbackToSavepoint | None:
    head.accept("work")
    if not head.accept("to"):
        return None  # ROLLBACK [WORK]: sqlglot's
    head.accept("savepoint")
    return RollbackToSavepoint(_named(head, "ROLLBACK TO"))


# -- SHOW VITESS_*, ALTER VSCHEMA ----------------------------------------------------------------

_SHOWS: dict[str, type[ShowVitessShards | ShowVitessKeyspaces | ShowVitessTablets]] = {
    "vitess_shards": ShowVitessShards,
    "vitess_keyspaces": ShowVitessKeyspaces,
    "keyspaces": ShowVitessKeyspaces,
    "vitess_tablets": ShowVitessTablets,
}


def _show(
    head: _Head,
) -> ShowVitessShards | ShowVitessKeyspaces | ShowVitessTablets | ShowShardgateWorker | None:
    word = head.word() or ""
    if word == "shardgate_worker":
        head.end("SHOW SHARDGATE_WORKER")
        return ShowShardgateWorker()
    kind = _SHOWS.get(word)
    if kind is None:
        return None
    like: str | None = None
    if head.accept("like"):
        if head.char() not in ("'", '"'):
            raise head.error("LIKE takes a quoted pattern")
        like = head.quoted()
    head.end("SHOW statement")
    return kind(like)


_ALTER_VSCHEMA_FORMS = (
    "ALTER VSCHEMA forms: ADD TABLE t | DROP TABLE t | ADD SEQUENCE s | "
    "CREATE VINDEX v USING type [WITH k = v, ...] | DROP VINDEX v | "
    "ON t ADD VINDEX v(col, ...) [USING type] [WITH k = v, ...] | ON t DROP VINDEX v | "
    "ON t ADD AUTO_INCREMENT col USING seq | ON t DROP AUTO_INCREMENT"
)


def _alter(head: _Head) -> AlterVSchema | None:
    if not head.accept("vschema"):
        return None
    if head.accept("on"):
        keyspace, table = _qualified(head, "ON needs a table")
        return _alter_on(head, keyspace, table)
    verb = head.word()
    what = head.word()
    stmt: AlterVSchema
    match verb, what:
        case ("add", "table"):
            stmt = AddVSchemaTable(*_qualified(head, "ADD TABLE needs a table name"))
        case ("drop", "table"):
            stmt = DropVSchemaTable(*_qualified(head, "DROP TABLE needs a table name"))
        case ("add", "sequence"):
            stmt = AddVSchemaSequence(*_qualified(head, "ADD SEQUENCE needs a table name"))
        case ("create", "vindex"):
            keyspace, name = _qualified(head, "CREATE VINDEX needs a vindex name")
            head.expect("using", _ALTER_VSCHEMA_FORMS)
            vtype = _vindex_type(head)
            stmt = CreateVSchemaVindex(keyspace, name, vtype, _with_params(head))
        case ("drop", "vindex"):
            stmt = DropVSchemaVindex(*_qualified(head, "DROP VINDEX needs a vindex name"))
        case _:
            raise head.error(_ALTER_VSCHEMA_FORMS)
    head.end("ALTER VSCHEMA statement")
    return stmt


def _alter_on(head: _Head, keyspace: str | None, table: str) -> AlterVSchema:
    stmt: AlterVSchema
    match head.word(), head.word():
        case ("add", "vindex"):
            name = head.ident()
            if name is None:
                raise head.error("ADD VINDEX needs a vindex name")
            if head.char() != "(":
                raise head.error("ADD VINDEX name needs its column(s): name(col, ...)")
            at = head.pos
            columns = tuple(c.strip().strip("`") for c in _parenthesized(head, "columns")
                            .split(","))
            if not all(_is_name(c) for c in columns):
                raise head.error(f"bad column list {columns}: plain column names only", at)
            vtype = _vindex_type(head) if head.accept("using") else None
            stmt = AddColumnVindex(keyspace, table, name, columns, vtype, _with_params(head))
        case ("drop", "vindex"):
            name = head.ident()
            if name is None:
                raise head.error("DROP VINDEX needs a vindex name")
            stmt = DropColumnVindex(keyspace, table, name)
        case ("add", "auto_increment"):
            column = head.ident()
            if column is None:
                raise head.error("ADD AUTO_INCREMENT needs a column")
            head.expect("using", "ADD AUTO_INCREMENT col USING sequence")
            seq_ks, seq = _qualified(head, "USING needs a sequence table")
            stmt = AddAutoIncrement(keyspace, table, column,
                                    f"{seq_ks}.{seq}" if seq_ks else seq)
        case ("drop", "auto_increment"):
            stmt = DropAutoIncrement(keyspace, table)
        case _:
            raise head.error(_ALTER_VSCHEMA_FORMS)
    head.end("ALTER VSCHEMA statement")
    return stmt


def _qualified(head: _Head, missing: str) -> tuple[str | None, str]:
    """``[keyspace.]name`` as ``(keyspace or None, name)``."""
    first = head.ident()
    if first is None:
        raise head.error(missing)
    if head.char() == ".":
        head.pos += 1
        second = head.ident()
        if second is None:
            raise head.error(missing)
        return first, second
    return None, first


def _vindex_type(head: _Head) -> str:
    vtype = head.ident()
    if vtype is None:
        raise head.error("USING needs a vindex type (hash, consistent_lookup_unique, ...)")
    return vtype.lower()


def _with_params(head: _Head) -> tuple[tuple[str, str], ...]:
    """``WITH k = v, ...`` (values bare up to the next ``,`` or quoted); () without WITH."""
    if not head.accept("with"):
        return ()
    out: list[tuple[str, str]] = []
    while True:
        key = head.ident()
        if key is None:
            raise head.error("WITH takes key = value, ...")
        if head.char() != "=":
            raise head.error(f"WITH {key}: expected '='")
        head.pos += 1
        if head.char() in ("'", '"'):
            value = head.quoted()
        else:
            start = head.pos
            while head.pos < len(head.sql) and head.sql[head.pos] not in ",;" \
                    and not head.sql[head.pos].isspace():
                head.pos += 1
            value = head.sql[start:head.pos]
            if not value:
                raise head.error(f"WITH {key} = needs a value")
        if any(k == key.lower() for k, _ in out):
            raise head.error(f"WITH: {key!r} is given twice")
        out.append((key.lower(), value))
        if head.char() != ",":
            return tuple(out)
        head.pos += 1


# -- DROP QUEUE ---------------------------------------------------------------------------------


def _drop_queue(head: _Head) -> DropQueueStatement | None:
    if not head.accept("queue"):
        return None
    if_exists = head.accept("if")
    if if_exists:
        head.expect("exists", "DROP QUEUE [IF EXISTS] [keyspace.]name")
    keyspace, name = _qualified(head, "DROP QUEUE needs a queue name")
    head.end("DROP QUEUE statement")
    return DropQueueStatement(name, keyspace, if_exists)


# -- CREATE QUEUE -------------------------------------------------------------------------------


def _create_queue(head: _Head) -> CreateQueueStatement | None:
    if not head.accept("queue"):
        return None
    ine = head.accept("if")
    if ine:
        head.expect("not", _CREATE_QUEUE_FORM)
        head.expect("exists", _CREATE_QUEUE_FORM)
    first = head.ident()
    if first is None:
        raise InvalidArgument(_CREATE_QUEUE_FORM)
    keyspace, name = None, first
    if head.char() == ".":
        head.pos += 1
        keyspace, second = first, head.ident()
        if second is None:
            raise InvalidArgument(_CREATE_QUEUE_FORM)
        name = second
    if head.char() != "(":
        raise InvalidArgument(_CREATE_QUEUE_FORM)
    columns = _column_defs(_parenthesized(head, "column list"))
    shard_column = vindex = None
    if head.accept("shard"):
        head.expect("by", _CREATE_QUEUE_FORM)
        col = head.ident()
        if col is None:
            raise head.error(f"SHARD BY needs a column; {_CREATE_QUEUE_FORM}")
        shard_column = col.lower()
        if head.accept("using"):
            vindex = head.ident()
            if vindex is None:
                raise head.error("USING needs a vindex name")
    options: tuple[tuple[str, str], ...] = ()
    if head.accept("with"):
        if head.char() != "(":
            raise head.error("WITH takes (option = value, ...)")
        options = _options(_parenthesized(head, "WITH options"))
    if head.char() == ";":
        head.pos += 1
    if not head.at_end():
        raise InvalidArgument(f"CREATE QUEUE: unexpected text {head.rest()[:40]!r}")
    return CreateQueueStatement(name=name, keyspace=keyspace, columns=columns,
                                if_not_exists=ine, shard_column=shard_column, vindex=vindex,
                                options=options)


def _parenthesized(head: _Head, what: str) -> str:
    """The text inside the parentheses opening here; the reader moves past them."""
    depth = 0
    quote: str | None = None
    text = head.sql
    for i in range(head.pos, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                body = text[head.pos + 1 : i]
                head.pos = i + 1
                return body
    raise InvalidArgument(f"CREATE QUEUE: unbalanced parentheses in the {what}")


def _column_defs(body: str) -> tuple[exp.ColumnDef, ...]:
    try:
        parsed: exp.Expression = exp.maybe_parse(f"CREATE TABLE t ({body})", dialect="mysql")
    except SqlglotError as exc:
        raise SyntaxError_(f"CREATE QUEUE: bad column list: {describe_error(exc)}") from exc
    schema = parsed.this if isinstance(parsed, exp.Create) else None
    if not isinstance(schema, exp.Schema):
        raise InvalidArgument("CREATE QUEUE: expected a column list")
    columns = tuple(c for c in schema.expressions if isinstance(c, exp.ColumnDef))
    if len(columns) != len(schema.expressions):
        raise InvalidArgument("CREATE QUEUE: only column definitions are allowed in the list")
    return columns


def _options(body: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for part in body.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidArgument(f"CREATE QUEUE: option {part.strip()!r} is not key = value")
        out.append((key.strip().lower(), value.strip().strip("'\"")))
    return tuple(out)


_OWN: dict[str, Callable[[_Head], Statement | None]] = {
    "use": _use,
    "savepoint": _savepoint,
    "release": _release,
    "rollback": _rollback,
    "show": _show,
    "alter": _alter,
    "create": _create_queue,
    "drop": _drop_queue,
}
