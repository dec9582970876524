"""shardgate's requirements for SQLAlchemy's dialect compliance suite.

:class:`Requirements` starts from SQLAlchemy's ``SuiteRequirements`` and
changes two kinds of answers, each with its reason:

* **What a MySQL 8 server is** (the listener reports ``8.0.31`` and clients
  use the stock ``mysql+pymysql`` dialect). SQLAlchemy's defaults describe no
  particular database; its own test requirements give MySQL the answers below
  (features MySQL has are opened, features it lacks closed). These say nothing
  about sharding: a single MySQL server gets the same.
* **What a sharded database cannot do** (the section at the end), closed
  with the reason a gate in front of many databases cannot give the
  single-server behaviour. Some apply only when the suite's keyspace is
  sharded (read from ``SHOW VITESS_SHARDS``).

Anything not named here keeps SuiteRequirements' answer.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.testing import exclusions
from sqlalchemy.testing.requirements import SuiteRequirements

_sharded: dict[str, bool] = {}


def _test_keyspace_sharded(config: Any) -> bool:
    """Whether the suite's keyspace (``test``) has more than one shard."""
    url = str(config.db.url)
    if url not in _sharded:
        with config.db.connect() as conn:
            rows = conn.execute(text("SHOW VITESS_SHARDS")).all()
        shards = [str(r[0]) for r in rows if str(r[0]).startswith("test/")]
        _sharded[url] = len(shards) > 1
    return _sharded[url]


def _when_sharded(reason: str) -> exclusions.compound:
    return exclusions.skip_if(_test_keyspace_sharded, reason)


class _Truthful(exclusions.compound):  # type: ignore[misc]
    """A requirement that is true when it holds (a plain ``compound`` is always true).

    ``HasTableTest.define_tables`` (SQLAlchemy 2.1) writes
    ``if testing.requires.view_reflection:`` without ``.enabled``, so its fixture
    creates views even when the requirement is closed; this makes that test
    read the answer the requirement gives, as the fixture's author meant.
    """

    def __bool__(self) -> bool:
        return bool(self.enabled)


class Requirements(SuiteRequirements):  # type: ignore[misc]
    """SuiteRequirements with MySQL 8's answers and the limits of a sharded database."""

    # -- a MySQL 8 server has these (SQLAlchemy's defaults close them) ----------------

    @property
    def unique_constraints_reflect_as_index(self) -> exclusions.compound:
        """MySQL implements a UNIQUE constraint as a unique index."""
        return exclusions.open()

    @property
    def unique_index_reflect_as_unique_constraints(self) -> exclusions.compound:
        """MySQL cannot tell a unique index from a UNIQUE constraint: the dialect reports
        each unique index as a unique constraint too."""
        return exclusions.open()

    @property
    def foreign_keys_reflect_as_index(self) -> exclusions.compound:
        """MySQL (InnoDB) creates an index for each foreign key."""
        return exclusions.open()

    @property
    def foreign_key_constraint_name_reflection(self) -> exclusions.compound:
        """MySQL reflects foreign key names (SHOW CREATE TABLE has them)."""
        return exclusions.open()

    @property
    def comment_reflection(self) -> exclusions.compound:
        """MySQL keeps table and column comments."""
        return exclusions.open()

    @property
    def check_constraint_reflection(self) -> exclusions.compound:
        """MySQL 8.0.16+ keeps CHECK constraints and shows them."""
        return exclusions.open()

    @property
    def foreign_key_constraint_option_reflection_ondelete(self) -> exclusions.compound:
        """MySQL shows ON DELETE of a foreign key."""
        return exclusions.open()

    @property
    def foreign_key_constraint_option_reflection_onupdate(self) -> exclusions.compound:
        """MySQL shows ON UPDATE of a foreign key."""
        return exclusions.open()

    @property
    def reflect_table_options(self) -> exclusions.compound:
        """MySQL has table options (ENGINE, CHARSET, ...), and the dialect reflects them."""
        return exclusions.open()

    @property
    def tuple_in(self) -> exclusions.compound:
        """MySQL takes ``(a, b) IN ((1, 2), ...)``."""
        return exclusions.open()

    @property
    def mod_operator_as_percent_sign(self) -> exclusions.compound:
        """MySQL's modulus is ``%``."""
        return exclusions.open()

    @property
    def savepoints(self) -> exclusions.compound:
        """MySQL has savepoints (the gate runs them on every shard of the transaction)."""
        return exclusions.open()

    # -- a MySQL 8 server lacks these (SQLAlchemy's defaults open them) ----------------

    @property
    def datetime_microseconds(self) -> exclusions.compound:
        """MySQL's DATETIME without a precision (the dialect's DateTime) keeps whole
        seconds."""
        return exclusions.closed()

    @property
    def time_microseconds(self) -> exclusions.compound:
        """MySQL's TIME without a precision keeps whole seconds."""
        return exclusions.closed()

    @property
    def datetime_implicit_bound(self) -> exclusions.compound:
        """PyMySQL binds dates as strings; MySQL returns a bound string as a string."""
        return exclusions.closed()

    @property
    def unbounded_varchar(self) -> exclusions.compound:
        """MySQL's VARCHAR needs a length."""
        return exclusions.closed()

    @property
    def date_implicit_bound(self) -> exclusions.compound:
        """PyMySQL binds dates as strings; MySQL returns a bound string as a string."""
        return exclusions.closed()

    @property
    def time_implicit_bound(self) -> exclusions.compound:
        """PyMySQL binds times as strings; MySQL returns a bound string as a string."""
        return exclusions.closed()

    @property
    def sql_expression_limit_offset(self) -> exclusions.compound:
        """MySQL's LIMIT and OFFSET take constants or placeholders, not expressions."""
        return exclusions.closed()

    @property
    def precision_generic_float_type(self) -> exclusions.compound:
        """MySQL's FLOAT is single precision: about six significant digits."""
        return exclusions.closed()

    # -- what a sharded database cannot do ----------------------------------------------

    @property
    def temporary_tables(self) -> exclusions.compound:
        """A temporary table lives in one database connection. A gate session runs each
        statement on a pooled connection of each shard it touches (outside a transaction
        the next statement may get another one), so a temporary table created by one
        statement is not there for the next: the gate cannot give a session a table
        that only its connection sees (Vitess pins a "reserved connection" for this).
        The gate refuses CREATE TEMPORARY TABLE (Unsupported)."""
        return exclusions.closed()

    @property
    def cross_schema_fk_reflection(self) -> exclusions.compound:
        """A foreign key to a table of another keyspace: keyspaces are separate
        databases (often on separate servers), which cannot check a constraint between
        them; the gate refuses such a CREATE TABLE (Unsupported)."""
        return exclusions.closed()

    @property
    def temp_table_reflection(self) -> exclusions.compound:
        """See ``temporary_tables``."""
        return exclusions.closed()

    # -- only when the suite's keyspace is sharded --------------------------------------

    @property
    def views(self) -> exclusions.compound:
        """MySQL has views (the shards' own; SHOW FULL TABLES and SHOW CREATE TABLE
        return them). Not in a sharded keyspace: a view is a query stored in each
        shard's database, where it sees only that shard's rows, so the gate refuses
        CREATE VIEW there (Unsupported); Vitess does not shard views either."""
        return _when_sharded("a view in a sharded keyspace would see one shard's rows")

    @property
    def view_reflection(self) -> exclusions.compound:
        """As ``views`` (SuiteRequirements' answer), but truthful: see :class:`_Truthful`."""
        rule = _Truthful()
        rule.skips.update(self.views.skips)
        rule.fails.update(self.views.fails)
        return rule

    @property
    def foreign_keys(self) -> exclusions.compound:
        """Each shard's database checks a foreign key against its own rows only: in a
        sharded keyspace a child row and its parent are on different shards unless both
        tables are sharded by the same key with the same values (Vitess supports only
        such shard-scoped foreign keys), so an insert the constraint allows on one
        server fails on a shard."""
        return _when_sharded("foreign keys are checked per shard")

    @property
    def autoincrement_insert(self) -> exclusions.compound:
        """An insert may leave the AUTO_INCREMENT key to the database. In a sharded
        keyspace too: the gate computes a row's shard from its sharding column before
        the row exists, so ``auto_shard`` (with ``sequence_keyspace``) gives a table
        whose key is AUTO_INCREMENT a sequence the gate takes the key from (Vitess's
        answer; a shard's own counter would repeat values across shards)."""
        return exclusions.open()

    @property
    def emulated_lastrowid(self) -> exclusions.compound:
        """MySQL returns the AUTO_INCREMENT value of an insert (cursor.lastrowid); a
        sequence value the gate gave is returned the same way."""
        return exclusions.open()

    @property
    def dbapi_lastrowid(self) -> exclusions.compound:
        """PyMySQL's cursor has ``lastrowid``; see ``emulated_lastrowid``."""
        return exclusions.open()
