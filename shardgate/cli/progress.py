"""Progress of a long command (a backfill, a copy): a bar redrawn in place on a terminal,
one line per stage elsewhere.

A bar drawn with ``\\r`` into a file or a pipe is one endless line of redraws, so
when the stream is not a terminal :class:`Progress` prints a line only when the
work reaches a new stage: where it starts (a resumed run says where it resumed),
each quarter of the estimate, and the end.
"""

from __future__ import annotations

import sys
from typing import TextIO

#: the bar's width in characters
WIDTH = 30
#: stages of a stream that is not a terminal, as fractions of the estimate
STAGES = (0.25, 0.5, 0.75, 1.0)


class Progress:
    """``progress(done, estimate)`` after each step; :meth:`end` once done."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self._stage = -1  # no line yet
        self._drawn = False

    def __call__(self, done: int, estimate: int) -> None:
        total = max(estimate, done, 1)
        text = f"{done}/{estimate} rows ({100 * done // total}%)"
        if self.tty:
            filled = int(WIDTH * done / total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {text}")
            self._drawn = True
        else:
            stage = sum(1 for s in STAGES if done >= s * total)
            if stage <= self._stage:
                return
            self._stage = stage
            self.stream.write(f"{self.label}: {text}\n")
        self.stream.flush()

    def end(self) -> None:
        """End the bar's line (on a terminal, after the last redraw)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
