"""Shard database URLs: parsing, redaction, and the errors bad ones give."""

from __future__ import annotations

import pytest

from shardgate.backends import open_backend
from shardgate.backends.urls import DatabaseURL, parse_url, redacted
from shardgate.errors import Code, InvalidArgument


@pytest.mark.parametrize(
    ("url", "database"),
    [
        ("sqlite:///shard.db", "shard.db"),
        ("sqlite:///data/ks/-80.db", "data/ks/-80.db"),
        ("sqlite:////var/lib/shardgate/ks.db", "/var/lib/shardgate/ks.db"),
        ("sqlite:///:memory:", ":memory:"),
        ("sqlite:///with%20space.db", "with space.db"),
    ],
)
def test_sqlite_paths(url: str, database: str) -> None:
    parsed = parse_url(url)
    assert parsed.kind == "sqlite"
    assert parsed.database == database
    assert parsed.host is None and parsed.user is None


def test_memory_flag() -> None:
    assert parse_url("sqlite:///:memory:").is_memory
    assert not parse_url("sqlite:///x.db").is_memory


def test_postgres_full() -> None:
    parsed = parse_url("postgresql://alice:s%40cret@db.example:6543/ks_80?sslmode=require")
    assert parsed == DatabaseURL(
        kind="postgresql",
        database="ks_80",
        user="alice",
        password="s@cret",
        host="db.example",
        port=6543,
        options={"sslmode": "require"},
        raw="postgresql://alice:s%40cret@db.example:6543/ks_80?sslmode=require",
    )


def test_postgres_minimal_and_alias() -> None:
    parsed = parse_url("postgres://postgres@127.0.0.1/x")
    assert parsed.kind == "postgresql"
    assert (parsed.user, parsed.password, parsed.port, parsed.database) == (
        "postgres",
        None,
        None,
        "x",
    )


@pytest.mark.parametrize("scheme", ["mysql", "mariadb", "MySQL"])
def test_mysql(scheme: str) -> None:
    parsed = parse_url(f"{scheme}://root:pw@127.0.0.1:3306/shard1")
    assert parsed.kind == "mysql"
    assert (parsed.user, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "root",
        "pw",
        "127.0.0.1",
        3306,
        "shard1",
    )


def test_ipv6_host() -> None:
    parsed = parse_url("postgresql://u@[::1]:5432/db")
    assert parsed.host == "::1" and parsed.port == 5432


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("oracle://u@h/db", "unknown scheme 'oracle'"),
        ("shard.db", "expected scheme://"),
        ("sqlite://host/x.db", "has no host"),
        ("sqlite:///", "missing the database file path"),
        ("postgresql:///db", "missing the host"),
        ("mysql://u:pw@h:notaport/db", "port"),
        ("postgresql://u@h/a/b", "contains '/'"),
        ("mysql://u@h/db#frag", "fragment"),
    ],
)
def test_bad_urls_name_the_url_and_the_accepted_forms(url: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_url(url)
    err = info.value
    assert err.code is Code.INVALID_ARGUMENT
    assert problem in err.message
    assert redacted(url) in err.message
    assert "sqlite:///" in err.message and "postgresql://" in err.message


def test_bad_url_message_hides_the_password() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_url("mysql://root:hunter2@h:99999/db")
    assert "hunter2" not in str(info.value)
    assert "root:***@h" in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root:hunter2@h:3306/db", "mysql://root:***@h:3306/db"),
        ("postgresql://u:p%2Fw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a/b:c@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://:secret@h/db", "postgresql://:***@h/db"),
        ("postgresql://u@h/db?password=secret&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("not a url", "not a url"),
    ],
)  # fmt: skip
def test_redacted(url: str, expected: str) -> None:
    assert redacted(url) == expected
    assert "secret" not in redacted(url) and "hunter2" not in redacted(url)


def test_safe_property_and_repr_hide_the_password() -> None:
    parsed = parse_url("mysql://root:hunter2@h/db")
    assert parsed.safe == "mysql://root:***@h/db"
    assert "hunter2" not in repr(parsed)


@pytest.mark.parametrize(
    ("url", "dialect", "placeholder"),
    [
        ("sqlite:///:memory:", "sqlite", "?"),
        ("postgresql://postgres@127.0.0.1:5432/x", "postgres", "%s"),
        ("mariadb://root@127.0.0.1/x", "mysql", "%s"),
    ],
)
async def test_open_backend_chooses_by_scheme(url: str, dialect: str, placeholder: str) -> None:
    backend = open_backend(url)  # opens nothing yet
    try:
        assert (backend.dialect, backend.placeholder) == (dialect, placeholder)
        assert backend.url == url
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///x.db?journal=off",
        "sqlite:///x.db?busy_timeout=soon",
        "mysql://root:hunter2@h/db?bogus=1",
        "mysql://root:hunter2@h/db?connect_timeout=abc",
        "postgresql://u:hunter2@h/db?no_such_libpq_option=1",
    ],
)
def test_bad_options_are_invalid_argument_without_password(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        open_backend(url)
    assert "hunter2" not in str(info.value)


def test_pool_size_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="pool_size"):
        open_backend("sqlite:///:memory:", pool_size=0)


def test_mysql_tls_defaults_to_off_on_loopback_only() -> None:
    from shardgate.backends.mysql import tls_kwargs
    from shardgate.errors import InvalidArgument

    assert tls_kwargs(parse_url("mysql://root@127.0.0.1:3306/db")) == {"ssl_disabled": True}
    assert tls_kwargs(parse_url("mysql://root@localhost/db")) == {"ssl_disabled": True}
    assert tls_kwargs(parse_url("mysql://root@db.example:3306/db")) == {}
    assert tls_kwargs(parse_url("mysql://root@127.0.0.1/db?ssl=preferred")) == {}
    assert tls_kwargs(parse_url("mysql://root@db.example/db?ssl=disabled")) == {
        "ssl_disabled": True
    }
    with pytest.raises(InvalidArgument):
        tls_kwargs(parse_url("mysql://root@db.example/db?ssl=maybe"))
