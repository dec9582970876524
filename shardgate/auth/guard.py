"""The one place the gate asks "may this caller run this statement?".

:meth:`Guard.authorize` is called by the gate for every statement a caller
sends (``Gate.execute``, ``Gate.stream_execute``), before planning:

1. the statement's :func:`~shardgate.auth.rules.analyze` verdict (kind,
   deny-list, tables with the role each needs), cached per text;
2. writes to the gate's own tables (sequence tables, lookup vindex tables)
   need the admin role: the gate maintains them itself;
3. with a table ACL, the caller's role on every table, checked against the
   :class:`~shardgate.auth.acl.TableACL`; in dry-run mode a denial is counted
   (``shardgate_acl_denials_total{dry_run="true"}``) and logged, not raised;
4. with a table ACL, for a caller below admin: every function it calls must be
   on the allow-list of the dialect of every keyspace the statement reaches
   (:mod:`~shardgate.auth.functions`), every catalog it reads among the views
   such a caller may read (:mod:`~shardgate.auth.catalogs`), and it may not
   call schema-qualified (user) functions or SHOW the server's state.

**Admin** (rule 4) means the admin role on every table the statement names,
or, when it names no table (``SELECT pg_sleep(1)``, a catalog read), the
admin role on the session keyspace's unnamed entry, which only a group for
``%`` grants (as for ``ALTER VSCHEMA``'s vindex forms).

The caller :data:`~shardgate.auth.identity.TRUSTED` (``None`` here means the
same) is the gate's own work and trusted in-process code (embedded use,
``shardgate up``'s setup): rules 1 apply, 2 and 3 do not. Front doors always
pass the caller's :class:`Identity`.
Without an ACL every identity may touch every table (rule 1 still applies).

Invariants: ``_access`` maps statement text to its verdict (an
:class:`Access` or the ``PermissionDenied`` message) and is bounded by
clearing; ``_resolved`` maps ``(text, session keyspace)`` to the tables with
their keyspace resolved and the gate-table rule applied, and why a caller
below admin is refused on the dialects reached, for the VSchema in
``_vschema`` (a new VSchema clears it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from shardgate.auth import catalogs, functions
from shardgate.auth.acl import Role, TableACL
from shardgate.auth.identity import Identity, Trusted
from shardgate.auth.rules import Access, analyze
from shardgate.errors import PermissionDenied
from shardgate.planner.target import session_keyspace
from shardgate.vindexes.lookup import LookupBase
from shardgate.vschema import TableType, VSchema

log = logging.getLogger(__name__)

DENIALS = Counter(
    "shardgate_acl_denials", "Statements the table ACL denied (or would deny, dry run)",
    ("role", "dry_run"),
)
#: Statement texts whose verdict is kept (the plan cache's order of size).
CACHE_SIZE = 10_000


#: The shard dialect of a keyspace (None: not known), as the gate answers it.
DialectOf = Callable[[str], "str | None"]


@dataclass(frozen=True)
class _Need:
    keyspace: str
    table: str
    role: Role


@dataclass(frozen=True)
class _Resolved:
    """One statement's checks in one session keyspace (see the module docstring)."""

    needs: tuple[_Need, ...]
    #: why a caller below admin may not run it (None: such a caller may)
    below_admin: str | None
    #: the keyspace whose unnamed entry decides "admin" when no table is named
    home: str


class Guard:
    """Statement rules and table ACLs for one gate (see the module docstring)."""

    def __init__(self, acl: TableACL | None = None, *, dry_run: bool = False) -> None:
        self.acl = acl
        self.dry_run = dry_run
        self._access: dict[str, Access | str] = {}
        self._resolved: dict[tuple[str, str | None], _Resolved] = {}
        self._vschema: VSchema | None = None
        self._gate_tables: frozenset[tuple[str, str]] = frozenset()

    def access(self, sql: str) -> Access:
        """The verdict of :func:`analyze` for ``sql``, cached (denials too)."""
        found = self._access.get(sql)
        if found is None:
            try:
                found = analyze(sql)
            except PermissionDenied as exc:
                found = exc.message
            if len(self._access) >= CACHE_SIZE:
                self._access.clear()
            self._access[sql] = found
        if isinstance(found, str):
            raise PermissionDenied(found)
        return found

    def authorize(
        self, identity: Identity | Trusted | None, sql: str, keyspace: str | None,
        vschema: VSchema, dialect_of: DialectOf | None = None,
    ) -> None:
        """Raise PermissionDenied unless ``identity`` may run ``sql`` in ``keyspace``.

        ``dialect_of`` names each keyspace's shard dialect (rule 4); without it the
        dialects are not known and a caller below admin may call only what every
        dialect allows and read no catalog.
        """
        access = self.access(sql)
        if not isinstance(identity, Identity) or self.acl is None:
            return
        resolved = self._needs(sql, keyspace, access, vschema, dialect_of)
        acl = self.acl
        admin = True
        for need in resolved.needs:
            have = acl.role(identity.user, need.keyspace, need.table)
            if have is None or have < need.role:
                self._deny(identity, need, have, acl)
            if have is not Role.ADMIN:
                admin = False
        if resolved.below_admin is not None:
            self._below_admin(identity, resolved, admin, acl)

    def _below_admin(self, identity: Identity, resolved: _Resolved, admin: bool,
                     acl: TableACL) -> None:
        """Rule 4: PermissionDenied unless the caller is admin (module docstring)."""
        if not resolved.needs:
            admin = acl.role(identity.user, resolved.home, "") is Role.ADMIN
        if admin:
            return
        message = f"user {identity.user!r} needs the admin role to {resolved.below_admin}"
        DENIALS.labels(Role.ADMIN.label, str(self.dry_run).lower()).inc()
        if self.dry_run:
            log.warning("ACL dry run, would deny: %s", message)
            return
        raise PermissionDenied(message)

    def require(
        self, identity: Identity | Trusted | None, keyspace: str, tables: Iterable[str],
        role: Role,
    ) -> None:
        """Raise PermissionDenied unless ``identity`` has ``role`` on every table of
        ``keyspace`` named (queue receive/ack, change streams: what no statement names)."""
        if not isinstance(identity, Identity) or self.acl is None:
            return
        for table in tables:
            need = _Need(keyspace, table, role)
            have = self.acl.role(identity.user, keyspace, table)
            if have is None or have < role:
                self._deny(identity, need, have, self.acl)

    def allows(
        self, identity: Identity | Trusted | None, keyspace: str, table: str, role: Role
    ) -> bool:
        """Whether ``identity`` has ``role`` on ``keyspace.table`` (lists shown to a caller,
        such as SHOW TABLES, leave out what it may not read; nothing is counted or logged)."""
        if not isinstance(identity, Identity) or self.acl is None or self.dry_run:
            return True
        have = self.acl.role(identity.user, keyspace, table)
        return have is not None and have >= role

    def _deny(self, identity: Identity, need: _Need, have: Role | None, acl: TableACL) -> None:
        name = f"{need.keyspace}.{need.table}" if need.keyspace else need.table
        group = acl.group_of(need.keyspace, need.table)
        where = (f"table group {group.name!r}" if group is not None
                 else "no table group names it")
        has = f"has {have.label}" if have is not None else "has no role"
        gate_table = (need.keyspace.lower(), need.table.lower()) in self._gate_tables
        why = " (the gate maintains this table itself)" if gate_table else ""
        message = (f"user {identity.user!r} needs the {need.role.label} role on table "
                   f"{name}{why} ({where}; the user {has})")
        DENIALS.labels(need.role.label, str(self.dry_run).lower()).inc()
        if self.dry_run:
            log.warning("ACL dry run, would deny: %s", message)
            return
        raise PermissionDenied(message)

    def _needs(
        self, sql: str, keyspace: str | None, access: Access, vschema: VSchema,
        dialect_of: DialectOf | None,
    ) -> _Resolved:
        if vschema is not self._vschema:
            self._vschema = vschema
            self._gate_tables = gate_tables(vschema)
            self._resolved = {}
        key = (sql, keyspace)
        found = self._resolved.get(key)
        if found is not None:
            return found
        session_ks = session_keyspace(keyspace) or ""
        needs = []
        for use in access.tables:
            ks = use.keyspace or session_ks or _home(vschema, use.table)
            role = use.role
            if role is Role.WRITER and (ks.lower(), use.table.lower()) in self._gate_tables:
                role = Role.ADMIN
            needs.append(_Need(ks, use.table, role))
        dialects = {dialect_of(ks) if dialect_of is not None and ks else None
                    for ks in {session_ks} | {n.keyspace for n in needs}}
        if len(self._resolved) >= CACHE_SIZE:
            self._resolved.clear()
        found = self._resolved[key] = _Resolved(
            tuple(needs), _below_admin(access, dialects), session_ks)
        return found


def _below_admin(access: Access, dialects: set[str | None]) -> str | None:
    """Why a caller below admin may not run ``access`` on shards of ``dialects`` (None:
    it may). A dialect not known (None) allows what every dialect allows."""
    if access.admin_only:
        return access.admin_only[0]
    for dialect in sorted(dialects, key=str):
        names = (access.functions.get(dialect) if dialect is not None else
                 frozenset().union(*access.functions.values())) or frozenset()
        for name in sorted(names):
            if not functions.allowed(name, dialect):
                where = f"the {dialect} allow-list" if dialect else "every dialect's allow-list"
                return (f"call {name}(): it is not on {where} of functions a caller below "
                        "admin may call (docs/security.md)")
    known = frozenset(d for d in dialects if d is not None)
    for name in access.catalogs:
        if None in dialects or not catalogs.readable(name, known):
            return (f"read catalog {name}: it is not among the catalog views a caller below "
                    "admin may read (docs/security.md)")
    return None


def gate_tables(vschema: VSchema) -> frozenset[tuple[str, str]]:
    """``(keyspace, table)`` of every sequence table and lookup vindex table, lower-cased."""
    out: set[tuple[str, str]] = set()
    for ks in vschema.keyspaces.values():
        for t in ks.tables.values():
            if t.type == TableType.SEQUENCE:
                out.add((ks.name.lower(), t.name.lower()))
        for vindex in ks.vindexes.values():
            if isinstance(vindex, LookupBase):
                owner_ks, _, table = vindex.table.rpartition(".")
                out.add(((owner_ks or ks.name).lower(), table.lower()))
    return frozenset(out)


def _home(vschema: VSchema, table: str) -> str:
    """The one keyspace whose VSchema has ``table`` ("" if none or several)."""
    homes = [ks.name for ks in vschema.keyspaces.values() if table.lower() in
             {t.lower() for t in ks.tables}]
    return homes[0] if len(homes) == 1 else ""
