"""VSchema changes as pure functions (shardgate.topo.vschema_edits), with ALTER VSCHEMA text."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError, VSchemaError
from shardgate.sql.classify import classify
from shardgate.sql.statements import AlterVSchema
from shardgate.topo.vschema_edits import (
    alter,
    dependents,
    drop_table,
    drop_table_cascade,
    set_vindex_params,
)
from shardgate.vschema import VSchema

COMMERCE: dict[str, Any] = {
    "sharded": True,
    "vindexes": {
        "hash": {"type": "hash"},
        "email_idx": {"type": "consistent_lookup_unique", "owner": "customer",
                      "params": {"table": "lookup.customer_email_idx", "from": "email",
                                 "to": "keyspace_id"}},
    },
    "tables": {
        "customer": {"column_vindexes": [{"column": "customer_id", "name": "hash"},
                                         {"column": "email", "name": "email_idx"}],
                     "auto_increment": {"column": "customer_id", "sequence": "customer_seq"}},
        "corder": {"column_vindexes": [{"column": "customer_id", "name": "hash"},
                                       {"column": "email", "name": "email_idx"}]},
    },
}
LOOKUP: dict[str, Any] = {"sharded": False, "tables": {"customer_seq": {"type": "sequence"}}}


def run(doc: dict[str, Any], sql: str, keyspace: str = "commerce") -> dict[str, Any]:
    stmt = classify(sql)
    assert isinstance(stmt, AlterVSchema)
    before = copy.deepcopy(doc)
    out = alter(doc, stmt, keyspace)
    assert doc == before, "the input document must not change"
    return out


def valid(commerce: dict[str, Any], lookup: dict[str, Any] = LOOKUP) -> VSchema:
    return VSchema.from_json({"commerce": commerce, "lookup": lookup})


def test_add_vindex_creates_the_table_and_the_vindex() -> None:
    out = run(COMMERCE, "ALTER VSCHEMA ON note ADD VINDEX xx(customer_id) USING xxhash")
    assert out["vindexes"]["xx"] == {"type": "xxhash"}
    assert out["tables"]["note"] == {"column_vindexes": [{"column": "customer_id",
                                                          "name": "xx"}]}
    assert valid(out).keyspace("commerce").tables["note"].primary is not None
    # an existing vindex: by name alone, or with the same type
    out = run(COMMERCE, "ALTER VSCHEMA ON note ADD VINDEX hash(customer_id)")
    out = run(out, "ALTER VSCHEMA ON note ADD VINDEX email_idx(email)")
    assert [cv["name"] for cv in out["tables"]["note"]["column_vindexes"]] == ["hash",
                                                                               "email_idx"]
    valid(out)


@pytest.mark.parametrize(
    "sql,code,detail",
    [
        ("ALTER VSCHEMA ON note ADD VINDEX nope(a)", Code.NOT_FOUND, "give its type"),
        ("ALTER VSCHEMA ON note ADD VINDEX hash(a) USING xxhash", Code.INVALID_ARGUMENT,
         "defined with type 'hash'"),
        ("ALTER VSCHEMA ON customer ADD VINDEX hash(customer_id)", Code.ALREADY_EXISTS,
         "already has vindex"),
        ("ALTER VSCHEMA ADD TABLE t", Code.INVALID_ARGUMENT, "is sharded"),
        ("ALTER VSCHEMA ADD SEQUENCE s", Code.INVALID_ARGUMENT, "unsharded"),
        ("ALTER VSCHEMA ON nope DROP VINDEX hash", Code.NOT_FOUND, "not in the VSchema"),
        ("ALTER VSCHEMA ON customer DROP VINDEX nope", Code.NOT_FOUND, "has no vindex"),
        ("ALTER VSCHEMA DROP VINDEX hash", Code.FAILED_PRECONDITION, "used by table(s)"),
        ("ALTER VSCHEMA CREATE VINDEX hash USING hash", Code.ALREADY_EXISTS, "already exists"),
        ("ALTER VSCHEMA DROP TABLE customer", Code.FAILED_PRECONDITION, "owns vindex"),
        ("ALTER VSCHEMA DROP TABLE nope", Code.NOT_FOUND, "not in the VSchema"),
        ("ALTER VSCHEMA ON customer ADD AUTO_INCREMENT id USING s", Code.ALREADY_EXISTS,
         "already has an auto_increment"),
        ("ALTER VSCHEMA ON corder DROP AUTO_INCREMENT", Code.NOT_FOUND, "no auto_increment"),
        ("ALTER VSCHEMA ON corder ADD VINDEX v(a) USING lookup WITH owner=customer",
         Code.INVALID_ARGUMENT, "the owner must be"),
    ],
)
def test_refusals(sql: str, code: Code, detail: str) -> None:
    with pytest.raises(ShardgateError) as err:
        run(COMMERCE, sql)
    assert err.value.code is code
    assert detail in err.value.message


def test_invalid_results_are_caught_by_validation_with_their_path() -> None:
    # a non-unique primary vindex: the edit is structurally fine, the VSchema is not
    out = run(COMMERCE, "ALTER VSCHEMA ON note ADD VINDEX cl(email) USING consistent_lookup "
                        "WITH table=lookup.note_cl, from=email, to=keyspace_id")
    with pytest.raises(VSchemaError) as err:
        valid(out)
    assert "commerce.tables.note.column_vindexes[0]" in err.value.message
    out = run(COMMERCE, "ALTER VSCHEMA ON note ADD VINDEX h2(a) USING no_such_type")
    with pytest.raises(VSchemaError) as err:
        valid(out)
    assert "commerce.vindexes.h2.type" in err.value.message


def test_drop_column_vindex_drops_what_is_left_unused() -> None:
    out = run(COMMERCE, "ALTER VSCHEMA ON corder DROP VINDEX email_idx")
    assert out["vindexes"]["email_idx"]["owner"] == "customer"  # customer still uses it
    out = run(out, "ALTER VSCHEMA ON customer DROP VINDEX email_idx")
    assert "email_idx" not in out["vindexes"]
    out = run(out, "ALTER VSCHEMA ON corder DROP VINDEX hash")
    assert "corder" not in out["tables"] and "hash" in out["vindexes"]
    valid(out)


def test_lookup_owner_and_write_only() -> None:
    out = run(COMMERCE, "ALTER VSCHEMA ON customer ADD VINDEX name_idx(name) USING "
                        "consistent_lookup WITH table='lookup.name_idx', from=name, "
                        "to=keyspace_id, write_only=true, owner=customer")
    assert out["vindexes"]["name_idx"] == {
        "type": "consistent_lookup", "owner": "customer",
        "params": {"table": "lookup.name_idx", "from": "name", "to": "keyspace_id",
                   "write_only": "true"}}
    vs = valid(out)
    cv = vs.keyspace("commerce").tables["customer"].column_vindexes[-1]
    assert cv.owned
    out = set_vindex_params(out, "commerce", "name_idx", {"write_only": None})
    assert "write_only" not in out["vindexes"]["name_idx"]["params"]


def test_sequences_and_unsharded_tables() -> None:
    out = run(LOOKUP, "ALTER VSCHEMA ADD SEQUENCE note_seq", "lookup")
    out = run(out, "ALTER VSCHEMA ADD TABLE settings", "lookup")
    assert out["tables"]["note_seq"] == {"type": "sequence"}
    assert out["tables"]["settings"] == {}
    commerce = run(COMMERCE, "ALTER VSCHEMA ON note ADD VINDEX hash(id)")
    commerce = run(commerce, "ALTER VSCHEMA ON note ADD AUTO_INCREMENT id USING note_seq")
    vs = valid(commerce, out)
    ai = vs.keyspace("commerce").tables["note"].auto_increment
    assert ai is not None and ai.sequence == "lookup.note_seq"
    out = run(out, "ALTER VSCHEMA DROP TABLE settings", "lookup")
    assert "settings" not in out["tables"]
    with pytest.raises(ShardgateError) as err:
        run(out, "ALTER VSCHEMA ADD TABLE note_seq", "lookup")
    assert err.value.code is Code.ALREADY_EXISTS


def test_dependents_and_cascade() -> None:
    docs = {"commerce": COMMERCE, "lookup": {**LOOKUP, "tables": {
        **LOOKUP["tables"], "customer_email_idx": {}}}}
    deps = dependents(docs, "commerce", "customer")
    assert deps.owned == (("email_idx", "lookup.customer_email_idx"),)
    assert "owns lookup vindex(es) email_idx" in deps.describe()
    assert dependents(docs, "lookup", "customer_email_idx").backing == (("commerce",
                                                                          "email_idx"),)
    assert dependents(docs, "lookup", "customer_seq").sequence_users == ("commerce.customer",)
    assert not dependents(docs, "commerce", "corder")

    changed = drop_table_cascade(docs, "commerce", "customer")
    assert set(changed) == {"commerce", "lookup"}
    assert "customer" not in changed["commerce"]["tables"]
    assert "email_idx" not in changed["commerce"]["vindexes"]
    assert changed["commerce"]["tables"]["corder"]["column_vindexes"] == [
        {"column": "customer_id", "name": "hash"}]
    assert "customer_email_idx" not in changed["lookup"]["tables"]
    VSchema.from_json({**docs, **changed})
    # the sequence: the auto_increment goes with it
    changed = drop_table_cascade(docs, "lookup", "customer_seq")
    assert "auto_increment" not in changed["commerce"]["tables"]["customer"]
    VSchema.from_json({**docs, **changed})
    # a table whose primary vindex would go: refused, nothing changed
    primary = copy.deepcopy(COMMERCE)
    primary["tables"]["by_email"] = {"column_vindexes": [{"column": "email",
                                                          "name": "email_idx"}]}
    with pytest.raises(ShardgateError) as err:
        drop_table_cascade({**docs, "commerce": primary}, "commerce", "customer")
    assert err.value.code is Code.FAILED_PRECONDITION
    assert "primary vindex of table commerce.by_email" in err.value.message


def test_drop_table_if_exists() -> None:
    assert drop_table(LOOKUP, "lookup", "nope", if_exists=True) == LOOKUP
