"""Both MariaDB drivers' errors (PyMySQL on the connection pool, asyncmy on the query
pool) map to the same shardgate codes."""

from __future__ import annotations

import asyncmy.errors
import pymysql
import pytest

from shardgate.backends.mysql import translate
from shardgate.errors import Code


@pytest.mark.parametrize("errors", [pymysql.err, asyncmy.errors], ids=["pymysql", "asyncmy"])
@pytest.mark.parametrize(("kind", "errno", "code"), [
    ("InterfaceError", 0, Code.UNAVAILABLE),          # not connected
    ("OperationalError", 2013, Code.UNAVAILABLE),     # lost connection during query
    ("ProgrammingError", 1064, Code.INVALID_ARGUMENT),
    ("ProgrammingError", 0, Code.INVALID_ARGUMENT),   # bad parameters, no errno
    ("IntegrityError", 1062, Code.ALREADY_EXISTS),
    ("OperationalError", 1213, Code.ABORTED),         # deadlock
    ("ProgrammingError", 1146, Code.NOT_FOUND),
])
def test_errors_map_alike(errors: object, kind: str, errno: int, code: Code) -> None:
    exc = getattr(errors, kind)(errno, "text")
    assert translate(exc, "mysql://root@host/db").code is code
