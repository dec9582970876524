"""Checking a vindex's VSchema ``params`` at construction."""

from __future__ import annotations

from collections.abc import Mapping, Set

from shardgate.errors import InvalidArgument


class ParamError(InvalidArgument):
    """A vindex's params are wrong; ``allowed`` and ``required`` say what it accepts."""

    def __init__(self, message: str, *, allowed: Set[str], required: Set[str]) -> None:
        super().__init__(message)
        self.allowed = frozenset(allowed)
        self.required = frozenset(required)


def check_params(
    type_name: str,
    name: str,
    params: Mapping[str, str],
    *,
    allowed: Set[str] = frozenset(),
    required: Set[str] = frozenset(),
) -> None:
    """Refuse unknown and missing params, naming the first one at fault."""
    for key in sorted(params):
        if key not in allowed and key not in required:
            known = ", ".join(sorted(allowed | required)) or "none"
            raise ParamError(
                f"vindex {name!r} ({type_name}): unknown param {key!r}; accepted params: {known}",
                allowed=allowed, required=required,
            )
    for key in sorted(required):
        if not params.get(key, "").strip():
            raise ParamError(f"vindex {name!r} ({type_name}): param {key!r} is required",
                             allowed=allowed, required=required)


def bool_param(type_name: str, name: str, params: Mapping[str, str], key: str) -> bool:
    """A ``"true"``/``"false"`` param (absent is false), as Vitess's ``boolFromMap``."""
    value = params.get(key, "false")
    if value not in ("true", "false"):
        raise InvalidArgument(
            f"vindex {name!r} ({type_name}): param {key!r} must be 'true' or 'false', got {value!r}"
        )
    return value == "true"
