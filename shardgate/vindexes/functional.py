"""The shared shape of unique functional vindexes: one hash per value.

A :class:`Hashing` vindex maps each value on its own, with no I/O, to at most
one keyspace id. ``multicol`` builds its keyspace ids from the hashes of such
vindexes (Vitess's ``Hashing`` interface).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from shardgate.vindexes._params import check_params
from shardgate.vindexes.base import KeyspaceId, SingleColumn


class Hashing(SingleColumn):
    """A unique functional vindex defined by :meth:`hash_value`."""

    #: Params this family accepts (none by default): others are refused.
    allowed_params: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        check_params(self.type_name, name, params, allowed=self.allowed_params)
        super().__init__(name, params)

    @property
    def unique(self) -> bool:
        return True

    @abstractmethod
    def hash_value(self, value: Any) -> KeyspaceId | None:
        """The keyspace id of one value, or None when it cannot be mapped."""

    def map(self, values: Sequence[Any]) -> list[list[KeyspaceId]]:
        out: list[list[KeyspaceId]] = []
        for value in values:
            ksid = self.hash_value(value)
            out.append([] if ksid is None else [ksid])
        return out

    def verify(self, values: Sequence[Any], ksids: Sequence[KeyspaceId]) -> list[bool]:
        return [self.hash_value(v) == k for v, k in zip(values, ksids, strict=True)]
