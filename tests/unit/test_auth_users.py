"""The static users file: shape, errors naming the JSON path, rotation, reload."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardgate.auth import ANONYMOUS, Identity, StaticUsers
from shardgate.auth.users import native_password_hash
from shardgate.errors import (
    Code,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    error_for_code,
)

# MySQL's PASSWORD('secret')
SECRET_NATIVE = "*14E65567ABDB5135D0CFD9A70B3032C179A49EE7"


def write(path: Path, content: object) -> Path:
    path.write_text(json.dumps(content))
    return path


def test_native_hash_is_mysqls() -> None:
    assert "*" + native_password_hash("secret").hex().upper() == SECRET_NATIVE


def test_password_and_native_entries_authenticate(tmp_path: Path) -> None:
    users = StaticUsers.load(write(tmp_path / "u.json", {
        "alice": [{"Password": "pw1", "UserData": "team-a"}],
        "bob": [{"MysqlNativePassword": SECRET_NATIVE}, {"Password": "next"}],
        "carol": {"Password": "single"},
    }))
    assert users.authenticate("alice", "pw1") == Identity("alice", "team-a", "password")
    assert users.authenticate("bob", "secret").user == "bob"
    assert users.authenticate("bob", "next").user == "bob"
    assert users.authenticate("carol", "single").user == "carol"
    for user, pw in [("alice", "pw2"), ("bob", "pw1"), ("nobody", "pw1"), ("alice", "")]:
        with pytest.raises(Unauthenticated) as info:
            users.authenticate(user, pw)
        assert info.value.code is Code.UNAUTHENTICATED
        assert pw not in info.value.message or not pw
    assert users.native_password_hashes("bob") == [
        native_password_hash("secret"), native_password_hash("next")
    ]
    assert users.plain_passwords("bob") == ["next"]
    assert users.plain_passwords("nobody") == []
    assert "pw1" not in repr(users) and "pw1" not in repr(users._users)


@pytest.mark.parametrize(("content", "where"), [
    ("{not json", "line 1"),
    ([], "$:"),
    ({"a": []}, "$.a:"),
    ({"a": [{"UserData": "x"}]}, "$.a[0]:"),
    ({"a": [{"Password": "x"}, {"Password": 3}]}, "$.a[1].Password"),
    ({"a": [{"MysqlNativePassword": "*12"}]}, "$.a[0].MysqlNativePassword"),
    ({"a": [{"Password": "x", "Pasword": "y"}]}, "unknown key(s) Pasword"),
])
def test_bad_file_names_the_json_path(tmp_path: Path, content: object, where: str) -> None:
    path = tmp_path / "u.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InvalidArgument) as info:
        StaticUsers.load(path)
    assert where in info.value.message and str(path) in info.value.message


def test_reload_on_change_keeps_old_users_on_a_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path / "u.json", {"alice": [{"Password": "old"}]})
    users = StaticUsers.load(path, poll_s=0.0)
    assert users.authenticate("alice", "old").user == "alice"
    write(path, {"alice": [{"Password": "new"}]})
    os.utime(path, ns=(1, 1))  # a different mtime even within the clock's resolution
    assert users.authenticate("alice", "new").user == "alice"
    with pytest.raises(Unauthenticated):
        users.authenticate("alice", "old")
    path.write_text("{broken")
    os.utime(path, ns=(2, 2))
    assert users.authenticate("alice", "new").user == "alice"


def test_codes_round_trip() -> None:
    assert isinstance(error_for_code(Code.UNAUTHENTICATED, "x"), Unauthenticated)
    assert isinstance(error_for_code(Code.PERMISSION_DENIED, "x"), PermissionDenied)
    assert ANONYMOUS.via == "anonymous"
