"""VSchema validation: Vitess's JSON shape, the V3 rules, errors naming the JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from shardgate.errors import Code, ShardgateError, VSchemaError
from shardgate.topo.model import Topology
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


# -- Vitess's protobuf JSON names, pinned, columns, require_explicit_routing, routing rules
#    (go/vt/vtgate/vindexes/vschema.go and proto/vschema.proto in vitessio/vitess)


def test_camel_case_spellings_are_accepted() -> None:
    camel = {
        "sharded": True,
        "requireExplicitRouting": False,
        "vindexes": dict(HASH),
        "tables": {
            "user": {"columnVindexes": [{"column": "id", "name": "hash"}],
                     "autoIncrement": {"column": "id", "sequence": "user_seq"},
                     "columns": [{"name": "id", "type": "INT64"}, {"name": "name"}],
                     "columnListAuthoritative": True},
        },
    }
    vs = VSchema.from_json({"user": camel,
                            "lk": {"sharded": False, "tables": {"user_seq": {"type": "sequence"}}}})
    user = vs.keyspaces["user"].tables["user"]
    assert user.primary is not None and user.primary.columns == ("id",)
    assert user.auto_increment is not None and user.auto_increment.sequence == "lk.user_seq"
    assert user.authoritative_columns == ("id", "name")
    assert vs.to_json()["user"] == camel  # the source document is kept as written
    both = ks(t={"column_vindexes": [{"column": "id", "name": "hash"}],
                 "columnVindexes": [{"column": "id", "name": "hash"}]})
    err = bad({"ks": both})
    assert err.path == "ks.tables.t" and "given twice" in err.message


def test_pinned_tables() -> None:
    vs = VSchema.from_json({"ks": ks(pin={"pinned": "80"}, pin2={"pinned": "3F01"})})
    assert vs.keyspaces["ks"].tables["pin"].pinned == b"\x80"
    assert vs.keyspaces["ks"].tables["pin2"].pinned == b"\x3f\x01"
    err = bad({"ks": ks(pin={"pinned": "8"})})
    assert err.path == "ks.tables.pin.pinned" and "could not decode" in err.message
    err = bad({"ks": ks(t={})})
    assert "pinned" in err.message  # the message names the way out
    err = bad({"ks": ks(s={"type": "sequence", "pinned": "80"})})
    assert "pinned sequence tables" in err.message


def test_columns_must_be_unique_and_well_formed() -> None:
    base: dict[str, Any] = {"column_vindexes": [{"column": "id", "name": "hash"}]}
    err = bad({"ks": ks(t={**base, "columns": [{"name": "a"}, {"name": "A"}]})})
    assert err.path == "ks.tables.t.columns[1].name" and "duplicate column" in err.message
    err = bad({"ks": ks(t={**base, "columns": [{"type": "INT64"}]})})
    assert err.path == "ks.tables.t.columns[0].name"
    err = bad({"ks": ks(t={**base, "column_list_authoritative": "yes"})})
    assert err.path == "ks.tables.t.column_list_authoritative"
    vs = VSchema.from_json({"ks": ks(t={**base, "columns": [{"name": "a"}]})})
    assert vs.keyspaces["ks"].tables["t"].authoritative_columns is None  # not authoritative


def test_require_explicit_routing() -> None:
    vs = VSchema.from_json({
        "hidden": {**ks(t={"column_vindexes": [{"column": "id", "name": "hash"}]}),
                   "require_explicit_routing": True},
        "main": {"sharded": False, "tables": {"m": {}}},
    })
    with pytest.raises(ShardgateError) as err:
        vs.find_table("t", None, None)
    assert err.value.code is Code.NOT_FOUND
    assert vs.find_table("t", "hidden", None).keyspace == "hidden"
    assert vs.find_table("t", None, "hidden").keyspace == "hidden"
    assert vs.find_table("m", None, None).keyspace == "main"
    only = VSchema.from_json({"solo": {"sharded": False, "requireExplicitRouting": True}})
    with pytest.raises(ShardgateError):
        only.find_table("x", None, None)
    assert only.find_table("x", "solo", None).keyspace == "solo"


def _routed(rules: dict[str, Any]) -> VSchema:
    return VSchema.from_json(
        {
            "user": ks(user={"column_vindexes": [{"column": "id", "name": "hash"}]},
                       old={"column_vindexes": [{"column": "id", "name": "hash"}]}),
            "main": {"sharded": False, "tables": {"user": {}}},
        },
        rules,
    )


def test_routing_rules_name_a_target() -> None:
    vs = _routed({"rules": [
        {"from_table": "user", "to_tables": ["main.user"]},
        {"fromTable": "user.old", "toTables": ["user.user"]},
        {"from_table": "gone", "to_tables": []},
    ]})
    # The bare name's rule applies only with neither a qualifier nor a default keyspace
    assert vs.routing_target("user", None, None) == ("main", "user")
    assert vs.routing_target("user", None, "user") is None
    assert vs.routing_target("old", "user", None) == ("user", "user")
    assert vs.routing_target("old", None, "user") == ("user", "user")  # default keyspace
    assert vs.routing_target("old", None, None) is None
    assert vs.routing_target("user", "user", None) is None  # no rule for user.user
    assert vs.find_table("old", "user", None).qualified == "user.old"  # find_table: no rules
    with pytest.raises(ShardgateError) as err:
        vs.routing_target("gone", None, None)
    assert err.value.code is Code.FAILED_PRECONDITION and "disabled" in err.value.message


@pytest.mark.parametrize(
    "rules,path,words",
    [
        ({"rules": [{"from_table": "t", "to_tables": ["a.t", "b.t"]}]},
         "routing_rules.rules[0].to_tables", "more than one target"),
        ({"rules": [{"from_table": "t", "to_tables": ["t"]}]},
         "routing_rules.rules[0].to_tables[0]", "qualified"),
        ({"rules": [{"from_table": "t", "to_tables": ["nope.t"]}]},
         "routing_rules.rules[0].to_tables[0]", "does not exist"),
        ({"rules": [{"from_table": "user@replica.t", "to_tables": ["main.user"]}]},
         "routing_rules.rules[0]", "tablet-type"),
        ({"rules": [{"from_table": "t", "to_tables": []}, {"from_table": "t"}]},
         "routing_rules.rules[1].from_table", "duplicate"),
        ({"rules": [{"from": "t"}]}, "routing_rules.rules[0]", "unknown field"),
        ({"rulez": []}, "routing_rules", "unknown field"),
    ],
)
def test_bad_routing_rules(rules: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(VSchemaError) as err:
        _routed(rules)
    assert err.value.path == path and words in err.value.message, err.value


def test_multi_tenant_spec_is_refused_by_name() -> None:
    err = bad({"ks": {"sharded": False, "multi_tenant_spec": {}}})
    assert "multi_tenant_spec" in err.message and "not supported" in err.message


def test_topology_carries_routing_rules() -> None:
    doc = {
        "keyspaces": {
            "main": {"shards": {"0": "sqlite:///m.db"}, "vschema": {"sharded": False}},
            "user": {"shards": {"-80": "sqlite:///a.db", "80-": "sqlite:///b.db"},
                     "vschema": ks(user={"column_vindexes": [{"column": "id", "name": "hash"}]})},
        },
        "routing_rules": {"rules": [{"from_table": "user", "to_tables": ["main.user"]}]},
    }
    topo = Topology.from_dict(doc)
    assert topo.to_dict()["routing_rules"] == doc["routing_rules"]
    assert topo.build_vschema().routing_target("user", None, None) == ("main", "user")


def test_foreign_key_mode_and_column_fields() -> None:
    for mode in ("unspecified", "disallow", "unmanaged", 2):
        VSchema.from_json({"ks": {"sharded": False, "foreignKeyMode": mode}})
    err = bad({"ks": {"sharded": False, "foreign_key_mode": "managed"}})
    assert err.path == "ks.foreign_key_mode" and "not supported" in err.message
    err = bad({"ks": {"sharded": False, "foreign_key_mode": "sometimes"}})
    assert "must be one of" in err.message
    base: dict[str, Any] = {"column_vindexes": [{"column": "id", "name": "hash"}]}
    vs = VSchema.from_json({"ks": ks(t={**base, "columns": [
        {"name": "a", "type": "VARCHAR", "collation_name": "utf8mb4_bin", "nullable": True},
        {"name": "b", "type": 265}]})})  # protobuf JSON may give query.Type as a number
    assert [c.type for c in vs.keyspaces["ks"].tables["t"].columns] == ["VARCHAR", "265"]
    err = bad({"ks": ks(t={**base, "columns": [{"name": "a", "bogus": 1}]})})
    assert err.path == "ks.tables.t.columns[0]" and "unknown field" in err.message
