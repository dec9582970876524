"""Defaults the ``shardgate`` parser shows, named here so that building a command's
parser (and ``--help``) loads no gate, workflow or topo store module.

Each equals the constant of the module that uses it (named beside it);
``tests/unit/test_cli_dispatch.py`` holds them equal.
"""

from __future__ import annotations

#: ``twopc resolve --grace``: :data:`shardgate.gate.twopc.DEFAULT_RESOLVE_GRACE_S`
RESOLVE_GRACE_S = 60.0
#: ``lookup-vindex create --type``: :data:`shardgate.workflows.lookup_vindex.TYPES`
LOOKUP_TYPES = ("consistent_lookup_unique", "consistent_lookup", "lookup_unique", "lookup")
#: ``lookup-vindex create --batch``: :data:`shardgate.workflows.lookup_vindex.DEFAULT_BATCH`
LOOKUP_BATCH = 1000
#: ``lookup-vindex create --settle``: :data:`shardgate.workflows.lookup_vindex.DEFAULT_SETTLE_S`
LOOKUP_SETTLE_S = 2.0
#: ``reshard|movetables create --batch``: :data:`shardgate.workflows.rowcopy.DEFAULT_BATCH`
COPY_BATCH = 10_000
#: ``--max-lag`` of the traffic switches: :data:`shardgate.workflows.cutover.DEFAULT_MAX_LAG_S`
MAX_LAG_S = 5.0
#: ``cluster restart --settle``: :data:`shardgate.workflows.rolling_restart.DEFAULT_SETTLE_S`
RESTART_SETTLE_S = 1.0
#: ``cluster restart --stop-timeout``:
#: :data:`shardgate.workflows.rolling_restart.DEFAULT_STOP_TIMEOUT_S`
RESTART_STOP_TIMEOUT_S = 30.0

#: each default above and the constant it mirrors, ``module:NAME``
MIRRORS = {
    "RESOLVE_GRACE_S": "shardgate.gate.twopc:DEFAULT_RESOLVE_GRACE_S",
    "LOOKUP_TYPES": "shardgate.workflows.lookup_vindex:TYPES",
    "LOOKUP_BATCH": "shardgate.workflows.lookup_vindex:DEFAULT_BATCH",
    "LOOKUP_SETTLE_S": "shardgate.workflows.lookup_vindex:DEFAULT_SETTLE_S",
    "COPY_BATCH": "shardgate.workflows.rowcopy:DEFAULT_BATCH",
    "MAX_LAG_S": "shardgate.workflows.cutover:DEFAULT_MAX_LAG_S",
    "RESTART_SETTLE_S": "shardgate.workflows.rolling_restart:DEFAULT_SETTLE_S",
    "RESTART_STOP_TIMEOUT_S": "shardgate.workflows.rolling_restart:DEFAULT_STOP_TIMEOUT_S",
}
