"""A one-line progress display on stderr (rewritten in place on a terminal, sparse lines otherwise),
and how the long build-host commands stop on Ctrl-C or SIGTERM (:func:`stop_signals`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

__all__ = ["Progress", "human_bytes", "Terminated", "Stopped", "stop_signals", "descendants"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C so that every ``finally`` runs: staging directories are
    removed, child processes stopped. Its exit status is 143 (128 + 15), Ctrl-C's 130."""


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children before grandchildren), read from /proc; [] without it."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    level = children.get(pid, [])
    while level:
        found += level
        level = [c for p in level for c in children.get(p, [])]
    return found


def _stop_descendants() -> None:
    """SIGTERM to every process below this one. The ``finally`` blocks that follow ask each child
    to stop too, but a helper in front of it cannot pass that on: strace blocks SIGTERM (its
    default with ``-o FILE PROG``), so before READY the traced runtime would only be told by the
    ``kill -9`` of strace 60 s later, and then left running. This is what a terminal's Ctrl-C
    already does (the whole foreground group gets SIGINT), for a signal sent to our pid only."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:  # exited meanwhile, or not ours to signal
            pass


class Stopped:
    """What :func:`stop_signals` saw: ``signum`` is the first SIGINT/SIGTERM received, else None.

    Test it in a failure's handler too: a child stopped by the signal may surface as that
    child's failure (for example, the traced boot "exited before READY") instead of the
    interrupt itself, and the command should still say it was interrupted.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.holding = False  # inside held(): a signal is noted, raised when the block ends
        self.deferred: int | None = None

    @contextlib.contextmanager
    def held(self):
        """Inside, SIGINT and SIGTERM raise nothing; the first one is raised as the block ends.

        For native modules' imports (torch, onnx, onnxruntime: pybind11). A KeyboardInterrupt
        raised while their initialisation runs Python code becomes a C++ exception that nothing
        catches: ``std::terminate``, an abort (-6) and a core instead of a clean exit 130."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.deferred is not None:
            signum, self.deferred = self.deferred, None
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    @property
    def exit_code(self) -> int | None:
        """143 after SIGTERM, 130 after SIGINT, None when neither came."""
        return None if self.signum is None else 128 + self.signum

    @property
    def word(self) -> str:
        return "terminated" if self.signum == signal.SIGTERM else "interrupted"


@contextlib.contextmanager
def stop_signals():
    """While inside, SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated` in the main
    thread, after a SIGTERM to every descendant process (:func:`_stop_descendants`). Yields a
    :class:`Stopped`; the previous handlers come back on the way out. Outside the main thread
    it only yields.

    A second signal while the first one's exception unwinds (an ``except``/``finally``/``__exit__``
    handling it is running: a staging directory being removed, a child being waited for) is
    ignored, so that clean-up is not cut short. Any other time it raises again: an exception
    raised in a ``__del__`` is swallowed, and the next Ctrl-C must still stop the command.
    """
    stopped = Stopped()
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def stop(signum, _frame):
        if stopped.signum is not None and isinstance(sys.exc_info()[1], KeyboardInterrupt):
            return
        if stopped.signum is None:
            stopped.signum = signum
            _stop_descendants()
        if stopped.holding:
            stopped.deferred = stopped.deferred or signum
            return
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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

    def end_line(self) -> None:
        """End a line ``spin``/``count`` left open on a terminal, so an error or an interrupt
        message that follows starts on its own line instead of after the spinner's text."""
        if self.tty and self._width and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0

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
