"""The registry of vindex families: type name -> class.

Filled explicitly, once, by :mod:`shardgate.vindexes` (its ``__init__``);
nothing registers itself while being defined. A name is registered once:
a second :func:`register` of it is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shardgate.errors import AlreadyExists, InvalidArgument, NotFound
from shardgate.vindexes.base import Vindex

#: What builds a vindex: ``factory(name, params)``; vindex classes qualify.
VindexFactory = Callable[[str, Mapping[str, str]], Vindex]

_FAMILIES: dict[str, VindexFactory] = {}


def register(type_name: str, cls: VindexFactory) -> None:
    """Make ``type_name`` (as used in VSchema ``"type"``) build vindexes with ``cls``."""
    if not type_name:
        raise InvalidArgument("a vindex type name cannot be empty")
    if type_name in _FAMILIES:
        raise AlreadyExists(f"vindex type {type_name!r} is already registered")
    _FAMILIES[type_name] = cls


def known_types() -> list[str]:
    """Registered type names, sorted."""
    return sorted(_FAMILIES)


def create_vindex(type_name: str, name: str, params: Mapping[str, str] | None = None) -> Vindex:
    """Build the vindex ``name`` of family ``type_name`` from its VSchema ``params``.

    Raises :class:`NotFound` for an unknown type and :class:`InvalidArgument`
    for bad params.
    """
    factory = _FAMILIES.get(type_name)
    if factory is None:
        raise NotFound(
            f"unknown vindex type {type_name!r} for vindex {name!r}; "
            f"known types: {', '.join(known_types())}"
        )
    for key, value in (params or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument(
                f"vindex {name!r} ({type_name}): param {key!r} must be a string with a string "
                f"value, got {value!r}"
            )
    return factory(name, dict(params or {}))


#: a param name no vindex accepts: asking with it makes a family list its params
_PROBE = "__sg_probe__"


def describe_types() -> list[dict[str, object]]:
    """Every registered family with its params (``{"name", "required"}``) and traits.

    The params come from each family's own check (the one that refuses bad
    VSchemas), so this list cannot drift from what is accepted.
    """
    from shardgate.vindexes._params import ParamError

    out: list[dict[str, object]] = []
    for type_name in known_types():
        try:
            _FAMILIES[type_name]("probe", {_PROBE: "x"})
        except ParamError as exc:
            params = [{"name": p, "required": p in exc.required}
                      for p in sorted(exc.allowed | exc.required)]
        else:  # pragma: no cover - every family checks its params
            params = []
        out.append({"type": type_name, "params": params,
                    "lookup": any(p["name"] == "table" for p in params)})
    return out
