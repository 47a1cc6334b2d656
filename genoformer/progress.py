"""Progress bars that also work in a log: a live bar on a terminal, plain lines elsewhere.

tqdm redraws one line with carriage returns, which a log file or a pipe (`make quickstart > log`)
shows as nothing for minutes, or as one endless line. Every progress bar of genoformer is this
module's `tqdm`: tqdm.auto's bar where the output is a terminal (or a notebook), and otherwise
the same bar's text as a plain line at most every `LINE_SECONDS` seconds, plus its last state
when it ends. The training commands' progress (a Lightning callback) follows the same rule:
genoformer.core.callbacks.TrainingProgress.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Optional

from tqdm.auto import tqdm as _tqdm

LINE_SECONDS = 30.0
"""Seconds between two plain progress lines of one bar (the first and the last are always shown)."""


def interactive(stream: Any) -> bool:
    """Whether `stream` shows a redrawn line as a live bar: a terminal, or a notebook's output."""
    if "ipykernel" in sys.modules:
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class PlainLines:
    """A file for tqdm that turns its redrawn status (`\\r` + text) into plain lines on `stream`:
    the first status, then one at most every `seconds`, and the last one when the bar ends."""

    def __init__(self, stream: IO[str], seconds: Optional[float] = None) -> None:
        self.stream = stream
        self.seconds = LINE_SECONDS if seconds is None else seconds
        self.pending = ""  # the latest status, not yet written
        self.written = ""  # the last status written
        self.last_time = -float("inf")

    def _emit(self) -> None:
        if self.pending and self.pending != self.written:
            self.stream.write(self.pending + "\n")
            self.stream.flush()
            self.written = self.pending
        self.last_time = time.monotonic()

    def write(self, text: str) -> int:
        """tqdm writes "\r" + status (+ spaces) to redraw, "\n" after the last status of a bar
        it keeps, and "\r" + spaces to clear one it does not keep."""
        status = text.strip("\r\n").rstrip()
        if status:
            self.pending = status
            if time.monotonic() - self.last_time >= self.seconds:
                self._emit()
        elif text:  # the bar ends: its last state
            self._emit()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


class tqdm(_tqdm):  # noqa: N801 - tqdm's name, so that a call site reads as tqdm's
    """tqdm.auto's bar on a terminal or in a notebook; plain lines elsewhere (`PlainLines` on the
    same stream: stderr unless `file` is given)."""

    def __init__(self, *args: Any, file: Any = None, **kwargs: Any) -> None:
        stream = sys.stderr if file is None else file
        self.plain = not interactive(stream)
        super().__init__(*args, file=PlainLines(stream) if self.plain else stream, **kwargs)

    def close(self) -> None:
        if self.plain and not self.disable and hasattr(self, "last_print_n"):
            self.refresh()  # its last state, also for a bar that clears itself (leave=False)
        super().close()
