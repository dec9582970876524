"""A planned statement: what kind it is, its text and the primitive tree that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardgate.engine.primitive import Primitive
from shardgate.sql.statements import StatementType

__all__ = ["Plan", "StatementType"]


@dataclass(frozen=True)
class Plan:
    """A planned statement: its type, the original text and the primitive tree."""

    statement_type: StatementType
    original: str
    instructions: Primitive
    #: the statement with literals and bind variables replaced by ``?``: the key of query
    #: statistics (the gate's own statements, ``ALTER VSCHEMA``, ``CREATE QUEUE``...:
    #: their text, whitespace collapsed)
    normalized: str = ""

    def __post_init__(self) -> None:
        if not self.normalized:
            object.__setattr__(self, "normalized", " ".join(self.original.split()))

    def describe(self) -> dict[str, Any]:
        return {
            "QueryType": self.statement_type,
            "Original": self.original,
            "Instructions": self.instructions.describe(),
        }
