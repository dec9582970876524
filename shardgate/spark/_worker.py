"""What a shardgate source does on entering a reused PySpark worker.

PySpark's daemon runs ``gc.collect()`` after every task or planning call a
reused Python worker (``SPARK_REUSE_WORKER=1``) finishes. A full collection
walks every object the process tracks, and the modules a source imports
(pyarrow, sqlglot, the planner) double that: 30-40 ms after each call, more
than planning a read costs. :func:`settle` freezes what is alive when a source
method starts (:func:`gc.freeze`: imported modules, mostly) so those
collections only walk what the calls themselves allocate. Frozen objects are
still freed by reference counting; only cycles among them are never
collected, and module state is not garbage anyway.

Outside a reused worker (the driver, a test calling the classes directly)
it does nothing.
"""

from __future__ import annotations

import gc
import os


def settle() -> None:
    """Exclude the objects alive now from the cyclic collector, in reused Spark workers."""
    if os.environ.get("SPARK_REUSE_WORKER") == "1":
        gc.freeze()
