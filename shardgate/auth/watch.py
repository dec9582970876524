"""Reload-on-change for the files security reads (users file, ACL file, certificates)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

#: Seconds between two looks at a watched file's modification time.
DEFAULT_POLL_S = 1.0


class FileWatch:
    """Tells whether a file changed since the last time it was read.

    Invariants: ``stamp`` is the ``(mtime_ns, size, inode)`` of the file as last
    loaded (None when it could not be read); :meth:`changed` looks at the file
    at most once per ``poll_s`` seconds, so calling it on every request costs a
    clock read. Thread-safe: one caller at a time sees a given change.
    """

    def __init__(self, path: str | Path, *, poll_s: float = DEFAULT_POLL_S) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self.stamp = self._stat()
        self._next = time.monotonic() + poll_s
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> bool:
        """True once after the file's modification time, size or inode changed."""
        now = time.monotonic()
        if now < self._next:
            return False
        with self._lock:
            if now < self._next:
                return False
            self._next = now + self.poll_s
            stamp = self._stat()
            if stamp is None or stamp == self.stamp:
                return False
            self.stamp = stamp
            return True

    def force(self) -> None:
        """Make the next :meth:`changed` look at the file now (tests, SIGHUP)."""
        self._next = 0.0
