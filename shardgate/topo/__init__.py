"""Topology: which keyspaces and shards exist, and which database serves each."""

from shardgate.topo.file import load_cluster_file, write_cluster_file
from shardgate.topo.model import KeyspaceTopo, ShardTopo, Topology

__all__ = [
    "KeyspaceTopo",
    "ShardTopo",
    "Topology",
    "load_cluster_file",
    "write_cluster_file",
]
