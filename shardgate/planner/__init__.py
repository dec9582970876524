"""Statements to primitive trees (pure, synchronous)."""

from shardgate.planner.build import Plan, build_plan

__all__ = ["Plan", "build_plan"]
