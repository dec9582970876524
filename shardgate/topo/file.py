"""The cluster file: YAML naming keyspaces, shards, database URLs and VSchemas.

Example::

    default_keyspace: commerce
    keyspaces:
      commerce:
        shards:
          "-80": postgresql://postgres@127.0.0.1:5432/commerce_a
          "80-": postgresql://postgres@127.0.0.1:5432/commerce_b
        vschema:                 # Vitess vschema JSON, inline ...
          sharded: true
          vindexes: {hash: {type: hash}}
          tables: {customer: {column_vindexes: [{column: id, name: hash}]}}
      lookup:
        shards: {"0": sqlite:///data/lookup.db}
        vschema: lookup.json     # ... or a path to a JSON file, relative to this file

Relative ``sqlite:///`` paths are resolved against the file's directory, so a
cluster directory can be moved as a whole; one that leads out of that
directory (``sqlite:///../../x.db``, or through a symbolic link) is refused.
Absolute paths (``sqlite:////var/lib/x.db``) are taken as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from shardgate.errors import InvalidArgument, NotFound
from shardgate.topo.model import Topology


def load_cluster_file(path: str | Path) -> Topology:
    """Read and validate a cluster file."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"cluster file {p} does not exist")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"cluster file {p} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidArgument(f"cluster file {p}: expected a mapping with 'keyspaces'")
    base = p.parent.resolve()
    for ks_name, spec in (doc.get("keyspaces") or {}).items():
        if not isinstance(spec, dict):
            continue
        vs = spec.get("vschema")
        if isinstance(vs, str):
            vpath = base / vs
            try:
                spec["vschema"] = json.loads(vpath.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise InvalidArgument(
                    f"{p}: keyspaces.{ks_name}.vschema: cannot read {vpath}: {exc}"
                ) from exc
        shards = spec.get("shards")
        if isinstance(shards, dict):
            spec["shards"] = {
                str(k): _absolute_sqlite(v, base, f"{p}: keyspaces.{ks_name}.shards.{k}")
                for k, v in shards.items()
            }
    return Topology.from_dict(doc, path=str(p))


def _absolute_sqlite(url: Any, base: Path, where: str) -> Any:
    """A relative ``sqlite:///`` URL made absolute under ``base``; refused if it leaves it."""
    if isinstance(url, str) and url.startswith("sqlite:///") and ":memory:" not in url:
        rest, sep, query = url[len("sqlite:///"):].partition("?")
        if not rest.startswith("/"):
            path = (base / rest).resolve()
            if not path.is_relative_to(base):
                raise InvalidArgument(
                    f"{where}: the relative SQLite path {rest!r} leads out of the cluster "
                    f"directory {base} (to {path}); keep shard files under the cluster "
                    "directory or write an absolute path (sqlite:////abs/path.db)"
                )
            return "sqlite:///" + str(path) + sep + query
    return url


def write_cluster_file(topo: Topology, path: str | Path) -> None:
    """Write a topology as a cluster file (VSchemas inline)."""
    Path(path).write_text(yaml.safe_dump(topo.to_dict(), sort_keys=False))
