"""Workflows: long-running changes to a live cluster whose state lives in the topo store.

Each workflow is a state machine recorded with ``put_workflow`` after every
step, so any process can resume it after a crash. Today:
:mod:`~shardgate.workflows.lookup_vindex` (Vitess's ``LookupVindex create /
externalize``: a lookup vindex added ``write_only``, backfilled from the
owner table while writes continue, verified, then switched to routing).
Workflows go through the gate (its sessions, its VSchema changes); they never
bypass the seam to the databases.
"""

from shardgate.workflows.lookup_vindex import LookupVindexSpec, LookupVindexWorkflow

__all__ = ["LookupVindexSpec", "LookupVindexWorkflow"]
