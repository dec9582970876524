"""Primitives (plans as data) and their execution."""
