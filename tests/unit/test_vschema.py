"""VSchema validation: Vitess's JSON shape, the V3 rules, errors naming the JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError, VSchemaError
from shardgate.vschema import VSchema

HASH = {"hash": {"type": "hash"}}


def ks(**tables: Any) -> dict[str, Any]:
    return {"sharded": True, "vindexes": dict(HASH), "tables": tables}


def bad(docs: dict[str, Any]) -> VSchemaError:
    with pytest.raises(VSchemaError) as err:
        VSchema.from_json(docs)
    assert err.value.code is Code.INVALID_ARGUMENT
    return err.value


def test_vitess_shape_is_accepted_unchanged() -> None:
    doc = {
        "sharded": True,
        "vindexes": {
            "hash": {"type": "hash"},
            "name_idx": {"type": "lookup", "owner": "user",
                         "params": {"table": "lk.name_idx", "from": "name", "to": "keyspace_id",
                                    "autocommit": "true"}},
            "mc": {"type": "multicol", "params": {"column_count": "2",
                                                 "column_vindex": "hash,hash"}},
        },
        "tables": {
            "user": {"column_vindexes": [{"column": "id", "name": "hash"},
                                         {"column": "name", "name": "name_idx"}],
                     "auto_increment": {"column": "id", "sequence": "user_seq"}},
            "ev": {"column_vindexes": [{"columns": ["a", "b"], "name": "mc"}]},
            "countries": {"type": "reference"},
            "q": {"type": "queue", "column_vindexes": [{"column": "id", "name": "hash"}],
                  "queue": {"ack_wait": "30s"}},
        },
    }
    vs = VSchema.from_json({"user": doc, "lk": {"sharded": False,
                                                "tables": {"user_seq": {"type": "sequence"}}}})
    user = vs.keyspaces["user"].tables["user"]
    assert user.primary is not None and user.primary.name == "hash"
    assert [cv.name for cv in user.owned_vindexes] == ["name_idx"]
    assert user.auto_increment is not None and user.auto_increment.sequence == "lk.user_seq"
    assert vs.keyspaces["user"].tables["ev"].primary.columns == ("a", "b")  # type: ignore[union-attr]
    assert vs.keyspaces["user"].tables["q"].options == {"ack_wait": "30s"}
    assert vs.to_json()["user"] == doc


@pytest.mark.parametrize(
    "doc,path,words",
    [
        ({"sharded": "yes"}, "ks.sharded", "true or false"),
        ({"sharded": True, "tablez": {}}, "ks", "unknown field"),
        ({"sharded": True, "vindexes": {"v": {"type": "nope"}}}, "ks.vindexes.v.type",
         "known types"),
        ({"sharded": True, "vindexes": {"v": {"type": "hash", "params": {"x": 1}}}},
         "ks.vindexes.v.params.x", "string"),
        ({"sharded": True, "vindexes": {"v": {"type": "lookup", "params": {}}}},
         "ks.vindexes.v.params", "is required"),
        (ks(t={}), "ks.tables.t.column_vindexes", "at least one column vindex"),
        (ks(t={"column_vindexes": [{"column": "id", "name": "nope"}]}),
         "ks.tables.t.column_vindexes[0].name", "not defined"),
        (ks(t={"column_vindexes": [{"name": "hash"}]}), "ks.tables.t.column_vindexes[0]",
         "exactly one of"),
        (ks(t={"column_vindexes": [{"columns": ["a", "b"], "name": "hash"}]}),
         "ks.tables.t.column_vindexes[0].columns", "takes one column"),
        (ks(t={"type": "view", "column_vindexes": []}), "ks.tables.t.type", "unknown table type"),
        (ks(s={"type": "sequence"}), "ks.tables.s.type", "unsharded keyspace"),
        (ks(t={"column_vindexes": [{"column": "id", "name": "hash"}],
               "auto_increment": {"column": "id", "sequence": "nope_seq"}}),
         "ks.tables.t.auto_increment.sequence", "not defined"),
    ],
)
def test_invalid_vschemas_name_the_path(doc: dict[str, Any], path: str, words: str) -> None:
    err = bad({"ks": doc})
    assert err.path == path, err
    assert words in err.message, err


def test_primary_vindex_must_be_unique() -> None:
    doc = ks(t={"column_vindexes": [{"column": "name", "name": "nu"}]})
    doc["vindexes"]["nu"] = {"type": "lookup",
                             "params": {"table": "lk.t", "from": "name", "to": "ksid"}}
    err = bad({"ks": doc})
    assert err.path == "ks.tables.t.column_vindexes[0]" and "must be unique" in err.message


def test_owned_primary_vindex_cannot_be_a_lookup() -> None:
    doc = ks(t={"column_vindexes": [{"column": "name", "name": "lu"}]})
    doc["vindexes"]["lu"] = {"type": "lookup_unique", "owner": "t",
                             "params": {"table": "lk.t", "from": "name", "to": "ksid"}}
    err = bad({"ks": doc})
    assert "must be functional" in err.message


def test_owner_must_be_a_table_of_the_keyspace() -> None:
    doc = ks()
    doc["vindexes"]["lu"] = {"type": "lookup_unique", "owner": "ghost",
                             "params": {"table": "lk.t", "from": "name", "to": "ksid"}}
    err = bad({"ks": doc})
    assert err.path == "ks.vindexes.lu.owner"


def test_table_resolution_and_ambiguity() -> None:
    vs = VSchema.from_json({
        "a": ks(t={"column_vindexes": [{"column": "id", "name": "hash"}]},
                shared={"column_vindexes": [{"column": "id", "name": "hash"}]}),
        "b": {"sharded": False, "tables": {"shared": {}}},
    })
    assert vs.find_table("t", None, None).keyspace == "a"
    assert vs.find_table("shared", None, "b").keyspace == "b"  # default keyspace first
    assert vs.find_table("shared", "a", None).keyspace == "a"  # qualified
    with pytest.raises(ShardgateError) as err:
        vs.find_table("shared", None, None)
    assert err.value.code is Code.INVALID_ARGUMENT and "qualify" in err.value.message
    # unsharded keyspaces route tables they do not list
    assert vs.find_table("anything", None, "b").keyspace == "b"
    with pytest.raises(ShardgateError) as err:
        vs.find_table("anything", None, "a")
    assert err.value.code is Code.NOT_FOUND
