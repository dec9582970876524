"""The names of the SQL dialects (no sqlglot here: a backend or a Spark task can name
its dialect without loading it)."""

from __future__ import annotations

from enum import StrEnum

from shardgate.errors import InvalidArgument

#: meta flag of a SUM that is AVG's partial sum (the planner sets it, SQLite renders it)
AVG_SUM = "sg_avg_sum"


class Dialect(StrEnum):
    """A shard database's SQL dialect; the value is sqlglot's name for it."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"
    MYSQL = "mysql"

    @classmethod
    def of(cls, name: str) -> Dialect:
        """The dialect named ``name``: a dialect's value or a backend URL kind
        (``postgresql``); InvalidArgument for anything else."""
        try:
            return cls(_ALIASES.get(name, name))
        except ValueError:
            raise InvalidArgument(
                f"unknown SQL dialect {name!r}; use one of {[d.value for d in cls]}"
            ) from None


_ALIASES = {"postgresql": "postgres", "mariadb": "mysql"}
