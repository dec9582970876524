"""``shardgate doctor``'s checks, fed with fake findings (the real machine: tests/acceptance)."""

from __future__ import annotations

from shardgate.cli.doctor import _fix, _satisfies, check_extras, check_java, check_python


def test_python_too_old_fails_with_what_to_do() -> None:
    assert check_python((3, 11, 7)).status == "ok"
    old = check_python((3, 10, 14))
    assert old.status == "FAIL"
    assert "3.10.14 is older than 3.11" in old.detail
    assert "install Python >= 3.11" in old.fix


def test_missing_extra_is_a_warning_naming_the_modules_and_the_install() -> None:
    checks = check_extras(lambda name: None if name in ("pyspark", "deltalake") else object())
    spark = next(c for c in checks if c.name == "extra [spark]")
    assert spark.status == "warn"
    assert "missing pyspark, deltalake" in spark.detail
    assert "pip install -e '.[spark]'" in spark.fix
    assert next(c for c in checks if c.name == "extra [dev]").status == "ok"


def test_no_java_is_a_warning_with_the_package_to_install() -> None:
    c = check_java(lambda name: None)
    assert (c.status, c.detail) == ("warn", "not found on PATH")
    assert "openjdk-17" in c.fix


def test_settings_compare_as_the_servers_print_them() -> None:
    assert _satisfies("logical", "logical") and not _satisfies("replica", "logical")
    assert _satisfies("row", "ROW") and not _satisfies(None, "ROW")
    assert _satisfies("64", ">0") and not _satisfies("0", ">0")
    assert _satisfies("32", ">=8") and not _satisfies("4", ">=8")
    fix = _fix("postgresql", ["wal_level", "max_prepared_transactions"])
    assert "ALTER SYSTEM SET wal_level = 'logical'" in fix
    assert "ALTER SYSTEM SET max_prepared_transactions = '64'" in fix
    assert "restart PostgreSQL" in fix
    assert "binlog_format = ROW" in _fix("mysql", ["binlog_format"])
