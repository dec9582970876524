"""What a shardgate source does on entering a reused PySpark worker.

Two costs of PySpark's Python workers that are not the source's work, and
that together were a fifth of a read's CPU time (``bench/spark_read.py``):

* **Collections.** PySpark's daemon runs ``gc.collect()`` after every task or
  planning call a reused worker (``SPARK_REUSE_WORKER=1``) finishes. A full
  collection walks every object the process tracks, and the modules a source
  imports (pyarrow, sqlglot, the planner) double that: 30-40 ms after each
  call, more than planning a read costs. :func:`settle` freezes what is alive
  when a source method starts (:func:`gc.freeze`: imported modules, mostly),
  so those collections walk only what the calls allocate. Frozen objects are
  still freed by reference counting; only cycles among them are never
  collected, and module state is not garbage anyway.
* **Memory handed back and forth.** A task's Arrow batches are tens of MB
  allocated and freed per batch; glibc's malloc returns such memory to the
  kernel on free (``munmap``/``brk``) and takes it back, page faults
  included, on the next batch. Once per process :func:`settle` raises glibc's
  mmap and trim thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`),
  so a worker keeps what it freed, up to its high-water mark, for the next
  batch: 15% less CPU per task.

Outside a reused worker (the driver, a test calling the classes directly)
:func:`settle` does nothing.
"""

from __future__ import annotations

import ctypes
import gc
import os

#: allocations up to this size come from the heap, not from their own mmap
MMAP_THRESHOLD = 64 << 20
#: free memory at the top of the heap is given back only beyond this
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters

_tuned_pid = 0


def settle() -> None:
    """In a reused Spark worker: freeze the objects alive now; tune malloc once."""
    global _tuned_pid
    if os.environ.get("SPARK_REUSE_WORKER") != "1":
        return
    gc.freeze()
    if _tuned_pid != os.getpid():
        _tuned_pid = os.getpid()
        _tune_malloc()


def _tune_malloc() -> None:
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library; glibc only
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
