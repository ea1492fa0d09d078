"""The primary engine's calls on a thread of their own, so the engine loop can stop waiting for a
batch that hangs and serve from the fallback (docs/breaker.md).

Only with a fallback configured: without one there is nothing better to do than wait, and the
hand-off costs a thread switch per batch. The worker thread is then the one owner of the primary
engine (every ``run`` is made there), as the engine loop's thread is of the fallback. A hung call
keeps the worker busy; the loop sees :attr:`EngineWorker.busy` and routes around it until the call
returns, whenever that is.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["EngineWorker"]


class EngineWorker:
    def __init__(self, engine: Any, name: str = "edge-engine-primary") -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._job: tuple | None = None  # (ids, mask) waiting for the thread
        self._done = threading.Event()
        self._out: Any = None
        self._error: BaseException | None = None
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A call is in progress (or was given up on and has not returned yet)."""
        return self._busy

    def start(self, ids, mask, run: Any = None) -> None:
        """Hand one batch to the thread; the caller waits with :meth:`wait`. ``run``: the call to
        make instead of the engine's ``run`` (the same engine's, without injected faults)."""
        with self._cond:
            if self._busy:
                raise RuntimeError("the primary engine is still running an earlier batch")
            self._busy = True
            self._done.clear()
            self._out, self._error = None, None
            self._job = (ids, mask, run or self.engine.run)
            self._cond.notify()

    def wait(self, timeout_s: float | None) -> tuple[bool, Any]:
        """(True, outputs) when the call returned in time; raises what it raised; (False, None)
        when ``timeout_s`` passed first (the call goes on, and :attr:`busy` stays true)."""
        if not self._done.wait(timeout_s):
            return False, None
        if self._error is not None:
            raise self._error
        return True, self._out

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a call given up on to return; whether the worker is free."""
        return not self._busy or (self._done.wait(max(0.0, timeout_s)) and not self._busy)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                assert self._job is not None  # the wait ends on a job or a stop
                ids, mask, run = self._job
                self._job = None
            try:
                self._out = run(ids, mask)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop's thread
                self._error = exc
            self._busy = False
            self._done.set()
