"""Statements to primitive trees (pure, synchronous)."""

from shardgate.engine.plan import Plan
from shardgate.planner.build import build_plan

__all__ = ["Plan", "build_plan"]
