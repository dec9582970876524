"""UNION parts planned apart: their rows one after the other (Vitess's Concatenate)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.result import Result, Row


@dataclass(frozen=True)
class Concatenate(Primitive):
    """The rows of each input in turn; the field names are the first input's."""

    inputs: tuple[Primitive, ...]

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        fields: list[str] = []
        rows: list[Row] = []
        for i, part in enumerate(self.inputs):
            res = await part.execute(vc, bind_vars)
            if i == 0:
                fields = list(res.fields)
            rows.extend(res.rows)
        return Result(fields=fields, rows=rows)

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Concatenate", "Inputs": [p.describe() for p in self.inputs]}
