"""Databases of every kind for module-scoped fixtures.

``make_database`` (tests/conftest.py) makes databases that live for one test. A
module whose tests only read a fixed data set (or put it back) shares one set of
databases per backend kind instead: :func:`module_databases` makes them, and
hands them to the same background dropper when the block ends. :func:`kind_param`
is the module-scoped counterpart of the ``backend_kind`` fixture (same ids and
marks, so ``-m "not mysql"`` works), to override it in such a module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import _drop_postgres_slots, _dropper, create_database, require_server

#: the ``backend_kind`` parameters, for a module-scoped override of that fixture
KINDS = [
    pytest.param("sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


def kind_param(request: pytest.FixtureRequest) -> str:
    """The kind of a fixture parametrized by :data:`KINDS`; skips/fails (see
    ``require_server``) when its server is down."""
    kind: str = request.param
    if kind != "sqlite":
        require_server(kind)
    return kind


@contextlib.contextmanager
def module_databases(directory: Path, owner: str) -> Iterator[Callable[..., str]]:
    """``make(kind, hint="") -> url`` of a new empty database (SQLite: a file in
    ``directory``), as ``make_database`` makes them; the server databases are
    dropped in the background when the block ends (``owner`` names them there)."""
    made: list[tuple[str, str]] = []

    def make(kind: str, hint: str = "") -> str:
        url, name = create_database(kind, hint, directory)
        if name is not None:
            made.append((kind, name))
        return url

    try:
        yield make
    finally:
        for kind, name in reversed(made):
            if kind == "postgres":
                _drop_postgres_slots(name)
            _dropper.drop(kind, name, owner)
