"""EXPLAIN: the plan of a statement, as the one-row result of a query."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardgate.engine.cursor import ExecCursor
from shardgate.engine.primitive import Primitive
from shardgate.result import Result


@dataclass(frozen=True)
class Explain(Primitive):
    """Returns the described plan (the golden-file JSON shape) without running it,
    each route with the shards it reaches (:func:`with_target_shards`)."""

    plan: dict[str, Any]
    #: the explained plan's primitives (to resolve its routes' shards)
    inner: Primitive | None = None

    async def execute(self, vc: ExecCursor, bind_vars: Mapping[str, Any]) -> Result:
        plan = self.plan
        if self.inner is not None:
            plan = await with_target_shards(self.inner, copy.deepcopy(self.plan), vc)
        return Result(fields=["plan"], rows=[(json.dumps(plan, indent=2),)])

    def describe(self) -> dict[str, Any]:
        return {"OperatorType": "Explain", "Inputs": [self.plan["Instructions"]]}


def _routes(p: Primitive) -> list[Primitive]:
    """The primitives of a plan tree that reach shards (routes), depth first, in field order."""
    from dataclasses import fields, is_dataclass

    from shardgate.engine.route import Route

    out: list[Primitive] = [p] if isinstance(p, Route) else []
    if not is_dataclass(p):
        return out
    for f in fields(p):
        value = getattr(p, f.name)
        children = value if isinstance(value, tuple | list) else (value,)
        for child in children:
            if isinstance(child, Primitive):
                out.extend(_routes(child))
    return out


def _route_nodes(node: Any) -> list[dict[str, Any]]:
    """The ``Route`` dicts of a described plan, depth first, in ``Inputs`` order."""
    if not isinstance(node, dict):
        return []
    out = [node] if node.get("OperatorType") == "Route" else []
    for child in node.get("Inputs", ()):
        out.extend(_route_nodes(child))
    return out


async def with_target_shards(
    instructions: Primitive, described: dict[str, Any], vc: ExecCursor
) -> dict[str, Any]:
    """``described`` with each route's shards (``"Shards"``), resolved as execution would.

    A route's shards come from its vindex and the statement's literal values
    (a lookup vindex reads its table, nothing else runs). A route whose values
    are bind variables keeps no ``Shards``; so does a plan whose described
    routes cannot be matched one to one with its primitives.
    """
    from shardgate.engine.route import Route
    from shardgate.errors import ShardgateError

    routes = [r for r in _routes(instructions) if isinstance(r, Route)]
    nodes = _route_nodes(described.get("Instructions", described))
    if len(routes) != len(nodes):
        return described
    for route, node in zip(routes, nodes, strict=True):
        try:
            node["Shards"] = [f"{route.keyspace}/{s}" for s in await route.shards(vc, {})]
        except (ShardgateError, KeyError):
            continue  # needs bind variables (or a subquery's result) to route
    return described
