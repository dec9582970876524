"""``region_json``: a region byte prefix from a country map, then the id's hash (cost 1, unique).

As Vitess ``go/vt/vtgate/vindexes/region_json.go``: a two-column vindex over
``(id, country)``. Params (both required):

* ``region_map``: path of a JSON file ``{"country": region number, ...}``, read
  once when the vindex is built;
* ``region_bytes``: ``1`` or ``2``, how many bytes the region takes.

The keyspace id is the region number as a big-endian uint16 (its last byte
only when ``region_bytes`` is 1) followed by the 8-byte ``hash`` keyspace id of
``id``, so a region owns a contiguous key range (geo-partitioning). A row whose
id is no uint64 or whose country is not in the map maps to nothing, as does a
row with other than two values; Vitess routes no prefix of the columns either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardgate.errors import InvalidArgument
from shardgate.vindexes._params import check_params
from shardgate.vindexes._values import to_bytes
from shardgate.vindexes.base import KeyspaceId, MultiColumn
from shardgate.vindexes.hash import Hash


def load_region_map(name: str, path: str) -> dict[str, int]:
    """Read a region map file: a JSON object of country -> region number (0..65535)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise InvalidArgument(
            f"vindex {name!r} (region_json): cannot read region_map {path!r}: {exc.strerror}"
        ) from exc
    except ValueError as exc:
        raise InvalidArgument(
            f"vindex {name!r} (region_json): region_map {path!r} is not valid JSON: {exc}"
        ) from exc
    if not isinstance(doc, dict):
        raise InvalidArgument(
            f"vindex {name!r} (region_json): region_map {path!r} must hold a JSON object"
        )
    out: dict[str, int] = {}
    for country, region in doc.items():
        if isinstance(region, bool) or not isinstance(region, int) or not 0 <= region < 1 << 64:
            raise InvalidArgument(
                f"vindex {name!r} (region_json): region of {country!r} in {path!r} must be "
                f"an unsigned integer, got {region!r}"
            )
        out[country] = region
    return out


class RegionJSON(MultiColumn):
    """``(id, country)`` -> region bytes + ``hash(id)``."""

    type_name = "region_json"

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        check_params(self.type_name, name, params, required={"region_map", "region_bytes"})
        super().__init__(name, params)
        if params["region_bytes"] not in ("1", "2"):
            raise InvalidArgument(
                f"vindex {name!r} (region_json): region_bytes must be 1 or 2, "
                f"got {params['region_bytes']!r}"
            )
        self._region_bytes = int(params["region_bytes"])
        self._regions = load_region_map(name, params["region_map"])
        self._hash = Hash(name, {})

    @property
    def cost(self) -> int:
        return 1

    @property
    def unique(self) -> bool:
        return True

    def _ksid(self, row: Sequence[Any]) -> KeyspaceId | None:
        if len(row) != 2:
            return None
        hashed = self._hash.hash_value(row[0])
        country = to_bytes(row[1])
        if hashed is None or country is None:
            return None
        region = self._regions.get(country.decode("utf-8", "replace"))
        if region is None:
            return None
        prefix = (region & 0xFFFF).to_bytes(2, "big")[2 - self._region_bytes :]
        return prefix + hashed

    def map_multi(self, rows: Sequence[Sequence[Any]]) -> list[list[KeyspaceId]]:
        out: list[list[KeyspaceId]] = []
        for row in rows:
            ksid = self._ksid(row)
            out.append([] if ksid is None else [ksid])
        return out

    def verify_multi(
        self, rows: Sequence[Sequence[Any]], ksids: Sequence[KeyspaceId]
    ) -> list[bool]:
        """True where ``rows[i]`` maps to ``ksids[i]``."""
        return [self._ksid(r) == k for r, k in zip(rows, ksids, strict=True)]

    def prefix_bytes(self, n_columns: int) -> int:
        return self._region_bytes + 8 if n_columns >= 2 else 0
