"""A one-line progress display on stderr (rewritten in place on a terminal, sparse lines otherwise)."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "human_bytes"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """``spin(text)`` for work without a total, ``count(step, done, total, nbytes)`` with one."""

    def __init__(self, stream=None, quiet: bool = False, interval_s: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        # Off a terminal (CI logs, journald) a line every few seconds is plenty.
        self.interval_s = interval_s if self.tty else 5.0
        self._last = 0.0
        self._width = 0

    def _show(self, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def spin(self, text: str) -> None:
        self._show(text)

    def count(self, step: str, done: int, total: int, nbytes: int) -> None:
        self._show(f"{step}: {done}/{total} files, {human_bytes(nbytes)}", force=done == total)

    def done(self, text: str) -> None:
        """Finish the current line with a summary that stays on screen."""
        if self.quiet:
            return
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad + "\n")
            self._width = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
