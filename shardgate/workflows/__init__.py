"""Workflows: long-running changes to a live cluster whose state lives in the topo store.

Each workflow is a state machine recorded with ``put_workflow`` after every
step, so any process can resume it after a crash. Today:
:mod:`~shardgate.workflows.lookup_vindex` (Vitess's ``LookupVindex create /
externalize``: a lookup vindex added ``write_only``, backfilled from the
owner table while writes continue, verified, then switched to routing) and
:mod:`~shardgate.workflows.reshard` (Vitess's ``Reshard``: split or merge
shards with copy, catch-up, VDiff and traffic switches; it works on the topo
store and the shard databases through ``shardgate.backends``), and
:mod:`~shardgate.workflows.movetables` (Vitess's ``MoveTables``: the same
machinery moving tables to another keyspace, traffic moved by routing rules).
Workflows never bypass the seam to the databases (the gate, or ``backends``).
"""

from shardgate.workflows.lookup_vindex import LookupVindexSpec, LookupVindexWorkflow

__all__ = ["LookupVindexSpec", "LookupVindexWorkflow"]
