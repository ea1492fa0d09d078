"""How boot runs its stages: timed, named after their function, failures turned into BootError.

:meth:`Stages.run` names a stage after the function it calls (``fn.__name__``), so the name in
the timeline is the name to grep for; nothing can drift apart. :class:`Task` runs a chain of
stages on its own thread; :class:`Job` runs stages on whichever thread is free first;
:class:`Handoff` passes one value between the boot's threads.
"""

from __future__ import annotations

import threading

from edge.errors import BootError, EdgeError, ErrorCode
from edge.runtime.timeline import Timeline

__all__ = ["Stages", "Task", "Job", "Handoff", "Cancelled", "stage_error"]


class Stages:
    """Runs each stage inside the timeline and turns failures into BootError."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline

    def run(self, fn, *args, setting, note=None, kwargs: dict | None = None, **info):
        """``fn(*args, **kwargs)`` as the stage ``fn.__name__``; ``setting`` names what to change if it
        fails: a string, or a function that returns it, called only then (a text that costs a stat or
        an import is paid by a failed boot alone). ``note``: a function of ``fn``'s result whose dict
        is added to the stage's entry (what the stage found, e.g. how a file was checked). ``info``
        goes into the stage's entry as it is."""
        name = fn.__name__
        try:
            with self.timeline.stage(name, **info) as entry:
                result = fn(*args, **(kwargs or {}))
                if note is not None:
                    entry.update(note(result))
                return result
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise stage_error(name, exc, setting) from exc


def stage_error(stage: str, exc: BaseException, setting) -> BootError:
    """``exc`` as a BootError of ``stage``: the boot stage's name wins over a library's own
    label, so the timeline, the log and systemd's status all name the same stage. ``setting``:
    a string, or a function that returns one (:meth:`Stages.run`)."""
    if callable(setting):
        try:
            setting = setting()
        except Exception as err:  # noqa: BLE001 - the advice must never hide the stage's own error
            setting = f"(no advice: {type(err).__name__}: {err})"
    if isinstance(exc, BootError):
        exc.stage = stage
        exc.setting = setting if not exc.setting or exc.setting in setting else f"{setting}; {exc.setting}"
        return exc
    code = exc.code if isinstance(exc, EdgeError) else ErrorCode.BOOT_STAGE_FAILED
    return BootError(f"{type(exc).__name__}: {exc}", code, stage=stage, setting=setting)


class Task(threading.Thread):
    """``fn()`` on its own thread; ``result()`` joins and re-raises its error."""

    def __init__(self, name: str, fn) -> None:
        super().__init__(name=f"boot-{name}", daemon=True)
        self._fn = fn
        self.value = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


class Job:
    """``fn()``, run once by the first thread that takes it (:meth:`take`), or on a thread of its
    own (:meth:`start`); :meth:`result` waits for it and re-raises its error. ``helper(done)``: what
    another thread can do for a job already taken (:meth:`take_or_help`), e.g. hash some of its
    chunks; it returns once there is nothing left to share, or once ``done`` (an Event) is set."""

    def __init__(self, name: str, fn, helper=None) -> None:
        self.name = name
        self._fn = fn
        self._helper = helper
        self._lock = threading.Lock()
        self._taken = False
        self._done = threading.Event()
        self.error: BaseException | None = None

    def take(self) -> bool:
        """Run it here unless another thread has; True when this call ran it."""
        with self._lock:
            if self._taken:
                return False
            self._taken = True
        try:
            self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self.error = exc
        finally:
            self._done.set()
        return True

    def take_or_help(self) -> None:
        """Run it here, or, when another thread has, help it (``helper``) while it runs."""
        if not self.take() and self._helper is not None and not self._done.is_set():
            self._helper(self._done)

    def drop(self) -> None:
        """Never run it (a boot that failed elsewhere); a run already under way goes on."""
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self._done.set()

    def start(self) -> None:
        """Run it on a thread of its own."""
        threading.Thread(target=self.take, name=f"boot-{self.name}", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None = None) -> None:
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"boot job {self.name} still running after {timeout_s} s")
        if self.error is not None:
            raise self.error


class Handoff:
    """One value passed from one boot thread to another, or word that it never will be."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value = None

    def put(self, value) -> None:
        self._value = value
        self._done.set()

    def cancel(self) -> None:
        self._done.set()

    def get(self):
        self._done.wait()
        if self._value is None:
            raise Cancelled()
        return self._value


class Cancelled(Exception):
    """The main thread failed first; its error is the one reported."""
