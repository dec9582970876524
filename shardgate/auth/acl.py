"""Table ACLs in Vitess's ``table_groups`` shape (``--table-acl-config``).

::

    {"table_groups": [
      {"name": "orders", "table_names_or_prefixes": ["customer", "corder", "order_%"],
       "readers": ["reporting"], "writers": ["app"], "admins": ["dba"]},
      {"name": "everything-else", "table_names_or_prefixes": ["%"],
       "readers": ["%"], "writers": [], "admins": ["dba"]}
    ]}

A table belongs to the group naming it exactly, else to the group with the
longest prefix (``order_%``) matching it; ``%`` alone matches every table.
Entries may be qualified (``lookup.customer_seq``); a qualified entry wins
over a bare one for a table of that keyspace. Roles nest as in Vitess: an
admin may write and read, a writer may read. A member ``%`` is every user. A
table no group names is denied to everyone (say so with a ``%`` group).

The file is checked whole when loaded: a bad file is an InvalidArgument naming
the JSON path, and the gate refuses to start (strict mode, always). A later
change is reloaded; a change that does not parse is logged and the previous
ACL stays.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardgate.auth.watch import DEFAULT_POLL_S, FileWatch
from shardgate.errors import InvalidArgument

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"^(?:[A-Za-z0-9_$]+\.)?(?:[A-Za-z0-9_$]+%?|%)$")
_GROUP_KEYS = frozenset({"name", "table_names_or_prefixes", "readers", "writers", "admins"})
ALL = "%"


class Role(enum.IntEnum):
    """What a statement needs on a table; a higher role includes the lower ones."""

    READER = 1
    WRITER = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class TableGroup:
    """One ``table_groups`` entry: its members per role."""

    name: str
    readers: frozenset[str]
    writers: frozenset[str]
    admins: frozenset[str]

    def role_of(self, user: str) -> Role | None:
        """The highest role ``user`` has here (None: no role)."""
        for role, members in ((Role.ADMIN, self.admins), (Role.WRITER, self.writers),
                              (Role.READER, self.readers)):
            if user in members or ALL in members:
                return role
        return None


def _bad(path: str, where: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"ACL file {path}: {where}: {problem}")


def _names(path: str, where: str, raw: Any, *, entries: bool = False) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise _bad(path, where, "expected a list of non-empty strings")
    if entries:
        for i, name in enumerate(raw):
            if not _ENTRY.match(name):
                raise _bad(path, f"{where}[{i}]",
                           f"{name!r} is not a table name or a prefix ending in %")
    return list(raw)


@dataclass(frozen=True)
class _Parsed:
    exact: dict[str, TableGroup]
    #: qualified prefixes ("ks.order_"), then bare ones; longest first in each
    prefixes: list[tuple[str, TableGroup]]
    groups: tuple[TableGroup, ...]


def parse_acl(text: str, path: str) -> _Parsed:
    """The groups of an ACL file's text; InvalidArgument naming the JSON path at fault."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(path, f"line {exc.lineno} column {exc.colno}", f"not JSON: {exc.msg}") from None
    if not isinstance(raw, Mapping) or set(raw) != {"table_groups"}:
        raise _bad(path, "$", 'expected {"table_groups": [...]}')
    groups_raw = raw["table_groups"]
    if not isinstance(groups_raw, list):
        raise _bad(path, "$.table_groups", "expected a list of groups")
    exact: dict[str, TableGroup] = {}
    prefixes: dict[str, TableGroup] = {}
    groups: list[TableGroup] = []
    seen: set[str] = set()
    for i, g in enumerate(groups_raw):
        where = f"$.table_groups[{i}]"
        if not isinstance(g, Mapping):
            raise _bad(path, where, "expected an object")
        unknown = sorted(set(g) - _GROUP_KEYS)
        if unknown:
            raise _bad(path, where, f"unknown key(s) {', '.join(unknown)}")
        name = g.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(path, f"{where}.name", "expected a non-empty string")
        if name in seen:
            raise _bad(path, f"{where}.name", f"group {name!r} is defined twice")
        seen.add(name)
        if "table_names_or_prefixes" not in g:
            raise _bad(path, where, "missing table_names_or_prefixes")
        tables = _names(path, f"{where}.table_names_or_prefixes",
                        g["table_names_or_prefixes"], entries=True)
        if not tables:
            raise _bad(path, f"{where}.table_names_or_prefixes", "expected at least one table")
        group = TableGroup(
            name,
            *(frozenset(_names(path, f"{where}.{role}", g.get(role, []))) for role in
              ("readers", "writers", "admins")),
        )
        groups.append(group)
        for j, entry in enumerate(tables):
            key = entry.lower()
            target = prefixes if key.endswith("%") else exact
            stem = key[:-1] if key.endswith("%") else key
            if stem in target:
                raise _bad(path, f"{where}.table_names_or_prefixes[{j}]",
                           f"{entry!r} is already in group {target[stem].name!r}")
            target[stem] = group
    ordered = sorted(prefixes.items(), key=lambda kv: ("." not in kv[0], -len(kv[0])))
    return _Parsed(exact, ordered, tuple(groups))


class TableACL:
    """The table groups of an ACL file, reloaded when the file changes.

    Invariants: ``_parsed`` is the last content that parsed; ``_roles`` caches
    ``(user, keyspace, table) -> role`` for it and is replaced, not mutated,
    on reload (readers never see a half-built cache).
    """

    def __init__(self, parsed: _Parsed, *, path: Path | None = None,
                 poll_s: float = DEFAULT_POLL_S) -> None:
        self._parsed = parsed
        self._roles: dict[tuple[str, str, str], Role | None] = {}
        self.path = path
        self._watch = FileWatch(path, poll_s=poll_s) if path is not None else None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, *, poll_s: float = DEFAULT_POLL_S) -> TableACL:
        """Read an ACL file; InvalidArgument (naming the JSON path) when it is bad."""
        p = Path(path)
        return cls(parse_acl(_read(p), str(p)), path=p, poll_s=poll_s)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> TableACL:
        """An ACL from an in-memory mapping of the file's shape."""
        return cls(parse_acl(json.dumps(doc), "<mapping>"))

    def reload(self) -> None:
        """Read the file again now; a bad file is logged and the previous ACL stays."""
        if self.path is None:
            return
        with self._lock:
            try:
                parsed = parse_acl(_read(self.path), str(self.path))
            except InvalidArgument as exc:
                log.error("ACL file not reloaded, keeping the previous ACL: %s", exc.message)
                return
            self._parsed, self._roles = parsed, {}
            log.info("ACL file %s reloaded (%d groups)", self.path, len(parsed.groups))

    def group_of(self, keyspace: str, table: str) -> TableGroup | None:
        """The group ``keyspace.table`` belongs to (None: no group names it)."""
        parsed = self._parsed
        t = table.lower()
        q = f"{keyspace.lower()}.{t}" if keyspace else ""
        for key in (q, t):
            if key and key in parsed.exact:
                return parsed.exact[key]
        for stem, group in parsed.prefixes:
            if (q.startswith(stem) if "." in stem else t.startswith(stem)):
                return group
        return None

    def role(self, user: str, keyspace: str, table: str) -> Role | None:
        """The highest role ``user`` has on ``keyspace.table`` (None: none)."""
        if self._watch is not None and self._watch.changed():
            self.reload()
        roles = self._roles
        key = (user, keyspace, table)
        try:
            return roles[key]
        except KeyError:
            pass
        group = self.group_of(keyspace, table)
        found = group.role_of(user) if group is not None else None
        if len(roles) < 100_000:
            roles[key] = found
        return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InvalidArgument(f"ACL file {path}: cannot read it: {exc.strerror}") from None
