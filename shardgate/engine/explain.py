"""EXPLAIN: the plan of a statement, as the one-row result of a query."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.primitives import ExecCursor, Primitive
from shardgate.result import Result


@dataclass(frozen=True)
class Explain(Primitive):
    """Returns the described plan (the golden-file JSON shape) without running it."""

    plan: dict[str, Any]

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        return Result(fields=["plan"], rows=[(json.dumps(self.plan, indent=2),)])

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Explain", "Inputs": [self.plan["Instructions"]]}
